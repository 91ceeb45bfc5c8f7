//! `/health` (liveness), `/ready` (readiness) and `/metrics` (Prometheus text).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::AppState;

/// How long `GET /ready` waits for the store's writer to commit a no-op job, in ms
/// ([`tb_engine::readiness::WRITER_TIMEOUT_MS`]).
pub const READY_WRITER_TIMEOUT_MS: u64 = tb_engine::readiness::WRITER_TIMEOUT_MS;

/// How long `GET /ready` waits for the subscription read, in ms
/// ([`tb_engine::readiness::READ_TIMEOUT_MS`]).
pub const READY_READ_TIMEOUT_MS: u64 = tb_engine::readiness::READ_TIMEOUT_MS;

/// `GET /health` -> `{"status":"ok"}`: pure liveness (the process answers HTTP); it never touches the
/// store. Use `/ready` to know whether writes are being accepted.
#[utoipa::path(get, path = "/health", tag = "operations", responses((status = 200, description = "{status: ok}")))]
pub async fn health() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
}

/// Schedules with a due tick not fired within `tb_engine::scheduler::LATE_AFTER_MS`, as the scheduler's last pass saw them:
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

/// Queue subscriptions this process does not consume right now, with why: `{"degraded":
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
/// The store checks come from [`tb_engine::Engine::readiness`]: one probe serves every caller for
/// [`tb_engine::readiness::PROBE_INTERVAL`] (1 s), so the store sees at most one probe write a second
/// however often `/ready` is asked; `shutdown` and the warnings are read on every call. A subscription
/// registered through the API is listed as `api`, never by its id (the secret part of its ingest URL;
/// [`tb_engine::Catalog::public_label`]); `unsealable` says `{"api": "<n> registered subscription(s):
/// <reason>"}`.
///
/// `warnings.auditLog` is the audit log's state ([`crate::audit::ready_status`]): `broken` when rows
/// were written into it by hand (a warning, never a 503), `unkeyed` without an audit key.
#[utoipa::path(get, path = "/ready", tag = "operations", responses(
    (status = 200, description = "{status: ready, checks, warnings}"),
    (status = 503, description = "{status: unavailable, checks, warnings}")))]
pub async fn ready(State(st): State<AppState>) -> Response {
    // The store probe is shared by every caller for its interval (one no-op write a second at most).
    let probe = st.engine.readiness().await;
    let writer = &probe.writer;
    let subs = &probe.waiting;
    let closing = st.engine.is_closing();
    let catalog = st.engine.catalog();
    let mut waiting: BTreeMap<&'static str, Vec<String>> =
        [("dead-lettered", vec![]), ("failed", vec![])].into();
    if let Ok(subs) = subs {
        for (id, state) in subs {
            // A registered subscription's id is the secret part of its ingest URL: `api` here.
            let label = catalog.public_label(id).to_string();
            let list = waiting.entry(state.as_str()).or_default();
            if !list.contains(&label) {
                list.push(label);
            }
        }
    }
    let ok = writer.is_ok() && subs.is_ok() && !closing;
    let facts = st.engine.store.facts();
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
        "warnings": {"subscriptions": waiting, "schedules": late_schedules(&st), "queues": degraded_queues(&st), "secrets": {"unsealable": unsealable(&st)}, "auditLog": crate::audit::ready_status(&st).await},
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

/// Registered subscriptions this replica cannot unseal (only registrations have sealed secrets): their
/// ids are the secret parts of their ingest URLs, so `/ready` (public) says how many and the first
/// reason, under `api`: `{"api": "<n> registered subscription(s): <reason>"}`, `{}` when none. The ids
/// are in the log and behind a key (`GET /v1/trigger-subscriptions`).
fn unsealable(st: &AppState) -> Value {
    let all = st.engine.unsealable();
    let mut out = serde_json::Map::new();
    if let Some(reason) = all.values().next() {
        out.insert(
            tb_engine::catalog::REGISTERED_LABEL.into(),
            format!("{} registered subscription(s): {reason}", all.len()).into(),
        );
    }
    Value::Object(out)
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
