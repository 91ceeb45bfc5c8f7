//! A session restarted by a new `opened` keeps the `synchronize` that arrives with it (docs/sessions.md
//! "Coalescing": "an opened and a synchronize arriving together lose nothing"), on SQLite and on
//! PostgreSQL.
//!
//! The quickstart's `github-sessions` shape (examples/quickstart.toml): `pull_request.opened` starts a
//! `pr-session` coalesced on `{repository.full_name}#{pull_request.number}`, later `pull_request`
//! events raise `pr.<action>` on the session holding that key. The first session of 400 PRs is
//! started and cancelled; then per PR a new `opened` and a `synchronize` race, two ways:
//!
//! * attempt race (200 PRs): both accepted, then their two attempts released together (one task
//!   each, behind a barrier). While the key still points at the cancelled run and the `opened` start
//!   is queued, the signal must retry (`target_starting`), never be dead-lettered `target_terminal`;
//! * ingest race (200 PRs), with the worker running: the two webhook deliveries accepted by two tasks
//!   released together, each attempted as soon as it commits, so the `synchronize` may be attempted
//!   before the `opened` is even committed (the settle window, `START_SETTLE_MS`, covers that).
//!
//! Either way the `synchronize` must end on the NEW session.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderMap;
use serde_json::{json, Value};
use tb_core::binding::{Binding, BindingAction, OnExisting};
use tb_core::connector::ConnectorSpec;
use tb_core::delivery::{AttemptOutcome, DeliveryState};
use tb_core::retry::{Backoff, RetryPolicy};
use tb_core::run::RunStatus;
use tb_core::workflow::{Executor, Workflow};
use tb_store::{Lease, Store};
use tokio::sync::Barrier;
use trigger_bridge_engine::ingest::{ingest, IngestAnswer};
use trigger_bridge_engine::{Catalog, Engine, SubscriptionConfig};

const SECRET: &str = "restart-race-secret";
const PAIRS: usize = 200;
/// Pairs raced at once (each pair's two attempts are released together by its own barrier).
const WAVE: usize = 8;
/// A lease clock past every due time: the test decides when a retry runs, not the backoff.
const FAR: i64 = i64::MAX / 4;

fn catalog() -> Catalog {
    let key = "{repository.full_name}#{pull_request.number}";
    let binding = |id: &str, types: &[&str], action: BindingAction| Binding {
        rate_limit_per_min: 0,
        id: id.into(),
        subscription: "github-sessions".into(),
        event_types: types.iter().map(|s| s.to_string()).collect(),
        filter: Default::default(),
        action,
        inputs: [("number".to_string(), "pull_request.number".to_string())]
            .into_iter()
            .collect(),
    };
    let sub = SubscriptionConfig {
        retry: RetryPolicy {
            max_attempts: 50,
            backoff: Backoff::Fixed,
            initial_ms: 20,
            max_ms: 20,
            jitter: 0.0,
            schedule_ms: None,
        },
        ..SubscriptionConfig::webhook("github-sessions", ConnectorSpec::Github, SECRET.as_bytes())
    };
    Catalog::new(
        vec![sub],
        vec![
            binding(
                "pr-session-start",
                &["pull_request.opened"],
                BindingAction::StartRun {
                    workflow: "pr-session".into(),
                    coalesce_key: Some(key.into()),
                    on_existing: OnExisting::Signal,
                    signal: Some("pr.{action}".into()),
                    prompt: None,
                    wake: false,
                },
            ),
            binding(
                "pr-session-events",
                &["pull_request.synchronize", "pull_request.closed"],
                BindingAction::RaiseSignal {
                    workflow: Some("pr-session".into()),
                    coalesce_key: Some(key.into()),
                    run: None,
                    signal: "pr.{action}".into(),
                    wake: false,
                },
            ),
        ],
        vec![Workflow {
            id: "pr-session".into(),
            executor: Executor::Session {
                config: json!({"agent": "pr-reviewer"}),
                mailbox: Default::default(),
            },
        }],
    )
}

