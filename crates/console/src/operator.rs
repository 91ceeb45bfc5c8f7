//! The viewer of a console page and what its key's scopes let it do. Found by
//! [`crate::login::guard`] and put in the request's extensions; the pages read it to hide what the
//! viewer may not do.

/// The viewer of a page: the API key's name, its scopes now, and the login's CSRF token.
#[derive(Debug, Clone)]
pub struct Operator {
    /// The API key's name (`anonymous` on an open console).
    pub name: String,
    pub(crate) scopes: Vec<String>,
    /// The CSRF token every form of this login carries.
    pub csrf: String,
    pub(crate) token_sha256: String,
}

impl Operator {
    /// Whether the viewer holds `scope`.
    pub fn may(&self, scope: &str) -> bool {
        self.scopes.iter().any(|s| s == "*" || s == scope)
    }
    /// `operator:write`: pause / resume, replay, raise a signal.
    pub fn may_act(&self) -> bool {
        self.may(WRITE)
    }
    /// `operator:bodies`: open a receipt's redacted body.
    pub fn may_read_bodies(&self) -> bool {
        self.may(BODIES)
    }
    /// The principal the API's handlers see for this viewer.
    pub fn principal(&self) -> tb_api::auth::Principal {
        tb_api::auth::Principal(self.name.clone(), self.scopes.clone())
    }
}

/// Scope to see the console.
pub const READ: &str = "operator:read";
/// Scope to act in it.
pub const WRITE: &str = "operator:write";
/// Scope to open redacted bodies.
pub const BODIES: &str = "operator:bodies";
