//! Batched commits (`crate::sql::batch`): concurrent receipt and attempt commits on one
//! store, started together behind a barrier on a multi-thread runtime. On PostgreSQL they share
//! transactions (one multi-row statement per table); each caller must still get its own answer: one
//! receipt per dedup key (a duplicate in the same batch included), one attempt per lease, a stale token
//! refused without touching the others. SQLite commits them one job at a time and must answer the same.
//! Every race is bounded (`support::race`, 60 s).

mod support;
use support::{delivered, race, receipt};

use std::collections::BTreeMap;
use std::sync::Arc;

use tb_core::delivery::DeliveryState;
use tb_core::ids::{new_id, IdKind};
use tb_core::receipt::ReceiptState;
use tb_core::run::RunStatus;
use trigger_bridge_store::postgres::testing::TestDatabase;
use trigger_bridge_store::postgres::{PgStore, PoolOptions};
use trigger_bridge_store::sqlite::SqliteStore;
use trigger_bridge_store::*;

/// Rounds a PostgreSQL race is repeated until a batch of several items formed (each round is a
/// fresh set of items).
const ROUNDS: usize = 5;

/// A store, what keeps its storage alive, and how to read its largest batches.
struct Handle {
    name: &'static str,
    store: Arc<dyn Store>,
    largest: Box<dyn Fn() -> (usize, usize) + Send + Sync>,
    _guard: Box<dyn std::any::Any + Send>,
}

/// SQLite always; PostgreSQL (8 connections, so 2 batches of each kind in flight) unless the server
/// is unreachable and `CI` is unset.
async fn handles() -> Vec<Handle> {
    let dir = tempfile::tempdir().expect("tempdir");
    let sqlite = Arc::new(SqliteStore::open_dir(dir.path()).expect("open sqlite"));
    let s2 = sqlite.clone();
    let mut out = vec![Handle {
        name: "sqlite",
        store: sqlite,
        largest: Box::new(move || s2.largest_batches()),
        _guard: Box::new(dir),
    }];
    if let Some(db) = TestDatabase::create() {
        let opts = PoolOptions {
            connections: 8,
            queue_capacity: 10_000,
        };
        let pg = Arc::new(
            PgStore::connect(db.url(), opts)
                .await
                .expect("open postgres"),
        );
        let p2 = pg.clone();
        out.push(Handle {
            name: "postgres",
            store: pg,
            largest: Box::new(move || p2.largest_batches()),
            _guard: Box::new(db),
        });
    }
    out
}

