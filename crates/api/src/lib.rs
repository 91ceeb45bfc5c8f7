//! HTTP surface (DESIGN §8): ingest endpoints, runs and their events, receipts, deliveries,
//! subscriptions, `/health`, `/ready` and `/metrics`. Errors use the flat envelope `{error, message, details?}`.
//! No response ever echoes inbound content.

pub mod activity;
pub mod audit;
pub mod auth;
pub mod bindings;
pub mod body;
pub mod dead_letters;
pub mod discovery;
pub mod error;
pub mod idempotency;
pub mod ingest;
pub mod inspect;
pub mod openapi;
pub mod ops;
pub mod quarantine;
pub mod registration;
pub mod replay;
pub mod routes;
pub mod runs;
pub mod schedules;
pub mod services;
pub mod sessions;
pub mod sse;
pub mod timeline;
pub mod webhooks;
pub mod wire;

use std::sync::Arc;

use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use tb_engine::Engine;

/// Shared state of every handler.
#[derive(Clone)]
pub struct AppState {
    pub engine: Arc<Engine>,
    /// Renders `/metrics`; `None` when no recorder is installed (tests).
    pub metrics: Option<PrometheusHandle>,
    /// Host facts for discovery and the OpenWOP endpoints.
    pub host: discovery::HostInfo,
    /// API keys; empty = open API (development on loopback).
    pub keys: auth::ApiKeys,
    /// Where registered subscriptions' secrets live; `None` = registration not served (501).
    pub secrets: Option<tb_engine::registration::SecretStore>,
}

/// Largest JSON body of a management request, in bytes (ingest bodies have their own per-subscription
/// limit and are read by the ingest handler itself).
pub const MAX_API_BODY: usize = 1 << 20;

/// Scope of the read endpoints of runs (OpenWOP §12).
const READ: &str = "runs:read";
/// Scope of the endpoints that start or drive runs.
const CREATE: &str = "runs:create";
/// Scope of the management endpoints (subscriptions, receipts, deliveries, bindings, capabilities).
const MANAGE: &str = "webhooks:manage";

