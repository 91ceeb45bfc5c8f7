//! Content-free event payloads (DESIGN §5.6; OpenWOP trigger-bridge §3, run-event envelope §4).
//!
//! The payload structs carry exactly the spec's fields; nothing here may ever hold a body, header,
//! secret, token or credential.

use serde::{Deserialize, Serialize};

use crate::delivery::AttemptOutcome;
use crate::subscription::{StateChangeReason, SubscriptionState};

/// `trigger.delivery.attempted` event type.
pub const DELIVERY_ATTEMPTED: &str = "trigger.delivery.attempted";
/// `trigger.subscription.state.changed` event type.
pub const SUBSCRIPTION_STATE_CHANGED: &str = "trigger.subscription.state.changed";
/// `run.started` event type.
pub const RUN_STARTED: &str = "run.started";

/// Payload of `trigger.delivery.attempted`: exactly `subscriptionId, dedupKey, attempt, outcome, runId?`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeliveryAttempted {
    pub subscription_id: String,
    pub dedup_key: String,
    /// 1-based attempt number.
    pub attempt: u32,
    pub outcome: AttemptOutcome,
    /// Present only when `outcome` is `delivered` and the action started or targeted a run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
}

/// Payload of `trigger.subscription.state.changed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubscriptionStateChanged {
    pub subscription_id: String,
    /// `webhook`, `schedule`, `queue`, `form`.
    pub source: String,
    pub from_state: SubscriptionState,
    pub to_state: SubscriptionState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<StateChangeReason>,
}

impl SubscriptionStateChanged {
    /// The payload announcing transition `t` of subscription `subscription_id` (of kind `source`).
    pub fn of(
        subscription_id: &str,
        source: crate::subscription::Source,
        t: &crate::subscription::Transition,
    ) -> Self {
        SubscriptionStateChanged {
            subscription_id: subscription_id.to_string(),
            source: source.as_str().to_string(),
            from_state: t.from,
            to_state: t.to,
            reason: t.reason,
        }
    }
}

/// Payload of `run.started` (open object; `workflowId` required).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunStarted {
    pub workflow_id: String,
    /// Inputs mapped from allowlisted normalized fields only.
    pub inputs: serde_json::Value,
}

/// `run.dead_lettered` event type (RFC 0053).
pub const RUN_DEAD_LETTERED: &str = "run.dead_lettered";

/// The payload a run event is stored with: without the fields its run row holds, which
/// [`shown_payload`] puts back when the event is read, so every reader sees the payload it was built
/// with. Dropped: `runId` of `trigger.delivery.attempted` and `run.dead_lettered` when it is this run
/// (`run_events.run_id`); `workflowId` and `inputs` of `run.started`, which `attempt::first_events`
/// builds from the run's own `workflow_id` and `inputs` columns. Other events are stored as built.
pub fn stored_payload(
    event_type: &str,
    run_id: &str,
    payload: &serde_json::Value,
) -> serde_json::Value {
    let mut p = payload.clone();
    if let serde_json::Value::Object(m) = &mut p {
        match event_type {
            DELIVERY_ATTEMPTED | RUN_DEAD_LETTERED
                if m.get("runId").and_then(|v| v.as_str()) == Some(run_id) =>
            {
                m.remove("runId");
            }
            RUN_STARTED if m.contains_key("workflowId") && m.contains_key("inputs") => {
                m.remove("workflowId");
                m.remove("inputs");
            }
            _ => {}
        }
    }
    p
}

/// Whether [`shown_payload`] needs the run row's `(workflow_id, inputs)` for this stored payload.
pub fn needs_run_row(event_type: &str, stored: &serde_json::Value) -> bool {
    event_type == RUN_STARTED && stored.get("workflowId").is_none()
}

