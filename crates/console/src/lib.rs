//! The operator console: `/ui` in the same binary as the API, server-rendered HTML
//! (`maud`) with progressive enhancement (htmx, vendored), live over SSE ([`live`]), behind an API-key
//! login with CSRF tokens ([`login`]).
//!
//! The console calls nothing the API does not offer: every page reads through the API's own handler
//! functions (`tb_api::inspect`, `tb_api::sessions`, ...), with the viewer as the principal, and every
//! action goes through the API's handler and is recorded in the audit log with the same action name
//! the API's route records (`tb_api::audit::action_of`), marked `"via": "console"`.
//!
//! Layout: [`operator`] (the viewer), [`login`] (login, cookie, CSRF, the scope guard), [`live`] (the change feed), [`assets`] (embedded files), [`html`] (shell
//! and pieces), `pages::*` (one module per page).

pub mod assets;
pub mod html;
pub mod live;
pub mod login;
pub mod operator;
mod pages;

use std::sync::Arc;

use axum::http::{Method, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post, MethodRouter};
use axum::Router;
use serde_json::Value;
use tb_api::error::ApiError;
use tb_api::AppState;

use crate::login::{Need, Operator};

/// The console's state: the API's, the live feed and the overview's short cache.
#[derive(Clone)]
pub struct Console {
    /// The API's state: the console reads and acts through the API's handlers with it.
    pub api: AppState,
    hub: live::Hub,
    activity: Arc<tokio::sync::Mutex<Option<CachedActivity>>>,
    /// The cookie token of the open console's one `anonymous` login (no keys configured).
    anonymous: Arc<tokio::sync::Mutex<Option<String>>>,
}

/// The activity as last read: when, at which change of the live feed, and what.
type CachedActivity = (std::time::Instant, u64, Arc<tb_api::activity::Activity>);

/// How long the overview's activity is reused by every viewer of this replica while the live feed
/// reports no change (a change makes the next viewer read it again, once for all).
const ACTIVITY_CACHE: std::time::Duration = std::time::Duration::from_secs(10);

impl Console {
    /// The console over the API's state; starts the live feed.
    pub fn new(api: AppState) -> Console {
        let hub = live::Hub::start(api.engine.clone());
        // Logins of keys no longer configured (removed, or rotated under the same name) end now, so
        // putting an old key back later does not revive a cookie stolen meanwhile.
        let (store, keep) = (api.engine.store.clone(), login::valid_logins(&api.keys));
        tokio::spawn(async move {
            match store.prune_console_logins(keep).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    logins = n,
                    "console logins of keys no longer configured ended"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "ending the console logins of removed keys failed")
                }
            }
        });
        Console {
            api,
            hub,
            activity: Default::default(),
            anonymous: Default::default(),
        }
    }

    /// The last hour's activity, shared by every viewer until the live feed reports a change or
    /// [`ACTIVITY_CACHE`] passes; read once per change however many pages are open.
    pub(crate) async fn activity(&self) -> Result<Arc<tb_api::activity::Activity>, ApiError> {
        let mut slot = self.activity.lock().await;
        let change = self.hub.current();
        if let Some((at, seen, a)) = slot.as_ref() {
            if *seen == change && at.elapsed() < ACTIVITY_CACHE {
                return Ok(a.clone());
            }
        }
        let a = Arc::new(tb_api::activity::load(&self.api, Some(60)).await?);
        *slot = Some((std::time::Instant::now(), change, a.clone()));
        Ok(a)
    }
}

/// Every console route with what it needs: [`Need::Read`] pages, [`Need::Write`] actions (all `POST`,
/// all CSRF-checked), the body view ([`Need::Bodies`]), and the public login page and assets.
pub fn routes() -> Vec<(Method, &'static str, Option<Need>)> {
    ROUTES.iter().map(|(m, p, n)| (m.clone(), *p, *n)).collect()
}

const ROUTES: &[(Method, &str, Option<Need>)] = &[
    (Method::GET, "/ui/login", None),
    (Method::POST, "/ui/login", None),
    (Method::GET, "/ui/assets/{name}", None),
    (Method::POST, "/ui/logout", Some(Need::LoggedIn)),
    (Method::GET, "/ui", Some(Need::Read)),
    (Method::GET, "/ui/events", Some(Need::Read)),
    (Method::GET, "/ui/subscriptions", Some(Need::Read)),
    (Method::GET, "/ui/subscriptions/{id}", Some(Need::Read)),
    (
        Method::POST,
        "/ui/subscriptions/{id}/pause",
        Some(Need::Write),
    ),
    (
        Method::POST,
        "/ui/subscriptions/{id}/resume",
        Some(Need::Write),
    ),
    (
        Method::POST,
        "/ui/subscriptions/{id}/release",
        Some(Need::Write),
    ),
    (Method::GET, "/ui/receipts", Some(Need::Read)),
    (Method::GET, "/ui/receipts/{id}", Some(Need::Read)),
    (Method::GET, "/ui/receipts/{id}/body", Some(Need::Bodies)),
    (Method::GET, "/ui/dead-letters", Some(Need::Read)),
    (Method::POST, "/ui/dead-letters/replay", Some(Need::Write)),
    (Method::GET, "/ui/runs", Some(Need::Read)),
    (Method::GET, "/ui/runs/{id}", Some(Need::Read)),
    (Method::POST, "/ui/runs/{id}/signals", Some(Need::Write)),
    (Method::GET, "/ui/operations", Some(Need::Read)),
    (Method::GET, "/ui/audit", Some(Need::Read)),
];