/// Every route with its access (public or scope), in one table: see [`routes::Routes`]. A new route
/// is one line here.
pub fn routes(state: AppState) -> routes::Routes {
    use axum::http::Method;
    const GET: Method = Method::GET;
    const POST: Method = Method::POST;
    const DELETE: Method = Method::DELETE;
    routes::Routes::new(state)
        // Public: discovery, health, metrics; ingest (the signature is the credential) and capability
        // URLs (the token is).
        .public(GET, "/health", ops::health)
        .public(GET, "/ready", ops::ready)
        .public(GET, "/metrics", ops::metrics)
        .public(GET, "/.well-known/openwop", discovery::discovery)
        .public(GET, "/v1/openapi.json", openapi::openapi)
        .public(
            POST,
            "/v1/trigger-subscriptions/{id}/ingest",
            ingest::ingest,
        )
        .public(POST, "/v1/hooks/{token}", sessions::hook)
        // What the caller's own key may do (any known key).
        .keyed("/v1/auth/key", auth::key_info)
        // Workflows and runs.
        .scoped(
            GET,
            "/v1/workflows/{id}",
            "manifest:read",
            runs::get_workflow,
        )
        .scoped(GET, "/v1/runs", READ, runs::list_runs)
        .scoped(POST, "/v1/runs", CREATE, runs::create)
        .scoped(GET, "/v1/runs/{id}", READ, runs::get_run)
        .scoped(POST, "/v1/runs/{id}", CREATE, runs::fork)
        .scoped(POST, "/v1/runs/{id}/cancel", "runs:cancel", runs::cancel)
        .scoped(GET, "/v1/runs/{id}/events", READ, sse::events)
        .scoped(GET, "/v1/runs/{id}/events/poll", READ, runs::poll_events)
        .scoped(GET, "/v1/runs/{id}/ancestry", READ, runs::ancestry)
        // Only the run's executor: its result token, or a key holding `runs:result`.
        .executor(POST, "/v1/runs/{id}/result", runs::post_result)
        // Sessions.
        .scoped(GET, "/v1/runs/{id}/signals", READ, sessions::list_signals)
        .scoped(POST, "/v1/runs/{id}/signals", CREATE, sessions::raise)
        .scoped(
            GET,
            "/v1/runs/{id}/signal-payloads/{ref}",
            READ,
            sessions::signal_payload,
        )
        .scoped(GET, "/v1/runs/{id}/waits", READ, sessions::list_waits)
        .scoped(POST, "/v1/runs/{id}/waits", CREATE, sessions::create_wait)
        .scoped(GET, "/v1/runs/{id}/waits/{wait}", READ, sessions::get_wait)
        .scoped(
            POST,
            "/v1/runs/{id}/waits/{wait}",
            CREATE,
            sessions::wait_action,
        )
        .scoped(POST, "/v1/runs/{id}/prompts", CREATE, sessions::prompt)
        .scoped(GET, "/v1/runs/{id}/turns", READ, sessions::list_turns)
        .scoped(POST, "/v1/runs/{id}/turns:claim", CREATE, sessions::claim)
        .scoped(
            POST,
            "/v1/runs/{id}/turns/{turn}/ack",
            CREATE,
            sessions::ack,
        )
        // Management.
        .scoped(POST, "/v1/webhooks", MANAGE, webhooks::register)
        .scoped(DELETE, "/v1/webhooks/{id}", MANAGE, webhooks::delete)
        .scoped(
            GET,
            "/v1/trigger-subscriptions",
            MANAGE,
            inspect::list_subscriptions,
        )
        .scoped(
            POST,
            "/v1/trigger-subscriptions",
            MANAGE,
            registration::register,
        )
        .scoped(
            GET,
            "/v1/trigger-subscriptions/{id}",
            MANAGE,
            inspect::get_subscription,
        )
        .scoped(
            POST,
            "/v1/trigger-subscriptions/{id}/pause",
            MANAGE,
            inspect::pause_subscription,
        )
        .scoped(
            POST,
            "/v1/trigger-subscriptions/{id}/resume",
            MANAGE,
            inspect::resume_subscription,
        )
        .scoped(
            POST,
            "/v1/trigger-subscriptions/{id}/quarantine",
            MANAGE,
            quarantine::quarantine,
        )
        .scoped(
            POST,
            "/v1/trigger-subscriptions/{id}/release",
            MANAGE,
            quarantine::release,
        )
        .scoped(
            POST,
            "/v1/trigger-subscriptions/{id}/rotate-secret",
            MANAGE,
            registration::rotate,
        )
        .scoped(
            GET,
            "/v1/trigger-subscriptions/{id}/ingress-counts",
            MANAGE,
            quarantine::counts,
        )
        .scoped(GET, "/v1/quarantines", MANAGE, quarantine::list)
        .scoped(
            GET,
            "/v1/trigger-subscriptions/{id}/dead-letters",
            MANAGE,
            dead_letters::list,
        )
        .scoped(
            POST,
            "/v1/trigger-subscriptions/{id}/dead-letters:replay",
            MANAGE,
            replay::replay_all,
        )
        .scoped(GET, "/v1/receipts", MANAGE, inspect::list_receipts)
        .scoped(GET, "/v1/receipts/{id}", MANAGE, inspect::get_receipt)
        .scoped(
            GET,
            "/v1/receipts/{id}/redacted-body",
            "operator:bodies",
            inspect::redacted_body,
        )
        .scoped(GET, "/v1/deliveries", MANAGE, inspect::list_deliveries)
        .scoped(GET, "/v1/deliveries/{id}", MANAGE, inspect::get_delivery)
        .scoped(
            POST,
            "/v1/deliveries/{id}/replay",
            MANAGE,
            inspect::replay_delivery,
        )
        .scoped(GET, "/v1/capabilities", MANAGE, sessions::list_capabilities)
        .scoped(POST, "/v1/capabilities", MANAGE, sessions::mint)
        .scoped(
            POST,
            "/v1/capabilities/{id}/revoke",
            MANAGE,
            sessions::revoke,
        )
        .scoped(GET, "/v1/services", MANAGE, services::list)
        .scoped(
            GET,
            "/v1/services/dead-letters",
            MANAGE,
            services::dead_letters,
        )
        .scoped(GET, "/v1/schedules", MANAGE, schedules::list)
        .scoped(POST, "/v1/schedules", MANAGE, schedules::create)
        .scoped(GET, "/v1/schedules/{id}", MANAGE, schedules::get)
        .scoped(DELETE, "/v1/schedules/{id}", MANAGE, schedules::delete)
        .scoped(GET, "/v1/schedules/{id}/next", MANAGE, schedules::next)
        .scoped(POST, "/v1/schedules/{id}/pause", MANAGE, schedules::pause)
        .scoped(POST, "/v1/schedules/{id}/resume", MANAGE, schedules::resume)
        .scoped(GET, "/v1/activity", MANAGE, activity::activity)
        .scoped(GET, "/v1/audit", "audit:read", audit::list)
        .scoped(GET, "/v1/audit/verify", "audit:read", audit::verify)
        .scoped(GET, "/v1/bindings", MANAGE, bindings::list)
        .scoped(POST, "/v1/bindings/{id}/revoke", MANAGE, bindings::revoke)
        .scoped(POST, "/v1/bindings/{id}/restore", MANAGE, bindings::restore)
}

/// The whole API router: [`routes()`] (each route guarded by its own access layer) plus the 404/405
/// fallbacks, the error envelope and the body limit.
pub fn router(state: AppState) -> Router {
    routes(state.clone())
        .into_router()
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(axum::middleware::from_fn(error::envelope_errors))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_API_BODY))
        .layer(axum::middleware::map_response(nosniff))
        .with_state(state)
}

/// Adds `X-Content-Type-Options: nosniff` to a response: no browser may read an answer as another
/// type than its `Content-Type` (a JSON error echoing a path as HTML, an SSE stream as script). Layered
/// on the API router, the console's and, in `serve`, around everything the server answers.
pub async fn nosniff(mut res: axum::response::Response) -> axum::response::Response {
    res.headers_mut().insert(
        axum::http::header::X_CONTENT_TYPE_OPTIONS,
        axum::http::HeaderValue::from_static("nosniff"),
    );
    res
}
