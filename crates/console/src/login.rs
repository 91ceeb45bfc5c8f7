//! Who is looking: API-key login, the login cookie, CSRF tokens and the per-route scope guard.
//!
//! - `POST /ui/login` takes an API key (the same keys as the API, `[[api_keys]]` /
//!   `TRIGGER_BRIDGE_API_KEY`), checks it against the configured digests in constant time, and stores a
//!   login row (`console_logins`: the SHA-256 of a random 256-bit token, the key's *name*, a random
//!   CSRF token, 12 h expiry). The browser gets the token in cookie [`COOKIE`]: `HttpOnly`,
//!   `SameSite=Strict`, `Path=/ui`, and `Secure` when the request came over TLS (`X-Forwarded-Proto:
//!   https` from the proxy in front). Logins live in the store, so every replica knows them.
//! - Every request re-reads the key's scopes from the configuration by its name: a key removed from
//!   the configuration ends its logins at the next request; a key with fewer scopes sees less.
//! - Every `POST` carries the login's CSRF token (form field `csrf` or header `X-CSRF-Token`),
//!   compared in constant time; a missing or wrong one is 403 `csrf_failed` and nothing happens.
//! - Scopes (declared per route in [`crate::router`]): `operator:read` to see, `operator:write` to act,
//!   `operator:bodies` to open a receipt's redacted body; `*` holds all. The pages hide what the viewer
//!   may not do.
//! - With no key configured (development on loopback) the console is open like the API: the first
//!   visit makes an `anonymous` login, so CSRF tokens still guard every form.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tb_engine::failed_auth::Surface;
use tb_store::ConsoleLogin;

use crate::html;
pub use crate::operator::{Operator, BODIES, READ, WRITE};
use crate::Console;

/// The login cookie's name.
pub const COOKIE: &str = "tb_console";
/// How long a login lasts, in ms: 12 hours.
pub const LOGIN_TTL_MS: i64 = 12 * 3_600_000;
/// Largest form a console `POST` may send, in bytes.
pub const MAX_FORM: usize = 64 * 1024;

fn sha_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    rand::fill(&mut b[..]);
    hex::encode(b)
}

