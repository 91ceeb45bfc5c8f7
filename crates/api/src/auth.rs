//! Bearer API keys (OpenWOP §12 auth): `Authorization: Bearer <key>` on every management and read
//! endpoint, with scopes. Keys are held as SHA-256 digests and compared in constant time. Discovery,
//! `/health`, `/ready`, `/metrics` and the ingest endpoints take no credential (on ingest the signature is the
//! credential). Each route declares its [`Access`] where it is added to the router
//! ([`crate::routes::Routes`]); nothing here looks at the request path.
//!
//! With no key configured the API is open (development on loopback only; `serve` refuses a non-loopback
//! listen address without keys). Errors: 401 `unauthenticated`, 403 `forbidden`, in the flat envelope.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tb_engine::failed_auth::Surface;

use crate::AppState;

/// The scope of `POST /v1/runs/{id}/result` for an API key: the key of an http worker that reports
/// the runs it accepted with 202. `runs:create` does not hold it (docs/http-api.md).
pub const RESULT_SCOPE: &str = "runs:result";

/// Scopes (OpenWOP §12).
pub const SCOPES: &[&str] = &[
    "manifest:read",
    "runs:create",
    "runs:read",
    "runs:cancel",
    // Reporting a run's result as its executor (an http worker's key): not in a session agent's set.
    RESULT_SCOPE,
    "artifacts:read",
    "webhooks:manage",
    "approvals:respond",
    "audit:read",
    // The operator console: see everything, act (pause, replay, raise), open redacted bodies.
    "operator:read",
    "operator:write",
    "operator:bodies",
];

/// One API key: a name for logs, the SHA-256 of the key, its scopes (`*` = all) and the OpenWOP
/// tenants (workspaces) it is a member of (`*` = every tenant; `[[api_keys]] tenants`, default
/// [`DEFAULT_TENANT`] only).
#[derive(Debug, Clone)]
pub struct ApiKey {
    /// The key's name (`[[api_keys]] name`), shown in logs instead of the key.
    pub name: String,
    /// SHA-256 of the key's text; the key itself is not kept.
    pub sha256: [u8; 32],
    /// Scopes granted (`[[api_keys]] scopes`, e.g. `runs:read`); `*` grants all.
    pub scopes: Vec<String>,
    /// OpenWOP tenants (workspaces) the key is a member of (`[[api_keys]] tenants`); `*` = every
    /// tenant; [`DEFAULT_TENANT`] alone when the key declares none (OpenWOP webhooks.md: the caller
    /// must be a member of a subscription's tenant).
    pub tenants: Vec<String>,
}

/// The tenant of a key that declares none (`[[api_keys]]` without `tenants`).
pub const DEFAULT_TENANT: &str = "default";

impl ApiKey {
    /// A key from its cleartext (e.g. `TRIGGER_BRIDGE_API_KEY`) with every scope, a member of every
    /// tenant.
    pub fn full_scope(name: &str, key: &str) -> ApiKey {
        ApiKey {
            name: name.into(),
            sha256: digest(key),
            scopes: vec!["*".into()],
            tenants: vec!["*".into()],
        }
    }

    /// Whether the key holds `scope` (`*` holds every scope).
    pub fn allows(&self, scope: &str) -> bool {
        self.scopes.iter().any(|s| s == "*" || s == scope)
    }

    /// Whether the key is a member of tenant `tenant` (`*` is a member of every tenant).
    pub fn member_of(&self, tenant: &str) -> bool {
        self.tenants.iter().any(|t| t == "*" || t == tenant)
    }
}

/// Whether caller `p` is a member of tenant (OpenWOP workspace) `tenant`, as outbound webhooks need
/// (OpenWOP webhooks.md: "The caller MUST be a member of the tenant the subscription will live
/// under"): on an open API (no keys configured) every caller is; otherwise the key `p` names must
/// list it ([`ApiKey::member_of`]). A principal that names no configured key is a member of none.
pub fn is_member(keys: &ApiKeys, p: &Principal, tenant: &str) -> bool {
    keys.0.is_empty() || keys.0.iter().any(|k| k.name == p.0 && k.member_of(tenant))
}

/// SHA-256 of a key, as stored (`[[api_keys]] sha256 = "<hex>"`).
pub fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Who made a request: the API key's name, or `anonymous` on an open API. Set by [`require`] for the
/// handlers and the idempotency layer (whose records are scoped per principal).
#[derive(Debug, Clone)]
pub struct Principal(pub String, pub Vec<String>);

impl Principal {
    /// The caller on an open API (no keys configured): every scope.
    pub fn anonymous() -> Principal {
        Principal("anonymous".into(), vec!["*".into()])
    }

    /// Whether the caller holds `scope`.
    pub fn may(&self, scope: &str) -> bool {
        self.1.iter().any(|s| s == "*" || s == scope)
    }
}

/// The configured keys; empty means the API is open.
#[derive(Debug, Clone, Default)]
pub struct ApiKeys(pub Arc<Vec<ApiKey>>);

