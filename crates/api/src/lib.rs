//! HTTP surface (DESIGN §8): ingest endpoints, runs and their events, receipts, deliveries,
//! subscriptions, `/health` and `/metrics`. Errors use the flat envelope `{error, message, details?}`.
//! No response ever echoes inbound content.

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
pub mod registration;
pub mod runs;
pub mod sessions;
pub mod sse;
pub mod timeline;
pub mod webhooks;
pub mod wire;

use std::sync::Arc;

use axum::routing::{get, post};
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

/// The whole API router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/health", get(ops::health))
        .route("/.well-known/openwop", get(discovery::discovery))
        .route("/v1/openapi.json", get(openapi::openapi))
        .route("/v1/workflows/{id}", get(runs::get_workflow))
        .route("/v1/webhooks", post(webhooks::register))
        .route("/v1/webhooks/{id}", axum::routing::delete(webhooks::delete))
        .route(
            "/v1/trigger-subscriptions/{id}/dead-letters",
            get(dead_letters::list),
        )
        .route("/v1/runs/{id}/cancel", post(runs::cancel))
        .route("/v1/runs/{id}/events", get(sse::events))
        .route("/v1/runs/{id}/ancestry", get(runs::ancestry))
        .route("/metrics", get(ops::metrics))
        .route(
            "/v1/trigger-subscriptions",
            get(inspect::list_subscriptions).post(registration::register),
        )
        .route(
            "/v1/trigger-subscriptions/{id}",
            get(inspect::get_subscription),
        )
        .route(
            "/v1/trigger-subscriptions/{id}/pause",
            post(inspect::pause_subscription),
        )
        .route(
            "/v1/trigger-subscriptions/{id}/resume",
            post(inspect::resume_subscription),
        )
        .route(
            "/v1/trigger-subscriptions/{id}/ingest",
            post(ingest::ingest),
        )
        .route("/v1/receipts", get(inspect::list_receipts))
        .route("/v1/receipts/{id}", get(inspect::get_receipt))
        .route("/v1/deliveries", get(inspect::list_deliveries))
        .route("/v1/deliveries/{id}", get(inspect::get_delivery))
        .route("/v1/runs", get(runs::list_runs).post(runs::create))
        .route("/v1/runs/{id}", get(runs::get_run).post(runs::fork))
        .route("/v1/runs/{id}/events/poll", get(runs::poll_events))
        .route("/v1/runs/{id}/result", post(runs::post_result))
        .route("/v1/deliveries/{id}/replay", post(inspect::replay_delivery))
        .route(
            "/v1/runs/{id}/signals",
            get(sessions::list_signals).post(sessions::raise),
        )
        .route(
            "/v1/runs/{id}/signal-payloads/{ref}",
            get(sessions::signal_payload),
        )
        .route(
            "/v1/runs/{id}/waits",
            get(sessions::list_waits).post(sessions::create_wait),
        )
        .route(
            "/v1/runs/{id}/waits/{wait}",
            get(sessions::get_wait).post(sessions::wait_action),
        )
        .route("/v1/runs/{id}/prompts", post(sessions::prompt))
        .route("/v1/runs/{id}/turns", get(sessions::list_turns))
        .route("/v1/runs/{id}/turns:claim", post(sessions::claim))
        .route("/v1/runs/{id}/turns/{turn}/ack", post(sessions::ack))
        .route(
            "/v1/capabilities",
            get(sessions::list_capabilities).post(sessions::mint),
        )
        .route("/v1/capabilities/{id}/revoke", post(sessions::revoke))
        .route("/v1/hooks/{token}", post(sessions::hook))
        .route("/v1/bindings", get(bindings::list))
        .route("/v1/bindings/{id}/revoke", post(bindings::revoke))
        .route("/v1/bindings/{id}/restore", post(bindings::restore))
        .fallback(error::not_found)
        .method_not_allowed_fallback(error::method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            idempotency::layer,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require,
        ))
        .layer(axum::middleware::from_fn(error::envelope_errors))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_API_BODY))
        .with_state(state)
}
