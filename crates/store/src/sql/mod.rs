//! Backend-neutral data access: every query of the store, written once against [`Db`].

mod db;

pub use db::{numbered_to_dollar, Db, Dialect, FromValue, Param, Row, ToParam, Value};
