//! Runs started through the API (`POST /v1/runs`, OpenWOP §12), an edge of [`crate::accept`]: the
//! request becomes a receipt (source `api`) of the pseudo-subscription [`crate::API_SOURCE`] with one
//! `start_run` delivery of kind `api_run`, so the run is started,
//! retried and recorded by the same delivery engine as trigger runs. The run id is known at once and
//! reads as `pending` until the delivery starts it.

use bytes::Bytes;
use serde_json::Value;
use tb_core::delivery::{DeliveryKind, DeliveryState};
use tb_core::ids::{new_id, run_id_for_delivery, IdKind};
use tb_core::receipt::ReceiptSource;
use tb_core::{ErrorCode, TbError};
use tb_store::NewDelivery;

use crate::accept::{accept, Inbound, Routing};
use crate::{clock, Engine, API_SOURCE};

/// Starts a run of `workflow_id` with `inputs`. The receipt keeps no request body: its content is the
/// delivery's workflow and inputs. Returns the run id.
/// Errors: `not_found` (no such workflow), `unavailable` (store).
pub async fn start(engine: &Engine, workflow_id: &str, inputs: Value) -> Result<String, TbError> {
    start_traced(engine, workflow_id, inputs, None).await
}

/// [`start`] for a request that carried a W3C `traceparent`: the run's `receipt` span is its child
/// ([`crate::trace`]). Errors: those of [`start`].
pub async fn start_traced(
    engine: &Engine,
    workflow_id: &str,
    inputs: Value,
    trace_parent: Option<tb_core::trace::TraceContext>,
) -> Result<String, TbError> {
    if engine.catalog().workflow(workflow_id).is_none() {
        return Err(TbError::new(ErrorCode::NotFound, "no such workflow"));
    }
    let delivery_id = new_id(IdKind::Delivery);
    let run_id = run_id_for_delivery(&delivery_id);
    let inbound = Inbound {
        source: ReceiptSource::Api,
        subscription: API_SOURCE.into(),
        counter: None,
        provider_event_id: None,
        event_type: "run.requested".into(),
        // No body and no normalized fields of its own: the request is the delivery's workflow and
        // inputs (an idle session's bytes).
        normalized: serde_json::json!({}),
        body: Bytes::new(),
        content_type: None,
        received_at: clock::now_ms(),
        dedup: None,
        rate_limit_per_min: None,
        routing: Routing::Fixed(vec![NewDelivery {
            id: delivery_id,
            kind: DeliveryKind::ApiRun,
            binding_id: API_SOURCE.into(),
            action: "start_run".into(),
            workflow_id: Some(workflow_id.into()),
            run_id: Some(run_id.clone()),
            inputs,
            params: None,
            state: DeliveryState::Pending,
            dead_letter_reason: None,
        }]),
        capability: None,
        target_run: None,
        trace_parent,
    };
    accept(engine, inbound).await?;
    Ok(run_id)
}

/// Ends a run with a terminal `status` (cancel, or a worker's `POST /v1/runs/{id}/result`) and wakes
/// every long-poll on it (waits, `turns:claim`): the store resolves the run's armed wait with winner
/// `stop` in the same transaction, and [`Engine::session_changed`] makes the sleepers re-read at once
/// instead of at their timeout. Errors: the store's (`NotFound` when the run has
/// not started, `Conflict` when it already ended).
pub async fn finish(
    engine: &Engine,
    run_id: &str,
    status: tb_core::run::RunStatus,
    output: Option<Value>,
) -> Result<tb_store::RunRecord, tb_store::StoreError> {
    let run = engine
        .store
        .finish_run(run_id, status, output, clock::now_ms())
        .await?;
    engine.session_changed();
    Ok(run)
}
