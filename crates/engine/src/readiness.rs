//! The store probe behind `GET /ready` (docs/operations.md, "Readiness"): one no-op job committed
//! through the store's writer and one read of the subscriptions, each bounded by a timeout.
//!
//! `/ready` is public and cheap to ask, so its probe must not cost the store a write per request: a
//! probe's result is reused by every caller for [`PROBE_INTERVAL`] after it finished, and callers that
//! arrive while a probe runs wait for that probe instead of starting their own (single flight). However
//! many callers ask, the store sees at most one probe write per interval. What needs no I/O (shutdown,
//! late schedules, degraded queues) is not cached: the handler reads it on every call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tb_core::subscription::SubscriptionState;

use crate::Engine;

/// How long a probe's result answers `GET /ready` after it finished: 1 s. A load balancer asking
/// every few seconds sees every probe fresh; a flood of asks costs one no-op write a second. A
/// change of the store's health shows within this interval plus the probe's own timeouts.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// How long the probe waits for the store's writer to commit its no-op job, in ms.
pub const WRITER_TIMEOUT_MS: u64 = 1_000;

/// How long the probe waits for the subscription read, in ms.
pub const READ_TIMEOUT_MS: u64 = 1_000;

/// What one probe found.
#[derive(Debug, Clone)]
pub struct Probe {
    /// `Ok` when the writer committed the no-op job within [`WRITER_TIMEOUT_MS`]; else why not
    /// (queue full, writer stopped or dead, timeout).
    pub writer: Result<(), String>,
    /// `Ok` with the subscriptions that wait for an operator (`dead-lettered`, `failed`: id and state,
    /// ordered by id) when the subscriptions were read within [`READ_TIMEOUT_MS`]; else why not.
    pub waiting: Result<Vec<(String, SubscriptionState)>, String>,
}

/// The last probe and when it finished; the lock is held while a probe runs (single flight).
pub struct ReadyProbe {
    last: tokio::sync::Mutex<Option<(Instant, Arc<Probe>)>>,
    /// How long a result answers, in ms ([`PROBE_INTERVAL`] unless set).
    interval_ms: AtomicU64,
}

impl Default for ReadyProbe {
    fn default() -> ReadyProbe {
        ReadyProbe {
            last: Default::default(),
            interval_ms: AtomicU64::new(PROBE_INTERVAL.as_millis() as u64),
        }
    }
}

impl Engine {
    /// The store probe of `GET /ready` (module docs): the last result when it is younger than
    /// its interval ([`PROBE_INTERVAL`] unless set), else a new probe, one at a time however many callers ask. Never fails: a
    /// failed check is in the [`Probe`].
    pub async fn readiness(&self) -> Arc<Probe> {
        let mut last = self.ready_probe.last.lock().await;
        let interval = Duration::from_millis(self.ready_probe.interval_ms.load(Ordering::Relaxed));
        if let Some((at, probe)) = last.as_ref() {
            if at.elapsed() < interval {
                return probe.clone();
            }
        }
        let probe = Arc::new(self.probe_store().await);
        *last = Some((Instant::now(), probe.clone()));
        probe
    }

    /// Sets how long a probe's result answers `GET /ready` (default [`PROBE_INTERVAL`]; zero probes
    /// on every call, still one at a time).
    pub fn set_ready_probe_interval(&self, interval: Duration) {
        self.ready_probe
            .interval_ms
            .store(interval.as_millis() as u64, Ordering::Relaxed);
    }

    async fn probe_store(&self) -> Probe {
        let writer = match tokio::time::timeout(
            Duration::from_millis(WRITER_TIMEOUT_MS),
            self.store.ping_writer(),
        )
        .await
        {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "the writer did not commit a no-op within {WRITER_TIMEOUT_MS} ms"
            )),
        };
        let waiting = match tokio::time::timeout(
            Duration::from_millis(READ_TIMEOUT_MS),
            self.store.list_subscriptions(),
        )
        .await
        {
            Ok(Ok(subs)) => Ok(subs
                .into_iter()
                .filter(|s| s.state.needs_operator())
                .map(|s| (s.id, s.state))
                .collect()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!(
                "reading subscriptions took over {READ_TIMEOUT_MS} ms"
            )),
        };
        Probe { writer, waiting }
    }
}
