//! Domain core of trigger-bridge (DESIGN §2, §4, §6).
//!
//! Everything here is pure data and pure functions: ids, the error codes the API answers with, the retry
//! policy and its backoff, dedup-key derivation, the normalized event routing may look at, bindings and
//! their matching, and the subscription / delivery / receipt / run state machines. No I/O, no async.

pub mod attempt;
pub mod audit;
pub mod binding;
pub mod connector;
pub mod credentials;
pub mod dedup;
pub mod delivery;
pub mod error;
pub mod events;
pub mod failed_auth;
pub mod front_door;
pub mod idempotency;
pub mod ids;
pub mod lease;
pub mod limits;
pub mod normalized;
pub mod outbox;
pub mod quarantine;
pub mod queue;
pub mod rate;
pub mod receipt;
pub mod redact;
pub mod replay;
pub mod retention;
pub mod retry;
pub mod rotation;
pub mod run;
pub mod schedule;
pub mod secret_ref;
pub mod service;
pub mod session;
pub mod signal;
pub mod subscription;
pub mod template;
pub mod trace;
pub mod turn;
pub mod wait;
pub mod workflow;

pub use error::{ErrorCode, TbError};
