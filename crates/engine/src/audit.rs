//! The audit log's engine side (docs/operations.md, "The audit log"): the audit key every append and
//! every check uses, appends that count recorded breaks, the status `GET /ready` shows, and the signed
//! head checkpoints exported now and then so that truncation is detectable from outside the database.
//! The chain's rules are `tb_core::audit`'s; the store appends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tb_core::audit::{Checkpoint, Entry, Key, NewEntry};
use tb_core::{ErrorCode, TbError};
use tb_store::{AuditHead, AuditQuery, StoreError};

use crate::{store_err, Engine};

/// How often `serve` exports a checkpoint by default: 60 s (`[server] audit_checkpoint_secs`).
pub const DEFAULT_CHECKPOINT_EVERY: Duration = Duration::from_secs(60);

/// How long the audit status `GET /ready` shows is reused: 1 s (one read of the head row a second
/// however often `/ready` is asked).
pub const STATUS_INTERVAL: Duration = Duration::from_secs(1);

/// The audit state of one engine: its key and the cached status.
#[derive(Default)]
pub struct AuditState {
    key: std::sync::RwLock<Option<Key>>,
    status: tokio::sync::Mutex<Option<(Instant, Arc<AuditStatus>)>>,
}

/// What `GET /ready` says about the audit log.
#[derive(Debug, Clone)]
pub struct AuditStatus {
    /// Whether this replica holds the audit key (else it appends unkeyed entries).
    pub keyed: bool,
    /// The head row as read (with the largest `seq` and the recorded breaks), or why it could not be.
    pub head: Result<AuditHead, String>,
}

impl AuditStatus {
    /// Whether the log is broken: rows lie past the head or below seq 1 now
    /// (`tb_core::audit::bounds`), or an append stepped over some.
    pub fn broken(&self) -> bool {
        self.head.as_ref().is_ok_and(|h| {
            tb_core::audit::bounds(h.seq, h.max_seq, h.below_one).is_some() || h.breaks > 0
        })
    }
}

impl Engine {
    /// Sets the audit key (`None`: entries are appended unkeyed). `serve` derives it from the sealing
    /// key ([`crate::sealing::SecretKey::audit_key`]) before the first append.
    pub fn set_audit_key(&self, key: Option<Key>) {
        *self.audit.key.write().unwrap_or_else(|p| p.into_inner()) = key;
    }

    /// The audit key, if this replica has one.
    pub fn audit_key(&self) -> Option<Key> {
        self.audit
            .key
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Appends `e` to the audit log under the audit key and returns the new entry. When the append
    /// found rows past the head (written by hand) it stepped over them with an `audit.break` entry:
    /// that is logged as an error and counted (`tb_audit_breaks_total`) after the commit. A failed
    /// append is counted (`tb_audit_append_failed_total`); the caller logs it with its context.
    /// Errors: the store's.
    pub async fn append_audit(&self, e: NewEntry) -> Result<Entry, StoreError> {
        match self.store.append_audit(e, self.audit_key()).await {
            Ok(a) => {
                if let Some(b) = &a.break_entry {
                    metrics::counter!("tb_audit_breaks_total").increment(1);
                    tracing::error!(
                        seq = b.seq,
                        detail = %b.entry.detail,
                        "audit log broken: rows lie past its head (written into the database by hand, not by a server); entry {} records it and the log goes on after it (docs/operations.md, \"The audit log\")",
                        b.seq
                    );
                    *self.audit.status.lock().await = None;
                }
                Ok(a.entry)
            }
            Err(err) => {
                metrics::counter!("tb_audit_append_failed_total").increment(1);
                Err(err)
            }
        }
    }

    /// The audit log's status for `GET /ready`: read at most once per [`STATUS_INTERVAL`] (one read
    /// at a time however many callers ask); a failed read is in the status.
    pub async fn audit_status(&self) -> Arc<AuditStatus> {
        let mut last = self.audit.status.lock().await;
        if let Some((at, s)) = last.as_ref() {
            if at.elapsed() < STATUS_INTERVAL {
                return s.clone();
            }
        }
        let s = Arc::new(AuditStatus {
            keyed: self.audit_key().is_some(),
            head: self.store.audit_head().await.map_err(|e| e.to_string()),
        });
        *last = Some((Instant::now(), s.clone()));
        s
    }

    /// The checkpoint of the log's head now, with the head's hash: `Ok(None)` without a key or with an
    /// empty log. The head entry must carry the key's MAC (a head written without the key, e.g. forged,
    /// is never signed). Errors: the store's (typed as [`crate::store_err`]), or `conflict` when the
    /// head entry is missing or unkeyed.
    pub async fn audit_checkpoint(&self) -> Result<Option<(Checkpoint, String)>, TbError> {
        let Some(key) = self.audit_key() else {
            return Ok(None);
        };
        let head = self.store.audit_head().await.map_err(store_err)?;
        if head.seq == 0 {
            return Ok(None);
        }
        let entry = self
            .store
            .audit_entries(AuditQuery {
                after_seq: Some(head.seq - 1),
                limit: 1,
                ..AuditQuery::default()
            })
            .await
            .map_err(store_err)?
            .into_iter()
            .next()
            .filter(|e| e.seq == head.seq && e.hash == head.hash);
        let keyed = entry
            .as_ref()
            .is_some_and(|e| tb_core::audit::mac(&key, &e.prev_hash, e.seq, &e.entry) == e.hash);
        if !keyed {
            return Err(TbError::new(
                ErrorCode::Conflict,
                format!(
                    "the audit log's head (entry {}) is missing or does not carry the audit key's MAC: not checkpointed; run `trigger-bridge audit list --verify`",
                    head.seq
                ),
            ));
        }
        Ok(Some((
            Checkpoint::of(&key, head.seq, &head.hash),
            head.hash,
        )))
    }
}

/// Exports a checkpoint of the audit log's head every `every` until `stop` turns true: the log line
/// `audit checkpoint seq=<seq> head=<hash> mac=<mac>` (when the head moved since the last one) and the
/// gauge `tb_audit_checkpoint_seq`. Keep these lines outside the database (the log collector):
/// `trigger-bridge audit list --verify --checkpoint <seq>:<mac>` proves the log still holds that head.
/// Without an audit key nothing is exported (a warning once).
pub async fn checkpoints(
    engine: Arc<Engine>,
    every: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut last: Option<i64> = None;
    let mut warned = false;
    loop {
        match engine.audit_checkpoint().await {
            Ok(Some((cp, head))) => {
                metrics::gauge!("tb_audit_checkpoint_seq").set(cp.seq as f64);
                if last != Some(cp.seq) {
                    tracing::info!(
                        seq = cp.seq,
                        head = %head,
                        mac = %cp.mac,
                        "audit checkpoint seq={} head={} mac={}",
                        cp.seq,
                        head,
                        cp.mac
                    );
                    last = Some(cp.seq);
                }
            }
            Ok(None) if engine.audit_key().is_none() && !warned => {
                warned = true;
                tracing::warn!("no audit key (TRIGGER_BRIDGE_SECRET_KEY is not set): the audit log is appended unkeyed and no checkpoint is exported");
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e.message, "audit checkpoint not exported"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            r = stop.changed() => if r.is_err() || *stop.borrow() { return },
        }
    }
}
