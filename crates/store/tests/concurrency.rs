//! The session path under real concurrency (DESIGN §9): several store handles on ONE database, tasks on
//! a multi-thread runtime started together behind a barrier. On PostgreSQL each handle is a `PgStore` of
//! its own (its own connection pool, as a replica has) on one `TestDatabase` schema; on SQLite the tasks
//! share one `SqliteStore` (one process, one writer). Every race is bounded (`support::race`, 60 s).

mod support;
use support::race;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::json;
use tb_core::attempt::AttemptReport;
use tb_core::delivery::{AttemptDecision, DeliveryState};
use tb_core::ids::{new_id, IdKind};
use tb_core::lease::Completion;
use tb_core::receipt::ReceiptState;
use tb_core::run::RunStatus;
use tb_core::signal::{DataPlacement, MailboxPolicy, SignalSource, SourceKind};
use tb_core::subscription::{FailurePolicy, Source};
use tb_core::turn::TurnState;
use tb_core::wait::{WaitKind, WaitSpec, WaitState};
use trigger_bridge_store::postgres::testing::TestDatabase;
use trigger_bridge_store::postgres::{PgStore, PoolOptions};
use trigger_bridge_store::sqlite::SqliteStore;
use trigger_bridge_store::*;

/// What keeps a backend's storage alive for the length of a test.
type Guard = Box<dyn std::any::Any + Send>;

/// `n` handles on one database per backend available here: SQLite (one store, shared) always;
/// PostgreSQL (`n` stores, 2 connections each, one schema) unless the server is unreachable and `CI`
/// is unset.
async fn handles(n: usize) -> Vec<(&'static str, Vec<Arc<dyn Store>>, Guard)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let s: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).expect("open sqlite"));
    let mut out = vec![("sqlite", vec![s; n], Box::new(dir) as Guard)];
    if let Some(db) = TestDatabase::create() {
        let mut stores: Vec<Arc<dyn Store>> = Vec::new();
        for _ in 0..n {
            let opts = PoolOptions {
                connections: 2,
                queue_capacity: 1_000,
            };
            let pg = PgStore::connect(db.url(), opts)
                .await
                .expect("open postgres");
            stores.push(Arc::new(pg));
        }
        out.push(("postgres", stores, Box::new(db)));
    }
    out
}

const IMMEDIATE: FailurePolicy = FailurePolicy {
    failure_window_ms: 0,
    dead_letter_after_ms: 0,
    dead_letter_min_failures: 1,
};

