//! Workers over NATS: the nats executor, the orchestrator and the SDK end to end against
//! a private nats-server, in one process: a run is published to a service, handled, and ended by its
//! CompletionEvent; a failing handler is retried with back-off and dead-lettered; headers are read
//! in any case; the Durable Timer triplet never reaches a handler; a service that is down fails the
//! attempts until the delivery is dead-lettered. Skips with a printed reason without
//! `/usr/sbin/nats-server`, unless `CI` is set. Every wait is bounded.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures_util::StreamExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tb_core::retry::{Backoff, RetryPolicy};
use tb_core::run::RunStatus;
use tb_core::workflow::{Executor, Workflow};
use tb_sdk::{Action, Context, HandlerError, Service};
use tb_store::sqlite::SqliteStore;
use tb_store::Store;
use tb_wire::{json, CompletionEvent, DlqEntry, Heartbeat};
use trigger_bridge_engine::worker::{self, WorkerConfig};
use trigger_bridge_engine::{orchestrator, runs, Catalog, Engine};

type Nats = trigger_bridge_engine::testing::NatsServer;

struct Bridge {
    engine: Arc<Engine>,
    _stop: tokio::sync::watch::Sender<bool>,
    _dir: tempfile::TempDir,
}

/// An engine on SQLite whose workflow `wf` runs action `work` of service `svc` over NATS, with its
/// worker and orchestrator; API runs get `attempts` attempts 100 ms apart.
async fn bridge(nats: &Nats, attempts: u32) -> Bridge {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    let wf = Workflow {
        id: "wf".into(),
        executor: Executor::Nats {
            service: "svc".into(),
            action: "work".into(),
            durable_timer: false,
        },
    };
    let engine = Engine::start(store, Catalog::new(vec![], vec![], vec![wf]))
        .await
        .unwrap();
    *engine.api_run_retry.write().unwrap() = RetryPolicy {
        max_attempts: attempts,
        backoff: Backoff::Fixed,
        initial_ms: 100,
        max_ms: 100,
        jitter: 0.0,
        schedule_ms: None,
    };
    let client = async_nats::connect(nats.url()).await.unwrap();
    engine.set_nats(client.clone());
    let (stop, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(worker::run(
        engine.clone(),
        WorkerConfig::default(),
        rx.clone(),
    ));
    tokio::spawn(orchestrator::run(engine.clone(), client, rx));
    Bridge {
        engine,
        _stop: stop,
        _dir: dir,
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
struct Job {
    key: String,
    #[serde(default)]
    fail: bool,
}

#[derive(Serialize, JsonSchema)]
struct Done {
    ok: bool,
}

/// What the handler saw, per call.
type Seen = Arc<Mutex<Vec<(Context, Job, Instant)>>>;

/// Service `svc` with action `work` (3 attempts, 100 ms doubling): fails when the job says so.
fn service(seen: Seen) -> Service {
    Service::new("svc")
        .source("inbound", "triggers.v2.svc.inbound")
        .ack_wait(Duration::from_secs(3))
        .action(
            Action::new("work", move |ctx: Context, job: Job| {
                let seen = seen.clone();
                async move {
                    let fail = job.fail;
                    seen.lock().unwrap().push((ctx, job, Instant::now()));
                    if fail {
                        Err(HandlerError::retryable("the job asked to fail"))
                    } else {
                        Ok(Done { ok: true })
                    }
                }
            })
            .retry(3, Duration::from_millis(100), 2.0, Duration::from_secs(5)),
        )
}

/// Runs `svc` until the returned sender is dropped or sent; waits (<= 10 s) for the orchestrator,
/// then for the service's first heartbeat (sent once its stream and consumers are open).
async fn start_service(
    b: &Bridge,
    nats: &Nats,
    svc: Service,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let url = nats.url();
    let deadline = Instant::now() + Duration::from_secs(10);
    // Register fails fast while no orchestrator listens yet: wait for one first.
    let probe = async_nats::connect(&url).await.unwrap();
    while probe
        .request(
            tb_wire::subjects::MANIFEST_FETCH,
            b"{\"service\":\"none\"}".to_vec().into(),
        )
        .await
        .is_err()
    {
        assert!(Instant::now() < deadline, "no orchestrator within 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let task = tokio::spawn(async move {
        svc.run_until(&url, async {
            let _ = rx.await;
        })
        .await
        .expect("the service runs");
    });
    let started = tb_wire::time::WireTime::now().unix_nanos();
    loop {
        let beat = b
            .engine
            .store
            .get_service("svc")
            .await
            .unwrap()
            .and_then(|r| r.started_at);
        let at = beat.and_then(|t| tb_wire::time::parse_rfc3339nano(&t).ok());
        if at.is_some_and(|t| t.unix_nanos() >= started) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the service did not start within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (tx, task)
}

async fn wait_run(
    engine: &Engine,
    id: &str,
    status: RunStatus,
    within: Duration,
) -> tb_store::RunRecord {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(r) = engine.store.get_run(id).await {
            if r.status == status {
                return r;
            }
            assert!(
                !r.status.is_terminal() || Instant::now() < deadline,
                "run {id} ended {:?}, expected {status:?}",
                r.status
            );
        }
        assert!(
            Instant::now() < deadline,
            "run {id} not {status:?} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_handled_by_the_service_and_ended_by_its_completion_event() {
    let Some(n) = Nats::start() else { return };
    let b = bridge(&n, 3).await;
    let watch = async_nats::connect(n.url()).await.unwrap();
    let mut events = watch.subscribe("triggers.v2.flow.events.>").await.unwrap();
    let mut beats = watch.subscribe(tb_wire::subjects::HEARTBEAT).await.unwrap();
    let seen = Seen::default();
    let svc = service(seen.clone());
    let flows = svc.flows();
    let hash = svc.manifest().manifest_hash;
    let (stop, task) = start_service(&b, &n, svc).await;
    let run_id = runs::start(&b.engine, "wf", serde_json::json!({"key": "a"}))
        .await
        .unwrap();
    let run = wait_run(
        &b.engine,
        &run_id,
        RunStatus::Completed,
        Duration::from_secs(20),
    )
    .await;
    // The register reply handed the service its flow.
    assert!(
        flows.version("wf").is_some_and(|v| v.len() == 12),
        "flow wf known: {:?}",
        flows.version("wf")
    );
    // The handler saw the envelope the executor wrote.
    let (ctx, job, _) = seen.lock().unwrap()[0].clone();
    assert_eq!(job.key, "a");
    assert_eq!(ctx.attempt, 1);
    let env = &ctx.envelope;
    assert_eq!(env.flow_run_id, run_id);
    assert_eq!(env.flow_id, "wf");
    assert_eq!(Some(env.idempotency_key.clone()), run.delivery_id);
    assert_eq!(env.source_node_id, "work");
    assert_eq!(env.retry_count, 0);
    assert_eq!(
        env.traceparent,
        format!("00-{}-{}-01", env.trace_id, env.span_id)
    );
    assert_eq!((env.trace_id.len(), env.span_id.len()), (32, 16));
    // The CompletionEvent's bytes are the documented shape (they re-encode to themselves).
    let m = tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .unwrap()
        .unwrap();
    let ev: CompletionEvent = serde_json::from_slice(&m.payload).unwrap();
    assert_eq!(json::to_vec(&ev, false).unwrap(), m.payload.to_vec());
    assert_eq!(m.subject.as_str(), "triggers.v2.flow.events.wf");
    assert_eq!(
        (ev.status.as_str(), ev.error.as_str(), ev.service.as_str()),
        ("ok", "", "svc")
    );
    assert_eq!(
        (
            ev.flow_run_id.as_str(),
            ev.node_id.as_str(),
            ev.node_type.as_str()
        ),
        (run_id.as_str(), "work", "service")
    );
    let text = std::str::from_utf8(&m.payload).unwrap();
    assert!(
        text.starts_with(r#"{"flow_run_id":""#) && !text.contains(r#""error""#),
        "{text}"
    );
    // Heartbeats: the documented shape and the registered hash.
    let hb = tokio::time::timeout(Duration::from_secs(7), beats.next())
        .await
        .unwrap()
        .unwrap();
    let beat: Heartbeat = serde_json::from_slice(&hb.payload).unwrap();
    assert_eq!(json::to_vec(&beat, false).unwrap(), hb.payload.to_vec());
    assert_eq!(
        (
            beat.service.as_str(),
            beat.manifest_hash.as_str(),
            beat.shutting_down
        ),
        ("svc", hash.as_str(), false)
    );
    // A graceful stop sends a last heartbeat with shutting_down.
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
    let last = loop {
        let hb = tokio::time::timeout(Duration::from_secs(7), beats.next())
            .await
            .unwrap()
            .unwrap();
        let beat: Heartbeat = serde_json::from_slice(&hb.payload).unwrap();
        if beat.shutting_down {
            break beat;
        }
    };
    assert_eq!(last.service, "svc");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !b
        .engine
        .store
        .get_service("svc")
        .await
        .unwrap()
        .unwrap()
        .shutting_down
    {
        assert!(
            Instant::now() < deadline,
            "the last heartbeat did not mark it draining"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_handler_is_retried_with_backoff_then_dead_lettered_once() {
    let Some(n) = Nats::start() else { return };
    let b = bridge(&n, 3).await;
    let seen = Seen::default();
    let (_stop, _task) = start_service(&b, &n, service(seen.clone())).await;
    let input = serde_json::json!({"key": "b", "fail": true});
    let run_id = runs::start(&b.engine, "wf", input.clone()).await.unwrap();
    let run = wait_run(
        &b.engine,
        &run_id,
        RunStatus::Failed,
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(
        run.output.as_ref().unwrap()["error"],
        "the job asked to fail"
    );
    let calls = seen.lock().unwrap().clone();
    assert_eq!(
        calls.iter().map(|c| c.0.attempt).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert_eq!(
        calls
            .iter()
            .map(|c| c.0.envelope.retry_count)
            .collect::<Vec<_>>(),
        [0, 1, 2]
    );
    // Back-off: 100 ms, then 200 ms (JetStream's nak delay; allow scheduling slack below).
    let gap = |i: usize| calls[i].2.duration_since(calls[i - 1].2);
    assert!(
        gap(1) >= Duration::from_millis(90),
        "first retry after {:?}",
        gap(1)
    );
    assert!(
        gap(2) >= Duration::from_millis(190),
        "second retry after {:?}",
        gap(2)
    );
    // One DLQ entry with the full envelope and the input as received.
    let js = jetstream::new(async_nats::connect(n.url()).await.unwrap());
    let mut dlq = js.get_stream("triggers-dlq").await.unwrap();
    let msg = dlq
        .get_last_raw_message_by_subject("triggers.v2.dlq.svc.work")
        .await
        .unwrap();
    let entry: DlqEntry = serde_json::from_slice(&msg.payload).unwrap();
    assert_eq!(entry.kind, "action");
    assert_eq!(entry.err_msg, "the job asked to fail");
    assert_eq!(entry.envelope.flow_run_id, run_id);
    assert_eq!(
        Some(entry.envelope.idempotency_key.clone()),
        run.delivery_id
    );
    assert_eq!(entry.envelope.retry_count, 2);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(entry.body.get()).unwrap(),
        input
    );
    assert_eq!(dlq.info().await.unwrap().state.messages, 1);
    // Publishing the same entry again is de-duplicated by its Nats-Msg-Id.
    let mut h = async_nats::HeaderMap::new();
    h.insert(tb_wire::headers::NATS_MSG_ID, entry.msg_id().as_str());
    let ack = js
        .publish_with_headers("triggers.v2.dlq.svc.work", h, msg.payload.clone())
        .await
        .unwrap()
        .await
        .unwrap();
    assert!(ack.duplicate, "the repeat is a duplicate");
    assert_eq!(dlq.info().await.unwrap().state.messages, 1);
    // The bridge lists it (newest first, the service's subjects only).
    let listing = trigger_bridge_engine::service_dlq::list(&b.engine, Some("svc"), 10)
        .await
        .unwrap();
    assert_eq!(
        (listing.entries.len(), listing.scanned, listing.truncated),
        (1, 1, false)
    );
    assert_eq!(listing.entries[0].subject, "triggers.v2.dlq.svc.work");
    assert_eq!(listing.entries[0].entry.envelope.flow_run_id, run_id);
    let other = trigger_bridge_engine::service_dlq::list(&b.engine, Some("nobody"), 10)
        .await
        .unwrap();
    assert!(other.entries.is_empty());
}

fn sha(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_are_read_in_any_case_and_the_timer_triplet_never_reaches_a_handler() {
    let Some(n) = Nats::start() else { return };
    let b = bridge(&n, 3).await;
    let seen = Seen::default();
    let (_stop, _task) = start_service(&b, &n, service(seen.clone())).await;
    let js = jetstream::new(async_nats::connect(n.url()).await.unwrap());
    let body = br#"{"key":"c"}"#.to_vec();
    let ctx = r#"{"v":1,"kind":"root","flow_id":"f","flow_version":"1","root_execution_id":"ex1"}"#;
    let publish = |pairs: Vec<(&'static str, String)>, body: Vec<u8>| {
        let js = js.clone();
        async move {
            let mut h = async_nats::HeaderMap::new();
            for (k, v) in pairs {
                h.insert(k, v.as_str());
            }
            js.publish_with_headers("triggers.v2.svc.inbound", h, body.into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    };
    publish(
        vec![
            ("x-triggers-flow-run-id", "run-x".into()),
            ("X-TRIGGERS-SOURCE-NODE-ID", "work".into()),
            ("x-Triggers-Retry-Count", "4".into()),
            ("x-triggers-idempotency-key", "idem-c".into()),
            ("x-triggers-emitted-at", "2026-05-26T14:30:45.12Z".into()),
            ("X-Triggers-Durable-Timer-Context", ctx.into()),
            ("x-triggers-execution-id", "ex1".into()),
            ("x-triggers-durable-timer-payload-sha256", sha(&body)),
        ],
        body.clone(),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the handler never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (c, job, _) = seen.lock().unwrap()[0].clone();
    assert_eq!(job.key, "c");
    assert_eq!(c.envelope.flow_run_id, "run-x");
    assert_eq!(c.envelope.idempotency_key, "idem-c");
    assert_eq!(c.envelope.retry_count, 4, "max(header, delivered - 1)");
    assert_eq!(c.envelope.emitted_at.format(), "2026-05-26T14:30:45.12Z");
    assert!(
        !c.headers
            .iter()
            .any(|(k, _)| k.to_ascii_lowercase().contains("durable-timer")
                || k.eq_ignore_ascii_case("x-triggers-execution-id")),
        "the triplet reached the handler: {:?}",
        c.headers
    );
    assert_eq!(
        c.durable_timer
            .as_ref()
            .map(|t| t.root_execution_id.as_str()),
        Some("ex1")
    );
    // A triplet that does not match the payload is rejected to the envelope DLQ; no handler runs.
    publish(
        vec![
            ("X-Triggers-Source-Node-Id", "work".into()),
            ("X-Triggers-Idempotency-Key", "idem-d".into()),
            ("X-Triggers-Durable-Timer-Context", ctx.into()),
            ("X-Triggers-Execution-Id", "ex1".into()),
            ("X-Triggers-Durable-Timer-Payload-SHA256", sha(b"other")),
        ],
        br#"{"key":"d"}"#.to_vec(),
    )
    .await;
    // So is an undecodable body (kind decode, on the action's DLQ) and a node no action serves
    // (kind unknown_action, on the fallback subject).
    publish(
        vec![
            ("X-Triggers-Source-Node-Id", "work".into()),
            ("X-Triggers-Idempotency-Key", "idem-e".into()),
        ],
        b"not json".to_vec(),
    )
    .await;
    publish(
        vec![
            ("X-Triggers-Source-Node-Id", "nope".into()),
            ("X-Triggers-Idempotency-Key", "idem-f".into()),
        ],
        body.clone(),
    )
    .await;
    let dlq = js.get_stream("triggers-dlq").await.unwrap();
    for (subject, kind, key) in [
        ("triggers.v2.dlq.svc.envelope", "envelope", "idem-d"),
        ("triggers.v2.dlq.svc.work", "decode", "idem-e"),
        (
            "triggers.v2.dlq.svc.unknown_action",
            "unknown_action",
            "idem-f",
        ),
    ] {
        let entry = dlq_entry(&dlq, subject).await;
        assert_eq!(
            (entry.kind.as_str(), entry.envelope.idempotency_key.as_str()),
            (kind, key)
        );
    }
    // A flow id that cannot name a subject (no CompletionEvent could be sent) is an envelope error.
    publish(
        vec![
            ("X-Triggers-Source-Node-Id", "work".into()),
            ("X-Triggers-Flow-Id", "a b".into()),
            ("X-Triggers-Flow-Run-Id", "run-g".into()),
            ("X-Triggers-Idempotency-Key", "idem-g".into()),
        ],
        body.clone(),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while dlq_entry(&dlq, "triggers.v2.dlq.svc.envelope")
        .await
        .envelope
        .idempotency_key
        != "idem-g"
    {
        assert!(
            Instant::now() < deadline,
            "no envelope DLQ entry for the bad flow id"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let undecodable = dlq
        .get_last_raw_message_by_subject("triggers.v2.dlq.svc.work")
        .await
        .unwrap();
    let e: DlqEntry = serde_json::from_slice(&undecodable.payload).unwrap();
    assert_eq!(
        e.body.get(),
        r#""not json""#,
        "a body that is not JSON is kept as a string"
    );
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "no handler ran for a rejected message"
    );
}

/// Starts a run of `wf` with `input`, waits (<= 10 s) for it to fail, and returns its id, its
/// delivery and the delivery's attempts.
async fn failed_run(
    b: &Bridge,
    input: serde_json::Value,
) -> (
    String,
    tb_store::DeliveryRecord,
    Vec<tb_store::AttemptRecord>,
) {
    let run_id = runs::start(&b.engine, "wf", input).await.unwrap();
    let run = wait_run(
        &b.engine,
        &run_id,
        RunStatus::Failed,
        Duration::from_secs(10),
    )
    .await;
    let d = b
        .engine
        .store
        .get_delivery(run.delivery_id.as_deref().unwrap())
        .await
        .unwrap();
    let attempts = b.engine.store.attempts(&d.id).await.unwrap();
    (run_id, d, attempts)
}

/// The last DLQ entry on `subject` in the `triggers-dlq` stream, waiting for it (<= 10 s).
async fn dlq_entry(dlq: &jetstream::stream::Stream, subject: &str) -> DlqEntry {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(m) = dlq.get_last_raw_message_by_subject(subject).await {
            return serde_json::from_slice(&m.payload).unwrap();
        }
        assert!(Instant::now() < deadline, "no DLQ entry on {subject}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_that_is_down_fails_attempts_until_the_delivery_is_dead_lettered() {
    let Some(n) = Nats::start() else { return };
    let b = bridge(&n, 2).await;
    // Never registered: attempts fail with service_unregistered.
    let (run_id, d, attempts) = failed_run(&b, serde_json::json!({"key": "e"})).await;
    assert_eq!(d.state.as_str(), "dead-lettered");
    assert_eq!(attempts.len(), 2);
    assert!(
        attempts
            .iter()
            .all(|a| a.error_class.as_deref() == Some("service_unregistered")),
        "{attempts:?}"
    );
    // The orchestrator's source DLQ got an entry for it.
    let js = jetstream::new(async_nats::connect(n.url()).await.unwrap());
    let dlq = js.get_stream("triggers-dlq").await.unwrap();
    let entry = dlq_entry(&dlq, "triggers.v2.dlq.source.api").await;
    assert_eq!(
        (entry.kind.as_str(), entry.envelope.flow_run_id.as_str()),
        ("delivery", run_id.as_str())
    );
    assert!(
        entry.err_msg.starts_with("service_unregistered"),
        "{}",
        entry.err_msg
    );
    let all = trigger_bridge_engine::service_dlq::list(&b.engine, None, 10)
        .await
        .unwrap();
    assert_eq!(all.entries[0].subject, "triggers.v2.dlq.source.api");
    // Registered, then silent for 3 beats (the service task is aborted: no shutdown heartbeat): down.
    let (_stop, task) = start_service(&b, &n, service(Seen::default())).await;
    task.abort();
    let _ = task.await;
    tokio::time::sleep(Duration::from_millis(
        tb_core::service::DOWN_AFTER_MS as u64 + 1_000,
    ))
    .await;
    let (_, d, attempts) = failed_run(&b, serde_json::json!({"key": "f"})).await;
    assert_eq!(d.state.as_str(), "dead-lettered");
    assert!(
        attempts
            .iter()
            .all(|a| a.error_class.as_deref() == Some("service_down")),
        "{attempts:?}"
    );
    assert!(
        attempts[0]
            .message
            .as_deref()
            .unwrap_or("")
            .contains("is down"),
        "{attempts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_past_its_timeout_fails_and_two_sources_share_one_slot() {
    let Some(n) = Nats::start() else { return };
    let b = bridge(&n, 3).await;
    let seen = Seen::default();
    let s2 = seen.clone();
    // One handler slot, two sources; `slow` jobs outlive the 300 ms timeout.
    let svc = Service::new("svc")
        .source("inbound", "triggers.v2.svc.inbound")
        .source("other", "triggers.v2.svc.other")
        .concurrency(1)
        .ack_wait(Duration::from_secs(3))
        .action(
            Action::new("work", move |ctx: Context, job: Job| {
                let seen = s2.clone();
                async move {
                    seen.lock()
                        .unwrap()
                        .push((ctx, job.clone(), Instant::now()));
                    if job.fail {
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                    Ok::<_, HandlerError>(Done { ok: true })
                }
            })
            .timeout(Duration::from_millis(300))
            .retry(2, Duration::from_millis(50), 1.0, Duration::ZERO),
        );
    let (_stop, _task) = start_service(&b, &n, svc).await;
    // Both sources are served by the one slot, the idle one holding none.
    let js = jetstream::new(async_nats::connect(n.url()).await.unwrap());
    for (i, subject) in [
        "triggers.v2.svc.inbound",
        "triggers.v2.svc.other",
        "triggers.v2.svc.inbound",
        "triggers.v2.svc.inbound",
    ]
    .iter()
    .enumerate()
    {
        let mut h = async_nats::HeaderMap::new();
        h.insert("X-Triggers-Source-Node-Id", "work");
        h.insert("X-Triggers-Idempotency-Key", format!("k{i}").as_str());
        let body = format!(r#"{{"key":"k{i}"}}"#);
        js.publish_with_headers(subject.to_string(), h, body.into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.lock().unwrap().len() < 4 {
        assert!(
            Instant::now() < deadline,
            "only {} of 4 handled with one slot",
            seen.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A run whose handler outlives its timeout: 2 attempts, then failed with the timeout's text.
    let run_id = runs::start(
        &b.engine,
        "wf",
        serde_json::json!({"key": "slow", "fail": true}),
    )
    .await
    .unwrap();
    let run = wait_run(
        &b.engine,
        &run_id,
        RunStatus::Failed,
        Duration::from_secs(15),
    )
    .await;
    let error = run.output.as_ref().unwrap()["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        error.starts_with("timeout: no result within 300 ms"),
        "{error}"
    );
    let slow: Vec<i64> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|c| c.1.key == "slow")
        .map(|c| c.0.attempt)
        .collect();
    assert_eq!(slow, [1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_that_cannot_be_written_yet_is_retried_without_running_the_handler_again() {
    let Some(n) = Nats::start() else { return };
    let b = bridge(&n, 3).await;
    let seen = Seen::default();
    let (_stop, _task) = start_service(&b, &n, service(seen.clone())).await;
    // The DLQ stream is full and refuses new entries.
    let js = jetstream::new(async_nats::connect(n.url()).await.unwrap());
    let mut dlq = js.get_stream("triggers-dlq").await.unwrap();
    let mut config = dlq.info().await.unwrap().config.clone();
    config.max_messages = 1;
    config.discard = jetstream::stream::DiscardPolicy::New;
    js.update_stream(config.clone()).await.unwrap();
    js.publish("triggers.v2.dlq.svc.filler", "x".into())
        .await
        .unwrap()
        .await
        .unwrap();
    let run_id = runs::start(
        &b.engine,
        "wf",
        serde_json::json!({"key": "h", "fail": true}),
    )
    .await
    .unwrap();
    // All 3 attempts ran and failed; the entry is refused, so the run is not failed yet.
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.lock().unwrap().len() < 3 {
        assert!(Instant::now() < deadline, "3 attempts did not run");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        b.engine.store.get_run(&run_id).await.unwrap().status,
        RunStatus::Running
    );
    // Room again: the kept message writes its entry and fails the run, with no 4th attempt.
    dlq.purge().await.unwrap();
    config.max_messages = -1;
    js.update_stream(config).await.unwrap();
    wait_run(
        &b.engine,
        &run_id,
        RunStatus::Failed,
        Duration::from_secs(15),
    )
    .await;
    let entry = dlq_entry(&dlq, "triggers.v2.dlq.svc.work").await;
    assert_eq!(
        (entry.kind.as_str(), entry.envelope.flow_run_id.as_str()),
        ("action", run_id.as_str())
    );
    assert_eq!(seen.lock().unwrap().len(), 3, "the handler ran again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_dead_letters_before_the_stream_exists_is_empty_and_without_nats_an_error() {
    let Some(n) = Nats::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    let engine = Engine::start(store, Catalog::new(vec![], vec![], vec![]))
        .await
        .unwrap();
    let err = trigger_bridge_engine::service_dlq::list(&engine, None, 10)
        .await
        .unwrap_err();
    assert!(err.contains("--nats-url"), "{err}");
    // No orchestrator ran: no triggers-dlq stream yet.
    engine.set_nats(async_nats::connect(n.url()).await.unwrap());
    let l = trigger_bridge_engine::service_dlq::list(&engine, Some("svc"), 10)
        .await
        .unwrap();
    assert_eq!((l.entries.len(), l.scanned, l.truncated), (0, 0, false));
}
