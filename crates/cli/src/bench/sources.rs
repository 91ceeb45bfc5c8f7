//! Source benchmarks, in process on a scratch SQLite store:
//!
//! * `bench schedules`: N schedules firing every minute; each simulated minute is one scheduler pass
//!   (the clock is injected, so nothing waits for real minutes). Per pass: ticks committed per second,
//!   the pass's wall time (= how late the last of the N ticks fires behind its nominal minute), and
//!   this process's CPU per tick. The ticks' runs are not started (no worker): this is the tick path.
//! * `bench queue`: M messages published to a fresh JetStream stream, then consumed: messages/s to
//!   committed receipts and to started (`noop`) runs, and CPU per message.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tb_core::binding::{Binding, BindingAction};
use tb_core::queue::QueueSpec;
use tb_core::schedule::ScheduleSpec;
use tb_core::workflow::{Executor, Workflow};
use tb_engine::scheduler::Scheduler;
use tb_engine::{Catalog, Engine, SubscriptionConfig};
use tb_store::sqlite::SqliteStore;
use tb_store::Store;

/// This process's user + system CPU time.
pub(crate) fn cpu() -> Duration {
    // SAFETY: `rusage` is plain integers, for which all-zero bytes are a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable `rusage` that outlives the call.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn noop() -> Workflow {
    Workflow {
        id: "noop".into(),
        executor: Executor::Noop,
    }
}

fn binding(sub: &str) -> Binding {
    Binding {
        rate_limit_per_min: 0,
        id: format!("{sub}-run"),
        subscription: sub.into(),
        event_types: vec!["*".into()],
        filter: Default::default(),
        action: BindingAction::start_run("noop"),
        inputs: Default::default(),
    }
}

fn scratch(dir: &Path, name: &str) -> Result<std::path::PathBuf> {
    let d = dir.join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
    Ok(d)
}

/// `bench schedules`.
pub async fn schedules(count: usize, minutes: usize, data_dir: &Path) -> Result<()> {
    let dir = scratch(data_dir, "bench-schedules")?;
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(&dir)?);
    let ids: Vec<String> = (0..count).map(|i| format!("sched-{i:06}")).collect();
    let subs = ids
        .iter()
        .map(|id| SubscriptionConfig::schedule(id, ScheduleSpec::new("* * * * *")))
        .collect();
    let bindings = ids.iter().map(|id| binding(id)).collect();
    eprintln!("creating {count} schedules ...");
    let engine = Engine::start(store, Catalog::new(subs, bindings, vec![noop()]))
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let t0 = (tb_engine::clock::now_ms() / 60_000 + 1) * 60_000;
    let mut s = Scheduler::default();
    // First sight: every cursor is anchored (one write each), nothing fires.
    s.pass(&engine, t0 - 30_000).await;
    let (mut rates, mut lags, mut cpus) = (Vec::new(), Vec::new(), Vec::new());
    for m in 0..minutes {
        let (c0, w0) = (cpu(), Instant::now());
        let (r, _) = s.pass(&engine, t0 + m as i64 * 60_000).await;
        let (wall, used) = (w0.elapsed(), cpu() - c0);
        if r.fired as usize != count {
            bail!("minute {m}: {} of {count} ticks fired ({r:?})", r.fired);
        }
        eprintln!(
            "minute {m}: {count} ticks in {:.2} s ({:.0} ticks/s), CPU {:.0} us/tick",
            wall.as_secs_f64(),
            count as f64 / wall.as_secs_f64(),
            used.as_micros() as f64 / count as f64
        );
        rates.push(count as f64 / wall.as_secs_f64());
        lags.push(wall.as_secs_f64());
        cpus.push(used.as_micros() as f64 / count as f64);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    };
    println!(
        "schedules: {count} firing every minute, {minutes} minutes: {:.0} ticks/s, last tick {:.2} s behind its minute, CPU {:.0} us/tick (medians; SQLite, tick commits only)",
        median(&mut rates),
        median(&mut lags),
        median(&mut cpus)
    );
    engine.store.close().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// `bench queue`.
pub async fn queue(messages: usize, nats_url: &str, data_dir: &Path) -> Result<()> {
    let dir = scratch(data_dir, "bench-queue")?;
    let db = dir.join(tb_store::sqlite::DB_FILE);
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(&dir)?);
    let stream = format!("BENCH_{}", std::process::id());
    let mut spec = QueueSpec::new(&stream);
    spec.subjects = vec![format!("bench.{}.>", std::process::id())];
    spec.create_stream = true;
    let subject = format!("bench.{}.msg", std::process::id());
    let sub = SubscriptionConfig::queue("bench-queue", spec);
    let engine = Engine::start(
        store,
        Catalog::new(vec![sub], vec![binding("bench-queue")], vec![noop()]),
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let client = async_nats::connect(nats_url)
        .await
        .with_context(|| format!("cannot reach NATS at {nats_url}"))?;
    let js = async_nats::jetstream::new(client.clone());
    js.get_or_create_stream(async_nats::jetstream::stream::Config {
        name: stream.clone(),
        subjects: vec![format!("bench.{}.>", std::process::id())],
        ..Default::default()
    })
    .await
    .map_err(|e| anyhow::anyhow!("stream: {e}"))?;
    eprintln!("publishing {messages} messages to {stream} ...");
    let body = br#"{"type":"bench","data":{"n":1}}"#.to_vec();
    let mut acks = Vec::new();
    for i in 0..messages {
        let mut h = async_nats::HeaderMap::new();
        h.insert("Nats-Msg-Id", format!("m-{i}").as_str());
        acks.push(
            js.publish_with_headers(subject.clone(), h, body.clone().into())
                .await
                .map_err(|e| anyhow::anyhow!("publish: {e}"))?,
        );
        if acks.len() >= 512 {
            for a in acks.drain(..) {
                a.await.map_err(|e| anyhow::anyhow!("publish ack: {e}"))?;
            }
        }
    }
    for a in acks.drain(..) {
        a.await.map_err(|e| anyhow::anyhow!("publish ack: {e}"))?;
    }
    let (stop, rx) = tokio::sync::watch::channel(false);
    let (c0, w0) = (cpu(), Instant::now());
    tokio::spawn(tb_engine::worker::run(
        engine.clone(),
        Default::default(),
        rx.clone(),
    ));
    tokio::spawn(tb_engine::queue::run(engine.clone(), Some(client), rx));
    let count = |sql: &str| -> i64 {
        rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .and_then(|c| c.query_row(sql, [], |r| r.get(0)))
            .unwrap_or(0)
    };
    let mut receipts_done = None;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let receipts = count("SELECT COUNT(*) FROM receipts");
        if receipts_done.is_none() && receipts >= messages as i64 {
            receipts_done = Some(w0.elapsed());
        }
        if count("SELECT COUNT(*) FROM runs") >= messages as i64 {
            break;
        }
        if Instant::now() > deadline {
            bail!("not drained in 600 s: {receipts} receipts");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (wall, used) = (w0.elapsed(), cpu() - c0);
    let to_receipts = receipts_done.unwrap_or(wall);
    let _ = stop.send(true);
    let _ = js.delete_stream(&stream).await;
    println!(
        "queue: {messages} JetStream messages: {:.0} msg/s to receipts, {:.0} msg/s to runs, CPU {:.0} us/msg (SQLite, noop runs)",
        messages as f64 / to_receipts.as_secs_f64(),
        messages as f64 / wall.as_secs_f64(),
        used.as_micros() as f64 / messages as f64
    );
    engine.store.close().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
