//! NATS JetStream queue subscriptions against the real nats-server. Each test starts its
//! own nats-server (`/usr/sbin/nats-server`, JetStream on, a private port and store dir) so it can stop
//! and restart it; without the binary a test skips with a printed reason, unless `CI` is set (then it
//! fails). Every wait is bounded.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use tb_core::binding::{Binding, BindingAction};
use tb_core::queue::QueueSpec;
use tb_core::receipt::{ReceiptSource, ReceiptState};
use tb_core::subscription::SubscriptionState;
use tb_core::workflow::{Executor, Workflow};
use tb_store::sqlite::SqliteStore;
use tb_store::{ListQuery, Store};
use trigger_bridge_engine::worker::{self, WorkerConfig};
use trigger_bridge_engine::{queue, Catalog, Engine, SubscriptionConfig};

type Nats = trigger_bridge_engine::testing::NatsServer;

struct Bridge {
    engine: Arc<Engine>,
    stop: tokio::sync::watch::Sender<bool>,
    _dir: tempfile::TempDir,
}

/// Queue subscription `orders` on `spec` and a binding starting `noop` for every message.
fn catalog(spec: QueueSpec) -> Catalog {
    let sub = SubscriptionConfig::queue("orders", spec);
    let binding = Binding {
        rate_limit_per_min: 0,
        id: "on-order".into(),
        subscription: "orders".into(),
        event_types: vec!["queue.message".into()],
        filter: Default::default(),
        action: BindingAction::start_run("noop"),
        inputs: [("subject".to_string(), "queue.subject".to_string())].into(),
    };
    let wf = Workflow {
        id: "noop".into(),
        executor: Executor::Noop,
    };
    Catalog::new(vec![sub], vec![binding], vec![wf])
}

/// An engine on SQLite with queue subscription `orders` (stream `ORDERS`, subjects `orders.>`,
/// created if missing), a binding starting `noop` for every message, its worker and its consumer.
async fn bridge(nats: &Nats, tune: impl FnOnce(&mut QueueSpec)) -> Bridge {
    let mut spec = QueueSpec::new("ORDERS");
    spec.subjects = vec!["orders.>".into()];
    spec.create_stream = true;
    spec.ack_wait_ms = 2_000;
    tune(&mut spec);
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    let engine = Engine::start(store, catalog(spec)).await.unwrap();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let client = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect(nats.url())
        .await
        .unwrap();
    tokio::spawn(worker::run(
        engine.clone(),
        WorkerConfig::default(),
        rx.clone(),
    ));
    // Duplicate answers are counted on their receipts once a second.
    tokio::spawn(trigger_bridge_engine::duplicates::run(
        engine.clone(),
        rx.clone(),
    ));
    tokio::spawn(queue::run(engine.clone(), Some(client), rx));
    Bridge {
        engine,
        stop,
        _dir: dir,
    }
}

async fn js(nats: &Nats) -> jetstream::Context {
    jetstream::new(async_nats::connect(nats.url()).await.unwrap())
}

/// Publishes `body` on `subject` with `header: id` (when given) and waits for the stream's ack. A
/// stream the engine has just created can answer its info before it takes messages (nats-server
/// 2.9): a publish refused with `StreamNotFound` (so nothing was stored) is retried for up to 10 s;
/// any other error fails the test at once.
async fn publish(
    js: &jetstream::Context,
    subject: &str,
    header: Option<(&str, &str)>,
    body: &[u8],
) {
    use async_nats::jetstream::context::PublishErrorKind;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut h = async_nats::HeaderMap::new();
        if let Some((k, v)) = header {
            h.insert(k, v);
        }
        let sent = js
            .publish_with_headers(subject.to_string(), h, body.to_vec().into())
            .await;
        let acked = match sent {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match acked {
            Ok(_) => return,
            Err(e) if e.kind() == PublishErrorKind::StreamNotFound && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("publish on {subject}: {e}"),
        }
    }
}

