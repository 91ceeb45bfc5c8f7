//! `bench services`: actions through the nats executor end to end, in one process on a
//! scratch SQLite store: signed GitHub `pull_request.opened` webhooks go through the real ingest
//! pipeline (signature, routing, commit), the worker publishes each run to a `triggers.v2` service
//! (the SDK, in this process) through JetStream, its handler answers, its CompletionEvent comes back
//! through the completion stream and ends the run. Closed loop with `connections` senders, each
//! waiting for its run to end before sending the next. Reports actions/s, the latency from the
//! webhook call to the run's end (p50/p99) and this process's CPU per action (bridge and service
//! together; the nats-server's is not counted).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tb_core::binding::{Binding, BindingAction};
use tb_core::connector::ConnectorSpec;
use tb_core::workflow::{Executor, Workflow};
use tb_engine::{accept::IngestAnswer, Catalog, Engine, SubscriptionConfig};
use tb_store::sqlite::SqliteStore;
use tb_store::Store;

const SERVICE: &str = "bench-svc";
const SECRET: &[u8] = b"bench-github-secret";

#[derive(serde::Serialize, schemars::JsonSchema)]
struct Done {
    ok: bool,
}

fn catalog() -> Catalog {
    let sub = SubscriptionConfig::webhook("github", ConnectorSpec::Github, SECRET);
    let binding = Binding {
        rate_limit_per_min: 0,
        id: "pr-opened".into(),
        subscription: "github".into(),
        event_types: vec!["pull_request.opened".into()],
        filter: Default::default(),
        action: BindingAction::start_run("work"),
        inputs: [
            ("repository".to_string(), "repository.full_name".to_string()),
            ("number".to_string(), "pull_request.number".to_string()),
        ]
        .into(),
    };
    let wf = Workflow {
        id: "work".into(),
        executor: Executor::Nats {
            service: SERVICE.into(),
            action: "work".into(),
            durable_timer: false,
        },
    };
    Catalog::new(vec![sub], vec![binding], vec![wf])
}

fn request(i: usize) -> (http::HeaderMap, bytes::Bytes) {
    let body = format!(
        r#"{{"action":"opened","number":{i},"pull_request":{{"number":{i},"head":{{"sha":"0123456789abcdef"}}}},"repository":{{"full_name":"acme/app"}}}}"#
    );
    let mut h = http::HeaderMap::new();
    h.insert("content-type", "application/json".parse().unwrap());
    h.insert("x-github-event", "pull_request".parse().unwrap());
    h.insert(
        "x-github-delivery",
        format!("bench-{i}-{}", uuid::Uuid::new_v4())
            .parse()
            .unwrap(),
    );
    h.insert(
        "x-hub-signature-256",
        tb_ingress::github::sign(SECRET, body.as_bytes())
            .parse()
            .unwrap(),
    );
    (h, body.into_bytes().into())
}