/// The payload of a stored run event as it was built (the inverse of [`stored_payload`]): `runId` put
/// back on a delivered `trigger.delivery.attempted` and on `run.dead_lettered`; `workflowId` and
/// `inputs` on `run.started`, from `run_row` = the run's `(workflow_id, inputs)` (required when
/// [`needs_run_row`]; `None` leaves them out). Payloads stored in full (before) come back as they are.
pub fn shown_payload(
    event_type: &str,
    run_id: &str,
    run_row: Option<(&str, &serde_json::Value)>,
    mut stored: serde_json::Value,
) -> serde_json::Value {
    use serde_json::Value;
    if let Value::Object(m) = &mut stored {
        match event_type {
            DELIVERY_ATTEMPTED
                if !m.contains_key("runId")
                    && m.get("outcome").and_then(Value::as_str) == Some("delivered") =>
            {
                m.insert("runId".into(), run_id.into());
            }
            RUN_DEAD_LETTERED if !m.contains_key("runId") => {
                m.insert("runId".into(), run_id.into());
            }
            RUN_STARTED if !m.contains_key("workflowId") => {
                if let Some((workflow_id, inputs)) = run_row {
                    m.insert("workflowId".into(), workflow_id.into());
                    m.insert("inputs".into(), inputs.clone());
                }
            }
            _ => {}
        }
    }
    stored
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn attempted_has_exactly_the_spec_fields() {
        let e = DeliveryAttempted {
            subscription_id: "s".into(),
            dedup_key: "dk_1".into(),
            attempt: 1,
            outcome: AttemptOutcome::Delivered,
            run_id: Some("run_1".into()),
        };
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            json!({"subscriptionId":"s","dedupKey":"dk_1","attempt":1,"outcome":"delivered","runId":"run_1"})
        );
        let r = DeliveryAttempted {
            outcome: AttemptOutcome::Retrying,
            run_id: None,
            ..e
        };
        assert_eq!(serde_json::to_value(&r).unwrap()["outcome"], "retrying");
        assert!(serde_json::to_value(&r).unwrap().get("runId").is_none());
    }

    #[test]
    fn a_run_event_is_stored_without_the_run_rows_fields_and_read_back_whole() {
        let inputs = json!({"pr": 7});
        let row = Some(("wf", &inputs));
        let cases = [
            (
                DELIVERY_ATTEMPTED,
                json!({"subscriptionId":"s","dedupKey":"dk_1","attempt":1,"outcome":"delivered","runId":"run_1"}),
                json!({"subscriptionId":"s","dedupKey":"dk_1","attempt":1,"outcome":"delivered"}),
            ),
            (
                RUN_STARTED,
                json!({"workflowId":"wf","inputs":{"pr":7}}),
                json!({}),
            ),
            (
                RUN_DEAD_LETTERED,
                json!({"runId":"run_1","reason":"r","attempts":3}),
                json!({"reason":"r","attempts":3}),
            ),
            (
                "tb.turn.queued",
                json!({"turnId":"t","kind":"start"}),
                json!({"turnId":"t","kind":"start"}),
            ),
        ];
        for (ty, built, stored) in cases {
            assert_eq!(stored_payload(ty, "run_1", &built), stored, "{ty}");
            assert_eq!(needs_run_row(ty, &stored), ty == RUN_STARTED, "{ty}");
            assert_eq!(shown_payload(ty, "run_1", row, stored), built, "{ty}");
            // A payload stored in full (before this version) reads as it is.
            assert_eq!(
                shown_payload(ty, "run_1", row, built.clone()),
                built,
                "{ty}"
            );
        }
        // Another run's id stays; an attempt that did not deliver gets no runId.
        let other = json!({"outcome":"delivered","runId":"run_2"});
        assert_eq!(stored_payload(DELIVERY_ATTEMPTED, "run_1", &other), other);
        let retrying = json!({"outcome":"retrying"});
        assert_eq!(
            shown_payload(DELIVERY_ATTEMPTED, "run_1", None, retrying.clone()),
            retrying
        );
    }

    #[test]
    fn state_changed_uses_wire_enums() {
        let e = SubscriptionStateChanged {
            subscription_id: "s".into(),
            source: "webhook".into(),
            from_state: SubscriptionState::Failed,
            to_state: SubscriptionState::DeadLettered,
            reason: Some(StateChangeReason::RetryExhausted),
        };
        assert_eq!(
            serde_json::to_value(&e).unwrap(),
            json!({"subscriptionId":"s","source":"webhook","fromState":"failed","toState":"dead-lettered","reason":"retry-exhausted"})
        );
    }
}