async fn subscription(s: &dyn Store, id: &str) {
    support::webhook_subscription(s, id).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_receipts_in_shared_transactions_keep_one_receipt_per_key_and_answer_each() {
    for h in handles().await {
        let s = h.store.clone();
        subscription(&*s, "hooks").await;
        let mut batched = false;
        for round in 0..ROUNDS {
            // 24 keys, each sent twice at once (a duplicate may share the first one's batch), every
            // third handed over at commit; one more receipt whose delivery is created dead-lettered
            // (the single path inside a batch).
            let n = 48;
            let results = race(n + 1, |i| {
                let s = s.clone();
                async move {
                    let r = if i == n {
                        receipt(&format!("r{round}-dead"), false, true)
                    } else {
                        let k = i / 2;
                        receipt(&format!("r{round}-k{k}"), k % 3 == 0, false)
                    };
                    let key = r.dedup_key.clone();
                    (key, r.id.clone(), s.commit_receipt(r).await)
                }
            })
            .await;
            let mut by_key: BTreeMap<String, Vec<(String, IngestOutcome)>> = BTreeMap::new();
            for (key, id, out) in results {
                let out = out.unwrap_or_else(|e| panic!("{}: {key}: {e}", h.name));
                by_key.entry(key).or_default().push((id, out));
            }
            assert_eq!(by_key.len(), 25, "{}", h.name);
            for (key, outs) in &by_key {
                let accepted: Vec<&(String, IngestOutcome)> = outs
                    .iter()
                    .filter(|(_, o)| matches!(o, IngestOutcome::Accepted { .. }))
                    .collect();
                assert_eq!(accepted.len(), 1, "{}: {key}: one receipt per key", h.name);
                let (first_id, first) = accepted[0];
                let IngestOutcome::Accepted {
                    receipt_id,
                    deliveries,
                    leased,
                } = first
                else {
                    unreachable!()
                };
                assert_eq!(receipt_id, first_id, "{}: {key}", h.name);
                assert_eq!(deliveries.len(), 1, "{}: {key}", h.name);
                let handed = key
                    .rsplit_once("-k")
                    .is_some_and(|(_, k)| k.parse::<usize>().unwrap() % 3 == 0);
                assert_eq!(leased.len(), usize::from(handed), "{}: {key}", h.name);
                let d = s.get_delivery(&deliveries[0].delivery_id).await.unwrap();
                assert_eq!(d.receipt_id, *receipt_id, "{}: {key}", h.name);
                if handed {
                    assert_eq!(d.lease_owner.as_deref(), Some("w"), "{}: {key}", h.name);
                    assert_eq!(d.lease_until, Some(leased[0].lease_until), "{}", h.name);
                } else {
                    assert_eq!(d.lease_owner, None, "{}: {key}", h.name);
                }
                let body = s.get_body(receipt_id).await.unwrap();
                assert_eq!(
                    &body[..],
                    format!("{{\"key\":\"{key}\"}}").as_bytes(),
                    "{}: {key}",
                    h.name
                );
                for (_, o) in outs {
                    if let IngestOutcome::Duplicate { receipt_id: of, .. } = o {
                        assert_eq!(of, receipt_id, "{}: {key}: names the first", h.name);
                    }
                }
                if key.ends_with("-dead") {
                    assert_eq!(d.state, DeliveryState::DeadLettered, "{}", h.name);
                    let attempts = s.attempts(&d.id).await.unwrap();
                    assert_eq!(attempts.len(), 1, "{}: the dead letter's record", h.name);
                } else {
                    assert_eq!(outs.len(), 2, "{}: {key}", h.name);
                    assert_eq!(d.state, DeliveryState::Pending, "{}: {key}", h.name);
                }
            }
            let (largest, _) = (h.largest)();
            if h.name == "sqlite" || largest > 1 {
                batched = true;
                break;
            }
        }
        eprintln!("{}: largest batches {:?}", h.name, (h.largest)());
        if h.name == "postgres" {
            assert!(
                batched,
                "postgres: no batch of several receipts formed in {ROUNDS} rounds"
            );
        } else {
            assert_eq!((h.largest)(), (0, 0), "sqlite commits one job at a time");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_attempts_in_shared_transactions_record_one_attempt_per_lease() {
    for h in handles().await {
        let s = h.store.clone();
        subscription(&*s, "hooks").await;
        let mut batched = false;
        for round in 0..ROUNDS {
            let n = 40;
            let mut leases = Vec::with_capacity(n);
            for k in 0..n {
                let out = s
                    .commit_receipt(receipt(&format!("a{round}-{k}"), true, false))
                    .await
                    .unwrap();
                let IngestOutcome::Accepted { mut leased, .. } = out else {
                    panic!("{}: a new key", h.name)
                };
                leases.push(leased.remove(0));
            }
            let leases = Arc::new(leases);
            // Every lease completed once; delivery 0 completed twice at once (one wins); delivery 1
            // also by a holder of a stale token (always refused).
            let results = race(n + 2, |i| {
                let (s, leases) = (s.clone(), leases.clone());
                async move {
                    let (k, token) = match i {
                        i if i < n => (i, leases[i].token.clone()),
                        i if i == n => (0, leases[0].token.clone()),
                        _ => (1, "stale-token".to_string()),
                    };
                    (k, i, s.commit_attempt(delivered(&leases[k], &token)).await)
                }
            })
            .await;
            let mut won: BTreeMap<usize, usize> = BTreeMap::new();
            for (k, i, out) in &results {
                match out {
                    Ok(done) => {
                        *won.entry(*k).or_default() += 1;
                        assert_eq!(
                            done.run_id.as_ref(),
                            leases[*k].delivery.run_id.as_ref(),
                            "{}",
                            h.name
                        );
                    }
                    Err(StoreError::LeaseLost(id)) => {
                        // Only delivery 0's two holders race (either may lose) and the stale one.
                        assert!(
                            (*k == 0 && (*i == 0 || *i == n)) || *i == n + 1,
                            "{}: attempt {i} on delivery {k} lost",
                            h.name
                        );
                        assert_eq!(id, &leases[*k].delivery.id, "{}", h.name);
                    }
                    Err(e) => panic!("{}: attempt {i}: {e}", h.name),
                }
            }
            assert_eq!(won.len(), n, "{}: every delivery completed", h.name);
            assert!(
                won.values().all(|c| *c == 1),
                "{}: once each: {won:?}",
                h.name
            );
            let stale = results.iter().find(|(_, i, _)| *i == n + 1).unwrap();
            assert!(
                matches!(stale.2, Err(StoreError::LeaseLost(_))),
                "{}: a stale token is refused",
                h.name
            );
            for l in leases.iter() {
                let d = s.get_delivery(&l.delivery.id).await.unwrap();
                assert_eq!(d.state, DeliveryState::Delivered, "{}", h.name);
                assert_eq!(d.attempts, 1, "{}", h.name);
                assert_eq!(d.lease_owner, None, "{}", h.name);
                let attempts = s.attempts(&l.delivery.id).await.unwrap();
                assert_eq!(attempts.len(), 1, "{}: one attempt row", h.name);
                let run_id = l.delivery.run_id.as_deref().unwrap();
                let run = s.get_run(run_id).await.unwrap();
                assert_eq!(run.status, RunStatus::Completed, "{}", h.name);
                let log = s.run_events(run_id, None, 100).await.unwrap();
                let seqs: Vec<u64> = log.iter().map(|e| e.sequence).collect();
                assert_eq!(
                    seqs,
                    (0..log.len() as u64).collect::<Vec<_>>(),
                    "{}",
                    h.name
                );
                assert!(
                    log.iter().any(|e| e.event_type == "run.started"),
                    "{}",
                    h.name
                );
                let r = s.get_receipt(&l.delivery.receipt_id).await.unwrap();
                assert_eq!(r.state, ReceiptState::Consumed, "{}", h.name);
            }
            let (_, largest) = (h.largest)();
            if h.name == "sqlite" || largest > 1 {
                batched = true;
                break;
            }
        }
        eprintln!("{}: largest batches {:?}", h.name, (h.largest)());
        if h.name == "postgres" {
            assert!(
                batched,
                "postgres: no batch of several attempts formed in {ROUNDS} rounds"
            );
        }
    }
}

/// A receipt routed to two bindings, both deliveries handed to worker `w` at commit.
fn two_bindings(key: &str) -> NewReceipt {
    let mut r = receipt(key, true, false);
    let mut second = r.deliveries[0].clone();
    second.id = new_id(IdKind::Delivery);
    second.binding_id = "other".into();
    second.run_id = Some(new_id(IdKind::Run));
    r.deliveries.push(second);
    r.lease = Some(LeaseRequest {
        owner: "w".into(),
        lease_ms: 60_000,
        limit: 2,
    });
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sibling_deliveries_completed_at_once_settle_their_receipt() {
    for h in handles().await {
        let s = h.store.clone();
        subscription(&*s, "hooks").await;
        // 16 receipts of two deliveries each; all 32 attempts race, so siblings share batches.
        let mut leases = Vec::new();
        let mut receipts = Vec::new();
        for k in 0..16 {
            let out = s
                .commit_receipt(two_bindings(&format!("sib-{k}")))
                .await
                .unwrap();
            let IngestOutcome::Accepted {
                receipt_id, leased, ..
            } = out
            else {
                panic!("{}: a new key", h.name)
            };
            assert_eq!(leased.len(), 2, "{}", h.name);
            receipts.push(receipt_id);
            leases.extend(leased);
        }
        let leases = Arc::new(leases);
        let results = race(leases.len(), |i| {
            let (s, leases) = (s.clone(), leases.clone());
            async move {
                s.commit_attempt(delivered(&leases[i], &leases[i].token))
                    .await
            }
        })
        .await;
        for (i, r) in results.iter().enumerate() {
            assert!(r.is_ok(), "{}: attempt {i}: {r:?}", h.name);
        }
        for id in &receipts {
            let r = s.get_receipt(id).await.unwrap();
            assert_eq!(
                r.state,
                ReceiptState::Consumed,
                "{}: {id}: both deliveries ended, so the receipt settles",
                h.name
            );
        }
        eprintln!("{}: largest batches {:?}", h.name, (h.largest)());
    }
}

/// Commits waiting for a batch are bounded by the pool's queue: past it, a commit is refused `Busy` at
/// once (nothing written for it), and every commit that was answered `Accepted` is in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn past_the_queue_bound_a_commit_is_refused_busy_and_nothing_is_lost() {
    let Some(db) = TestDatabase::create() else {
        return; // the reason is printed by `TestDatabase::create` (never skipped under CI)
    };
    let opts = PoolOptions {
        connections: 4,
        queue_capacity: 4,
    };
    let s: Arc<dyn Store> = Arc::new(PgStore::connect(db.url(), opts).await.unwrap());
    subscription(&*s, "hooks").await;
    let results = race(200, |i| {
        let s = s.clone();
        async move {
            let r = receipt(&format!("busy-{i}"), false, false);
            let id = r.id.clone();
            (id, s.commit_receipt(r).await)
        }
    })
    .await;
    let (mut accepted, mut busy) = (Vec::new(), 0);
    for (id, out) in results {
        match out {
            Ok(IngestOutcome::Accepted { receipt_id, .. }) => {
                assert_eq!(receipt_id, id);
                accepted.push(id);
            }
            Err(StoreError::Busy(m)) => {
                assert!(m.contains("retry"), "{m}");
                busy += 1;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(
        busy > 0,
        "200 commits at once on a queue of 4 must refuse some"
    );
    assert_eq!(accepted.len() + busy, 200);
    for id in &accepted {
        s.get_receipt(id).await.unwrap();
    }
    let all = s
        .list_receipts(ListQuery {
            limit: 500,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.len(), accepted.len(), "a refused commit wrote nothing");
}

/// A receipt whose statement fails (its id taken by another receipt) fails alone: the batch it shares
/// is rolled back and its items are committed again one per transaction, so the others are accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_failing_receipt_does_not_fail_the_batch_it_shares() {
    for h in handles().await {
        let s = h.store.clone();
        subscription(&*s, "hooks").await;
        let n = 40;
        let mut receipts: Vec<NewReceipt> = (0..n)
            .map(|k| receipt(&format!("bad-{k}"), false, false))
            .collect();
        // Receipt 1 reuses receipt 0's id under another dedup key: one of the two must fail.
        receipts[1].id = receipts[0].id.clone();
        let receipts = Arc::new(receipts);
        let results = race(n, |i| {
            let (s, receipts) = (s.clone(), receipts.clone());
            async move { s.commit_receipt(receipts[i].clone()).await }
        })
        .await;
        let failed: Vec<usize> = (0..n).filter(|i| results[*i].is_err()).collect();
        assert_eq!(
            failed.len(),
            1,
            "{}: only one of the pair fails: {failed:?}",
            h.name
        );
        assert!(failed[0] <= 1, "{}: {failed:?}", h.name);
        assert!(
            matches!(results[failed[0]], Err(StoreError::Database(_))),
            "{}: {:?}",
            h.name,
            results[failed[0]]
        );
        for (i, r) in results.iter().enumerate() {
            if i != failed[0] {
                assert!(
                    matches!(r, Ok(IngestOutcome::Accepted { .. })),
                    "{}: receipt {i}: {r:?}",
                    h.name
                );
            }
        }
        eprintln!("{}: largest batches {:?}", h.name, (h.largest)());
    }
}
