//! A queue subscription under SIGKILL: the server consumes a NATS JetStream stream and is
//! killed three times mid-stream, then restarted. A message committed but not yet acked when the
//! process died is redelivered by JetStream and answered `duplicate` by its receipt's dedup key, so
//! every message ends as exactly one receipt and one run. Uses its own nats-server (skips with a
//! printed reason without one, unless `CI` is set).

mod common;

use std::time::{Duration, Instant};

use common::{free_port, Server};

const MESSAGES: u32 = 1500;
const KILLS: usize = 3;

fn count(db: &std::path::Path, sql: &str) -> i64 {
    let c = rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    c.busy_timeout(Duration::from_secs(5)).unwrap();
    c.query_row(sql, [], |r| r.get(0)).unwrap_or(0)
}

#[test]
fn sigkill_between_commit_and_ack_is_deduplicated_on_redelivery() {
    let Some(nats) = tb_engine::testing::NatsServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tb.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[server]
# Leases of the killed process lapse in 2 s (the default is 60 s).
lease_ms = 2000
nats_url = "{}"

[[subscriptions]]
id = "orders"
source = "queue"
[subscriptions.queue]
stream = "ORDERS"
subjects = ["orders.>"]
create_stream = true
ack_wait_ms = 1000
batch = 64

[[workflows]]
id = "noop"
executor = "noop"

[[bindings]]
id = "on-order"
subscription = "orders"
event_types = ["queue.message"]
action = "start_run"
workflow = "noop"
"#,
            nats.url()
        ),
    )
    .unwrap();
    let data = dir.path().join("data");
    let db = data.join("trigger-bridge.db");
    let mut server = Server::spawn(&config, &data, free_port());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let js = rt.block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
        let deadline = Instant::now() + Duration::from_secs(10);
        while js.get_stream("ORDERS").await.is_err() {
            assert!(
                Instant::now() < deadline,
                "the bridge did not create the stream"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for i in 0..MESSAGES {
            // Right after the stream is created its subjects may not take messages yet under load
            // (the ack is "no responders", StreamNotFound): a bounded retry, as a publisher does.
            // `Nats-Msg-Id` makes a retried publish count once.
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let mut h = async_nats::HeaderMap::new();
                h.insert("Nats-Msg-Id", format!("order-{i}").as_str());
                let ack = js
                    .publish_with_headers("orders.new", h, br#"{"type":"order"}"#.to_vec().into())
                    .await
                    .unwrap()
                    .await;
                match ack {
                    Ok(_) => break,
                    Err(e) if Instant::now() < deadline => {
                        eprintln!("publish {i}: {e}; retrying");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => panic!("publish {i}: {e}"),
                }
            }
        }
        js
    });
    let started = Instant::now();
    let receipts = "SELECT COUNT(*) FROM receipts WHERE subscription_id = 'orders'";
    let runs = "SELECT COUNT(*) FROM runs";
    for k in 1..=KILLS {
        // Kill mid-stream: once this kill's share of the messages has receipts.
        let at = (MESSAGES as i64 * k as i64) / (KILLS as i64 + 1);
        let deadline = Instant::now() + Duration::from_secs(60);
        while count(&db, receipts) < at {
            assert!(
                Instant::now() < deadline,
                "only {} receipts",
                count(&db, receipts)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        eprintln!(
            "kill {k} at {} receipts, {:?}",
            count(&db, receipts),
            started.elapsed()
        );
        server.kill9();
        server.restart();
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while count(&db, runs) < MESSAGES as i64 {
        assert!(
            Instant::now() < deadline,
            "drain: {} receipts, {} runs",
            count(&db, receipts),
            count(&db, runs)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Past several ack waits, for any late redelivery.
    std::thread::sleep(Duration::from_millis(3_000));
    assert_eq!(
        count(&db, receipts),
        MESSAGES as i64,
        "one receipt per message"
    );
    assert_eq!(count(&db, runs), MESSAGES as i64, "one run per message");
    let (redelivered, pending) = rt.block_on(async {
        let stream = js.get_stream("ORDERS").await.unwrap();
        let mut c: async_nats::jetstream::consumer::PullConsumer =
            stream.get_consumer("tb-orders").await.unwrap();
        let i = c.info().await.unwrap();
        (
            i.num_redelivered,
            i.num_ack_pending + i.num_pending as usize,
        )
    });
    let dups = count(&db, "SELECT COALESCE(SUM(duplicates), 0) FROM receipts");
    eprintln!(
        "{MESSAGES} messages, {KILLS} SIGKILLs: {} receipts, {} runs, {redelivered} redelivered by JetStream, {dups} answered duplicate",
        count(&db, receipts),
        count(&db, runs)
    );
    assert_eq!(pending, 0, "everything acked in the end");
}
