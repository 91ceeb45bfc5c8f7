//! Duplicate deliveries are counted on the first receipt (DESIGN §5.2: one dedup key, one receipt)
//! without a write on the duplicate's own path: answers are counted in memory and added to the
//! receipts' `duplicates` / `last_duplicate_at` once a second, in one store write.

use std::collections::HashMap;
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

    /// Writes the pending counts. When the store refuses them (busy, unavailable) they are put back and
    /// go with the next flush, merged with what arrived meanwhile: a count is never silently lost while
    /// the process lives.
    pub async fn flush_duplicates(&self) {
        let batch: Vec<(String, u64, i64)> = {
            let mut m = self.duplicates.lock().expect("duplicates lock");
            m.drain().map(|(k, (n, at))| (k, n, at)).collect()
        };
        if batch.is_empty() {
            return;
        }
        if let Err(e) = self.store.add_duplicates(batch.clone()).await {
            tracing::warn!(error = %e, receipts = batch.len(), "recording duplicate counts failed; kept for the next flush");
            put_back(&mut self.duplicates.lock().expect("duplicates lock"), batch);
        }
    }
}

/// Merges a batch the store refused back into the pending counts: counts add up, the latest time wins.
/// New receipts beyond [`MAX_PENDING`] are left out, as in [`Engine::note_duplicate`].
fn put_back(pending: &mut HashMap<String, (u64, i64)>, batch: Vec<(String, u64, i64)>) {
    for (id, n, at) in batch {
        if let Some(e) = pending.get_mut(&id) {
            e.0 += n;
            e.1 = e.1.max(at);
        } else if pending.len() < MAX_PENDING {
            pending.insert(id, (n, at));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_batch_is_merged_back_with_what_arrived_meanwhile() {
        let mut pending = HashMap::from([("rcpt_a".to_string(), (2, 500))]);
        put_back(
            &mut pending,
            vec![("rcpt_a".into(), 3, 400), ("rcpt_b".into(), 1, 450)],
        );
        assert_eq!(pending["rcpt_a"], (5, 500));
        assert_eq!(pending["rcpt_b"], (1, 450));
    }

    /// A flush the store refuses keeps its counts for the next one (they used to be dropped).
    #[tokio::test]
    async fn a_flush_the_store_refuses_keeps_its_counts() {
        let dir = tempfile::tempdir().unwrap();
        let store = tb_store::sqlite::SqliteStore::open_dir(dir.path()).unwrap();
        store.crash_writer_for_test().unwrap();
        let engine = Engine::start(
            Arc::new(store),
            crate::catalog::Catalog::new(vec![], vec![], vec![]),
        )
        .await
        .unwrap();
        engine.note_duplicate("rcpt_a");
        engine.note_duplicate("rcpt_a");
        engine.flush_duplicates().await;
        let pending = engine.duplicates.lock().unwrap().clone();
        assert_eq!(pending.get("rcpt_a").map(|e| e.0), Some(2), "{pending:?}");
    }
}
