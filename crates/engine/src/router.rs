//! The router: turns a normalized event into one delivery per matching binding (DESIGN §3). Bindings
//! decide everything; the payload only fills allowlisted inputs and `{field}` placeholders.

use tb_core::binding::BindingAction;
use tb_core::delivery::{DeliveryKind, DeliveryState};
use tb_core::ids::{new_id, run_id_for_delivery, IdKind};
use tb_core::normalized::NormalizedEvent;
use tb_store::NewDelivery;

use crate::catalog::Catalog;

/// One new delivery per binding of `subscription` that matches `event`, in config order.
///
/// * When `dead_letter` is set (the subscription is dead-lettered) the deliveries are created
///   dead-lettered with reason `subscription_dead_lettered`.
/// * A binding whose templates cannot be rendered for this event (a field it names is absent, or the
///   signal name is invalid) gives a delivery dead-lettered with that reason, so the receipt ends
///   `routing_failed` instead of vanishing.
/// * A plain `start_run` delivery pre-assigns its run id (the sender's answer names it); a coalescing
///   one learns its run only when performed.
pub fn route(
    catalog: &Catalog,
    subscription: &str,
    event: &NormalizedEvent,
    dead_letter: bool,
) -> Vec<NewDelivery> {
    catalog
        .bindings_of(subscription)
        .filter(|b| b.matches(event))
        .map(|b| {
            let id = new_id(IdKind::Delivery);
            let (params, failure) = match b.params(event) {
                Ok(p) => (Some(p), None),
                Err(e) => (None, Some(e.reason())),
            };
            let plain_start = matches!(
                &b.action,
                BindingAction::StartRun {
                    coalesce_key: None,
                    ..
                }
            );
            let dead = dead_letter || failure.is_some();
            NewDelivery {
                kind: DeliveryKind::Binding,
                run_id: (plain_start && !dead).then(|| run_id_for_delivery(&id)),
                id,
                binding_id: b.id.clone(),
                action: b.action.name().into(),
                workflow_id: b.action.workflow().map(str::to_string),
                inputs: b.map_inputs(event),
                params: params
                    .filter(|p| *p != Default::default())
                    .map(|p| serde_json::to_value(p).expect("serializable")),
                state: if dead {
                    DeliveryState::DeadLettered
                } else {
                    DeliveryState::Pending
                },
                dead_letter_reason: if dead_letter {
                    Some("subscription_dead_lettered".to_string())
                } else {
                    failure.map(str::to_string)
                },
            }
        })
        .collect()
}
