//! Cron schedules through the engine, with an injected clock: no test waits for a real
//! minute. Ticks go through `accept` like any source; each test reads back receipts and deliveries.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tb_core::binding::{Binding, BindingAction};
use tb_core::receipt::ReceiptSource;
use tb_core::schedule::{parse_instant, utc_rfc3339, MissedTicks, ScheduleSpec};
use tb_core::subscription::SubscriptionInput;
use tb_core::workflow::{Executor, Workflow};
use tb_store::postgres::testing::TestDatabase;
use tb_store::postgres::{PgStore, PoolOptions};
use tb_store::sqlite::SqliteStore;
use tb_store::{ListQuery, Store};
use trigger_bridge_engine::scheduler::Scheduler;
use trigger_bridge_engine::{Catalog, Engine, SubscriptionConfig};

fn ms(t: &str) -> i64 {
    parse_instant(t).unwrap()
}

fn binding(sub: &str) -> Binding {
    Binding {
        rate_limit_per_min: 0,
        id: format!("{sub}-run"),
        subscription: sub.into(),
        event_types: vec!["schedule.tick".into()],
        filter: Default::default(),
        action: BindingAction::start_run("noop"),
        inputs: [("nominal".to_string(), "schedule.nominal_time".to_string())].into(),
    }
}

fn catalog(schedules: &[(&str, ScheduleSpec)]) -> Catalog {
    let subs = schedules
        .iter()
        .map(|(id, spec)| SubscriptionConfig::schedule(id, spec.clone()))
        .collect();
    let bindings = schedules.iter().map(|(id, _)| binding(id)).collect();
    let wf = Workflow {
        id: "noop".into(),
        executor: Executor::Noop,
    };
    Catalog::new(subs, bindings, vec![wf])
}

fn spec(cron: &str, tz: &str, missed: MissedTicks) -> ScheduleSpec {
    ScheduleSpec {
        timezone: tz.into(),
        missed,
        ..ScheduleSpec::new(cron)
    }
}

