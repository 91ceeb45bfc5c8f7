//! The flows a running service knows, shared between the service loop (which applies the register
//! reply and broadcasts) and the message handlers (which route by them).

use std::sync::{Arc, RwLock};

use tb_wire::flow::FlowTable;

/// The flows a running service knows (its register reply, then broadcasts); shared with
/// [`crate::Service::flows`] so a caller can look.
#[derive(Clone, Default)]
pub struct Flows(pub(crate) Arc<RwLock<FlowTable>>);

impl Flows {
    /// The version of flow `id`, when known.
    pub fn version(&self, id: &str) -> Option<String> {
        self.0.read().unwrap().version(id).map(str::to_string)
    }

    /// How many flows are known.
    pub fn len(&self) -> usize {
        self.0.read().unwrap().len()
    }

    /// True when none is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
