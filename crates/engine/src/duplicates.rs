//! Duplicate deliveries are counted on the first receipt (DESIGN §5.2: one dedup key, one receipt)
//! without a write on the duplicate's own path: answers are counted in memory and added to the
//! receipts' `duplicates` / `last_duplicate_at` once a second, in one store write.

use std::sync::Arc;
use std::time::Duration;

use crate::{clock, Engine};

/// Most distinct receipts held between flushes; past this, further duplicates are only counted in the
/// `tb_receipts_total{outcome="duplicate"}` metric (a flood of repeats cannot grow memory).
const MAX_PENDING: usize = 100_000;

impl Engine {
    /// Counts one duplicate answer for `receipt_id` (flushed by [`run`]).
    pub fn note_duplicate(&self, receipt_id: &str) {
        let mut m = self.duplicates.lock().expect("duplicates lock");
        let now = clock::now_ms();
        if let Some(e) = m.get_mut(receipt_id) {
            e.0 += 1;
            e.1 = now;
        } else if m.len() < MAX_PENDING {
            m.insert(receipt_id.to_string(), (1, now));
        }
    }

    /// Writes the pending counts; on failure they are dropped (and logged): counts are advisory.
    pub async fn flush_duplicates(&self) {
        let batch: Vec<(String, u64, i64)> = {
            let mut m = self.duplicates.lock().expect("duplicates lock");
            m.drain().map(|(k, (n, at))| (k, n, at)).collect()
        };
        if batch.is_empty() {
            return;
        }
        if let Err(e) = self.store.add_duplicates(batch).await {
            tracing::warn!(error = %e, "recording duplicate counts failed");
        }
    }
}

/// Flushes duplicate counts every second until `shutdown`, then once more.
pub async fn run(engine: Arc<Engine>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => engine.flush_duplicates().await,
            _ = shutdown.changed() => break,
        }
    }
    engine.flush_duplicates().await;
}
