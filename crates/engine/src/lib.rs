//! The durable delivery engine (DESIGN §3, §6): the ingest pipeline (verify -> dedup -> route -> one
//! commit), the delivery worker (lease -> perform -> record the attempt), and the run executors.
//!
//! [`Engine`] is the one handle the API and CLI hold.

pub mod accept;
pub mod audit;
pub mod capability;
pub mod catalog;
pub mod clock;
pub mod completions;
pub mod duplicates;
pub mod edge;
pub mod effects;
pub mod executor;
pub mod failed_auth;
pub mod flows;
pub mod handoff;
pub mod ingest;
pub mod nats_executor;
pub mod orchestrator;
pub mod quarantine;
pub mod queue;
pub mod rate_limit;
pub mod readiness;
pub mod registration;
pub mod replay;
pub mod router;
pub mod runs;
pub mod scheduler;
pub mod schedules;
pub mod sealing;
pub mod secrets;
pub mod service_dlq;
pub mod sessions;
pub mod ssrf;
pub mod start;
pub mod sweeper;
pub mod sync;
pub mod testing;
pub mod trace;
pub mod wake;
pub mod webhooks;
pub mod wire_event;
pub mod worker;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use tb_core::subscription::{SubscriptionInput, SubscriptionState, Transition};
use tb_core::{ErrorCode, TbError};
use tb_store::{Store, StoreError};
use tokio::sync::Notify;

pub use catalog::{Catalog, SubscriptionConfig};

/// Shared engine state: the store, the operator catalog (subscriptions, bindings, workflows), the cached
/// subscription states, and the in-process notification that wakes the delivery worker at once.
pub struct Engine {
    pub store: Arc<dyn Store>,
    catalog: RwLock<Arc<Catalog>>,
    states: RwLock<HashMap<String, SubscriptionState>>,
    /// Signalled after every commit that creates due work.
    /// Shared so a spawned commit task ([`ingest`]) can wake the worker after its caller went away.
    pub work_ready: Arc<Notify>,
    /// The http executor's client for workflows without `allow_private`: every name resolved through
    /// the SSRF guard ([`ssrf::GuardedResolver`]).
    pub(crate) http: reqwest::Client,
    /// The http executor's client for `allow_private` workflows (no address guard).
    pub(crate) http_private: reqwest::Client,
    /// Live outbound webhooks.
    pub webhooks: webhooks::Registry,
    /// Lifts the SSRF address rules for outbound webhooks (local testing only).
    pub webhook_allow_private: std::sync::atomic::AtomicBool,
    /// Durable outbound webhooks (retried, dead-lettered); off = best-effort with the breaker.
    pub webhooks_durable: std::sync::atomic::AtomicBool,
    /// Retry policy of runs started through `POST /v1/runs` (default: the Svix schedule).
    pub api_run_retry: RwLock<tb_core::retry::RetryPolicy>,
    /// Bumped after every committed change to signals, waits or turns: long-polls (`turns:claim`,
    /// `GET .../waits/{id}`) and the timer loop wake on it instead of polling.
    pub sessions: tokio::sync::watch::Sender<u64>,
    /// Set on shutdown: long-polls answer at once.
    pub closing: std::sync::atomic::AtomicBool,
    /// Duplicate answers not yet added to their receipts' counters (flushed by [`duplicates::run`]).
    pub(crate) duplicates: std::sync::Mutex<HashMap<String, (u64, i64)>>,
    /// Request rate limits and refusal counts ([`rate_limit`]).
    pub rate_limits: rate_limit::RateLimits,
    /// The quarantined subscriptions ([`quarantine`]), cached from the store.
    pub(crate) quarantines: RwLock<HashMap<String, tb_store::QuarantineRecord>>,
    /// The server-wide quotas ([`edge::IngressQuotas`]).
    pub(crate) quotas: RwLock<edge::IngressQuotas>,
    /// Delivery attempts running now (the worker counts them; the shutdown log reports them).
    pub attempts_in_flight: std::sync::atomic::AtomicUsize,
    /// Id of the last configuration change ([`tb_store::ConfigChange`]) this engine's caches reflect;
    /// read from the store before the caches were loaded, advanced by [`sync::poll_once`].
    pub(crate) config_cursor: std::sync::atomic::AtomicI64,
    /// Registered subscriptions this replica could not load because their secret cannot be unsealed
    /// here (id -> why); their webhooks get 503 instead of 404 until the key is fixed.
    pub(crate) unsealable: std::sync::Mutex<HashMap<String, String>>,
    /// The local worker that takes deliveries leased at commit ([`handoff`]); empty without one.
    pub handoff: handoff::HandOff,
    /// Schedules with a due tick not fired within [`scheduler::LATE_AFTER_MS`], as of the scheduler's last pass
    /// ([`scheduler::run`]); `GET /ready` lists them.
    pub schedules_late: Arc<std::sync::Mutex<Vec<scheduler::Late>>>,
    /// Queue subscriptions not consuming now, with why ([`queue::run`]); `GET /ready` lists them.
    pub queues_degraded: queue::Degraded,
    /// Set when a queue bus is wired (`serve --nats-url`): discovery advertises `queueBus`.
    pub queue_bus: std::sync::atomic::AtomicBool,
    /// The NATS connection (`serve --nats-url`), once set: the nats executor publishes through it.
    nats: std::sync::OnceLock<async_nats::Client>,
    /// Run ids of nats runs ended by their CompletionEvent on this replica, as they commit (for
    /// in-process observers such as `bench services`; nobody listening costs nothing).
    pub run_ends: tokio::sync::broadcast::Sender<String>,
    /// Bumped after every receipt and attempt this replica commits: the console's live feed
    /// (`tb_console::live`) wakes on it. A `watch` send with no receiver costs an atomic add.
    pub changes: Arc<tokio::sync::watch::Sender<u64>>,
    /// The audit key and the audit log's status for `GET /ready` ([`audit`]).
    pub(crate) audit: audit::AuditState,
    /// The last store probe of `GET /ready` ([`readiness`]), reused for its interval.
    pub(crate) ready_probe: readiness::ReadyProbe,
    /// Wrong API keys per client address ([`failed_auth`]).
    pub(crate) failed_keys: failed_auth::FailedKeys,
}

