//! The router: turns a normalized event into one delivery per matching binding (DESIGN §3). Bindings
//! decide everything; the payload only fills allowlisted inputs.

use tb_core::binding::BindingAction;
use tb_core::delivery::DeliveryState;
use tb_core::ids::{new_id, run_id_for_delivery, IdKind};
use tb_core::normalized::NormalizedEvent;
use tb_store::NewDelivery;

use crate::catalog::Catalog;

/// One new delivery per binding of `subscription` that matches `event`, in config order. When
/// `dead_letter` is set (the subscription is dead-lettered) the deliveries are created dead-lettered with
/// reason `subscription_dead_lettered`.
pub fn route(
    catalog: &Catalog,
    subscription: &str,
    event: &NormalizedEvent,
    dead_letter: bool,
) -> Vec<NewDelivery> {
    catalog
        .bindings_of(subscription)
        .iter()
        .filter(|b| b.matches(event))
        .map(|b| match &b.action {
            BindingAction::StartRun { workflow } => {
                let id = new_id(IdKind::Delivery);
                NewDelivery {
                    run_id: (!dead_letter).then(|| run_id_for_delivery(&id)),
                    id,
                    binding_id: b.id.clone(),
                    action: "start_run".into(),
                    workflow_id: Some(workflow.clone()),
                    inputs: b.map_inputs(event),
                    state: if dead_letter {
                        DeliveryState::DeadLettered
                    } else {
                        DeliveryState::Pending
                    },
                    dead_letter_reason: dead_letter
                        .then(|| "subscription_dead_lettered".to_string()),
                }
            }
        })
        .collect()
}