/// `bench services`.
pub async fn services(
    events: usize,
    connections: usize,
    nats_url: &str,
    data_dir: &Path,
) -> Result<()> {
    let dir = data_dir.join("bench-services");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let client = async_nats::connect(nats_url).await.map_err(|e| {
        anyhow!("NATS at {nats_url}: {e} (bench services needs a NATS server with JetStream)")
    })?;
    // A fresh inbound stream and completion consumer, so nothing of an earlier run is replayed.
    let js = async_nats::jetstream::new(client.clone());
    let _ = js
        .delete_stream(format!("triggers-sources-{SERVICE}"))
        .await;
    let _ = js.delete_stream(tb_engine::completions::STREAM).await;
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(&dir)?);
    let engine = Engine::start(store, catalog())
        .await
        .map_err(|e| anyhow!("{e}"))?;
    engine.set_nats(client.clone());
    let (stop, rx) = tokio::sync::watch::channel(false);
    let worker = tokio::spawn(tb_engine::worker::run(
        engine.clone(),
        Default::default(),
        rx.clone(),
    ));
    let orch = tokio::spawn(tb_engine::orchestrator::run(
        engine.clone(),
        client.clone(),
        rx.clone(),
    ));
    // The service, in this process, on its own connection.
    let svc = tb_sdk::Service::new(SERVICE)
        .source("inbound", format!("triggers.v2.{SERVICE}.inbound"))
        .concurrency(connections.max(16))
        .action(tb_sdk::Action::new(
            "work",
            |_ctx: tb_sdk::Context, _input: serde_json::Value| async {
                Ok::<_, tb_sdk::HandlerError>(Done { ok: true })
            },
        ));
    let (svc_stop, svc_rx) = tokio::sync::oneshot::channel::<()>();
    let url = nats_url.to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    let service = loop {
        // Register fails fast until the orchestrator listens.
        let probe = client
            .request(
                tb_wire::subjects::MANIFEST_FETCH,
                b"{\"service\":\"-\"}".to_vec().into(),
            )
            .await;
        if probe.is_ok() {
            let url = url.clone();
            break tokio::spawn(async move {
                svc.run_until(&url, async {
                    let _ = svc_rx.await;
                })
                .await
            });
        }
        if Instant::now() > deadline {
            bail!("the orchestrator did not start within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    while engine
        .store
        .get_service(SERVICE)
        .await?
        .is_none_or(|s| s.last_heartbeat_at.is_none())
    {
        if Instant::now() > deadline {
            bail!("the service did not start within 10 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Run ends, delivered to the sender waiting for each.
    let waiting: Arc<Mutex<HashMap<String, tokio::sync::oneshot::Sender<()>>>> = Arc::default();
    let mut ends = engine.run_ends.subscribe();
    let w = waiting.clone();
    tokio::spawn(async move {
        while let Ok(id) = ends.recv().await {
            if let Some(tx) = w.lock().unwrap().remove(&id) {
                let _ = tx.send(());
            }
        }
    });
    eprintln!("{events} webhooks, {connections} at a time, to {SERVICE} over NATS ...");
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (c0, t0) = (super::sources::cpu(), Instant::now());
    let mut senders = Vec::new();
    for _ in 0..connections.max(1) {
        let (engine, next, waiting) = (engine.clone(), next.clone(), waiting.clone());
        senders.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= events {
                    return Ok::<_, anyhow::Error>(lat);
                }
                let (h, body) = request(i);
                let start = Instant::now();
                let answer = tb_engine::ingest::ingest(&engine, "github", &h, body)
                    .await
                    .map_err(|e| anyhow!("ingest: {e}"))?;
                let IngestAnswer::Accepted {
                    run_id: Some(run), ..
                } = answer
                else {
                    bail!("webhook {i} started no run: {answer:?}");
                };
                let (tx, rx) = tokio::sync::oneshot::channel();
                waiting.lock().unwrap().insert(run.clone(), tx);
                // The run may have ended before it was waited for.
                let ended = engine
                    .store
                    .get_run(&run)
                    .await
                    .is_ok_and(|r| r.status.is_terminal());
                if ended {
                    waiting.lock().unwrap().remove(&run);
                } else if tokio::time::timeout(Duration::from_secs(60), rx)
                    .await
                    .is_err()
                {
                    bail!("run {run} did not end within 60 s");
                }
                lat.push(start.elapsed());
            }
        }));
    }
    let mut lat = Vec::with_capacity(events);
    for s in senders {
        lat.extend(s.await??);
    }
    let (wall, used) = (t0.elapsed(), super::sources::cpu() - c0);
    let _ = svc_stop.send(());
    let _ = service.await;
    let _ = stop.send(true);
    let _ = (worker.await, orch.await);
    let _ = std::fs::remove_dir_all(&dir);
    if lat.len() != events {
        bail!("{} of {events} runs ended", lat.len());
    }
    lat.sort();
    let pct =
        |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)].as_secs_f64() * 1000.0;
    println!(
        "services: {:.0} actions/s end to end (webhook -> service handler -> CompletionEvent -> run completed), p50 {:.1} ms, p99 {:.1} ms, {events} runs, {connections} senders, CPU {:.0} µs/action (bridge + service, one process), {} CompletionEvents offered again before their run was recorded",
        events as f64 / wall.as_secs_f64(),
        pct(0.50),
        pct(0.99),
        used.as_secs_f64() * 1e6 / events as f64,
        tb_engine::completions::NOT_YET.load(std::sync::atomic::Ordering::Relaxed)
    );
    Ok(())
}
