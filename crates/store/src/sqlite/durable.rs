//! What is durable on SQLite: the group commits the sync thread has flushed to disk.
//!
//! The writer connection runs with `synchronous = NORMAL`, so `COMMIT` appends the batch's frames to the
//! WAL without waiting for the disk; a second thread then calls `fdatasync` on the WAL file and only
//! then answers the batch's callers (docs/architecture.md, "SQLite: the group commit"). The writer goes
//! on with the next batch while the disk works, and one `fdatasync` covers every batch committed
//! before it. In WAL mode with `NORMAL`, SQLite itself still syncs the WAL before each checkpoint and
//! the WAL header when the file is reused (sqlite.org/pragma.html#pragma_synchronous), so a frame
//! flushed here stays valid.
//!
//! Readers must not show what is committed but not yet durable (a receipt a power loss could still
//! take away): every batch gets a sequence number before its `COMMIT`, and a read waits, after it read,
//! until the batches that could be in its snapshot are synced ([`Durability::settled`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tokio::sync::watch;

use crate::{StoreError, StoreResult};

/// The writer's and the sync thread's counters, shared with the readers.
pub(crate) struct Durability {
    /// The sequence number of the last batch that began its `COMMIT` (1, 2, ...; 0 = none).
    committing: AtomicU64,
    /// The last batch whose frames are flushed (or whose commit failed: nothing of it is visible).
    synced: watch::Sender<u64>,
    /// Why the store stopped (a failed flush, the sync thread gone), and the last batch flushed by
    /// then: from then on nothing is written, and a read that may have seen a later batch (one that
    /// will never be flushed) fails.
    stopped: Mutex<Option<(String, u64)>>,
}

impl Durability {
    pub(crate) fn new() -> Durability {
        Durability {
            committing: AtomicU64::new(0),
            synced: watch::Sender::new(0),
            stopped: Mutex::new(None),
        }
    }

    /// Called by the writer just before a batch's `COMMIT`: the batch's sequence number.
    pub(crate) fn begin_commit(&self) -> u64 {
        self.committing.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// The sequence number of the last batch that began its `COMMIT`.
    pub(crate) fn committed(&self) -> u64 {
        self.committing.load(Ordering::SeqCst)
    }

    /// Called by the sync thread once batches up to `seq` are flushed (or failed).
    pub(crate) fn synced_up_to(&self, seq: u64) {
        self.synced.send_if_modified(|s| {
            if seq > *s {
                *s = seq;
                true
            } else {
                false
            }
        });
    }

    /// Waits until everything a read that has just finished could have seen is durable: every batch
    /// whose `COMMIT` began before now. Call it AFTER the read (a snapshot is taken at the read's first
    /// statement, so a batch visible to it began its commit before this call). Returns at once when
    /// nothing is pending, which is the common case; at most one `fdatasync` otherwise. Errors:
    /// `Unavailable` once the store stopped ([`Self::stop`]) with a batch the read could have seen not
    /// flushed (after a failed flush, every later read); a store stopped with everything flushed reads on.
    pub(crate) async fn settled(&self) -> StoreResult<()> {
        let need = self.committing.load(Ordering::SeqCst);
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s >= need).await;
        match self.stopped.lock().expect("durability lock").as_ref() {
            Some((why, flushed)) if need > *flushed => Err(StoreError::Unavailable(why.clone())),
            _ => Ok(()),
        }
    }

    /// Stops the store for good with `why` (the first reason is kept) and releases every waiting
    /// reader, which then gets the error.
    pub(crate) fn stop(&self, why: &str) {
        let flushed = *self.synced.borrow();
        self.stopped
            .lock()
            .expect("durability lock")
            .get_or_insert_with(|| (why.to_string(), flushed));
        self.synced_up_to(u64::MAX);
    }

    /// `Unavailable` with the reason once the store stopped; `Ok` before.
    pub(crate) fn check(&self) -> StoreResult<()> {
        match self.stopped.lock().expect("durability lock").as_ref() {
            Some((why, _)) => Err(StoreError::Unavailable(why.clone())),
            None => Ok(()),
        }
    }

    /// [`Self::settled`] for a caller that is not async (a blocking thread).
    #[cfg(test)]
    pub(crate) fn is_settled(&self) -> bool {
        *self.synced.borrow() >= self.committing.load(Ordering::SeqCst)
    }
}
