//! An attempt whose outcome never reached the store is counted when its lease is taken over
//! (docs/operations.md "Lost attempts"; rule `tb_core::lease::take_over`, writes
//! `tb_core::attempt::lost`), on SQLite and on PostgreSQL: the attempt log then counts every attempt a
//! worker may have seen, as the delivery's `attempts` does.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::json;
use tb_core::attempt::{AttemptFailure, AttemptReport};
use tb_core::delivery::{AttemptDecision, AttemptOutcome, DeliveryState};
use tb_core::ids::{new_id, IdKind};
use tb_core::lease::Completion;
use tb_core::receipt::ReceiptState;
use tb_core::subscription::{FailurePolicy, Source};
use trigger_bridge_store::postgres::testing::TestDatabase;
use trigger_bridge_store::postgres::{PgStore, PoolOptions};
use trigger_bridge_store::sqlite::SqliteStore;
use trigger_bridge_store::*;

type Guard = Box<dyn std::any::Any + Send>;

/// A fresh store of each backend: SQLite in a temp dir, PostgreSQL in a schema of its own (skipped
/// with a printed reason only when the server is unreachable and `CI` is unset).
async fn backends() -> Vec<(&'static str, Arc<dyn Store>, Guard)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = SqliteStore::open_dir(dir.path()).expect("open sqlite");
    let mut out: Vec<(&'static str, Arc<dyn Store>, Guard)> =
        vec![("sqlite", Arc::new(s), Box::new(dir))];
    if let Some(db) = TestDatabase::create() {
        let pg = PgStore::connect(db.url(), PoolOptions::default())
            .await
            .expect("open postgres");
        out.push(("postgresql", Arc::new(pg), Box::new(db)));
    }
    out
}

async fn sub(store: &dyn Store) {
    store
        .upsert_subscription(
            SubscriptionDef {
                id: "s".into(),
                source: Source::Webhook,
                connector: "github".into(),
                config: json!({}),
                failure_threshold: 0,
            },
            1_000,
        )
        .await
        .unwrap();
}

/// A receipt with one pending `start_run` delivery; its delivery id.
async fn one_delivery(store: &dyn Store, key: &str) -> String {
    let d = new_id(IdKind::Delivery);
    let r = NewReceipt {
        id: new_id(IdKind::Receipt),
        source: tb_core::receipt::ReceiptSource::Webhook,
        subscription_id: "s".into(),
        dedup_key: key.into(),
        provider_event_id: format!("pe-{key}"),
        event_type: "push".into(),
        normalized: json!({"event": "push"}),
        state: ReceiptState::Routed,
        content_type: Some("application/json".into()),
        body: Bytes::from_static(b"{}"),
        received_at: 2_000,
        dedup_until: 2_000 + 86_400_000,
        deliveries: vec![NewDelivery {
            id: d.clone(),
            kind: tb_core::delivery::DeliveryKind::Binding,
            binding_id: "b1".into(),
            action: "start_run".into(),
            workflow_id: Some("noop".into()),
            run_id: Some(new_id(IdKind::Run)),
            inputs: json!({}),
            params: None,
            state: DeliveryState::Pending,
            dead_letter_reason: None,
        }],
        capability: None,
        lease: None,
        trace_context: None,
    };
    store.commit_receipt(r).await.unwrap();
    d
}

/// The commit of the attempt `lease` was granted for: delivered, or failed and retried at once.
fn commit(lease: &Lease, delivered: bool, now: i64) -> AttemptCommit {
    AttemptCommit {
        delivery_id: lease.delivery.id.clone(),
        report: AttemptReport {
            lease: Completion {
                token: lease.token.clone(),
                attempt: lease.delivery.attempts + 1,
            },
            event_id: new_id(IdKind::Event),
            decision: if delivered {
                AttemptDecision::Delivered
            } else {
                AttemptDecision::Retry { delay_ms: 0 }
            },
            failure: (!delivered).then(|| AttemptFailure {
                error_class: "http_500".into(),
                message: None,
                permanent: false,
            }),
            started_at: now,
            duration_ms: 3,
            run: None,
            effect: None,
            failure_policy: FailurePolicy::default(),
        },
        effect: None,
        now,
    }
}

fn outcomes(attempts: &[AttemptRecord]) -> Vec<(u32, AttemptOutcome, Option<&str>)> {
    attempts
        .iter()
        .map(|a| (a.attempt, a.outcome, a.error_class.as_deref()))
        .collect()
}

#[tokio::test]
async fn a_lapsed_lease_taken_over_records_its_attempt_lost() {
    for (backend, store, _guard) in backends().await {
        sub(&*store).await;
        let id = one_delivery(&*store, "dk_lost").await;
        // Attempt 1 is leased until 3 000; its worker performs the action, but its commit never
        // reaches the store.
        let first = store
            .lease_due("w1", 2_000, 1_000, 10)
            .await
            .unwrap()
            .remove(0);
        assert_eq!(
            (first.delivery.attempts, first.lost),
            (0, None),
            "{backend}"
        );
        // Taken over once lapsed: attempt 1 is recorded lost in the same grant, the new grant's
        // attempt is number 2.
        let second = store
            .lease_due("w2", 3_000, 1_000, 10)
            .await
            .unwrap()
            .remove(0);
        assert_eq!(second.delivery.id, id);
        assert_eq!(
            (second.delivery.attempts, second.lost),
            (1, Some(1)),
            "{backend}"
        );
        assert_eq!(second.delivery.last_error.as_deref(), Some("lease_expired"));
        assert_eq!(second.delivery.first_attempt_at, Some(3_000));
        let a = store.attempts(&id).await.unwrap();
        assert_eq!(
            outcomes(&a),
            vec![(1, AttemptOutcome::Lost, Some("lease_expired"))],
            "{backend}"
        );
        assert_eq!(
            (a[0].started_at, a[0].duration_ms, a[0].next_due_at),
            (3_000, 0, None),
            "{backend}: started at the lapse (the real start is not known)"
        );
        assert_eq!(
            a[0].message.as_deref(),
            Some(tb_core::attempt::LOST_MESSAGE)
        );
        // The first worker's late commit is refused; the second's is attempt 2.
        assert!(matches!(
            store.commit_attempt(commit(&first, true, 3_050)).await,
            Err(StoreError::LeaseLost(_))
        ));
        store
            .commit_attempt(commit(&second, true, 3_100))
            .await
            .unwrap();
        let d = store.get_delivery(&id).await.unwrap();
        assert_eq!(
            (d.state, d.attempts),
            (DeliveryState::Delivered, 2),
            "{backend}"
        );
        assert_eq!(
            outcomes(&store.attempts(&id).await.unwrap()),
            vec![
                (1, AttemptOutcome::Lost, Some("lease_expired")),
                (2, AttemptOutcome::Delivered, None)
            ],
            "{backend}"
        );
        // A released lease (given back without an attempt) and a recorded attempt are no loss.
        let other = one_delivery(&*store, "dk_released").await;
        let l = store
            .lease_due("w1", 4_000, 1_000, 10)
            .await
            .unwrap()
            .remove(0);
        assert_eq!(l.delivery.id, other);
        store.release_lease(&other, &l.token, 4_000).await.unwrap();
        let l = store
            .lease_due("w1", 4_000, 1_000, 10)
            .await
            .unwrap()
            .remove(0);
        assert_eq!(
            (l.delivery.attempts, l.lost),
            (0, None),
            "{backend}: released"
        );
        store
            .commit_attempt(commit(&l, false, 4_010))
            .await
            .unwrap();
        let l = store
            .lease_due("w1", 5_000, 1_000, 10)
            .await
            .unwrap()
            .remove(0);
        assert_eq!(
            (l.delivery.attempts, l.lost),
            (1, None),
            "{backend}: retried"
        );
        assert_eq!(store.attempts(&other).await.unwrap().len(), 1);
    }
}

/// A worker whose store connection is cut between performing an attempt and committing it (every
/// fourth delivery of 100, in each of two rounds): the commit never reaches the store, the lease
/// lapses, the delivery is leased again and performed again. The attempt log must count every
/// time the worker performed it.
#[tokio::test]
async fn attempts_counted_after_a_connection_cut_match_what_the_worker_saw() {
    const N: usize = 100;
    for (backend, store, _guard) in backends().await {
        sub(&*store).await;
        let mut ids = Vec::with_capacity(N);
        for i in 0..N {
            ids.push(one_delivery(&*store, &format!("dk_{i}")).await);
        }
        let mut seen: HashMap<String, u32> = HashMap::new();
        let mut cuts = 0;
        let mut now = 10_000;
        for round in 0..3 {
            let leases = store.lease_due("w", now, 1_000, 1_000).await.unwrap();
            for (i, l) in leases.iter().enumerate() {
                // The worker performs the action (the target sees it) ...
                *seen.entry(l.delivery.id.clone()).or_default() += 1;
                // ... then commits it, unless the connection is cut (rounds 0 and 1).
                if round < 2 && i % 4 == 0 {
                    cuts += 1;
                    continue;
                }
                store
                    .commit_attempt(commit(l, true, now + 10))
                    .await
                    .unwrap();
            }
            now += 1_000; // past every lease of this round
        }
        let mut logged = 0;
        let mut lost = 0;
        let mut mismatched = Vec::new();
        for id in &ids {
            let a = store.attempts(id).await.unwrap();
            let d = store.get_delivery(id).await.unwrap();
            assert_eq!(d.state, DeliveryState::Delivered, "{backend} {id}");
            logged += a.len();
            lost += a
                .iter()
                .filter(|a| a.outcome == AttemptOutcome::Lost)
                .count();
            let numbers: Vec<u32> = a.iter().map(|a| a.attempt).collect();
            let want: Vec<u32> = (1..=seen[id]).collect();
            if a.len() as u32 != seen[id] || d.attempts != seen[id] || numbers != want {
                mismatched.push((id.clone(), seen[id], a.len(), d.attempts));
            }
        }
        let performed: u32 = seen.values().sum();
        println!(
            "{backend}: {N} deliveries, {cuts} commits cut: the worker performed {performed} attempts; \
             the attempt log holds {logged} ({lost} lost); mismatched deliveries {}",
            mismatched.len()
        );
        assert!(mismatched.is_empty(), "{backend}: {mismatched:?}");
        assert_eq!((performed as usize, lost), (logged, cuts), "{backend}");
    }
}

/// The same over real connection cuts on PostgreSQL: four worker loops lease, "perform" (count) and
/// commit 200 deliveries while another connection terminates the store's connections every 10 ms
/// (`pg_terminate_backend`, selected by this store's own `application_name`). A commit cut mid-way
/// fails (its fate unknown to the worker, which moves on as the engine's worker does: the lease
/// lapses). No delivery may show fewer attempts than the worker performed. It may show more: a lease
/// whose own commit was cut is taken over as `lost` though nothing was performed under it (a lost
/// attempt is one that may have reached the target).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgresql_real_connection_cuts_never_hide_an_attempt() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::{Duration, Instant};
    const N: usize = 200;
    const LEASE_MS: u64 = 300;
    let Some(db) = TestDatabase::create() else {
        return; // the reason is printed by `TestDatabase::create` (never skipped under CI)
    };
    let app = format!("tb_cut_{}", &new_id(IdKind::Event)[4..20]);
    let url = format!("{}&application_name={app}", db.url());
    let opts = PoolOptions {
        connections: 4,
        queue_capacity: 1_000,
    };
    let store: Arc<dyn Store> = Arc::new(PgStore::connect(&url, opts).await.unwrap());
    sub(&*store).await;
    let mut ids = Vec::with_capacity(N);
    for i in 0..N {
        ids.push(one_delivery(&*store, &format!("dk_cut_{i}")).await);
    }
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    let stop = Arc::new(AtomicBool::new(false));
    let killed = Arc::new(AtomicUsize::new(0));
    let killer = {
        let (stop, killed, cfg, app) = (stop.clone(), killed.clone(), db.config(), app.clone());
        std::thread::spawn(move || {
            let mut c = trigger_bridge_store::postgres::connect(&cfg).unwrap();
            let sql = format!(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE application_name = '{app}'"
            );
            while !stop.load(Ordering::Relaxed) {
                let n: i64 = c.query_one(sql.as_str(), &[]).unwrap().get(0);
                killed.fetch_add(n as usize, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let seen: Arc<Mutex<HashMap<String, u32>>> = Default::default();
    let cut = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs(60);
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (store, seen, cut) = (store.clone(), seen.clone(), cut.clone());
            tokio::spawn(async move {
                loop {
                    assert!(Instant::now() < deadline, "not drained in 60 s");
                    let leases = match store.lease_due(&format!("w{w}"), now(), LEASE_MS, 8).await {
                        Ok(l) => l,
                        Err(_) => {
                            // Cut: its leases (if it committed) lapse. A pause, so the retry is
                            // not a tight loop while the connection is re-established.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            continue;
                        }
                    };
                    if leases.is_empty() {
                        // Done only when the store says no delivery is open (a leased one keeps
                        // its `due_at`); an error (a cut connection) is not "no work left".
                        if let Ok(None) = store.next_due_at().await {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    for l in &leases {
                        *seen
                            .lock()
                            .unwrap()
                            .entry(l.delivery.id.clone())
                            .or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(2)).await; // the POST
                        match store.commit_attempt(commit(l, true, now())).await {
                            Ok(_) => {}
                            Err(StoreError::LeaseLost(_)) => {}
                            Err(_) => {
                                cut.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
            })
        })
        .collect();
    // Cut for the first second, then let the backlog drain.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    killer.join().unwrap();
    for w in workers {
        w.await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    let (mut logged, mut lost, mut fewer, mut more) = (0, 0, Vec::new(), 0);
    for id in &ids {
        let a = store.attempts(id).await.unwrap();
        let d = store.get_delivery(id).await.unwrap();
        assert_eq!(d.state, DeliveryState::Delivered, "{id}");
        let numbers: Vec<u32> = a.iter().map(|a| a.attempt).collect();
        assert_eq!(numbers, (1..=d.attempts).collect::<Vec<_>>(), "{id}");
        logged += a.len();
        lost += a
            .iter()
            .filter(|a| a.outcome == AttemptOutcome::Lost)
            .count();
        let performed = seen.get(id).copied().unwrap_or(0);
        match (a.len() as u32).cmp(&performed) {
            std::cmp::Ordering::Less => fewer.push((id.clone(), performed, a.len())),
            std::cmp::Ordering::Greater => more += 1,
            std::cmp::Ordering::Equal => {}
        }
    }
    let performed: u32 = seen.values().sum();
    let twice = seen.values().filter(|n| **n > 1).count();
    println!(
        "postgresql, real cuts: {} backends terminated; {} commits failed; the worker performed \
         {performed} attempts ({twice} deliveries twice or more); the attempt log holds {logged} \
         ({lost} lost); deliveries with fewer attempts logged than performed {}, with more {more}",
        killed.load(Ordering::Relaxed),
        cut.load(Ordering::Relaxed),
        fewer.len()
    );
    assert!(fewer.is_empty(), "attempts hidden: {fewer:?}");
}
