//! The JSON shapes of the trigger-bridge HTTP API (camelCase, RFC 3339 UTC times with ms), shared by
//! the server, which serves them, and the typed client (`trigger-bridge-client`), which reads them, so
//! the two cannot drift apart. No logic lives here: building a view from a stored record is the
//! server's `wire` module; deciding anything is `tb_core`.
//!
//! Feature `openapi` derives `utoipa::ToSchema` for the server's `/v1/openapi.json`.

pub mod auth;
pub mod error;
pub mod inspect;
pub mod list;
pub mod replay;
pub mod runs;
pub mod sessions;

pub use auth::KeyInfo;
pub use error::ErrorBody;
pub use inspect::{AttemptView, DeliveryDetail, DeliveryView, ReceiptDetail, ReceiptView};
pub use list::ListQuery;
pub use replay::{ReplayFilter, ReplayOutcome, ReplayRequest, ReplaySkip};
pub use runs::RunCreated;
pub use sessions::*;
pub use tb_core::signal::SessionSignalV1;
