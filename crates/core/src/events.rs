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
