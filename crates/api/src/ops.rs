//! `/health` (liveness) and `/metrics` (Prometheus text).

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::json;

use crate::AppState;

/// `GET /health` -> `{"status":"ok"}`.
#[utoipa::path(get, path = "/health", tag = "operations", responses((status = 200, description = "{status: ok}")))]
pub async fn health() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}

/// `GET /metrics`: Prometheus exposition. Refreshes the queue-depth gauges from the store first.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text")))]
pub async fn metrics(State(st): State<AppState>) -> impl IntoResponse {
    if let Ok(d) = st.engine.store.queue_depth().await {
        metrics::gauge!("tb_queue_depth", "state" => "pending").set(d.pending as f64);
        metrics::gauge!("tb_queue_depth", "state" => "retrying").set(d.retrying as f64);
        metrics::gauge!("tb_queue_depth", "state" => "dead-lettered").set(d.dead_lettered as f64);
    }
    let body = st.metrics.as_ref().map(|h| h.render()).unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
}