fn handler_for(m: &Method, path: &str) -> MethodRouter<Console> {
    use pages::*;
    match (m.as_str(), path) {
        ("GET", "/ui/login") => get(login::login_page),
        ("POST", "/ui/login") => post(login::login),
        ("GET", "/ui/assets/{name}") => get(assets::asset),
        ("POST", "/ui/logout") => post(login::logout),
        ("GET", "/ui") => get(overview::page),
        ("GET", "/ui/events") => get(live::events),
        ("GET", "/ui/subscriptions") => get(subscriptions::list),
        ("GET", "/ui/subscriptions/{id}") => get(subscriptions::show),
        ("POST", "/ui/subscriptions/{id}/pause") => post(subscriptions::pause),
        ("POST", "/ui/subscriptions/{id}/resume") => post(subscriptions::resume),
        ("POST", "/ui/subscriptions/{id}/release") => post(subscriptions::release),
        ("GET", "/ui/receipts") => get(receipts::list),
        ("GET", "/ui/receipts/{id}") => get(receipts::show),
        ("GET", "/ui/receipts/{id}/body") => get(receipts::body),
        ("GET", "/ui/dead-letters") => get(dead_letters::list),
        ("POST", "/ui/dead-letters/replay") => post(dead_letters::replay),
        ("GET", "/ui/runs") => get(runs::list),
        ("GET", "/ui/runs/{id}") => get(runs::show),
        ("POST", "/ui/runs/{id}/signals") => post(runs::raise),
        ("GET", "/ui/operations") => get(operations::page),
        ("GET", "/ui/audit") => get(audit::page),
        _ => unreachable!("every route in ROUTES has a handler: {m} {path}"),
    }
}

/// The console's router (paths under `/ui`), ready to be merged with the API's.
pub fn router(api: AppState) -> Router {
    let c = Console::new(api);
    let mut r: Router<Console> = Router::new();
    for (m, path, need) in ROUTES {
        let mut mr = handler_for(m, path);
        if let Some(need) = need {
            mr = mr.route_layer(axum::middleware::from_fn_with_state(
                (c.clone(), *need),
                login::guard,
            ));
        }
        r = r.route(path, mr);
    }
    r.route(
        "/ui/",
        get(|| async { axum::response::Redirect::permanent("/ui") }),
    )
    .layer(axum::middleware::map_response(tb_api::nosniff))
    .with_state(c)
}

/// The outcome of calling an API handler from the console: its status and JSON body.
pub(crate) struct Outcome {
    pub status: StatusCode,
    pub body: Value,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.status.is_success()
    }
    /// The error envelope's `code: message`, for a failed call.
    pub fn error_text(&self) -> String {
        format!(
            "{}: {}",
            self.body["error"].as_str().unwrap_or("error"),
            self.body["message"].as_str().unwrap_or("")
        )
    }
}

/// Turns a handler's answer into an [`Outcome`].
pub(crate) async fn outcome<R: IntoResponse>(r: R) -> Outcome {
    let res = r.into_response();
    let status = res.status();
    let bytes = axum::body::to_bytes(res.into_body(), 4 << 20)
        .await
        .unwrap_or_default();
    Outcome {
        status,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

/// Runs an action through the API's handler (`method` + `route` name it as the API's route table does)
/// and records it in the audit log like the API would, with `"via": "console"`.
pub(crate) async fn act<R: IntoResponse>(
    c: &Console,
    op: &Operator,
    method: Method,
    route: &str,
    target: &str,
    answer: R,
) -> Outcome {
    let out = outcome(answer).await;
    let action = tb_api::audit::action_of(&method, route).unwrap_or("console.action");
    tb_api::audit::record(
        &c.api,
        &op.name,
        action,
        target.to_string(),
        out.status,
        &out.body,
        Some(&serde_json::json!({"via": "console"})),
    )
    .await;
    out
}

/// A read through an API handler: its JSON answer as the handler built it (no bytes in between).
pub(crate) async fn read<T, F>(f: F) -> Result<T, ApiError>
where
    F: std::future::Future<Output = Result<axum::Json<T>, ApiError>>,
{
    f.await.map(|axum::Json(v)| v)
}

/// [`read`] for a typed answer the page renders as JSON (`Value::Null` on any error: a page section
/// that could not be read shows as empty, as before).
pub(crate) async fn read_json<T, F>(f: F) -> Value
where
    T: serde::Serialize,
    F: std::future::Future<Output = Result<axum::Json<T>, ApiError>>,
{
    read(f)
        .await
        .ok()
        .and_then(|v| serde_json::to_value(v).ok())
        .unwrap_or(Value::Null)
}