async fn receipts(store: &dyn Store) -> Vec<tb_store::ReceiptRecord> {
    let mut out = Vec::new();
    let mut before = None;
    loop {
        let page = store
            .list_receipts(ListQuery {
                limit: 500,
                before: before.clone(),
                state: None,
                subscription_id: Some("orders".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        before = Some(last.id.clone());
        out.extend(page);
    }
    out
}

async fn runs(store: &dyn Store) -> usize {
    let mut n = 0;
    let mut before = None;
    loop {
        let page = store
            .list_runs(ListQuery {
                limit: 500,
                before: before.clone(),
                state: None,
                subscription_id: None,
                ..Default::default()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        before = Some(last.id.clone());
        n += page.len();
    }
    n
}

/// Waits (at most `limit`) until `probe` is true.
async fn until<F, Fut>(limit: Duration, mut probe: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if probe().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_messages_with_ten_percent_repeated_ids_start_exactly_900_runs() {
    let Some(nats) = Nats::start() else { return };
    let b = bridge(&nats, |_| {}).await;
    let js = js(&nats).await;
    // Wait for the consumer to create the stream.
    assert!(
        until(Duration::from_secs(10), || async {
            js.get_stream("ORDERS").await.is_ok()
        })
        .await,
        "the stream was not created"
    );
    for i in 0..1000u32 {
        // Every tenth message repeats an earlier id. The repeat's header is spelled in lower case,
        // which JetStream's own de-duplication does not read (so the stream keeps all 1000) and
        // ours does (headers are read case-insensitively).
        let (name, id) = if i % 10 == 9 {
            ("nats-msg-id", format!("order-{}", i - 5))
        } else {
            ("Nats-Msg-Id", format!("order-{i}"))
        };
        let body = format!(r#"{{"type":"order.created","n":{i}}}"#);
        publish(
            &js,
            &format!("orders.eu.{i}"),
            Some((name, &id)),
            body.as_bytes(),
        )
        .await;
    }
    let info = js
        .get_stream("ORDERS")
        .await
        .unwrap()
        .get_info()
        .await
        .unwrap();
    assert_eq!(
        info.state.last_sequence, 1000,
        "the stream took every message, repeats included (work-queue retention removes acked ones)"
    );
    let store = b.engine.store.clone();
    assert!(
        until(Duration::from_secs(60), || async {
            runs(store.as_ref()).await >= 900
        })
        .await,
        "900 runs did not start within 60 s (got {})",
        runs(store.as_ref()).await
    );
    // Let redeliveries (if any) arrive, then count again: exactly 900.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(runs(store.as_ref()).await, 900);
    let all = receipts(store.as_ref()).await;
    assert_eq!(all.len(), 900);
    assert!(all.iter().all(|r| r.source == ReceiptSource::Queue));
    // Every repeated id was answered duplicate on its first receipt (a redelivery adds more).
    let repeats: u64 = all.iter().map(|r| r.duplicates).sum();
    assert!(
        repeats >= 100,
        "{repeats} duplicates counted, 100 repeats sent"
    );
    // Every message was acked: none left pending for the consumer.
    let stream = js.get_stream("ORDERS").await.unwrap();
    let mut c: jetstream::consumer::PullConsumer = stream.get_consumer("tb-orders").await.unwrap();
    let ci = c.info().await.unwrap();
    assert_eq!((ci.num_ack_pending, ci.num_pending), (0, 0), "{ci:?}");
    b.stop.send(true).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_ends_rejected_terminated_and_visible() {
    let Some(nats) = Nats::start() else { return };
    let b = bridge(&nats, |_| {}).await;
    let js = js(&nats).await;
    assert!(
        until(Duration::from_secs(10), || async {
            js.get_stream("ORDERS").await.is_ok()
        })
        .await
    );
    publish(
        &js,
        "orders.bad",
        Some(("Nats-Msg-Id", "bad-1")),
        b"\xff not json",
    )
    .await;
    publish(
        &js,
        "orders.good",
        Some(("Nats-Msg-Id", "good-1")),
        br#"{"ok":true}"#,
    )
    .await;
    let store = b.engine.store.clone();
    assert!(
        until(Duration::from_secs(20), || async {
            receipts(store.as_ref()).await.len() == 2
        })
        .await
    );
    let all = receipts(store.as_ref()).await;
    let rejected: Vec<_> = all
        .iter()
        .filter(|r| r.state == ReceiptState::Rejected)
        .collect();
    assert_eq!(rejected.len(), 1, "{all:?}");
    assert!(
        until(Duration::from_secs(10), || async {
            runs(store.as_ref()).await == 1
        })
        .await
    );
    // Terminated, not redelivered: after several ack waits there is still one rejected receipt and
    // nothing pending.
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    assert_eq!(receipts(store.as_ref()).await.len(), 2);
    let stream = js.get_stream("ORDERS").await.unwrap();
    let mut c: jetstream::consumer::PullConsumer = stream.get_consumer("tb-orders").await.unwrap();
    let ci = c.info().await.unwrap();
    assert_eq!((ci.num_ack_pending, ci.num_redelivered), (0, 0), "{ci:?}");
    b.stop.send(true).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_nats_server_loses_nothing_and_the_subscription_recovers_on_its_own() {
    let Some(mut nats) = Nats::start() else {
        return;
    };
    let b = bridge(&nats, |_| {}).await;
    let js1 = js(&nats).await;
    assert!(
        until(Duration::from_secs(10), || async {
            js1.get_stream("ORDERS").await.is_ok()
        })
        .await
    );
    for i in 0..200 {
        publish(
            &js1,
            "orders.a",
            Some(("Nats-Msg-Id", &format!("a-{i}"))),
            b"{}",
        )
        .await;
    }
    drop(js1);
    // Stop the server mid-stream (some messages may still be unconsumed), then start it again on
    // the same store dir.
    nats.kill();
    let store = b.engine.store.clone();
    let engine = b.engine.clone();
    assert!(
        until(Duration::from_secs(30), || async {
            engine.subscription_state("orders") == Some(SubscriptionState::Failed)
        })
        .await,
        "the subscription did not go failed while NATS was down"
    );
    assert!(
        engine
            .queues_degraded
            .lock()
            .unwrap()
            .contains_key("orders"),
        "/ready lists the queue as degraded"
    );
    nats.restart();
    let js2 = js(&nats).await;
    for i in 0..200 {
        publish(
            &js2,
            "orders.b",
            Some(("Nats-Msg-Id", &format!("b-{i}"))),
            b"{}",
        )
        .await;
    }
    assert!(
        until(Duration::from_secs(60), || async {
            runs(store.as_ref()).await >= 400
        })
        .await,
        "got {} runs",
        runs(store.as_ref()).await
    );
    assert!(
        until(Duration::from_secs(10), || async {
            engine.subscription_state("orders") == Some(SubscriptionState::Active)
        })
        .await,
        "the subscription did not come back to active"
    );
    assert!(engine.queues_degraded.lock().unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(runs(store.as_ref()).await, 400);
    // Both changes are on the subscription's record.
    // Newest first, with every attempt of the 400 deliveries among them.
    let events = store.subscription_events("orders", 2_000).await.unwrap();
    let tos: Vec<String> = events
        .iter()
        .filter_map(|e| e.payload["toState"].as_str().map(str::to_string))
        .collect();
    assert!(
        tos.contains(&"failed".to_string()) && tos.contains(&"active".to_string()),
        "{tos:?}"
    );
    b.stop.send(true).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_consumer_is_recreated_while_the_bridge_runs() {
    let Some(nats) = Nats::start() else { return };
    let b = bridge(&nats, |_| {}).await;
    let js = js(&nats).await;
    assert!(
        until(Duration::from_secs(10), || async {
            js.get_stream("ORDERS").await.is_ok()
        })
        .await
    );
    publish(&js, "orders.x", Some(("Nats-Msg-Id", "x-1")), b"{}").await;
    let store = b.engine.store.clone();
    assert!(
        until(Duration::from_secs(20), || async {
            runs(store.as_ref()).await == 1
        })
        .await
    );
    let stream = js.get_stream("ORDERS").await.unwrap();
    stream.delete_consumer("tb-orders").await.unwrap();
    for i in 2..=20 {
        publish(
            &js,
            "orders.x",
            Some(("Nats-Msg-Id", &format!("x-{i}"))),
            b"{}",
        )
        .await;
    }
    assert!(
        until(Duration::from_secs(60), || async {
            runs(store.as_ref()).await == 20
        })
        .await,
        "got {} runs after the consumer was deleted",
        runs(store.as_ref()).await
    );
    assert!(stream
        .get_consumer::<jetstream::consumer::pull::Config>("tb-orders")
        .await
        .is_ok());
    b.stop.send(true).unwrap();
}

/// Two replicas on one PostgreSQL database share one durable consumer: every message is consumed by
/// one of them, and a message both see (a redelivery) still starts one run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_on_postgresql_share_the_consumer_and_start_one_run_per_message() {
    use tb_store::postgres::testing::TestDatabase;
    use tb_store::postgres::{PgStore, PoolOptions};
    let Some(nats) = Nats::start() else { return };
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let mut spec = QueueSpec::new("ORDERS");
    spec.subjects = vec!["orders.>".into()];
    spec.create_stream = true;
    spec.ack_wait_ms = 2_000;
    spec.batch = 8;
    let (stop, rx) = tokio::sync::watch::channel(false);
    let mut engines = Vec::new();
    for _ in 0..2 {
        let opts = PoolOptions {
            connections: 2,
            ..Default::default()
        };
        let store: Arc<dyn Store> = Arc::new(PgStore::connect(db.url(), opts).await.unwrap());
        let engine = Engine::start(store, catalog(spec.clone())).await.unwrap();
        let client = async_nats::connect(nats.url()).await.unwrap();
        tokio::spawn(worker::run(
            engine.clone(),
            WorkerConfig::default(),
            rx.clone(),
        ));
        tokio::spawn(queue::run(engine.clone(), Some(client), rx.clone()));
        engines.push(engine);
    }
    let js = js(&nats).await;
    assert!(
        until(Duration::from_secs(10), || async {
            js.get_stream("ORDERS").await.is_ok()
        })
        .await
    );
    for i in 0..300u32 {
        // Every third message is published twice under the same id, the second spelled so that
        // JetStream keeps it: the two copies may go to different replicas.
        let id = format!("m-{i}");
        publish(&js, "orders.x", Some(("Nats-Msg-Id", &id)), b"{}").await;
        if i % 3 == 0 {
            publish(&js, "orders.x", Some(("NATS-MSG-ID", &id)), b"{}").await;
        }
    }
    let store = engines[0].store.clone();
    assert!(
        until(Duration::from_secs(60), || async {
            runs(store.as_ref()).await >= 300
        })
        .await,
        "got {} runs",
        runs(store.as_ref()).await
    );
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert_eq!(runs(store.as_ref()).await, 300);
    assert_eq!(receipts(store.as_ref()).await.len(), 300);
    stop.send(true).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_stream_is_recreated_when_the_config_allows_it() {
    let Some(nats) = Nats::start() else { return };
    let b = bridge(&nats, |_| {}).await;
    let js = js(&nats).await;
    assert!(
        until(Duration::from_secs(10), || async {
            js.get_stream("ORDERS").await.is_ok()
        })
        .await
    );
    publish(&js, "orders.y", Some(("Nats-Msg-Id", "y-1")), b"{}").await;
    let store = b.engine.store.clone();
    assert!(
        until(Duration::from_secs(20), || async {
            runs(store.as_ref()).await == 1
        })
        .await
    );
    js.delete_stream("ORDERS").await.unwrap();
    // The consumer notices (its pull ends), re-creates the stream and its consumer.
    assert!(
        until(Duration::from_secs(30), || async {
            match js.get_stream("ORDERS").await {
                Ok(s) => s
                    .get_consumer::<jetstream::consumer::pull::Config>("tb-orders")
                    .await
                    .is_ok(),
                Err(_) => false,
            }
        })
        .await,
        "the stream and consumer were not re-created"
    );
    // The re-created stream answers its info before it takes messages: a publish right after it may
    // still be told the stream is not found (seen once in a full run), so the first one is retried.
    assert!(
        until(Duration::from_secs(10), || async {
            let mut h = async_nats::HeaderMap::new();
            h.insert("Nats-Msg-Id", "y-2");
            match js
                .publish_with_headers("orders.y".to_string(), h, b"{}".to_vec().into())
                .await
            {
                Ok(ack) => ack.await.is_ok(),
                Err(_) => false,
            }
        })
        .await,
        "the re-created stream never took a message"
    );
    for i in 3..=5 {
        publish(
            &js,
            "orders.y",
            Some(("Nats-Msg-Id", &format!("y-{i}"))),
            b"{}",
        )
        .await;
    }
    assert!(
        until(Duration::from_secs(30), || async {
            runs(store.as_ref()).await == 5
        })
        .await,
        "got {} runs",
        runs(store.as_ref()).await
    );
    b.stop.send(true).unwrap();
}

/// Without NATS (`serve` without `--nats-url`) a queue subscription says what to do, and nothing else
/// is affected.
#[tokio::test]
async fn without_nats_a_queue_subscription_reports_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    let sub = SubscriptionConfig::queue("orders", QueueSpec::new("ORDERS"));
    let engine = Engine::start(store, Catalog::new(vec![sub], vec![], vec![]))
        .await
        .unwrap();
    let (stop, rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(queue::run(engine.clone(), None, rx));
    assert!(
        until(Duration::from_secs(5), || async {
            engine
                .queues_degraded
                .lock()
                .unwrap()
                .contains_key("orders")
        })
        .await
    );
    let why = engine.queues_degraded.lock().unwrap()["orders"].clone();
    assert!(why.contains("--nats-url"), "{why}");
    assert_eq!(
        engine.subscription_state("orders"),
        Some(SubscriptionState::Active),
        "no source was ever lost: the state is untouched"
    );
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap()
        .unwrap();
}