/// The pseudo-subscription id of runs started through `POST /v1/runs`: their receipt and delivery carry
/// it; it is not a trigger subscription and has no state.
pub const API_SOURCE: &str = "api";

/// Maps a store error onto the API's typed error, keeping the message. A busy or unavailable store
/// (writer queue full, database locked, writer gone: 503 `unavailable`) carries `Retry-After: 1`.
pub fn store_err(e: StoreError) -> TbError {
    let transient = matches!(e, StoreError::Busy(_) | StoreError::Unavailable(_));
    let err = TbError::new(e.code(), e.to_string());
    if transient {
        err.retry_after(1)
    } else {
        err
    }
}

impl Engine {
    /// Registers every catalog subscription in the store (creating it `active`, or updating its config and
    /// keeping its state) and caches the states. Errors: the store refused a write.
    pub async fn start(store: Arc<dyn Store>, catalog: Catalog) -> Result<Arc<Engine>, TbError> {
        // Read before the caches load: a change committed meanwhile is applied again by the sync
        // task (every refresh is idempotent), never missed.
        let cursor = store.config_change_head().await.map_err(store_err)?;
        let mut states = HashMap::new();
        let now = clock::now_ms();
        for sub in catalog.subscriptions() {
            let rec = store
                .upsert_subscription(sub.store_def(), now)
                .await
                .map_err(store_err)?;
            states.insert(rec.id.clone(), rec.state);
        }
        // A dead-lettered subscription answers 202 and dead-letters every new event: say so at start.
        for s in store
            .subscriptions_in_state(SubscriptionState::DeadLettered)
            .await
            .map_err(store_err)?
        {
            tracing::warn!(
                subscription = %s.id,
                since = %tb_store::rfc3339(s.state_since),
                last_error = s.last_error.as_deref().unwrap_or(""),
                "subscription is dead-lettered: new events are kept as dead letters, none is delivered, until an operator resumes it"
            );
        }
        let revoked = store.revoked_bindings().await.map_err(store_err)?;
        let catalog = catalog.with_revoked(revoked.into_iter().map(|(id, _)| id).collect());
        // The http executor's clients: no redirects, no proxy from the environment; the guarded one
        // resolves every name through the SSRF guard, the other serves `allow_private` workflows.
        let client = |guarded: bool| {
            let b = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy()
                .pool_max_idle_per_host(64);
            let b = if guarded {
                b.dns_resolver(std::sync::Arc::new(ssrf::GuardedResolver))
            } else {
                b
            };
            b.build()
                .map_err(|e| TbError::new(ErrorCode::Internal, format!("http client: {e}")))
        };
        let http = client(true)?;
        let http_private = client(false)?;
        let engine = Arc::new(Engine {
            store,
            catalog: RwLock::new(Arc::new(catalog)),
            states: RwLock::new(states),
            work_ready: Arc::new(Notify::new()),
            webhooks: Default::default(),
            sessions: tokio::sync::watch::channel(0).0,
            closing: std::sync::atomic::AtomicBool::new(false),
            duplicates: Default::default(),
            rate_limits: Default::default(),
            quarantines: Default::default(),
            quotas: Default::default(),
            attempts_in_flight: Default::default(),
            config_cursor: std::sync::atomic::AtomicI64::new(cursor),
            unsealable: Default::default(),
            handoff: Default::default(),
            schedules_late: Default::default(),
            queues_degraded: Default::default(),
            queue_bus: std::sync::atomic::AtomicBool::new(false),
            nats: std::sync::OnceLock::new(),
            run_ends: tokio::sync::broadcast::channel(4096).0,
            changes: Arc::new(tokio::sync::watch::channel(0).0),
            audit: Default::default(),
            ready_probe: Default::default(),
            failed_keys: Default::default(),
            api_run_retry: RwLock::new(tb_core::retry::RetryPolicy::default()),
            webhooks_durable: std::sync::atomic::AtomicBool::new(true),
            webhook_allow_private: std::sync::atomic::AtomicBool::new(
                std::env::var("OPENWOP_WEBHOOK_ALLOW_PRIVATE").is_ok_and(|v| v == "true"),
            ),
            http,
            http_private,
        });
        engine.publish_state_gauges();
        engine.reload_quarantines().await?;
        Ok(engine)
    }

