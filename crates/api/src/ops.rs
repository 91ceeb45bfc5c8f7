//! `/health` (liveness), `/ready` (readiness) and `/metrics` (Prometheus text).

use std::collections::BTreeMap;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::AppState;

/// How long `GET /ready` waits for the store's writer to commit a no-op job, in ms.
pub const READY_WRITER_TIMEOUT_MS: u64 = 1_000;

/// How long `GET /ready` waits for the subscription read, in ms.
pub const READY_READ_TIMEOUT_MS: u64 = 1_000;

/// `GET /health` -> `{"status":"ok"}`: pure liveness (the process answers HTTP); it never touches the
/// store. Use `/ready` to know whether writes are being accepted.
#[utoipa::path(get, path = "/health", tag = "operations", responses((status = 200, description = "{status: ok}")))]
pub async fn health() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}

/// Schedules with a due tick not fired within `tb_engine::scheduler::LATE_AFTER_MS` (issue #11), as the scheduler's last pass saw them:
/// `{"late": [{"subscription", "lagMs"}]}`. A warning, never a 503: the process still serves.
fn late_schedules(st: &AppState) -> serde_json::Value {
    let late = st
        .engine
        .schedules_late
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|l| json!({"subscription": l.subscription, "lagMs": l.lag_ms}))
        .collect::<Vec<_>>();
    json!({ "late": late })
}

/// Queue subscriptions this process does not consume right now, with why (issue #11): `{"degraded":
/// {"<id>": "<reason>"}}`. A warning, never a 503.
fn degraded_queues(st: &AppState) -> serde_json::Value {
    let m = st
        .engine
        .queues_degraded
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    json!({ "degraded": m })
}

/// `GET /ready` (public): whether this process can take work now.
///
/// 200 `{"status":"ready","checks":{"writer":"ok","reads":"ok","shutdown":"no"},"store":{"backend":
/// "postgresql","reachable":true,"connections":8},"warnings":{"subscriptions":{"dead-lettered":[ids],
/// "failed":[ids]},"schedules":{"late":[{"subscription","lagMs"}]},"queues":{"degraded":{id: reason}},"secrets":{"unsealable":{id: reason}}}}` when the store's writer committed a no-op job within
/// [`READY_WRITER_TIMEOUT_MS`] and the subscriptions could be read within [`READY_READ_TIMEOUT_MS`].
/// Otherwise 503 with `Retry-After: 1` and `"status":"unavailable"`; each failed check holds its reason
/// (writer queue full, writer stopped or dead, timeout, shutting down). Subscriptions that wait for an
/// operator (`dead-lettered`, `failed`) are `warnings` only and never make it 503: the process still
/// ingests (their receipts are committed), and a load balancer must not take it out of rotation for
/// what only an operator can fix. `store` names the backend (`sqlite`, `postgresql`), whether it
/// answered (`reachable`: the writer check passed) and, on PostgreSQL, the pool's live connections
/// (`connections`; absent on SQLite), from [`tb_store::Store::facts`].
///
/// `warnings.auditLog` is the audit log's state ([`crate::audit::ready_status`]): `broken` when rows
/// were written into it by hand (a warning, never a 503), `unkeyed` without an audit key.
#[utoipa::path(get, path = "/ready", tag = "operations", responses(
    (status = 200, description = "{status: ready, checks, warnings}"),
    (status = 503, description = "{status: unavailable, checks, warnings}")))]
pub async fn ready(State(st): State<AppState>) -> Response {
    let store = &st.engine.store;
    let writer = match tokio::time::timeout(
        Duration::from_millis(READY_WRITER_TIMEOUT_MS),
        store.ping_writer(),
    )
    .await
    {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "the writer did not commit a no-op within {READY_WRITER_TIMEOUT_MS} ms"
        )),
    };
    let subs = match tokio::time::timeout(
        Duration::from_millis(READY_READ_TIMEOUT_MS),
        store.list_subscriptions(),
    )
    .await
    {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!(
            "reading subscriptions took over {READY_READ_TIMEOUT_MS} ms"
        )),
    };
    let closing = st.engine.is_closing();
    let mut waiting: BTreeMap<&'static str, Vec<String>> =
        [("dead-lettered", vec![]), ("failed", vec![])].into();
    if let Ok(subs) = &subs {
        for s in subs.iter().filter(|s| s.state.needs_operator()) {
            waiting
                .entry(s.state.as_str())
                .or_default()
                .push(s.id.clone());
        }
    }
    let ok = writer.is_ok() && subs.is_ok() && !closing;
    let facts = store.facts();
    let mut store_facts = json!({"backend": facts.backend, "reachable": writer.is_ok()});
    if let Some(n) = facts.connections {
        store_facts["connections"] = n.into();
    }
    let body = json!({
        "status": if ok { "ready" } else { "unavailable" },
        "checks": {
            "writer": check(writer.as_ref().err()),
            "reads": check(subs.as_ref().err()),
            "shutdown": if closing { "shutting down" } else { "no" },
        },
        "store": store_facts,
        "warnings": {"subscriptions": waiting, "schedules": late_schedules(&st), "queues": degraded_queues(&st), "secrets": {"unsealable": st.engine.unsealable()}, "auditLog": crate::audit::ready_status(&st).await},
    });
    if ok {
        (StatusCode::OK, Json(body)).into_response()
    } else {
        tracing::warn!(checks = %body["checks"], "not ready");
        (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            Json(body),
        )
            .into_response()
    }
}

/// A check's value in `/ready`: `"ok"`, or the reason it failed.
fn check(failure: Option<&String>) -> Value {
    failure.map_or_else(|| Value::from("ok"), |e| Value::from(e.as_str()))
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