async fn subscription(s: &dyn Store, id: &str) {
    s.upsert_subscription(
        SubscriptionDef {
            id: id.into(),
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

/// A receipt with one pending `start_run` delivery of `pr-session` (coalesce key `key`, if any).
fn start_receipt(sub: &str, key: Option<&str>) -> NewReceipt {
    let dedup = new_id(IdKind::Receipt);
    NewReceipt {
        id: new_id(IdKind::Receipt),
        source: tb_core::receipt::ReceiptSource::Webhook,
        subscription_id: sub.into(),
        dedup_key: dedup.clone(),
        provider_event_id: dedup,
        event_type: "pull_request.opened".into(),
        normalized: json!({"event": "pull_request", "action": "opened"}),
        state: ReceiptState::Routed,
        content_type: Some("application/json".into()),
        body: Bytes::from_static(b"{}"),
        received_at: 2_000,
        dedup_until: 2_000 + 86_400_000,
        deliveries: vec![NewDelivery {
            id: new_id(IdKind::Delivery),
            kind: tb_core::delivery::DeliveryKind::Binding,
            binding_id: "start".into(),
            action: "start_run".into(),
            workflow_id: Some("pr-session".into()),
            run_id: Some(new_id(IdKind::Run)),
            inputs: json!({}),
            params: key.map(|k| json!({"coalesceKey": k})),
            state: DeliveryState::Pending,
            dead_letter_reason: None,
        }],
        capability: None,
        lease: None,
        trace_context: None,
    }
}

/// The delivered attempt of `lease` performing `effect`.
fn delivered(lease: &Lease, effect: Effect, now: i64) -> AttemptCommit {
    AttemptCommit {
        delivery_id: lease.delivery.id.clone(),
        report: AttemptReport {
            lease: Completion {
                token: lease.token.clone(),
                attempt: lease.delivery.attempts + 1,
            },
            event_id: new_id(IdKind::Event),
            decision: AttemptDecision::Delivered,
            failure: None,
            started_at: now,
            duration_ms: 1,
            run: None,
            effect: None,
            failure_policy: IMMEDIATE,
        },
        effect: Some(effect),
        now,
    }
}

fn session_start(run_id: &str, coalesce: Option<Coalesce>) -> Effect {
    Effect::StartSession {
        run: NewRun {
            id: run_id.into(),
            workflow_id: "pr-session".into(),
            inputs: json!({}),
            status: RunStatus::Running,
            dead_letter: None,
            session: Some((json!({"system": "start"}), MailboxPolicy::default())),
        },
        coalesce: coalesce.map(Box::new),
    }
}

/// A running session run (started through a delivery, no coalescing); returns its id.
async fn session_run(s: &dyn Store) -> String {
    s.commit_receipt(start_receipt("gh", None)).await.unwrap();
    let lease = s.lease_due("w", 2_001, 60_000, 1).await.unwrap().remove(0);
    let run_id = lease.delivery.run_id.clone().unwrap();
    let done = s
        .commit_attempt(delivered(&lease, session_start(&run_id, None), 2_002))
        .await
        .unwrap();
    assert_eq!(done.run_id.as_deref(), Some(run_id.as_str()));
    run_id
}

fn api_signal(id: &str, name: &str) -> NewSignal {
    NewSignal {
        signal_id: id.into(),
        name: name.into(),
        source: SignalSource {
            kind: SourceKind::Api,
            receipt_id: None,
            actor_id: None,
        },
        data: DataPlacement::None,
        wake: false,
        delivery_id: None,
    }
}

/// The run's whole event log; asserts its sequences are 0, 1, 2, ... without a gap or a repeat.
async fn gapless_log(s: &dyn Store, run: &str) -> Vec<RunEventRecord> {
    let log = s.run_events(run, None, 10_000).await.unwrap();
    let seqs: Vec<u64> = log.iter().map(|e| e.sequence).collect();
    assert_eq!(seqs, (0..log.len() as u64).collect::<Vec<_>>());
    log
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn first_events_for_one_key_through_eight_handles_start_one_session_then_one_takes_over() {
    for (backend, stores, _guard) in handles(8).await {
        let s0 = stores[0].clone();
        subscription(&*s0, "gh").await;
        for _ in 0..8 {
            s0.commit_receipt(start_receipt("gh", Some("o/r#7")))
                .await
                .unwrap();
        }
        let leases = s0.lease_due("w", 2_001, 60_000, 10).await.unwrap();
        assert_eq!(leases.len(), 8);
        let leases = Arc::new(leases);
        let results = race(8, |i| {
            let (s, leases) = (stores[i].clone(), leases.clone());
            async move {
                let lease = &leases[i];
                let run_id = lease.delivery.run_id.clone().unwrap();
                let d = lease.delivery.id.clone();
                let co = Coalesce {
                    workflow_id: "pr-session".into(),
                    key: "o/r#7".into(),
                    on_existing: tb_core::binding::OnExisting::Signal,
                    signal: Some(NewSignal {
                        delivery_id: Some(d.clone()),
                        ..api_signal(&d, "pr.synchronize")
                    }),
                    prompt: None,
                };
                let done = s
                    .commit_attempt(delivered(lease, session_start(&run_id, Some(co)), 3_000))
                    .await;
                (run_id, done)
            }
        })
        .await;
        let mut started = Vec::new();
        let mut joined = BTreeMap::new();
        for (own, done) in results {
            let target = done
                .unwrap_or_else(|e| panic!("{backend}: {e}"))
                .run_id
                .unwrap();
            if target == own {
                started.push(own);
            } else {
                joined.insert(own, target);
            }
        }
        assert_eq!(started.len(), 1, "{backend}: exactly one session starts");
        let session = &started[0];
        assert_eq!(joined.len(), 7, "{backend}");
        assert!(
            joined.values().all(|t| t == session),
            "{backend}: all join it"
        );
        for own in joined.keys() {
            assert!(
                matches!(s0.get_run(own).await, Err(StoreError::NotFound { .. })),
                "{backend}: a joiner's run is never written"
            );
        }
        let turns = s0.list_turns(session).await.unwrap();
        assert_eq!(turns.len(), 1, "{backend}: one start turn");
        let sigs = s0.list_signals(session, None, 500).await.unwrap().signals;
        let mut seqs: Vec<u64> = sigs.iter().map(|x| x.seq).collect();
        seqs.sort();
        assert_eq!(
            seqs,
            (1..=7).collect::<Vec<_>>(),
            "{backend}: one signal per joiner"
        );
        gapless_log(&*s0, session).await;

        // The session ends; four new first events race again: one takes the key over, three join it.
        s0.finish_run(session, RunStatus::Completed, None, 4_000)
            .await
            .unwrap();
        for _ in 0..4 {
            s0.commit_receipt(start_receipt("gh", Some("o/r#7")))
                .await
                .unwrap();
        }
        let leases = Arc::new(s0.lease_due("w", 4_001, 60_000, 10).await.unwrap());
        assert_eq!(leases.len(), 4);
        let results = race(4, |i| {
            let (s, leases) = (stores[i].clone(), leases.clone());
            async move {
                let lease = &leases[i];
                let run_id = lease.delivery.run_id.clone().unwrap();
                let co = Coalesce {
                    workflow_id: "pr-session".into(),
                    key: "o/r#7".into(),
                    on_existing: tb_core::binding::OnExisting::Noop,
                    signal: None,
                    prompt: None,
                };
                let done = s
                    .commit_attempt(delivered(lease, session_start(&run_id, Some(co)), 5_000))
                    .await;
                (run_id, done)
            }
        })
        .await;
        let targets: Vec<(String, String)> = results
            .into_iter()
            .map(|(own, done)| {
                (
                    own,
                    done.unwrap_or_else(|e| panic!("{backend}: {e}"))
                        .run_id
                        .unwrap(),
                )
            })
            .collect();
        let took_over: Vec<&String> = targets
            .iter()
            .filter(|(o, t)| o == t)
            .map(|(o, _)| o)
            .collect();
        assert_eq!(
            took_over.len(),
            1,
            "{backend}: one start takes the ended session's key over"
        );
        let second = took_over[0].clone();
        assert_ne!(&second, session);
        assert!(
            targets.iter().all(|(_, t)| *t == second),
            "{backend}: the others join it"
        );
        assert_eq!(
            s0.get_run(&second).await.unwrap().status,
            RunStatus::Running
        );
        assert_eq!(
            s0.get_run(session).await.unwrap().status,
            RunStatus::Completed
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn signals_raised_through_three_handles_get_gapless_seqs_in_each_raisers_order() {
    const PER_RAISER: usize = 20;
    for (backend, stores, _guard) in handles(3).await {
        subscription(&*stores[0], "gh").await;
        let run = session_run(&*stores[0]).await;
        let outcomes = race(3, |i| {
            let (s, run) = (stores[i].clone(), run.clone());
            async move {
                let mut seqs = Vec::new();
                for j in 0..PER_RAISER {
                    let out = s
                        .raise_signal(&run, api_signal(&format!("r{i}-{j}"), "tick"), 3_000)
                        .await
                        .expect("raise");
                    assert_eq!(out.status, "queued");
                    seqs.push(out.signal["signalId"].as_str().unwrap().to_string());
                }
                seqs
            }
        })
        .await;
        let page = stores[0].list_signals(&run, None, 500).await.unwrap();
        assert_eq!(page.buffered, 3 * PER_RAISER as u64, "{backend}");
        let mut by_id = BTreeMap::new();
        for sig in &page.signals {
            by_id.insert(
                sig.signal["signalId"].as_str().unwrap().to_string(),
                sig.seq,
            );
        }
        let all: BTreeSet<u64> = by_id.values().copied().collect();
        assert_eq!(
            all,
            (1..=3 * PER_RAISER as u64).collect::<BTreeSet<_>>(),
            "{backend}: unique and gapless"
        );
        for ids in &outcomes {
            let seqs: Vec<u64> = ids.iter().map(|id| by_id[id]).collect();
            assert!(
                seqs.windows(2).all(|w| w[0] < w[1]),
                "{backend}: a raiser's signals keep its order: {seqs:?}"
            );
        }
        let log = gapless_log(&*stores[0], &run).await;
        let buffered: Vec<u64> = log
            .iter()
            .filter(|e| e.event_type == "tb.signal.buffered")
            .map(|e| e.payload["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(
            buffered,
            (1..=3 * PER_RAISER as u64).collect::<Vec<_>>(),
            "{backend}: the log records them in seq order"
        );
    }
}

/// A mailbox page and its `buffered` count come from one snapshot: while one handle raises signals,
/// every page another handle reads lists exactly as many buffered signals as its count says (a
/// page read in autocommit could see 0 rows and then a count of 1).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mailbox_page_read_while_signals_arrive_agrees_with_its_count() {
    const RAISED: usize = 60;
    for (backend, stores, _guard) in handles(2).await {
        subscription(&*stores[0], "gh").await;
        let run = session_run(&*stores[0]).await;
        let done = Arc::new(AtomicBool::new(false));
        let pages = race(2, |i| {
            let (s, run, done) = (stores[i].clone(), run.clone(), done.clone());
            async move {
                let mut pages = Vec::new();
                if i == 0 {
                    for j in 0..RAISED {
                        s.raise_signal(&run, api_signal(&format!("p{j}"), "tick"), 3_000)
                            .await
                            .expect("raise");
                        tokio::task::yield_now().await;
                    }
                    done.store(true, Ordering::SeqCst);
                } else {
                    while !done.load(Ordering::SeqCst) {
                        let page = s.list_signals(&run, None, 500).await.expect("list");
                        let listed = page
                            .signals
                            .iter()
                            .filter(|r| r.state == "buffered")
                            .count();
                        pages.push((listed as u64, page.buffered));
                    }
                }
                pages
            }
        })
        .await;
        let read = &pages[1];
        assert!(
            read.len() >= 2,
            "{backend}: the reader read {} pages",
            read.len()
        );
        let torn: Vec<_> = read.iter().filter(|(listed, n)| listed != n).collect();
        assert!(
            torn.is_empty(),
            "{backend}: pages whose rows disagree with their count: {torn:?}"
        );
        let last = stores[1].list_signals(&run, None, 500).await.unwrap();
        assert_eq!(last.buffered, RAISED as u64, "{backend}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wait_raced_by_a_signal_and_its_timer_on_two_handles_resolves_once() {
    const ROUNDS: usize = 12;
    for (backend, stores, _guard) in handles(2).await {
        subscription(&*stores[0], "gh").await;
        let mut wins = BTreeMap::new();
        for round in 0..ROUNDS {
            let run = session_run(&*stores[0]).await;
            let wait_id = format!("wait_{round}");
            let spec = WaitSpec {
                kind: WaitKind::Signal,
                names: vec!["go".into()],
                timeout_ms: Some(1_000),
                user_input: false,
                reason: "waiting for go".into(),
            };
            let w = stores[0]
                .create_wait(&run, &wait_id, spec, 10_000)
                .await
                .unwrap();
            assert_eq!((w.state, w.deadline), (WaitState::Armed, Some(11_000)));
            // Both candidates are visible at 20 000 ms: whichever commits first resolves the wait.
            let (raiser, timer) = (stores[0].clone(), stores[1].clone());
            let r = run.clone();
            let out = race(2, move |i| {
                let (raiser, timer, r) = (raiser.clone(), timer.clone(), r.clone());
                async move {
                    if i == 0 {
                        let o = raiser
                            .raise_signal(&r, api_signal("go-1", "go"), 20_000)
                            .await;
                        (o.expect("raise").consumed_by.is_some() as u32, 0)
                    } else {
                        (0, timer.fire_timers(20_000, 100).await.expect("timers"))
                    }
                }
            })
            .await;
            let by_signal = out[0].0;
            let by_timer = out[1].1;
            assert_eq!(
                by_signal + by_timer,
                1,
                "{backend} round {round}: one winner"
            );
            let w = stores[0].get_wait(&run, &wait_id).await.unwrap();
            assert_eq!(w.state, WaitState::Resolved, "{backend}");
            let kind = w.winner.as_ref().unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_string();
            assert_eq!(
                kind,
                if by_signal == 1 { "signal" } else { "timer" },
                "{backend}: the recorded winner is the one that won"
            );
            let log = gapless_log(&*stores[0], &run).await;
            let resolutions = log
                .iter()
                .filter(|e| {
                    matches!(
                        e.event_type.as_str(),
                        "tb.wait.resolved" | "tb.wait.timeout"
                    )
                })
                .count();
            assert_eq!(resolutions, 1, "{backend}: one resolution event");
            let wait_turns = stores[0]
                .list_turns(&run)
                .await
                .unwrap()
                .iter()
                .filter(|t| t.kind == tb_core::turn::TurnKind::Wait)
                .count();
            assert_eq!(wait_turns, 1, "{backend}: one wait turn");
            *wins.entry(kind).or_insert(0) += 1;
        }
        eprintln!("{backend}: winners over {ROUNDS} rounds: {wins:?}");
        assert_eq!(wins.values().sum::<usize>(), ROUNDS);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn turns_claimed_from_three_handles_get_one_lease_each() {
    const PROMPTS: usize = 5;
    for (backend, stores, _guard) in handles(3).await {
        subscription(&*stores[0], "gh").await;
        let run = session_run(&*stores[0]).await;
        for k in 0..PROMPTS {
            let p = NewPrompt {
                text: format!("prompt {k}"),
                variables: json!({}),
                from: "api".into(),
                delivery_id: None,
            };
            stores[0].enqueue_prompt(&run, p, 3_000).await.unwrap();
        }
        let total = PROMPTS + 1; // and the start turn
                                 // One head, three claimers at once: exactly one lease.
        let first = race(3, |i| {
            let (s, run) = (stores[i].clone(), run.clone());
            async move { s.claim_turn(&run, 60_000, 4_000).await.expect("claim") }
        })
        .await;
        let got: Vec<&TurnRecord> = first.iter().flatten().collect();
        assert_eq!(
            got.len(),
            1,
            "{backend}: one of three concurrent claims leases the head"
        );
        assert_eq!((got[0].seq, got[0].claims), (1, 1), "{backend}");
        stores[0]
            .ack_turn(&run, &got[0].id, 1, 4_001)
            .await
            .unwrap();
        // The rest: three claimers race through the queue, each acking what it leased.
        let acked = Arc::new(AtomicUsize::new(1));
        let leases = race(3, |i| {
            let (s, run, acked) = (stores[i].clone(), run.clone(), acked.clone());
            async move {
                let mut mine = Vec::new();
                for _ in 0..10_000 {
                    if acked.load(Ordering::SeqCst) == total {
                        break;
                    }
                    match s.claim_turn(&run, 60_000, 5_000).await.expect("claim") {
                        Some(t) => {
                            s.ack_turn(&run, &t.id, t.claims, 5_001)
                                .await
                                .expect("the lease holder acks");
                            acked.fetch_add(1, Ordering::SeqCst);
                            mine.push((t.seq, t.claims));
                        }
                        None => tokio::task::yield_now().await,
                    }
                }
                mine
            }
        })
        .await;
        let mut all: Vec<(u64, u32)> = leases.into_iter().flatten().collect();
        all.sort();
        let expected: Vec<(u64, u32)> = (2..=total as u64).map(|seq| (seq, 1)).collect();
        assert_eq!(all, expected, "{backend}: every turn leased exactly once");
        let turns = stores[0].list_turns(&run).await.unwrap();
        assert!(
            turns
                .iter()
                .all(|t| t.state == TurnState::Acked && t.claims == 1),
            "{backend}: {turns:?}"
        );
        gapless_log(&*stores[0], &run).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timer_loops_on_three_handles_step_each_due_run_once() {
    const RUNS: usize = 10;
    for (backend, stores, _guard) in handles(3).await {
        subscription(&*stores[0], "gh").await;
        let mut runs = Vec::new();
        for k in 0..RUNS {
            let run = session_run(&*stores[0]).await;
            let spec = WaitSpec {
                kind: WaitKind::Signal,
                names: vec!["never".into()],
                timeout_ms: Some(500 + k as u64),
                user_input: false,
                reason: "until the deadline".into(),
            };
            stores[0]
                .create_wait(&run, &format!("wait_t{k}"), spec, 10_000)
                .await
                .unwrap();
            runs.push(run);
        }
        assert_eq!(stores[0].next_timer_at().await.unwrap(), Some(10_500));
        // Three replicas' timer loops come due at once; each passes until nothing is due.
        let fired = race(3, |i| {
            let s = stores[i].clone();
            async move {
                let mut n = 0;
                for _ in 0..RUNS {
                    let k = s.fire_timers(20_000, 3).await.expect("timers");
                    n += k;
                    if s.next_timer_at().await.expect("next timer").is_none() {
                        break;
                    }
                }
                n
            }
        })
        .await;
        // Whatever the three skipped while another held it and left due, one more pass takes.
        let rest = stores[0].fire_timers(20_000, 100).await.unwrap();
        assert_eq!(
            fired.iter().sum::<u32>() + rest,
            RUNS as u32,
            "{backend}: every due run stepped exactly once ({fired:?} + {rest})"
        );
        for run in &runs {
            let log = gapless_log(&*stores[0], run).await;
            let timeouts = log
                .iter()
                .filter(|e| e.event_type == "tb.wait.timeout")
                .count();
            assert_eq!(timeouts, 1, "{backend}");
            let waits = stores[0].list_waits(run).await.unwrap();
            assert_eq!(waits.len(), 1);
            assert_eq!(waits[0].state, WaitState::Resolved, "{backend}");
            assert_eq!(waits[0].winner.as_ref().unwrap()["kind"], "timer");
        }
        assert_eq!(stores[0].next_timer_at().await.unwrap(), None);
    }
}

/// Rotations of one registered subscription's secret racing through four handles: each
/// expects the secret it read, so exactly one commits and the rest are refused `Conflict`, writing
/// nothing; the stored secret and the previous one are the winner's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_secret_rotations_commit_exactly_one() {
    for (backend, stores, _guard) in handles(4).await {
        let def = trigger_bridge_store::SubscriptionDef {
            id: "sub_rot".into(),
            source: tb_core::subscription::Source::Webhook,
            connector: "standard-webhooks".into(),
            config: serde_json::json!({}),
            failure_threshold: 5,
        };
        stores[0]
            .register_subscription(def.clone(), vec![("sub_rot".into(), b"S0".to_vec())], 1_000)
            .await
            .unwrap();
        let outcomes = race(4, |i| {
            let (s, def) = (stores[i].clone(), def.clone());
            async move {
                let mine = format!("S{}", i + 1).into_bytes();
                let sealed = vec![
                    ("sub_rot".to_string(), mine.clone()),
                    ("sub_rot#previous".to_string(), b"S0".to_vec()),
                ];
                let r = s
                    .rotate_subscription_secret(
                        def,
                        Some(b"S0".to_vec()),
                        sealed,
                        Vec::new(),
                        2_000,
                    )
                    .await;
                (mine, r)
            }
        })
        .await;
        let won: Vec<&Vec<u8>> = outcomes
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(m, _)| m)
            .collect();
        assert_eq!(won.len(), 1, "{backend}: one rotation commits");
        for (_, r) in &outcomes {
            if let Err(e) = r {
                assert!(
                    matches!(e, trigger_bridge_store::StoreError::Conflict(_)),
                    "{backend}: {e:?}"
                );
            }
        }
        let stored = stores[0].sealed_secret("sub_rot").await.unwrap();
        assert_eq!(stored.as_ref(), Some(won[0]), "{backend}");
        // An ended overlap: the next rotation deletes the previous secret in its commit.
        stores[1]
            .rotate_subscription_secret(
                def.clone(),
                stored,
                vec![("sub_rot".into(), b"S9".to_vec())],
                vec!["sub_rot#previous".into()],
                3_000,
            )
            .await
            .unwrap();
        assert_eq!(
            stores[0].sealed_secret("sub_rot#previous").await.unwrap(),
            None,
            "{backend}"
        );
        let gone = stores[0]
            .rotate_subscription_secret(def, None, Vec::new(), Vec::new(), 4_000)
            .await;
        assert!(
            matches!(gone, Err(trigger_bridge_store::StoreError::Conflict(_))),
            "{backend}: a stale expectation is refused: {gone:?}"
        );
    }
}

/// An ended rotation's previous secret is deleted only once the end its row records has passed, on
/// both backends (the row is read under its lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_previous_secret_is_dropped_only_after_its_end() {
    for (backend, stores, _guard) in handles(2).await {
        let def = trigger_bridge_store::SubscriptionDef {
            id: "sub_end".into(),
            source: tb_core::subscription::Source::Webhook,
            connector: "standard-webhooks".into(),
            config: serde_json::json!({"registration": {"workflow_id": "wf", "previousSecretUntil": 5_000}}),
            failure_threshold: 5,
        };
        stores[0]
            .register_subscription(
                def,
                vec![
                    ("sub_end".into(), b"S1".to_vec()),
                    ("sub_end#previous".into(), b"S0".to_vec()),
                ],
                1_000,
            )
            .await
            .unwrap();
        let s = &stores[1];
        assert!(
            !s.drop_ended_previous_secret("sub_end", "sub_end#previous", 4_999)
                .await
                .unwrap(),
            "{backend}"
        );
        assert!(
            s.sealed_secret("sub_end#previous").await.unwrap().is_some(),
            "{backend}"
        );
        assert!(
            s.drop_ended_previous_secret("sub_end", "sub_end#previous", 5_000)
                .await
                .unwrap(),
            "{backend}"
        );
        assert_eq!(
            s.sealed_secret("sub_end#previous").await.unwrap(),
            None,
            "{backend}"
        );
        assert_eq!(
            s.sealed_secret("sub_end").await.unwrap(),
            Some(b"S1".to_vec()),
            "{backend}"
        );
    }
}
