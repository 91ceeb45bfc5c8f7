//! The outbox of outbound webhooks (DESIGN §5; OpenWOP webhooks): which registered webhook gets which
//! run event. Every run event appended to a run's log fans out, in the same transaction, to one
//! `webhook` delivery per live (not deleted) webhook whose event filter takes the event's type.

use crate::ids::{new_id, IdKind};

/// True when a webhook registered for `filter` (event types, or `*` for all) takes events of type
/// `event_type` (exact match, case-sensitive).
pub fn takes(filter: &[String], event_type: &str) -> bool {
    filter.iter().any(|t| t == "*" || t == event_type)
}

/// One live webhook as the fan-out sees it: its id and its event filter (`webhooks.events`, a JSON
/// array of strings, parsed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveWebhook {
    pub id: String,
    pub events: Vec<String>,
}

/// One outbox delivery to insert: `deliveries` row with `action = 'webhook'`, state `pending`,
/// `inputs = {}`, `due_at = created_at = updated_at = now`. The event id stands in the receipt and
/// dedup-key columns and the webhook id in the subscription and binding columns, so `(receipt,
/// binding)` = `(event, webhook)` is unique: a fan-out written twice fails instead of sending twice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxDelivery {
    /// `dlv_<32 hex>`, fresh.
    pub id: String,
    pub webhook_id: String,
    pub event_id: String,
    pub run_id: String,
    /// Unix ms.
    pub due_at: i64,
}

/// The outbox deliveries of run event `event_id` (type `event_type`) of run `run_id`, appended at
/// `now` (Unix ms): one per webhook in `webhooks` that [`takes`] the type, in the given order. The
/// backend loads `webhooks` as `SELECT id, events FROM webhooks WHERE deleted = 0` (no lock: a webhook
/// deleted concurrently may still get this one event, as it would have a moment earlier).
pub fn fan_out(
    webhooks: &[LiveWebhook],
    run_id: &str,
    event_id: &str,
    event_type: &str,
    now: i64,
) -> Vec<OutboxDelivery> {
    webhooks
        .iter()
        .filter(|w| takes(&w.events, event_type))
        .map(|w| OutboxDelivery {
            id: new_id(IdKind::Delivery),
            webhook_id: w.id.clone(),
            event_id: event_id.to_string(),
            run_id: run_id.to_string(),
            due_at: now,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(id: &str, events: &[&str]) -> LiveWebhook {
        LiveWebhook {
            id: id.into(),
            events: events.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_filter_takes_its_types_or_everything_with_a_star() {
        let f = vec!["run.completed".to_string(), "run.failed".to_string()];
        assert!(takes(&f, "run.completed"));
        assert!(!takes(&f, "run.started"));
        assert!(!takes(&f, "RUN.COMPLETED"), "case-sensitive");
        assert!(takes(&["*".to_string()], "trigger.delivery.attempted"));
        assert!(!takes(&[], "run.completed"));
    }

    #[test]
    fn fan_out_makes_one_delivery_per_taking_webhook() {
        let hooks = [
            hook("wh_a", &["run.completed"]),
            hook("wh_b", &["*"]),
            hook("wh_c", &["run.started"]),
        ];
        let out = fan_out(&hooks, "run_1", "evt_1", "run.completed", 7_000);
        let got: Vec<(&str, &str, &str, i64)> = out
            .iter()
            .map(|d| {
                (
                    d.webhook_id.as_str(),
                    d.event_id.as_str(),
                    d.run_id.as_str(),
                    d.due_at,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("wh_a", "evt_1", "run_1", 7_000),
                ("wh_b", "evt_1", "run_1", 7_000)
            ]
        );
        assert!(out.iter().all(|d| d.id.starts_with("dlv_")));
        assert_ne!(out[0].id, out[1].id);
        assert!(fan_out(&hooks, "run_1", "evt_2", "run.failed", 1).len() == 1);
    }
}