/// The repository's GitHub fixture `file` (tests/fixtures/github, see its PROVENANCE.md), re-pointed
/// at PR `number` (the session's key). Each file is read and parsed once.
fn pr_event(file: &'static str, number: usize) -> Bytes {
    static PARSED: std::sync::Mutex<Vec<(&'static str, Value)>> = std::sync::Mutex::new(Vec::new());
    let mut v = {
        let mut parsed = PARSED.lock().unwrap();
        if !parsed.iter().any(|(f, _)| *f == file) {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../tests/fixtures/github/pull_request")
                .join(file);
            let v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
            parsed.push((file, v));
        }
        parsed.iter().find(|(f, _)| *f == file).unwrap().1.clone()
    };
    v["pull_request"]["number"] = json!(number);
    v["number"] = json!(number);
    Bytes::from(serde_json::to_vec(&v).unwrap())
}

/// Accepts one signed GitHub `pull_request` delivery; the id of the delivery it created.
async fn accept(engine: &Engine, github_delivery: &str, body: Bytes) -> String {
    let mut h = HeaderMap::new();
    h.insert("content-type", "application/json".parse().unwrap());
    h.insert("x-github-event", "pull_request".parse().unwrap());
    h.insert("x-github-delivery", github_delivery.parse().unwrap());
    let sig = tb_ingress::github::sign(SECRET.as_bytes(), &body);
    h.insert("x-hub-signature-256", sig.parse().unwrap());
    match ingest(engine, "github-sessions", &h, body).await.unwrap() {
        IngestAnswer::Accepted { mut deliveries, .. } => {
            assert_eq!(deliveries.len(), 1);
            deliveries.remove(0).delivery_id
        }
        other => panic!("{github_delivery}: not accepted: {other:?}"),
    }
}

/// Runs `jobs` with at most 16 in flight; their outputs in order.
async fn all<T: Send + 'static>(
    jobs: impl IntoIterator<Item = impl std::future::Future<Output = T> + Send + 'static>,
) -> Vec<T> {
    use futures_util::stream::StreamExt;
    futures_util::stream::iter(jobs.into_iter().map(tokio::spawn))
        .buffered(16)
        .map(|r| r.unwrap())
        .collect()
        .await
}

