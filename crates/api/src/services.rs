//! `GET /v1/services` (issue #12): the registered `triggers.v2` services and their liveness.

use axum::extract::State;
use axum::Json;
use serde_json::{json, Value};
use tb_core::service::liveness;

use crate::error::ApiError;
use crate::wire::time;
use crate::AppState;

/// `GET /v1/services` -> `{services: [{name, serviceVersion, manifestHash, liveness:
/// registered|up|draining|down, registeredAt, lastHeartbeatAt?, otherBuild, actions: [name]}]}`.
/// `otherBuild` is true when the last heartbeat carried another `manifest_hash` than the registered
/// one (a replica on another build).
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
            let mut v = json!({
                "name": s.name,
                "serviceVersion": s.service_version,
                "manifestHash": s.manifest_hash,
                "liveness": liveness(s.last_heartbeat_at, s.shutting_down, now).as_str(),
                "registeredAt": time(s.registered_at),
                "otherBuild": s.heartbeat_hash.as_deref().is_some_and(|h| h != s.manifest_hash),
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
