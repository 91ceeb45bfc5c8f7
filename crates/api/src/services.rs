//! `GET /v1/services`: the registered `triggers.v2` services and their liveness.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use tb_core::service::liveness;

use crate::error::ApiError;
use crate::wire::time;
use crate::AppState;

/// `GET /v1/services` -> `{services: [{name, serviceVersion, manifestHash, liveness:
/// registered|up|draining|down, registeredAt, lastHeartbeatAt?, otherBuild, replicasLive (replicas
/// `up`), replicas:
/// [{startedAt, lastHeartbeatAt, liveness, otherBuild}], actions: [name]}]}`. A service is `up` when
/// any replica is; `otherBuild` is true when a live replica heartbeats another `manifest_hash` than
/// the registered one (a replica on another build). Replicas silent for an hour are dropped.
#[utoipa::path(get, path = "/v1/services", tag = "services", responses((status = 200, description = "{services}"), (status = 401, description = "unauthenticated"), (status = 403, description = "forbidden")))]
pub async fn list(State(st): State<AppState>) -> Result<Json<Value>, ApiError> {
    let now = tb_engine::clock::now_ms();
    let services: Vec<Value> = st
        .engine
        .store
        .list_services()
        .await?
        .into_iter()
        .map(|s| {
            let actions: Vec<Value> = s.manifest["actions"]
                .as_array()
                .map(|a| a.iter().map(|x| x["name"].clone()).collect())
                .unwrap_or_default();
            let replicas: Vec<Value> = s
                .replicas
                .iter()
                .map(|r| {
                    json!({
                        "startedAt": r.started_at,
                        "lastHeartbeatAt": time(r.last_heartbeat_at),
                        "liveness": liveness(Some(r.last_heartbeat_at), r.shutting_down, now).as_str(),
                        "otherBuild": r.manifest_hash != s.manifest_hash,
                    })
                })
                .collect();
            let summary = tb_engine::orchestrator::summary_of(&s, now);
            let mut v = json!({
                "name": s.name,
                "serviceVersion": s.service_version,
                "manifestHash": s.manifest_hash,
                "liveness": summary.liveness.as_str(),
                "registeredAt": time(s.registered_at),
                "otherBuild": summary.other_build,
                "replicasLive": summary.up,
                "replicas": replicas,
                "actions": actions,
            });
            if let Some(t) = s.last_heartbeat_at {
                v["lastHeartbeatAt"] = time(t).into();
            }
            v
        })
        .collect();
    Ok(Json(json!({ "services": services })))
}

/// Query of `GET /v1/services/dead-letters`: `service` (one service's entries; default all, the
/// source DLQ included), `limit` (1..=500, default 50).
#[derive(Debug, serde::Deserialize)]
pub struct DlqParams {
    pub service: Option<String>,
    pub limit: Option<usize>,
}

/// `GET /v1/services/dead-letters?service=NAME&limit=N` -> `{items: [{subject, sequence, kind,
/// runId, flowId, idempotencyKey, retryCount, error, occurredAt}], scanned, truncated}`: the newest
/// DLQ entries the services (and the bridge's source DLQ) wrote to the stream `triggers-dlq`, newest
/// first, at most 10 000 looked at. Bodies are not returned. Errors: 400 `validation_error` for a
/// bad service name or limit; 503 `unavailable` without a NATS server or when JetStream fails.
#[utoipa::path(get, path = "/v1/services/dead-letters", tag = "services", params(("service" = Option<String>, Query, description = "one service"), ("limit" = Option<usize>, Query, description = "1..=500, default 50")), responses((status = 200, description = "{items, scanned, truncated}"), (status = 400, description = "validation_error"), (status = 503, description = "unavailable")))]
pub async fn dead_letters(
    State(st): State<AppState>,
    params: Result<axum::extract::Query<DlqParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    use tb_core::ErrorCode;
    let axum::extract::Query(p) =
        params.map_err(|e| ApiError::new(ErrorCode::ValidationError, e.body_text()))?;
    if let Some(s) = &p.service {
        tb_wire::subjects::validate_service_name(s)
            .map_err(|e| ApiError::new(ErrorCode::ValidationError, format!("service: {e}")))?;
    }
    let limit = p.limit.unwrap_or(50);
    if !(1..=500).contains(&limit) {
        return Err(ApiError::new(
            ErrorCode::ValidationError,
            "limit must be between 1 and 500",
        ));
    }
    let listing = tb_engine::service_dlq::list(&st.engine, p.service.as_deref(), limit)
        .await
        .map_err(|e| ApiError::new(ErrorCode::Unavailable, e))?;
    let items: Vec<Value> = listing
        .entries
        .iter()
        .map(|s| {
            let e = &s.entry;
            json!({
                "subject": s.subject,
                "sequence": s.sequence,
                "kind": e.kind,
                "runId": e.envelope.flow_run_id,
                "flowId": e.envelope.flow_id,
                "idempotencyKey": e.envelope.idempotency_key,
                "retryCount": e.envelope.retry_count,
                "error": e.err_msg,
                "occurredAt": e.occurred_at.format(),
            })
        })
        .collect();
    Ok(Json(json!({
        "items": items,
        "scanned": listing.scanned,
        "truncated": listing.truncated,
    })))
}
