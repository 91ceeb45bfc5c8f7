//! The error envelope every non-2xx answer carries.

use serde::{Deserialize, Serialize};

/// `{error, message}`: `error` is a stable machine code (`tb_core::ErrorCode::as_str`, or one of
/// `unauthenticated`, `forbidden`, `method_not_allowed`, `capability_not_provided`,
/// `idempotency_reply_withheld`); `message` says what to fix and never echoes inbound content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    pub error: String,
    #[serde(default)]
    pub message: String,
}
