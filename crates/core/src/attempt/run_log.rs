//! The first events of a run an attempt starts (spec notes §15; RFC 0053 for dead-lettered API runs).

use serde_json::{json, Value};

use super::{DeliveryRow, RunCreate, RunEvent, RunStart};
use crate::events::{self, RunStarted};
use crate::ids::{new_id, IdKind};

/// The log a started run begins with, and the run row's `next_sequence` after it:
///
/// * a run that started: `run.started {workflowId, inputs}` (seq 0, causation = the attempt's event
///   `causation`), the delivered `trigger.delivery.attempted` under that same event id (seq 1, payload
///   `attempted`), and, when its status is already terminal, its terminal event `{}` (seq 2);
///   `next_sequence` 3 or 2;
/// * a dead-lettered API run (`dead_letter = (reason, attempts)`): `run.dead_lettered {runId, reason,
///   attempts}` (seq 0, causation as above) then `run.failed {error: {code: reason, message}}` (seq 1);
///   `next_sequence` 2.
///
/// Other event ids are fresh `evt_<32 hex>`.
pub fn first_events(run: &RunStart, causation: &str, attempted: &Value) -> (Vec<RunEvent>, u64) {
    let ev =
        |sequence, event_id: String, event_type, payload, causation_id: Option<&str>| RunEvent {
            sequence,
            event_id,
            event_type,
            payload,
            causation_id: causation_id.map(str::to_string),
        };
    if let Some((reason, attempts)) = &run.dead_letter {
        let dl = json!({"runId": run.id, "reason": reason, "attempts": attempts});
        let failed = json!({"error": {"code": reason, "message": "the run could not be started; its retries are exhausted"}});
        let events = vec![
            ev(
                0,
                new_id(IdKind::Event),
                "run.dead_lettered",
                dl,
                Some(causation),
            ),
            ev(1, new_id(IdKind::Event), "run.failed", failed, None),
        ];
        return (events, 2);
    }
    let started = serde_json::to_value(RunStarted {
        workflow_id: run.workflow_id.clone(),
        inputs: run.inputs.clone(),
    })
    .expect("serializable");
    let mut events = vec![
        ev(
            0,
            new_id(IdKind::Event),
            events::RUN_STARTED,
            started,
            Some(causation),
        ),
        ev(
            1,
            causation.to_string(),
            events::DELIVERY_ATTEMPTED,
            attempted.clone(),
            None,
        ),
    ];
    if let Some(ty) = run.status.terminal_event() {
        events.push(ev(2, new_id(IdKind::Event), ty, json!({}), None));
    }
    let next = events.len() as u64;
    (events, next)
}

/// The run row and log for `run`, started by delivery `d`'s attempt `causation` at `now` (Unix ms).
pub(super) fn create(
    run: &RunStart,
    d: &DeliveryRow,
    causation: &str,
    attempted: &Value,
    now: i64,
) -> RunCreate {
    let (events, next_sequence) = first_events(run, causation, attempted);
    RunCreate {
        id: run.id.clone(),
        workflow_id: run.workflow_id.clone(),
        status: run.status,
        inputs: run.inputs.clone(),
        delivery_id: d.id.clone(),
        receipt_id: d.receipt_id.clone(),
        subscription_id: d.subscription_id.clone(),
        causation_id: causation.to_string(),
        next_sequence,
        created_at: now,
        events,
        start_session: run.session && run.dead_letter.is_none(),
    }
}