fn cookie_value(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
        .filter(|v| v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn behind_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

fn set_cookie(token: &str, max_age_s: i64, secure: bool) -> String {
    format!(
        "{COOKIE}={token}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={max_age_s}{}",
        if secure { "; Secure" } else { "" }
    )
}

/// The digest an open console's `anonymous` login records (there is no key).
const NO_KEY: &str = "-";

/// The scopes now of the key named `name` whose digest is `sha256_hex`; `None` when no such key is
/// configured any more: removed, or rotated (the same name, another key).
fn scopes_of(c: &Console, name: &str, sha256_hex: &str) -> Option<Vec<String>> {
    if c.api.keys.0.is_empty() {
        return (name == "anonymous" && sha256_hex == NO_KEY).then(|| vec!["*".to_string()]);
    }
    c.api
        .keys
        .0
        .iter()
        .find(|k| {
            k.name == name
                && bool::from(
                    hex::encode(k.sha256)
                        .as_bytes()
                        .ct_eq(sha256_hex.as_bytes()),
                )
        })
        .map(|k| k.scopes.clone())
}

/// The viewer of a request, from its cookie; `None` without a live login.
async fn operator(c: &Console, headers: &HeaderMap) -> Option<Operator> {
    let token = cookie_value(headers)?;
    let hash = sha_hex(&token);
    let login = c
        .api
        .engine
        .store
        .console_login(&hash, tb_engine::clock::now_ms())
        .await
        .ok()??;
    let Some(scopes) = scopes_of(c, &login.key_name, &login.key_sha256) else {
        // Its key was removed or rotated: the login ends for good (a key put back later does not
        // bring it back).
        let _ = c.api.engine.store.delete_console_login(&hash).await;
        return None;
    };
    Some(Operator {
        name: login.key_name,
        scopes,
        csrf: login.csrf,
        token_sha256: hash,
    })
}

/// The open console's one `anonymous` login of this process (made at the first visit, shared by every
/// visitor without a cookie), so cookieless requests cost no store write each.
async fn anonymous_login(c: &Console) -> Result<(String, Operator), tb_store::StoreError> {
    let mut slot = c.anonymous.lock().await;
    if let Some(token) = slot.as_ref() {
        let mut h = HeaderMap::new();
        if let Ok(v) = format!("{COOKIE}={token}").parse() {
            h.insert(header::COOKIE, v);
        }
        if let Some(op) = operator(c, &h).await {
            return Ok((token.clone(), op));
        }
    }
    let (token, op) = new_login(c, "anonymous", NO_KEY).await?;
    *slot = Some(token.clone());
    Ok((token, op))
}

/// The logins that may stay, as `name:sha256-hex`: one per configured key (`anonymous:-` on an
/// open console).
pub fn valid_logins(keys: &tb_api::auth::ApiKeys) -> Vec<String> {
    if keys.0.is_empty() {
        return vec![format!("anonymous:{NO_KEY}")];
    }
    keys.0
        .iter()
        .map(|k| format!("{}:{}", k.name, hex::encode(k.sha256)))
        .collect()
}

/// Stores a new login for the key `name` with digest `key_sha256` (hex; [`NO_KEY`] on an open
/// console); returns the cookie's token and the operator.
async fn new_login(
    c: &Console,
    name: &str,
    key_sha256: &str,
) -> Result<(String, Operator), tb_store::StoreError> {
    let token = random_hex(32);
    let now = tb_engine::clock::now_ms();
    let login = ConsoleLogin {
        token_sha256: sha_hex(&token),
        key_name: name.to_string(),
        key_sha256: key_sha256.to_string(),
        csrf: random_hex(16),
        created_at: now,
        expires_at: now + LOGIN_TTL_MS,
    };
    c.api
        .engine
        .store
        .create_console_login(login.clone())
        .await?;
    let scopes = scopes_of(c, name, key_sha256).unwrap_or_default();
    Ok((
        token,
        Operator {
            name: name.to_string(),
            scopes,
            csrf: login.csrf,
            token_sha256: login.token_sha256,
        },
    ))
}

/// What a route needs, declared where it is added ([`crate::router`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// `operator:read`.
    Read,
    /// `operator:write` (and a CSRF token: every such route is a `POST`).
    Write,
    /// `operator:bodies`.
    Bodies,
    /// A live login only, any scope, and the CSRF token (`POST /ui/logout`).
    LoggedIn,
}

fn refuse(status: StatusCode, code: &str, message: &str) -> Response {
    (status, html::error_page(status, code, message)).into_response()
}

/// The guard of every console route but the login page and the assets: finds the [`Operator`], checks
/// the route's [`Need`] and, on `POST`, the CSRF token; puts the operator in the request's extensions.
/// A `GET` without a login is sent to `/ui/login?next=<path>`; a `POST` without one is 403
/// `csrf_failed`.
pub async fn guard(State((c, need)): State<(Console, Need)>, req: Request, next: Next) -> Response {
    let post = req.method() == Method::POST;
    let mut fresh_cookie = None;
    let op = match operator(&c, req.headers()).await {
        Some(op) => op,
        None if c.api.keys.0.is_empty() && !post => match anonymous_login(&c).await {
            Ok((token, op)) => {
                fresh_cookie = Some(set_cookie(
                    &token,
                    LOGIN_TTL_MS / 1000,
                    behind_tls(req.headers()),
                ));
                op
            }
            Err(e) => {
                return refuse(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    &e.to_string(),
                )
            }
        },
        None if post => {
            return refuse(
                StatusCode::FORBIDDEN,
                "csrf_failed",
                "this form needs a live login: log in again and resend it",
            )
        }
        None => {
            let next_path = req
                .uri()
                .path_and_query()
                .map(|p| p.as_str().to_string())
                .unwrap_or_else(|| "/ui".into());
            return Redirect::to(&format!("/ui/login?next={}", html::url_encode(&next_path)))
                .into_response();
        }
    };
    let allowed = match need {
        Need::Read => op.may(READ),
        Need::Write => op.may(READ) && op.may(WRITE),
        Need::Bodies => op.may(READ) && op.may(BODIES),
        Need::LoggedIn => true,
    };
    if !allowed {
        let scope = match need {
            Need::Write => WRITE,
            Need::Bodies => BODIES,
            _ => READ,
        };
        return refuse(
            StatusCode::FORBIDDEN,
            "forbidden",
            &format!("the API key {} lacks the scope {scope}", op.name),
        );
    }
    if post && !same_origin(req.headers()) {
        return cross_site();
    }
    let req = if post {
        match check_csrf(req, &op.csrf).await {
            Ok(r) => r,
            Err(resp) => return resp,
        }
    } else {
        req
    };
    let mut req = req;
    req.extensions_mut().insert(op);
    let mut res = next.run(req).await;
    if let Some(cookie) = fresh_cookie {
        if let Ok(v) = cookie.parse() {
            res.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    res
}

/// Reads the form (at most [`MAX_FORM`] bytes) and checks its `csrf` field, or the `X-CSRF-Token`
/// header, against the login's token; gives the request back with its body intact.
async fn check_csrf(req: Request, expected: &str) -> Result<Request, Response> {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_FORM).await.map_err(|_| {
        refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            "the form is larger than 64 KiB",
        )
    })?;
    let from_header = parts
        .headers
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let from_form = form_field(&bytes, "csrf");
    let sent = from_header.or(from_form).unwrap_or_default();
    if !bool::from(sent.as_bytes().ct_eq(expected.as_bytes())) {
        tracing::warn!("console form refused: missing or wrong CSRF token");
        return Err(refuse(
            StatusCode::FORBIDDEN,
            "csrf_failed",
            "this form's CSRF token is missing or not this login's: reload the page and try again",
        ));
    }
    Ok(Request::from_parts(parts, axum::body::Body::from(bytes)))
}

/// The first value of `name` in a URL-encoded form.
fn form_field(body: &[u8], name: &str) -> Option<String> {
    let pairs: Vec<(String, String)> = serde_urlencoded_pairs(body);
    pairs.into_iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

fn serde_urlencoded_pairs(body: &[u8]) -> Vec<(String, String)> {
    serde_urlencoded::from_bytes(body).unwrap_or_default()
}

/// The login form.
#[derive(Debug, Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    key: String,
    #[serde(default)]
    next: String,
}

/// Where to go after logging in: a console path only (docs/console.md, "Login"). The path is
/// percent-decoded once and its dot segments resolved (`.`, `..`, and their encoded forms such as
/// `.%2e`, which browsers resolve too) before it is judged; it must then be `/ui` or lie under `/ui/`,
/// and hold no `%` (a second encoding), `\`, `//`, `?`, `#` or anything but printable ASCII.
/// Anything else, and anything unparsable, goes to `/ui`. The answer is the resolved path and the
/// query as sent (printable ASCII); the fragment is dropped.
fn safe_next(next: &str) -> String {
    resolve_next(next).unwrap_or_else(|| "/ui".to_string())
}

fn resolve_next(next: &str) -> Option<String> {
    let next = next.split('#').next().unwrap_or("");
    if !next.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return None;
    }
    let (path, query) = match next.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (next, None),
    };
    let decoded = percent_decode(path)?;
    let bad = |b: &u8| !(0x21..0x7f).contains(b) || b"%\\?#".contains(b);
    if !decoded.starts_with('/') || decoded.contains("//") || decoded.as_bytes().iter().any(bad) {
        return None;
    }
    // RFC 3986 §5.2.4 remove_dot_segments, over the decoded path.
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = decoded[1..].split('/').collect();
    let last = segments.len() - 1;
    for (i, seg) in segments.iter().enumerate() {
        match *seg {
            "." | ".." => {
                if *seg == ".." {
                    out.pop();
                }
                // A path ending in a dot segment names a directory: keep its trailing slash.
                if i == last {
                    out.push("");
                }
            }
            s => out.push(s),
        }
    }
    let path = format!("/{}", out.join("/"));
    if path != "/ui" && !path.starts_with("/ui/") {
        return None;
    }
    Some(match query {
        Some(q) => format!("{path}?{q}"),
        None => path,
    })
}

