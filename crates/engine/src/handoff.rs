//! Hand-off at commit: a receipt committed on a replica whose worker has free slots has its
//! `pending` deliveries written already leased to that worker in the receipt's own transaction
//! ([`tb_store::NewReceipt::lease`]), and the worker attempts them without a lease transaction. The
//! lease still covers a crash: a handed lease that is never completed lapses after `lease_ms`, and any
//! worker's `lease_due` then takes the delivery with a new token.
//!
//! Slots are reserved before the commit (one worker permit per delivery to lease, taken only if free
//! now: a commit never waits for a slot) and travel with each handed lease to the worker through a
//! bounded channel; a failed commit, or a delivery that was not leased, releases its permit at once.
//! Without a worker attached (role `api`, tests without a worker) nothing is reserved and nothing is
//! leased at commit.

use std::sync::{Arc, Mutex};

use tb_store::{Lease, LeaseRequest};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};

/// A lease granted at commit with the worker slot reserved for it.
#[derive(Debug)]
pub struct Handed {
    pub lease: Lease,
    /// Released when the attempt ends (or the lease is dropped unattempted).
    pub permit: OwnedSemaphorePermit,
    /// The receipt's event type, known at commit: the `http` executor sends it, and need not read the
    /// receipt for it.
    pub event_type: String,
}

/// The local worker, as the commit path sees it.
struct Local {
    owner: String,
    lease_ms: u64,
    permits: Arc<Semaphore>,
    tx: mpsc::Sender<Handed>,
}

/// The engine's side of the hand-off: which worker (if any) takes deliveries leased at commit.
#[derive(Default)]
pub struct HandOff {
    local: Mutex<Option<Local>>,
}

/// Worker slots reserved for one commit, and where its leases go.
pub struct Reservation {
    request: LeaseRequest,
    permits: Vec<OwnedSemaphorePermit>,
    tx: mpsc::Sender<Handed>,
}

impl HandOff {
    /// Attaches the local worker `owner` (lease length `lease_ms`, ms): commits then lease up to as many
    /// deliveries as `permits` has free, and send them on `tx` with their permits.
    pub fn attach(
        &self,
        owner: &str,
        lease_ms: u64,
        permits: Arc<Semaphore>,
        tx: mpsc::Sender<Handed>,
    ) {
        *self.local.lock().expect("hand-off lock") = Some(Local {
            owner: owner.to_string(),
            lease_ms,
            permits,
            tx,
        });
    }

    /// Detaches the worker (shutdown): later commits lease nothing; commits that reserved already still
    /// send their leases (the worker drains them until every reservation is gone).
    pub fn detach(&self) {
        self.local.lock().expect("hand-off lock").take();
    }

    /// Reserves up to `wanted` free worker slots for one commit; `None` without a worker, when `wanted`
    /// is 0, or when no slot is free (the deliveries are then written due, as without a hand-off).
    pub fn reserve(&self, wanted: usize) -> Option<Reservation> {
        if wanted == 0 {
            return None;
        }
        let guard = self.local.lock().expect("hand-off lock");
        let local = guard.as_ref()?;
        let permits: Vec<OwnedSemaphorePermit> = (0..wanted)
            .map_while(|_| local.permits.clone().try_acquire_owned().ok())
            .collect();
        if permits.is_empty() {
            return None;
        }
        Some(Reservation {
            request: LeaseRequest {
                owner: local.owner.clone(),
                lease_ms: local.lease_ms,
                limit: permits.len() as u32,
            },
            permits,
            tx: local.tx.clone(),
        })
    }
}

impl Reservation {
    /// What the commit is to lease ([`tb_store::NewReceipt::lease`]).
    pub fn request(&self) -> LeaseRequest {
        self.request.clone()
    }

    /// Sends the commit's `leased` deliveries (of a receipt of type `event_type`) to the worker, each
    /// with one reserved permit; permits left over are released. Returns how many were handed: a lease
    /// the worker can no longer take (it stopped) is dropped and lapses.
    pub fn deliver(self, leased: Vec<Lease>, event_type: &str) -> usize {
        let mut handed = 0;
        for (lease, permit) in leased.into_iter().zip(self.permits) {
            let h = Handed {
                lease,
                permit,
                event_type: event_type.to_string(),
            };
            match self.tx.try_send(h) {
                Ok(()) => handed += 1,
                Err(e) => {
                    tracing::warn!(error = %e, "worker gone; a delivery leased at commit will lapse and be leased again")
                }
            }
        }
        handed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(id: &str) -> Lease {
        Lease {
            delivery: tb_store::DeliveryRecord {
                id: id.into(),
                receipt_id: "rcpt_1".into(),
                subscription_id: "s".into(),
                binding_id: "b".into(),
                dedup_key: "k".into(),
                action: "start_run".into(),
                workflow_id: None,
                run_id: None,
                inputs: serde_json::json!({}),
                state: tb_core::delivery::DeliveryState::Pending,
                attempts: 0,
                due_at: Some(3_000),
                lease_until: Some(3_000),
                first_attempt_at: None,
                last_error: None,
                dead_letter_reason: None,
                created_at: 2_000,
                updated_at: 2_000,
                lease_owner: Some("w".into()),
                replays: 0,
                params: None,
                consumed_at: None,
                kind: tb_core::delivery::DeliveryKind::Binding,
                trace_context: None,
            },
            owner: "w".into(),
            token: "lse_1".into(),
            lease_until: 3_000,
            lease_ms: 1_000,
            lost: None,
        }
    }

    #[tokio::test]
    async fn only_free_slots_are_reserved_and_unused_ones_come_back() {
        let h = HandOff::default();
        assert!(h.reserve(1).is_none(), "no worker attached");
        let permits = Arc::new(Semaphore::new(2));
        let (tx, mut rx) = mpsc::channel(2);
        h.attach("w", 1_000, permits.clone(), tx);
        assert!(h.reserve(0).is_none());
        let r = h.reserve(3).expect("two slots free");
        assert_eq!(
            r.request(),
            LeaseRequest {
                owner: "w".into(),
                lease_ms: 1_000,
                limit: 2
            }
        );
        assert_eq!(permits.available_permits(), 0);
        assert!(h.reserve(1).is_none(), "every slot is reserved");
        // The commit leased one of the two: one slot goes with it, the other is free again.
        assert_eq!(r.deliver(vec![lease("dlv_1")], "thing.happened"), 1);
        assert_eq!(permits.available_permits(), 1);
        let got = rx.recv().await.unwrap();
        assert_eq!(got.lease.delivery.id, "dlv_1");
        assert_eq!(got.event_type, "thing.happened");
        drop(got);
        assert_eq!(
            permits.available_permits(),
            2,
            "the attempt's end frees its slot"
        );
        // A failed commit delivers nothing: its reservation's slots are freed when it is dropped.
        drop(h.reserve(2).unwrap());
        assert_eq!(permits.available_permits(), 2);
        h.detach();
        assert!(h.reserve(1).is_none(), "detached");
        assert!(
            rx.recv().await.is_none(),
            "the channel ends once the worker is detached"
        );
    }
}
