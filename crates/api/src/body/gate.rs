//! The shared limits of ingest bodies buffered before verification: body slots, each target's fair
//! share of them, and the byte budget ([`IngestGate`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::Semaphore;

use super::{
    DEFAULT_BODY_BUDGET_BYTES, DEFAULT_MAX_INFLIGHT_BODIES, DEFAULT_MAX_INFLIGHT_BODIES_PER_TARGET,
};

/// Whose share of the body slots an ingest body takes ([`IngestGate`]): each subscription has its own
/// share; every capability URL (`/v1/hooks/{token}`) shares one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// `POST /v1/trigger-subscriptions/{id}/ingest`, by subscription id.
    Subscription(String),
    /// `POST /v1/hooks/{token}` with a live token, all endpoints together.
    Capabilities,
}

/// The pure fair-share rule: a body for a target that already holds `held` slots may take another
/// when `held < per_target`.
pub fn target_admits(held: usize, per_target: usize) -> bool {
    held < per_target
}

pub(super) type Held = Arc<Mutex<HashMap<Target, usize>>>;

/// The shared limits of ingest bodies buffered before verification.
#[derive(Debug)]
pub struct IngestGate {
    pub(super) inflight: Arc<Semaphore>,
    pub(super) budget: Arc<Semaphore>,
    per_target: usize,
    /// Slots held per target; an entry is removed when its count falls to 0 (bounded by the slots).
    pub(super) held: Held,
}

impl IngestGate {
    /// At most `max_inflight` bodies read at once, holding at most `budget_bytes` bytes together; one
    /// target may hold [`DEFAULT_MAX_INFLIGHT_BODIES_PER_TARGET`] of the slots (at most `max_inflight`).
    pub fn new(max_inflight: usize, budget_bytes: usize) -> Self {
        IngestGate {
            inflight: Arc::new(Semaphore::new(max_inflight)),
            budget: Arc::new(Semaphore::new(budget_bytes.min(Semaphore::MAX_PERMITS))),
            per_target: DEFAULT_MAX_INFLIGHT_BODIES_PER_TARGET.min(max_inflight),
            held: Held::default(),
        }
    }

    /// This gate with at most `per_target` slots for one target (`[server].max_inflight_bodies_per_target`;
    /// `check-config` keeps it in 1..=max_inflight_bodies).
    pub fn with_per_target(mut self, per_target: usize) -> Self {
        self.per_target = per_target;
        self
    }

    /// The gate of routers built without [`layer`](super::layer) (tests; `serve` always installs the
    /// configured one): [`DEFAULT_MAX_INFLIGHT_BODIES`] and [`DEFAULT_BODY_BUDGET_BYTES`], shared by
    /// all of them, and, like their bodies without timeouts, no fair share (one target may take every
    /// slot: such routers run in-process clients whose bodies all wait for the client task at once).
    pub fn shared_default() -> Arc<IngestGate> {
        static G: OnceLock<Arc<IngestGate>> = OnceLock::new();
        G.get_or_init(|| {
            Arc::new(
                IngestGate::new(DEFAULT_MAX_INFLIGHT_BODIES, DEFAULT_BODY_BUDGET_BYTES)
                    .with_per_target(DEFAULT_MAX_INFLIGHT_BODIES),
            )
        })
        .clone()
    }

    /// Bytes of the budget not held by a body now.
    pub fn budget_available(&self) -> usize {
        self.budget.available_permits()
    }

    /// Body slots held by `target` now.
    pub fn held_by(&self, target: &Target) -> usize {
        self.held
            .lock()
            .map(|h| h.get(target).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Takes one of `target`'s slots, or `None` when it holds its share already.
    pub(super) fn take_target(&self, target: &Target) -> Option<TargetSlot> {
        let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = h.entry(target.clone()).or_insert(0);
        if !target_admits(*n, self.per_target) {
            if *n == 0 {
                h.remove(target);
            }
            return None;
        }
        *n += 1;
        Some(TargetSlot {
            held: self.held.clone(),
            target: target.clone(),
        })
    }
}

/// One body slot of a target, given back on drop.
pub(super) struct TargetSlot {
    held: Held,
    target: Target,
}

impl Drop for TargetSlot {
    fn drop(&mut self) {
        let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = h.get_mut(&self.target) {
            *n -= 1;
            if *n == 0 {
                h.remove(&self.target);
            }
        }
    }
}