/// Who may call a route, declared at the route in [`crate::routes()`] (never derived from the path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No credential: discovery, `/health`, `/metrics`, the ingest endpoints (the signature is the
    /// credential) and capability URLs (the token in the path is; signals-and-connectors §4).
    Public,
    /// A bearer API key holding this OpenWOP §12 scope (one of [`SCOPES`]).
    Scope(&'static str),
    /// Any known bearer API key, whatever its scopes: only `GET /v1/auth/key`, which tells a client
    /// what its own key may do.
    AnyKey,
    /// The run's executor, only `POST /v1/runs/{id}/result`: the run's own result token
    /// (`Authorization: Bearer tbres_...`, [`tb_core::run::result_token`]) or a bearer API key
    /// holding [`RESULT_SCOPE`]; checked by [`crate::runs::require_executor`].
    RunExecutor,
}

/// An error answer in the flat envelope; a 401 carries `WWW-Authenticate: Bearer`.
pub(crate) fn deny(status: StatusCode, code: &str, message: &str) -> Response {
    let mut r = (status, Json(json!({"error": code, "message": message}))).into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            axum::http::header::WWW_AUTHENTICATE,
            axum::http::HeaderValue::from_static("Bearer"),
        );
    }
    r
}

/// 429 `rate_limited` with `Retry-After`: too many wrong API keys from the caller's address
/// ([`tb_core::failed_auth`]).
pub fn throttled(retry_after_s: u64) -> Response {
    let mut r = deny(
        StatusCode::TOO_MANY_REQUESTS,
        "rate_limited",
        &format!(
            "too many wrong API keys from this address: every key it sends is refused for {retry_after_s} s"
        ),
    );
    r.headers_mut().insert(
        axum::http::header::RETRY_AFTER,
        axum::http::HeaderValue::from(retry_after_s),
    );
    r
}

/// The bearer credential of a request (`Authorization: Bearer <x>`, the scheme in any case), trimmed.
pub(crate) fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, k)| k.trim())
}

/// The configured key `presented` is (its SHA-256 compared in constant time with each key's), or
/// `None`. The one key lookup of the API and the console login.
pub fn known_key<'a>(keys: &'a ApiKeys, presented: &str) -> Option<&'a ApiKey> {
    let d = digest(presented);
    keys.0.iter().find(|k| bool::from(k.sha256.ct_eq(&d)))
}

/// The per-route middleware of a route whose [`Access`] is `Scope(scope)` or `AnyKey`: on an open
/// API (no keys) the caller is [`Principal::anonymous`]; otherwise a known key (holding `scope`, for
/// `Scope`) passes with its [`Principal`] in the request extensions. Errors: 401 `unauthenticated`
/// (no or unknown key, with `WWW-Authenticate: Bearer`), 403 `forbidden` (the key lacks `scope`), 429
/// `rate_limited` with `Retry-After` ([`throttled`]: the caller's address sent too many unknown keys,
/// `[rate_limits].failed_keys_per_min`; then every key it sends is refused unchecked until its window
/// ends, docs/limits.md "Wrong API keys").
pub async fn require(
    State((st, access)): State<(AppState, Access)>,
    mut req: Request,
    next: Next,
) -> Response {
    if st.keys.0.is_empty() {
        req.extensions_mut().insert(Principal::anonymous());
        return next.run(req).await;
    }
    let Some(presented) = bearer(req.headers()) else {
        return deny(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "send Authorization: Bearer <api key>",
        );
    };
    // Wrong keys are throttled per client address (tb_engine::failed_auth): past the limit every
    // key from the address is refused unchecked, so a right guess is not told from a wrong one.
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let client = st.engine.client_key(peer, req.headers());
    if let Err(retry_after_s) = st.engine.admit_key_check(client.as_deref(), Surface::Api) {
        return throttled(retry_after_s);
    }
    match known_key(&st.keys, presented) {
        None => {
            st.engine.key_check_failed(client.as_deref(), Surface::Api);
            deny(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "unknown API key",
            )
        }
        Some(k) => {
            // `AnyKey` (and `Public`, never layered) need no scope: only a known key.
            let needed = match access {
                Access::Scope(s) => Some(s),
                Access::RunExecutor => Some(RESULT_SCOPE),
                Access::AnyKey | Access::Public => None,
            };
            if let Some(s) = needed.filter(|s| !k.allows(s)) {
                return deny(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    &format!("this API key lacks the scope {s}"),
                );
            }
            let p = Principal(k.name.clone(), k.scopes.clone());
            req.extensions_mut().insert(p);
            next.run(req).await
        }
    }
}

/// `GET /v1/auth/key` (any known key) -> `{name, scopes}`: what the caller's key may do, so a client
/// (the MCP server above all) offers only the operations that will not be refused. Never the key.
#[utoipa::path(get, path = "/v1/auth/key", tag = "auth", responses((status = 200, description = "{name, scopes}"), (status = 401, description = "unauthenticated")))]
pub async fn key_info(p: Option<axum::Extension<Principal>>) -> Json<tb_api_types::KeyInfo> {
    let p = p
        .map(|axum::Extension(p)| p)
        .unwrap_or_else(Principal::anonymous);
    Json(tb_api_types::KeyInfo {
        name: p.0,
        scopes: p.1,
    })
}
