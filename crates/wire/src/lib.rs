//! The `triggers.v2` NATS wire protocol (contract: `docs/wire.md`, after the project's
//! wire spec). Pure: no I/O. Both ends use it: the SDK a service links, and the orchestrator side of
//! the server.
//!
//! * [`subjects`]: subject and stream/consumer names, the safe-subject rule, service names;
//! * [`headers`]: the envelope headers (canonical on write, case-insensitive on read), the Durable
//!   Timer triplet that never reaches a handler;
//! * [`time`]: RFC 3339 with nanoseconds, Go-trimmed by default;
//! * [`json`]: Go `encoding/json`-compatible bytes (floats, U+2028/9, HTML escaping, raw messages);
//! * [`shapes`]: Envelope, Heartbeat, CompletionEvent, DLQ entry, register reply;
//! * [`manifest`]: the manifest and its `manifest_hash`;
//! * [`schema`]: JSON Schema normalization to the Go reflector's shape;
//! * [`result_event`]: the `result_event` catalog entry of a flat typed output;
//! * [`flow`]: the flow body handed to services and how a message finds its action;
//! * [`outcome`]: ack, retry, dead letter or reject after a handler ran;
//! * [`durable_timer`]: the Durable Timer private context and its release gate.

pub mod durable_timer;
pub mod flow;
pub mod headers;
pub mod json;
pub mod manifest;
pub mod outcome;
pub mod result_event;
pub mod schema;
pub mod shapes;
pub mod subjects;
pub mod time;

pub use shapes::{CompletionEvent, DlqEntry, Envelope, FlowEnvelope, Heartbeat, RegisterReply};
