//! Bindings (DESIGN §2): the operator's routing rules, listed with their state, and revoked or restored
//! at once. A revoked binding matches nothing from the next request on, and its open deliveries are
//! refused by the worker (`binding_revoked`; receipt `disabled`).

use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde_json::{json, Value};

use crate::auth::Principal;
use crate::error::ApiError;
use crate::AppState;

/// `GET /v1/bindings` -> `{bindings: [{bindingId, subscriptionId, eventTypes, action, workflowId?, filter
/// (field -> allowed values), inputs (input -> field), actionConfig (the action with its parameters),
/// state: active|revoked}]}`: the binding policy, read-only.
#[utoipa::path(get, path = "/v1/bindings", tag = "bindings", responses((status = 200, description = "{bindings}")))]
pub async fn list(State(st): State<AppState>) -> Json<Value> {
    let catalog = st.engine.catalog();
    let bindings: Vec<Value> = catalog
        .all_bindings()
        .into_iter()
        .map(|(b, revoked)| {
            json!({
                "bindingId": b.id,
                "subscriptionId": b.subscription,
                "eventTypes": b.event_types,
                "action": b.action.name(),
                "workflowId": b.action.workflow(),
                "filter": b.filter,
                "inputs": b.inputs,
                "actionConfig": serde_json::to_value(&b.action).unwrap_or(Value::Null),
                "state": if revoked { "revoked" } else { "active" },
            })
        })
        .collect();
    Json(json!({ "bindings": bindings }))
}

async fn set(
    st: AppState,
    id: String,
    revoke: bool,
    who: Option<Principal>,
) -> Result<Json<Value>, ApiError> {
    let changed = st
        .engine
        .set_binding_revoked(&id, revoke, who.map(|p| p.0))
        .await?;
    Ok(Json(json!({
        "bindingId": id,
        "state": if revoke { "revoked" } else { "active" },
        "changed": changed,
    })))
}

/// Revokes a binding at once (idempotent). Errors: 404.
#[utoipa::path(post, path = "/v1/bindings/{id}/revoke", tag = "bindings", params(("id" = String, Path, description = "Binding id")), responses((status = 200, description = "{bindingId, state: revoked, changed}"), (status = 404, description = "not_found")))]
pub async fn revoke(
    State(st): State<AppState>,
    Path(id): Path<String>,
    who: Option<Extension<Principal>>,
) -> Result<Json<Value>, ApiError> {
    set(st, id, true, who.map(|Extension(p)| p)).await
}

/// Restores a revoked binding (idempotent). Errors: 404.
#[utoipa::path(post, path = "/v1/bindings/{id}/restore", tag = "bindings", params(("id" = String, Path, description = "Binding id")), responses((status = 200, description = "{bindingId, state: active, changed}"), (status = 404, description = "not_found")))]
pub async fn restore(
    State(st): State<AppState>,
    Path(id): Path<String>,
    who: Option<Extension<Principal>>,
) -> Result<Json<Value>, ApiError> {
    set(st, id, false, who.map(|Extension(p)| p)).await
}