    /// Subscriptions in `state` as stored (e.g. the dead-lettered ones for `GET /ready`), ordered by id,
    /// each with `state_since` (ms) and `last_error`. Errors: `unavailable` / `internal` from the store.
    pub async fn subscriptions_in_state(
        &self,
        state: SubscriptionState,
    ) -> Result<Vec<tb_store::SubscriptionRecord>, TbError> {
        self.store
            .subscriptions_in_state(state)
            .await
            .map_err(store_err)
    }

    /// Sets the gauge `tb_subscriptions{state}` to the number of known subscriptions in each state.
    fn publish_state_gauges(&self) {
        use SubscriptionState as S;
        let states = self.states.read().expect("states lock");
        for st in [S::Active, S::Paused, S::Failed, S::DeadLettered] {
            let n = states.values().filter(|s| **s == st).count();
            metrics::gauge!("tb_subscriptions", "state" => st.as_str()).set(n as f64);
        }
    }

    /// Wires the NATS connection the nats executor publishes through (once; later calls are
    /// ignored).
    pub fn set_nats(&self, client: async_nats::Client) {
        let _ = self.nats.set(client);
    }

    /// The NATS connection, once [`Engine::set_nats`] was called.
    pub fn nats(&self) -> Option<async_nats::Client> {
        self.nats.get().cloned()
    }

