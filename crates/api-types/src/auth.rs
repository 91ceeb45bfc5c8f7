//! `GET /v1/auth/key`: what the presented API key may do.

use serde::{Deserialize, Serialize};

/// The caller's key: its configured name (never the key) and its OpenWOP §12 scopes (`*` = every
/// scope). On an open API (no keys configured) the name is `anonymous` and the scopes `["*"]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "camelCase")]
pub struct KeyInfo {
    pub name: String,
    pub scopes: Vec<String>,
}

impl KeyInfo {
    /// Whether the key holds `scope` (`*` holds every scope): the rule of the server's `auth::require`.
    pub fn allows(&self, scope: &str) -> bool {
        self.scopes.iter().any(|s| s == "*" || s == scope)
    }
}
