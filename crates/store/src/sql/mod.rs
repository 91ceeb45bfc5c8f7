//! Backend-neutral data access: every query of the store, written once against [`Db`]. A backend
//! (`crate::sqlite`, `crate::postgres`) supplies the connection and the transaction; the code here loads
//! what a rule in `tb_core` needs, calls the rule, and writes what it returned.

pub(crate) mod attempt;
pub(crate) mod attempt_batch;
pub(crate) mod audit;
pub mod batch;
pub(crate) mod config;
mod db;
pub(crate) mod ingest_batch;
pub(crate) mod lease;
pub(crate) mod log;
pub(crate) mod packed_events;
mod pipeline;
pub(crate) mod read;
pub(crate) mod schedule;
pub(crate) mod services;
pub(crate) mod session;
mod store;
pub(crate) mod write;

pub use db::{numbered_to_dollar, to_postgres, Db, Dialect, FromValue, Param, Row, ToParam, Value};
pub(crate) use db::{Col, IdList, Rows};
pub(crate) use pipeline::Pipeline;
pub use session::waits::wait_view;
pub use store::{Backend, SqlStore};
