//! The shared limits of ingest bodies buffered before verification: body slots, each target's fair
//! share of them, each client's share of a target's slots, and the byte budget ([`IngestGate`]).

use std::collections::HashMap;
use std::net::IpAddr;
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

/// Slots held per target, and per (target, client key) where the client is known.
#[derive(Debug, Default)]
pub(super) struct HeldSlots {
    pub(super) by_target: HashMap<Target, usize>,
    pub(super) by_client: HashMap<(Target, IpAddr), usize>,
}

pub(super) type Held = Arc<Mutex<HeldSlots>>;

/// The shared limits of ingest bodies buffered before verification.
#[derive(Debug)]
pub struct IngestGate {
    pub(super) inflight: Arc<Semaphore>,
    pub(super) budget: Arc<Semaphore>,
    per_target: usize,
    /// Of one target's slots, the most one client ([`tb_core::front_door::client_key`]) may hold.
    per_client: usize,
    /// Slots held per target and per client of a target; an entry is removed when its count falls to
    /// 0 (bounded by the slots).
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
            per_client: usize::MAX,
            held: Held::default(),
        }
    }

    /// This gate with at most `per_client` of one target's slots for one client
    /// (`[server].max_inflight_bodies_per_client`; `check-config` keeps it in
    /// 1..=max_inflight_bodies_per_target). Without it a client may take the target's whole share.
    pub fn with_per_client(mut self, per_client: usize) -> Self {
        self.per_client = per_client;
        self
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
            .map(|h| h.by_target.get(target).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Body slots of `target` held by `client` (any address of its key) now.
    pub fn held_by_client(&self, target: &Target, client: IpAddr) -> usize {
        let key = (target.clone(), tb_core::front_door::client_key(client));
        self.held
            .lock()
            .map(|h| h.by_client.get(&key).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Takes one of `target`'s slots for `client` (`None`: not known, only the target's share
    /// applies). Errors: the metric reason of the share that is full, `target_bodies` or
    /// `client_bodies`.
    pub(super) fn take_target(
        &self,
        target: &Target,
        client: Option<IpAddr>,
    ) -> Result<TargetSlot, &'static str> {
        let client = client.map(tb_core::front_door::client_key);
        let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let held = h.by_target.get(target).copied().unwrap_or(0);
        if !target_admits(held, self.per_target) {
            return Err("target_bodies");
        }
        if let Some(c) = client {
            let mine = h.by_client.get(&(target.clone(), c)).copied().unwrap_or(0);
            if !tb_core::front_door::client_admits(mine, self.per_client) {
                return Err("client_bodies");
            }
            *h.by_client.entry((target.clone(), c)).or_insert(0) += 1;
        }
        *h.by_target.entry(target.clone()).or_insert(0) += 1;
        metrics::gauge!(SLOTS_HELD_GAUGE).increment(1.0);
        Ok(TargetSlot {
            held: self.held.clone(),
            target: target.clone(),
            client,
        })
    }
}

/// Gauge of the target body slots held now, all targets together (no per-target label: a
/// subscription id is part of its ingest URL, docs/http-api.md "Metrics").
pub const SLOTS_HELD_GAUGE: &str = "tb_http_body_slots_held";

/// One body slot of a target (and of its client's share), given back on drop.
pub(super) struct TargetSlot {
    held: Held,
    target: Target,
    client: Option<IpAddr>,
}

impl Drop for TargetSlot {
    fn drop(&mut self) {
        metrics::gauge!(SLOTS_HELD_GAUGE).decrement(1.0);
        let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = h.by_target.get_mut(&self.target) {
            *n -= 1;
            if *n == 0 {
                h.by_target.remove(&self.target);
            }
        }
        if let Some(c) = self.client {
            let key = (self.target.clone(), c);
            if let Some(n) = h.by_client.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    h.by_client.remove(&key);
                }
            }
        }
    }
}