/// Decodes `%XX` escapes once; `None` on a broken escape or a result that is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Whether a `POST` comes from a page of this server (docs/console.md, "Login"): when the browser
/// sends `Sec-Fetch-Site` it must be `same-origin` (or `none`: the user's own navigation); else when
/// it sends `Origin`, its host must be this request's `Host` (or `X-Forwarded-Host`, set by the proxy
/// in front; a cross-site form cannot set either header). A request with neither header is no
/// browser's cross-site form (browsers send `Origin` on every `POST`) and passes; the CSRF token of
/// a logged-in form still guards it.
pub(crate) fn same_origin(headers: &HeaderMap) -> bool {
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = headers.get("sec-fetch-site") {
        return site == "same-origin" || site == "none";
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    let Some(host) = origin.to_str().ok().and_then(|o| {
        o.strip_prefix("https://")
            .or_else(|| o.strip_prefix("http://"))
    }) else {
        // `null` (a sandboxed or privacy-sensitive context) or no web origin: refused.
        return false;
    };
    [text("host"), text("x-forwarded-host")]
        .into_iter()
        .flatten()
        .any(|h| h.trim().eq_ignore_ascii_case(host))
}

fn cross_site() -> Response {
    tracing::warn!("console form refused: sent from another site (Origin / Sec-Fetch-Site)");
    refuse(
        StatusCode::FORBIDDEN,
        "cross_site_refused",
        "this form was sent from another site: open the console at its own address and send it from there",
    )
}

/// `GET /ui/login?next=...`: the login form (public).
pub async fn login_page(
    State(c): State<Console>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Response {
    let next = safe_next(q.get("next").map(String::as_str).unwrap_or("/ui"));
    if c.api.keys.0.is_empty() {
        return Redirect::to(&next).into_response();
    }
    html::login_page(&next, None).into_response()
}

/// `POST /ui/login` (public): checks the key, stores a login, sets the cookie, goes to `next`
/// (`safe_next`). Errors: 403 `cross_site_refused` (sent from another site: `same_origin`); 429
/// with `Retry-After` (the client address sent too many wrong keys, to the console or the API:
/// [`tb_engine::failed_auth`], then every key it sends is refused unchecked); 401 (unknown key: the
/// form again, nothing stored, counted against the address); 403 (the key lacks `operator:read`).
pub async fn login(
    State(c): State<Console>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    headers: HeaderMap,
    Form(f): Form<LoginForm>,
) -> Response {
    if !same_origin(&headers) {
        return cross_site();
    }
    let next = safe_next(&f.next);
    let engine = &c.api.engine;
    let client = engine.client_key(peer.map(|p| p.0 .0.ip()), &headers);
    if let Err(wait) = engine.admit_key_check(client.as_deref(), Surface::Console) {
        let mut res = (
            StatusCode::TOO_MANY_REQUESTS,
            html::login_page(
                &next,
                Some(&format!(
                    "Too many wrong keys from this address: try again in {wait} s."
                )),
            ),
        )
            .into_response();
        res.headers_mut()
            .insert(header::RETRY_AFTER, axum::http::HeaderValue::from(wait));
        return res;
    }
    let key = tb_api::auth::known_key(&c.api.keys, f.key.trim()).cloned();
    let Some(key) = key else {
        if !c.api.keys.0.is_empty() {
            engine.key_check_failed(client.as_deref(), Surface::Console);
        }
        return (
            StatusCode::UNAUTHORIZED,
            html::login_page(&next, Some("That is not an API key of this server.")),
        )
            .into_response();
    };
    if !key.allows(READ) {
        return (
            StatusCode::FORBIDDEN,
            html::login_page(
                &next,
                Some(&format!(
                    "The key {} lacks the scope operator:read.",
                    key.name
                )),
            ),
        )
            .into_response();
    }
    let (token, _op) = match new_login(&c, &key.name, &hex::encode(key.sha256)).await {
        Ok(x) => x,
        Err(e) => {
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                &e.to_string(),
            )
        }
    };
    tb_api::audit::record(
        &c.api,
        &key.name,
        "console.login",
        String::new(),
        StatusCode::SEE_OTHER,
        &serde_json::Value::Null,
        None,
    )
    .await;
    let mut res = Redirect::to(&next).into_response();
    if let Ok(v) = set_cookie(&token, LOGIN_TTL_MS / 1000, behind_tls(&headers)).parse() {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
    res
}

/// `POST /ui/logout`: ends the login and clears the cookie.
pub async fn logout(
    State(c): State<Console>,
    axum::Extension(op): axum::Extension<Operator>,
    headers: HeaderMap,
) -> Response {
    let _ = c
        .api
        .engine
        .store
        .delete_console_login(&op.token_sha256)
        .await;
    tb_api::audit::record(
        &c.api,
        &op.name,
        "console.logout",
        String::new(),
        StatusCode::SEE_OTHER,
        &serde_json::Value::Null,
        None,
    )
    .await;
    let mut res = Redirect::to("/ui/login").into_response();
    if let Ok(v) = set_cookie("", 0, behind_tls(&headers)).parse() {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_console_paths_are_followed_after_login() {
        assert_eq!(
            safe_next("/ui/receipts?state=consumed"),
            "/ui/receipts?state=consumed"
        );
        assert_eq!(safe_next("https://evil.example/ui"), "/ui");
        assert_eq!(safe_next("//evil.example"), "/ui");
        assert_eq!(safe_next("/ui//evil.example"), "/ui");
        assert_eq!(safe_next("/v1/runs"), "/ui");
        assert_eq!(safe_next("/ui/../../evil"), "/ui");
        assert_eq!(safe_next("/ui/%2e%2e/evil"), "/ui");
        assert_eq!(safe_next("/ui\r\nX: 1"), "/ui");
        assert_eq!(safe_next("/uievil"), "/ui");
    }

    #[test]
    fn next_is_judged_after_decoding_and_resolving_dot_segments() {
        // Browsers resolve `.%2e` and `%2e.` as `..`: these climbed out of /ui before.
        assert_eq!(safe_next("/ui/.%2e/.%2e/v1/runs"), "/ui");
        assert_eq!(safe_next("/ui/%2e./v1/runs"), "/ui");
        assert_eq!(safe_next("/ui/%2E%2E"), "/ui");
        assert_eq!(safe_next("/ui/.."), "/ui");
        // A second encoding, an encoded backslash, slash or query: refused.
        assert_eq!(safe_next("/ui/%252e%252e/v1"), "/ui");
        assert_eq!(safe_next("/ui/%5c..%5cv1"), "/ui");
        assert_eq!(safe_next("/ui/%2f%2fevil.example"), "/ui");
        assert_eq!(safe_next("/ui/receipts%3Fx"), "/ui");
        assert_eq!(safe_next("/ui/%zz"), "/ui");
        // Dot segments that stay inside /ui resolve there; the query is kept, the fragment dropped.
        assert_eq!(safe_next("/ui/receipts/../runs?x=1#top"), "/ui/runs?x=1");
        assert_eq!(safe_next("/ui/./receipts/."), "/ui/receipts/");
        assert_eq!(safe_next("/ui/%72uns"), "/ui/runs");
        assert_eq!(safe_next("/ui"), "/ui");
    }

    #[test]
    fn a_post_from_another_site_is_told_from_the_console_s_own() {
        let h = |pairs: &[(&'static str, &'static str)]| {
            let mut m = HeaderMap::new();
            for (k, v) in pairs {
                m.insert(*k, v.parse().unwrap());
            }
            m
        };
        assert!(same_origin(&h(&[("sec-fetch-site", "same-origin")])));
        assert!(!same_origin(&h(&[
            ("sec-fetch-site", "cross-site"),
            ("origin", "http://b:1"),
            ("host", "b:1")
        ])));
        assert!(!same_origin(&h(&[("sec-fetch-site", "same-site")])));
        assert!(same_origin(&h(&[
            ("origin", "http://bridge:8080"),
            ("host", "bridge:8080")
        ])));
        assert!(same_origin(&h(&[
            ("origin", "https://ops.example"),
            ("host", "10.0.0.5:8080"),
            ("x-forwarded-host", "ops.example")
        ])));
        assert!(!same_origin(&h(&[
            ("origin", "https://evil.example"),
            ("host", "bridge:8080")
        ])));
        assert!(!same_origin(&h(&[
            ("origin", "null"),
            ("host", "bridge:8080")
        ])));
        // No browser headers at all (curl, scripts): passes; nothing cross-site about it.
        assert!(same_origin(&h(&[("host", "bridge:8080")])));
    }

    #[test]
    fn the_cookie_is_read_only_in_its_own_shape() {
        let mut h = HeaderMap::new();
        let t = "a".repeat(64);
        h.insert(
            header::COOKIE,
            format!("x=1; {COOKIE}={t}").parse().unwrap(),
        );
        assert_eq!(cookie_value(&h), Some(t));
        h.insert(header::COOKIE, format!("{COOKIE}=short").parse().unwrap());
        assert_eq!(cookie_value(&h), None);
    }

    #[test]
    fn cookies_are_http_only_strict_and_secure_behind_tls() {
        let c = set_cookie("abc", 60, true);
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.ends_with("; Secure"));
        assert!(!set_cookie("abc", 60, false).contains("Secure"));
    }

    #[test]
    fn form_fields_are_decoded() {
        assert_eq!(
            form_field(b"a=1&csrf=ab%20c", "csrf").as_deref(),
            Some("ab c")
        );
        assert_eq!(form_field(b"a=1", "csrf"), None);
    }
}