/// Leases every open delivery (whatever its due time) and attempts them all at once, until none is
/// left or 20 rounds have passed.
async fn drain(engine: &Arc<Engine>) {
    for _ in 0..20 {
        let leases = engine
            .store
            .lease_due("w", FAR, 60_000, 10_000)
            .await
            .unwrap();
        if leases.is_empty() {
            return;
        }
        let tasks: Vec<_> = leases
            .into_iter()
            .map(|l| {
                let e = engine.clone();
                tokio::spawn(async move { trigger_bridge_engine::worker::attempt(&e, l).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
    }
    panic!("deliveries still open after 20 rounds");
}

/// What one backend's races gave.
#[derive(Debug, Default)]
struct Figures {
    /// Attempt race: `synchronize` attempts that committed before their `opened` had taken the key
    /// over (they met the cancelled run while the start was queued): how often it went the hard way.
    sync_first: usize,
    /// Ingest race: `synchronize` deliveries that needed more than one attempt (their first met no
    /// live session: the `opened` was queued, or not committed yet).
    sync_waited: usize,
    /// Deliveries dead-lettered `target_terminal` (must be 0), both races.
    target_terminal: usize,
    /// `synchronize` signals found on the new session, both races (must be `2 * PAIRS`).
    on_new_session: usize,
}

/// What one pair showed.
struct Checked {
    /// Its deliveries dead-lettered `target_terminal`.
    target_terminal: usize,
    /// The `synchronize` is a signal on the new session.
    on_new_session: bool,
    /// The `synchronize`'s attempts, and whether its first was delivered.
    sync_attempts: u32,
    sync_first_delivered: bool,
}

/// Waits (until `deadline`) for pair `n` (`opened`, `synchronize` delivery ids) to settle, then checks
/// it: the `opened` started a new session (not `old_run`), and says whether the `synchronize` is a
/// signal on it.
async fn check(
    store: Arc<dyn Store>,
    n: usize,
    (o, s): (String, String),
    old_run: String,
    deadline: Instant,
) -> Checked {
    for d in [&o, &s] {
        while !store.get_delivery(d).await.unwrap().state.is_terminal() {
            assert!(Instant::now() < deadline, "PR {n}: {d} still open");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let start = store.get_delivery(&o).await.unwrap();
    let signal = store.get_delivery(&s).await.unwrap();
    let target_terminal = [&start, &signal]
        .iter()
        .filter(|d| d.dead_letter_reason.as_deref() == Some("target_terminal"))
        .count();
    assert_eq!(start.state, DeliveryState::Delivered, "PR {n}: {start:?}");
    let new_run = start.run_id.clone().unwrap();
    assert_ne!(
        new_run, old_run,
        "PR {n}: the new opened starts a new session"
    );
    let attempts = store.attempts(&s).await.unwrap();
    let mut on_new_session = false;
    if signal.state == DeliveryState::Delivered {
        assert_eq!(signal.run_id.as_deref(), Some(new_run.as_str()), "PR {n}");
        let page = store.list_signals(&new_run, None, 50).await.unwrap();
        on_new_session = page.signals.iter().any(|r| {
            r.signal["signalId"] == json!(s) && r.signal["name"] == json!("pr.synchronize")
        });
        assert!(
            on_new_session,
            "PR {n}: pr.synchronize on the new session: {page:?}"
        );
    }
    Checked {
        target_terminal,
        on_new_session,
        sync_attempts: signal.attempts,
        sync_first_delivered: attempts[0].outcome == AttemptOutcome::Delivered,
    }
}

async fn race(store: Arc<dyn Store>, backend: &str) -> Figures {
    let t0 = Instant::now();
    let engine = Engine::start(store.clone(), catalog()).await.unwrap();
    let opened = |n: usize| pr_event("00-opened.json", n);
    let sync = |n: usize| pr_event("22-synchronize.json", n);
    let mut f = Figures::default();

    // 1. The first session of PRs 0..2*PAIRS starts, and is cancelled.
    let first = all((0..2 * PAIRS).map(|n| {
        let e = engine.clone();
        async move { accept(&e, &format!("first-open-{n}"), opened(n)).await }
    }))
    .await;
    drain(&engine).await;
    let old_runs = all(first.iter().map(|d| {
        let (e, d) = (engine.clone(), d.clone());
        async move {
            let run = e.store.get_delivery(&d).await.unwrap().run_id.unwrap();
            trigger_bridge_engine::runs::finish(&e, &run, RunStatus::Cancelled, None)
                .await
                .unwrap();
            run
        }
    }))
    .await;

    // 2. Attempt race, PRs 0..PAIRS, first part: a new `opened` and a `synchronize` per PR, both
    //    accepted and leased (for the whole test: the worker started below leaves them alone).
    let pairs = all((0..PAIRS).map(|n| {
        let e = engine.clone();
        async move {
            let o = accept(&e, &format!("again-open-{n}"), opened(n)).await;
            let s = accept(&e, &format!("sync-{n}"), sync(n)).await;
            (o, s)
        }
    }))
    .await;
    let accepted = Instant::now();
    let mut leases: HashMap<String, Lease> = store
        .lease_due("w", FAR, 60_000, 10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|l| (l.delivery.id.clone(), l))
        .collect();
    assert_eq!(leases.len(), 2 * PAIRS);

    // 3. Ingest race, PRs PAIRS..2*PAIRS, with the worker running (each delivery is attempted as
    //    soon as it commits): the `opened` and the `synchronize` are accepted by two tasks released
    //    together, WAVE pairs at a time, as two webhook requests arriving at the same moment.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let worker = tokio::spawn(trigger_bridge_engine::worker::run(
        engine.clone(),
        Default::default(),
        stopped,
    ));
    let mut raced = Vec::with_capacity(PAIRS);
    for wave in (PAIRS..2 * PAIRS).collect::<Vec<_>>().chunks(WAVE) {
        let mut tasks = Vec::new();
        for &n in wave {
            let barrier = Arc::new(Barrier::new(2));
            let (e1, b1) = (engine.clone(), barrier.clone());
            let (e2, b2) = (engine.clone(), barrier);
            let (ob, sb) = (opened(n), sync(n));
            tasks.push((
                n,
                tokio::spawn(async move {
                    b1.wait().await;
                    accept(&e1, &format!("again-open-{n}"), ob).await
                }),
                tokio::spawn(async move {
                    b2.wait().await;
                    accept(&e2, &format!("sync-{n}"), sb).await
                }),
            ));
        }
        for (n, o, s) in tasks {
            raced.push((n, (o.await.unwrap(), s.await.unwrap())));
        }
    }

    // 4. Attempt race, second part (the worker retries what it refuses): each pair's two attempts
    //    released together, WAVE pairs at a time, once the settle window (`START_SETTLE_MS`) has
    //    passed since they were accepted, so only the queued start can hold the signal.
    let settle = Duration::from_millis(tb_core::binding::START_SETTLE_MS as u64 + 50);
    tokio::time::sleep(settle.saturating_sub(accepted.elapsed())).await;
    for wave in pairs.chunks(WAVE) {
        let mut tasks = Vec::new();
        for (o, s) in wave {
            let barrier = Arc::new(Barrier::new(2));
            for lease in [leases.remove(o).unwrap(), leases.remove(s).unwrap()] {
                let (e, b) = (engine.clone(), barrier.clone());
                tasks.push(tokio::spawn(async move {
                    b.wait().await;
                    trigger_bridge_engine::worker::attempt(&e, lease).await
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
    }

    // 5. Every delivery of both races settles (refused signals are retried by the worker), then
    //    each pair is checked.
    let deadline = Instant::now() + Duration::from_secs(60);
    let attempt_race = all(pairs.iter().enumerate().map(|(n, pair)| {
        check(
            store.clone(),
            n,
            pair.clone(),
            old_runs[n].clone(),
            deadline,
        )
    }))
    .await;
    let ingest_race = all(raced.iter().map(|(n, pair)| {
        check(
            store.clone(),
            *n,
            pair.clone(),
            old_runs[*n].clone(),
            deadline,
        )
    }))
    .await;
    stop.send(true).unwrap();
    worker.await.unwrap();
    for c in attempt_race.iter().chain(&ingest_race) {
        f.target_terminal += c.target_terminal;
        f.on_new_session += usize::from(c.on_new_session);
    }
    // An attempt-race `synchronize` whose first attempt met the cancelled run was refused to retry
    // (dead-lettered before the fix); an ingest-race one attempted again met no live session.
    f.sync_first = attempt_race
        .iter()
        .filter(|c| !c.sync_first_delivered)
        .count();
    f.sync_waited = ingest_race.iter().filter(|c| c.sync_attempts > 1).count();

    println!(
        "{backend}: {PAIRS} attempt pairs raced, synchronize committed first (met the cancelled run, \
         start queued) {}; {PAIRS} ingest pairs raced, synchronize attempted again {}; \
         dead-lettered target_terminal {}; synchronize on the new session {} of {}; {:?}",
        f.sync_first,
        f.sync_waited,
        f.target_terminal,
        f.on_new_session,
        2 * PAIRS,
        t0.elapsed()
    );
    f
}

fn assert_nothing_lost(f: &Figures) {
    assert_eq!(f.target_terminal, 0, "{f:?}");
    assert_eq!(f.on_new_session, 2 * PAIRS, "{f:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_synchronize_racing_a_restarting_opened_reaches_the_new_session_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(tb_store::sqlite::SqliteStore::open_dir(dir.path()).unwrap());
    let f = tokio::time::timeout(Duration::from_secs(120), race(store, "sqlite"))
        .await
        .expect("the race took over 120 s");
    assert_nothing_lost(&f);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_synchronize_racing_a_restarting_opened_reaches_the_new_session_on_postgresql() {
    let Some(db) = tb_store::postgres::testing::TestDatabase::create() else {
        return; // the reason is printed by `TestDatabase::create` (never skipped under CI)
    };
    let opts = tb_store::postgres::PoolOptions {
        connections: 8,
        queue_capacity: 10_000,
    };
    let store: Arc<dyn Store> = Arc::new(
        tb_store::postgres::PgStore::connect(db.url(), opts)
            .await
            .unwrap(),
    );
    let f = tokio::time::timeout(Duration::from_secs(120), race(store, "postgresql"))
        .await
        .expect("the race took over 120 s");
    assert_nothing_lost(&f);
}