/// The nominal instants of a subscription's receipts, read back from the stored bodies, in order;
/// each receipt has exactly one delivery.
async fn fired(store: &dyn Store, sub: &str) -> Vec<String> {
    let receipts = store
        .list_receipts(ListQuery {
            limit: 1000,
            before: None,
            state: None,
            subscription_id: Some(sub.into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut out = Vec::new();
    for r in receipts {
        assert_eq!(r.source, ReceiptSource::Schedule);
        let body: serde_json::Value =
            serde_json::from_slice(&store.get_body(&r.id).await.unwrap()).unwrap();
        let deliveries = store.deliveries_of_receipt(&r.id).await.unwrap();
        assert_eq!(deliveries.len(), 1, "one delivery per (receipt, binding)");
        assert_eq!(
            deliveries[0].inputs["nominal"], body["nominalTime"],
            "the binding maps the tick's nominal instant"
        );
        out.push(body["nominalTime"].as_str().unwrap().to_string());
    }
    out.sort();
    out
}

async fn sqlite(cat: Catalog) -> (Arc<Engine>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    (Engine::start(store, cat).await.unwrap(), dir)
}

#[tokio::test]
async fn a_stopped_server_fires_no_catch_up_with_skip_and_exactly_one_with_run_once() {
    let (engine, _dir) = sqlite(catalog(&[
        ("hourly-skip", spec("0 * * * *", "UTC", MissedTicks::Skip)),
        (
            "hourly-once",
            spec("0 * * * *", "UTC", MissedTicks::RunOnce),
        ),
    ]))
    .await;
    let mut s = Scheduler::default();
    // First sight anchors the cursors; 10:00 then fires on time for both.
    s.pass(&engine, ms("2026-12-01T09:30:00Z")).await;
    let (r, next) = s.pass(&engine, ms("2026-12-01T10:00:02Z")).await;
    assert_eq!(r.fired, 2, "{r:?}");
    assert_eq!(next, Some(ms("2026-12-01T11:00:00Z")));
    // The server is down from 10:00:02 until 14:30: 11:00, 12:00, 13:00 and 14:00 came due.
    let (r, _) = s.pass(&engine, ms("2026-12-01T14:30:00Z")).await;
    assert_eq!((r.fired, r.missed), (1, 7), "{r:?}");
    assert_eq!(
        fired(engine.store.as_ref(), "hourly-skip").await,
        ["2026-12-01T10:00:00Z"]
    );
    assert_eq!(
        fired(engine.store.as_ref(), "hourly-once").await,
        ["2026-12-01T10:00:00Z", "2026-12-01T14:00:00Z"]
    );
    let c = engine
        .store
        .schedule_cursor("hourly-skip")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.cursor.last_nominal_ms, ms("2026-12-01T14:00:00Z"));
    assert_eq!(c.cursor.missed_total, 4);
    // The next tick fires on time again.
    let (r, _) = s.pass(&engine, ms("2026-12-01T15:00:00Z")).await;
    assert_eq!(r.fired, 2);
}

#[tokio::test]
async fn berlin_spring_forward_fires_the_missing_time_once_through_the_engine() {
    let (engine, _dir) = sqlite(catalog(&[(
        "berlin",
        spec("30 2 * * *", "Europe/Berlin", MissedTicks::Skip),
    )]))
    .await;
    let mut s = Scheduler::default();
    // A pass every 10 simulated minutes from 2026-03-28 12:00Z to 2026-03-30 12:00Z.
    let (mut t, end) = (ms("2026-03-28T12:00:00Z"), ms("2026-03-30T12:00:00Z"));
    while t <= end {
        s.pass(&engine, t).await;
        t += 600_000;
    }
    assert_eq!(
        fired(engine.store.as_ref(), "berlin").await,
        ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]
    );
}

#[tokio::test]
async fn pause_skips_ticks_and_resume_starts_from_the_next_tick_without_catch_up() {
    let (engine, _dir) = sqlite(catalog(&[(
        "every-minute",
        spec("* * * * *", "UTC", MissedTicks::RunOnce),
    )]))
    .await;
    let mut s = Scheduler::default();
    s.pass(&engine, ms("2026-12-01T10:00:30Z")).await;
    s.pass(&engine, ms("2026-12-01T10:01:00Z")).await;
    engine
        .operate("every-minute", SubscriptionInput::OperatorPause)
        .await
        .unwrap();
    for m in 2..=5 {
        let (r, _) = s
            .pass(&engine, ms(&format!("2026-12-01T10:0{m}:00Z")))
            .await;
        assert_eq!((r.fired, r.paused), (0, 1), "minute {m}: {r:?}");
    }
    engine
        .operate("every-minute", SubscriptionInput::OperatorResume)
        .await
        .unwrap();
    let (r, _) = s.pass(&engine, ms("2026-12-01T10:05:30Z")).await;
    assert_eq!(r.fired, 0, "no catch-up on resume: {r:?}");
    s.pass(&engine, ms("2026-12-01T10:06:00Z")).await;
    assert_eq!(
        fired(engine.store.as_ref(), "every-minute").await,
        ["2026-12-01T10:01:00Z", "2026-12-01T10:06:00Z"]
    );
}

/// Runs `loops` scheduler loops (each its own engine over `stores`) at the same simulated instants,
/// as spawned tasks on the multi-thread runtime, so their passes really race; returns the fired and
/// duplicate totals.
async fn race(engines: Vec<Arc<Engine>>, instants: &[i64]) -> (u64, u64) {
    let mut schedulers: Vec<Option<Scheduler>> =
        engines.iter().map(|_| Some(Scheduler::default())).collect();
    let (mut fired, mut dups) = (0, 0);
    for (i, now) in instants.iter().enumerate() {
        let mut tasks = Vec::new();
        for (k, e) in engines.iter().enumerate() {
            let (e, mut s) = (e.clone(), schedulers[k].take().unwrap());
            // Loops see slightly different clocks, as replicas do.
            let now = now + ((i + k) % 3) as i64 * 150;
            tasks.push(tokio::spawn(async move {
                let (r, _) = s.pass(&e, now).await;
                (s, r)
            }));
        }
        for (k, t) in tasks.into_iter().enumerate() {
            let (s, r) = t.await.unwrap();
            assert_eq!(r.failed, 0, "{r:?}");
            fired += r.fired;
            dups += r.duplicates;
            schedulers[k] = Some(s);
        }
    }
    (fired, dups)
}

fn every_tick() -> Vec<i64> {
    // 20 simulated minutes of a 15-second schedule: a pass at every tick, plus one before.
    (0..=80)
        .map(|i| ms("2026-12-01T10:00:00Z") - 1000 + i * 15_000)
        .collect()
}

async fn assert_once_per_tick(store: &dyn Store) {
    let got = fired(store, "quarter-minute").await;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for n in &got {
        *counts.entry(n.clone()).or_default() += 1;
    }
    assert!(
        counts.values().all(|c| *c == 1),
        "a tick fired twice: {counts:?}"
    );
    let want: Vec<String> = (0..80)
        .map(|i| utc_rfc3339(ms("2026-12-01T10:00:00Z") + i * 15_000))
        .collect();
    assert_eq!(got, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_scheduler_loops_over_one_sqlite_store_fire_once_per_tick() {
    let cat = || {
        catalog(&[(
            "quarter-minute",
            spec("*/15 * * * * *", "UTC", MissedTicks::Skip),
        )])
    };
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    let a = Engine::start(store.clone(), cat()).await.unwrap();
    let b = Engine::start(store.clone(), cat()).await.unwrap();
    let (fired, dups) = race(vec![a, b], &every_tick()).await;
    assert_eq!(fired, 80, "one commit per tick (duplicates {dups})");
    assert_once_per_tick(store.as_ref()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_on_postgresql_fire_once_per_tick() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let cat = || {
        catalog(&[(
            "quarter-minute",
            spec("*/15 * * * * *", "UTC", MissedTicks::Skip),
        )])
    };
    let mut engines = Vec::new();
    for _ in 0..3 {
        let opts = PoolOptions {
            connections: 2,
            ..Default::default()
        };
        let store: Arc<dyn Store> = Arc::new(PgStore::connect(db.url(), opts).await.unwrap());
        engines.push(Engine::start(store, cat()).await.unwrap());
    }
    let store = engines[0].store.clone();
    let (fired, dups) = race(engines, &every_tick()).await;
    assert_eq!(fired, 80, "one commit per tick (duplicates {dups})");
    assert_once_per_tick(store.as_ref()).await;
}

#[tokio::test]
async fn a_failed_commit_leaves_the_tick_due_and_shows_it_late() {
    let (engine, dir) = sqlite(catalog(&[(
        "late",
        spec("0 * * * *", "UTC", MissedTicks::Skip),
    )]))
    .await;
    let late = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut s = Scheduler::new(late.clone());
    s.pass(&engine, ms("2026-12-01T09:59:00Z")).await;
    // Make the store refuse the tick's receipt: a trigger that fails every receipt insert.
    let path = dir.path().join("trigger-bridge.db");
    let c = rusqlite_open(&path);
    c.execute_batch(
        "CREATE TRIGGER refuse BEFORE INSERT ON receipts BEGIN SELECT RAISE(ABORT, 'refused'); END;",
    )
    .unwrap();
    let (r, _) = s.pass(&engine, ms("2026-12-01T10:00:45Z")).await;
    assert_eq!((r.fired, r.failed), (0, 1), "{r:?}");
    let shown: HashMap<String, u64> = late
        .lock()
        .unwrap()
        .iter()
        .map(|l| (l.subscription.clone(), l.lag_ms))
        .collect();
    assert_eq!(shown.get("late"), Some(&45_000), "late past 30 s");
    let c2 = engine.store.schedule_cursor("late").await.unwrap().unwrap();
    assert_eq!(
        c2.cursor.last_nominal_ms,
        ms("2026-12-01T09:59:00Z") - 1,
        "the cursor did not move"
    );
    // The store recovers within the tick's 60 s grace: it fires, late but once.
    c.execute_batch("DROP TRIGGER refuse;").unwrap();
    let (r, _) = s.pass(&engine, ms("2026-12-01T10:00:50Z")).await;
    assert_eq!(r.fired, 1, "{r:?}");
    assert!(late.lock().unwrap().is_empty());
}

fn rusqlite_open(path: &std::path::Path) -> rusqlite::Connection {
    let c = rusqlite::Connection::open(path).unwrap();
    c.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffer_one_fires_the_held_tick_once_the_previous_run_has_ended() {
    use tb_core::schedule::Overlap;
    let (engine, _dir) = sqlite(catalog(&[(
        "buffered",
        ScheduleSpec {
            overlap: Overlap::BufferOne,
            ..spec("* * * * *", "UTC", MissedTicks::Skip)
        },
    )]))
    .await;
    let mut s = Scheduler::default();
    s.pass(&engine, ms("2026-12-01T10:00:30Z")).await;
    // 10:01 fires; no worker runs, so its delivery stays pending: the previous tick's work goes on.
    let (r, _) = s.pass(&engine, ms("2026-12-01T10:01:00Z")).await;
    assert_eq!(r.fired, 1);
    let (r, next) = s.pass(&engine, ms("2026-12-01T10:02:00Z")).await;
    assert_eq!(r.fired, 0, "10:02 is held: {r:?}");
    let c = engine
        .store
        .schedule_cursor("buffered")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(c.cursor.buffered_ms, Some(ms("2026-12-01T10:02:00Z")));
    assert_eq!(
        next,
        Some(ms("2026-12-01T10:02:01Z")),
        "a held tick is looked at again within a second, not at the next tick"
    );
    // The previous run ends: a worker delivers it.
    let (stop, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(trigger_bridge_engine::worker::run(
        engine.clone(),
        Default::default(),
        rx,
    ));
    let first = c.cursor.last_receipt.clone().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !engine.store.deliveries_of_receipt(&first).await.unwrap()[0]
        .state
        .is_terminal()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the first run did not end"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (r, _) = s.pass(&engine, ms("2026-12-01T10:02:01Z")).await;
    assert_eq!(r.fired, 1, "the held tick fires: {r:?}");
    assert_eq!(
        fired(engine.store.as_ref(), "buffered").await,
        ["2026-12-01T10:01:00Z", "2026-12-01T10:02:00Z"]
    );
    stop.send(true).unwrap();
}

/// A pass committed a tick on time but its cursor write was lost; a later pass past the grace must
/// not fire that tick again as the `run_once` catch-up.
#[tokio::test]
async fn a_tick_committed_on_time_is_not_fired_again_as_the_catch_up() {
    let (engine, _dir) = sqlite(catalog(&[(
        "once",
        spec("* * * * *", "UTC", MissedTicks::RunOnce),
    )]))
    .await;
    let mut s = Scheduler::default();
    s.pass(&engine, ms("2026-12-01T09:59:30Z")).await;
    let anchor = engine.store.schedule_cursor("once").await.unwrap().unwrap();
    let (r, _) = s.pass(&engine, ms("2026-12-01T10:00:00Z")).await;
    assert_eq!(r.fired, 1);
    // Lose the cursor write: put the anchor back.
    let now = engine.store.schedule_cursor("once").await.unwrap().unwrap();
    assert!(engine
        .store
        .put_schedule_cursor("once", anchor.cursor.clone(), Some(now.version), 1)
        .await
        .unwrap());
    // Back at 10:01:30: 10:00 is past its grace (the latest "missed" tick, committed already), 10:01
    // is on time. Without the repair 10:00 would run again as the catch-up stamped 10:00.
    let mut s = Scheduler::default();
    let (r, _) = s.pass(&engine, ms("2026-12-01T10:01:30Z")).await;
    assert_eq!((r.fired, r.missed), (1, 0), "{r:?}");
    assert_eq!(
        fired(engine.store.as_ref(), "once").await,
        ["2026-12-01T10:00:00Z", "2026-12-01T10:01:00Z"],
        "10:00 once, never again as the catch-up"
    );
    // Later ticks go on as usual.
    let (r, _) = s.pass(&engine, ms("2026-12-01T10:05:00Z")).await;
    assert_eq!(
        r.fired, 3,
        "catch-up for 10:02-10:03, then 10:04 and 10:05: {r:?}"
    );
}