    /// The current catalog (a cheap snapshot; registrations replace it).
    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.read().expect("catalog lock").clone()
    }

    /// Adds a registered subscription and its binding to the catalog and its state to the cache.
    pub(crate) fn add_to_catalog(
        &self,
        sub: SubscriptionConfig,
        binding: tb_core::binding::Binding,
        state: SubscriptionState,
    ) {
        let mut c = self.catalog.write().expect("catalog lock");
        self.states
            .write()
            .expect("states lock")
            .insert(sub.id.clone(), state);
        *c = Arc::new(c.with(sub, binding));
        drop(c);
        self.publish_state_gauges();
    }

    /// Removes a subscription, its bindings and its cached state (a registration whose row is gone).
    pub(crate) fn remove_from_catalog(&self, id: &str) {
        let mut c = self.catalog.write().expect("catalog lock");
        self.states.write().expect("states lock").remove(id);
        *c = Arc::new(c.without(id));
        drop(c);
        self.publish_state_gauges();
    }

    /// Sets the cached state of known subscriptions to `states` (as stored), logging each that
    /// changed; ids not cached are ignored (a replica serves only the subscriptions it knows).
    pub(crate) fn set_states(&self, states: impl IntoIterator<Item = (String, SubscriptionState)>) {
        let mut changed = false;
        {
            let mut cache = self.states.write().expect("states lock");
            for (id, to) in states {
                if let Some(cur) = cache.get_mut(&id) {
                    if *cur != to {
                        tracing::info!(subscription = %id, from = cur.as_str(), to = to.as_str(), "subscription state changed on another replica");
                        *cur = to;
                        changed = true;
                    }
                }
            }
        }
        if changed {
            self.publish_state_gauges();
        }
    }

    /// Replaces the catalog's revoked binding ids with the store's. Errors: the store's.
    pub(crate) async fn reload_revocations(&self) -> Result<(), TbError> {
        let revoked = self.store.revoked_bindings().await.map_err(store_err)?;
        let mut c = self.catalog.write().expect("catalog lock");
        *c = Arc::new(c.with_revoked(revoked.into_iter().map(|(id, _)| id).collect()));
        Ok(())
    }

    /// Wakes long-polls and the timer loop after a session change was committed (a session change,
    /// a run's end included, appends run events: [`Engine::run_events_committed`] too).
    pub fn session_changed(&self) {
        self.sessions.send_modify(|n| *n = n.wrapping_add(1));
        self.run_events_committed();
    }

    /// Wakes the delivery worker after a commit that may have appended run events, when an outbound
    /// webhook is live: the events' outbox deliveries (`tb_core::outbox`, one per webhook taking the
    /// event's type) are due in that same commit, and would otherwise wait for the worker's next poll
    /// (`WorkerConfig::idle_poll`, 1 s; docs/openwop.md). A wake-up without a due delivery costs one
    /// empty lease query. Called after the commit returned, never before (the worker must see it).
    pub fn run_events_committed(&self) {
        if self.webhooks.any_live() {
            self.work_ready.notify_one();
        }
    }

    /// Marks the engine as shutting down and wakes every long-poll so it answers at once.
    pub fn close(&self) {
        self.closing
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.session_changed();
    }

    /// True once [`Engine::close`] was called.
    pub fn is_closing(&self) -> bool {
        self.closing.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The cached state of a subscription, if it exists.
    pub fn subscription_state(&self, id: &str) -> Option<SubscriptionState> {
        self.states.read().expect("states lock").get(id).copied()
    }

    pub(crate) fn note_transition(&self, id: &str, t: &Transition) {
        self.states
            .write()
            .expect("states lock")
            .insert(id.to_string(), t.to);
        if t.to == SubscriptionState::DeadLettered {
            tracing::warn!(
                subscription = id,
                from = t.from.as_str(),
                to = t.to.as_str(),
                "subscription dead-lettered after continuous failure: new events are kept as dead letters, none is delivered, until an operator resumes it"
            );
        } else {
            tracing::info!(
                subscription = id,
                from = t.from.as_str(),
                to = t.to.as_str(),
                "subscription state changed"
            );
        }
        metrics::counter!("tb_subscription_transitions_total", "to" => t.to.as_str()).increment(1);
        self.publish_state_gauges();
    }

    /// Revokes (`revoke = true`) or restores a configured binding, durably and at once: a revoked
    /// binding matches nothing from the next request on, and the worker refuses its open deliveries
    /// (`binding_revoked`, receipt `disabled`). Returns whether anything changed.
    /// Errors: `not_found` for an unknown binding.
    pub async fn set_binding_revoked(
        &self,
        id: &str,
        revoke: bool,
        by: Option<String>,
    ) -> Result<bool, TbError> {
        if !self
            .catalog()
            .all_bindings()
            .iter()
            .any(|(b, _)| b.id == id)
        {
            return Err(TbError::new(ErrorCode::NotFound, "no such binding"));
        }
        let changed = if revoke {
            self.store
                .revoke_binding(id, by, clock::now_ms())
                .await
                .map_err(store_err)?
        } else {
            self.store.restore_binding(id).await.map_err(store_err)?
        };
        self.reload_revocations().await?;
        tracing::info!(
            binding = id,
            revoked = revoke,
            changed,
            "binding revocation changed"
        );
        Ok(changed)
    }

    /// The error for a subscription id the catalog does not hold: `unavailable` (503) naming the
    /// reason when it is a registration whose secret cannot be unsealed on this replica (a missing or
    /// different `TRIGGER_BRIDGE_SECRET_KEY`), else `not_found` (404).
    pub fn missing_subscription(&self, id: &str) -> TbError {
        let why = self
            .unsealable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned();
        match why {
            Some(why) => TbError::new(
                ErrorCode::Unavailable,
                format!(
                    "this replica cannot open the subscription's signing secret ({why}); give every replica the same TRIGGER_BRIDGE_SECRET_KEY"
                ),
            ),
            None => TbError::new(ErrorCode::NotFound, "no such trigger subscription"),
        }
    }

    /// Records (or, with `None`, clears) why registered subscription `id` could not be loaded.
    /// Registered subscriptions this replica cannot serve because their secret does not unseal here
    /// (id -> why), ordered by id; `GET /ready` lists them as warnings.
    pub fn unsealable(&self) -> std::collections::BTreeMap<String, String> {
        self.unsealable
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    pub(crate) fn set_unsealable(&self, id: &str, why: Option<String>) {
        let mut m = self.unsealable.lock().unwrap_or_else(|p| p.into_inner());
        match why {
            Some(w) => {
                m.insert(id.to_string(), w);
            }
            None => {
                m.remove(id);
            }
        }
    }

    /// Operator pause / resume through the state machine; `None` when nothing changed.
    /// Errors: `not_found` for an unknown subscription.
    pub async fn operate(
        &self,
        id: &str,
        input: SubscriptionInput,
    ) -> Result<Option<Transition>, TbError> {
        if self.subscription_state(id).is_none() {
            return Err(TbError::new(
                ErrorCode::NotFound,
                "no such trigger subscription",
            ));
        }
        let t = self
            .store
            .apply_subscription_input(id, input, clock::now_ms())
            .await
            .map_err(store_err)?;
        if let Some(t) = &t {
            self.note_transition(id, t);
        }
        Ok(t)
    }
}
