//! The SQLite writer thread under failure: a panicking job, a full queue, a dead
//! writer, a locked database and a full disk each give the caller a typed error in bounded time, and the
//! store goes on where it can.

use std::future::Future;
use std::pin::Pin;
use std::sync::mpsc as std_mpsc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use serde_json::json;
use tb_core::ids::{new_id, IdKind};
use tb_core::receipt::ReceiptState;
use tb_core::subscription::Source;
use trigger_bridge_store::p;
use trigger_bridge_store::sql::Db;
use trigger_bridge_store::sqlite::writer::WriterOptions;
use trigger_bridge_store::sqlite::{SqliteStore, StoreOptions};
use trigger_bridge_store::*;

/// Upper bound of every wait in this file.
const BOUND: Duration = Duration::from_secs(10);

fn def(id: &str) -> SubscriptionDef {
    SubscriptionDef {
        id: id.into(),
        source: Source::Webhook,
        connector: "github".into(),
        config: json!({}),
        failure_threshold: 0,
    }
}

fn unmatched(body: Bytes) -> NewReceipt {
    NewReceipt {
        id: new_id(IdKind::Receipt),
        source: tb_core::receipt::ReceiptSource::Webhook,
        subscription_id: "s".into(),
        dedup_key: new_id(IdKind::Receipt),
        provider_event_id: "pe".into(),
        event_type: "push".into(),
        normalized: json!({"event": "push"}),
        state: ReceiptState::Unmatched,
        content_type: Some("application/json".into()),
        body,
        received_at: 2_000,
        dedup_until: 2_000 + 86_400_000,
        deliveries: vec![],
        capability: None,
        lease: None,
        trace_context: None,
    }
}

fn open(capacity: usize, busy_timeout: Duration) -> (SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        writer: WriterOptions {
            queue_capacity: capacity,
        },
        busy_timeout,
    };
    (SqliteStore::open_dir_with(dir.path(), opts).unwrap(), dir)
}

async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(BOUND, f)
        .await
        .expect("store answered within the bound")
}

/// Polls `f` once, so a store write enqueues its job, and hands it back.
async fn poll_once<F: Future>(mut f: Pin<Box<F>>) -> Pin<Box<F>> {
    std::future::poll_fn(|cx| {
        assert!(f.as_mut().poll(cx).is_pending(), "the writer is blocked");
        Poll::Ready(())
    })
    .await;
    f
}

/// A job that tells `started` it runs, then blocks the writer until `release` (at most [`BOUND`]).
fn blocker(
    started: std_mpsc::Sender<()>,
    release: std_mpsc::Receiver<()>,
) -> impl FnMut(&dyn Db) -> StoreResult<()> + Send + 'static {
    move |_| {
        started.send(()).unwrap();
        release.recv_timeout(BOUND).expect("released");
        Ok(())
    }
}

fn count(c: &dyn Db, table: &str) -> StoreResult<i64> {
    Ok(c.value(&format!("SELECT count(*) FROM {table}"), p![])?
        .unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_job_is_rolled_back_alone_and_the_writer_goes_on() {
    let (store, _dir) = open(16, Duration::from_secs(1));
    store
        .write_for_test(|c| c.exec("CREATE TABLE scratch (x TEXT)", p![]).map(|_| ()))
        .await
        .unwrap();
    // Hold the writer so the panicking job and a good one land in ONE batch.
    let (started_tx, started) = std_mpsc::channel();
    let (release, release_rx) = std_mpsc::channel();
    let hold = poll_once(Box::pin(
        store.write_for_test(blocker(started_tx, release_rx)),
    ))
    .await;
    tokio::task::spawn_blocking(move || started.recv_timeout(BOUND))
        .await
        .unwrap()
        .expect("the blocking job runs");
    let panicking = poll_once(Box::pin(store.write_for_test(|c| -> StoreResult<()> {
        c.exec(
            "INSERT INTO scratch VALUES ('from the panicking job')",
            p![],
        )
        .unwrap();
        panic!("boom in a write job");
    })))
    .await;
    let good =
        poll_once(Box::pin(store.write_for_test(|c| {
            c.exec("INSERT INTO scratch VALUES ('good')", p![])
        })))
        .await;
    release.send(()).unwrap();
    bounded(hold).await.unwrap();
    match bounded(panicking).await {
        Err(StoreError::Database(m)) => assert!(m.contains("panicked"), "{m}"),
        other => panic!("the panicking job's caller gets a Database error, got {other:?}"),
    }
    assert_eq!(bounded(good).await.unwrap(), 1, "its batch-mate committed");
    let rows: Vec<String> = store
        .write_for_test(|c| c.rows("SELECT x FROM scratch", p![], |r| r.get(0)))
        .await
        .unwrap();
    assert_eq!(
        rows,
        vec!["good".to_string()],
        "the panicking job rolled back"
    );
    // The writer is alive and the next store write succeeds.
    assert!(store.writer_alive());
    let rec = bounded(store.upsert_subscription(def("after-panic"), 1_000))
        .await
        .unwrap();
    assert_eq!(rec.id, "after-panic");
    store.ping_writer().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_busy_at_once_and_nothing_is_written() {
    let (store, _dir) = open(2, Duration::from_secs(1));
    let (started_tx, started) = std_mpsc::channel();
    let (release, release_rx) = std_mpsc::channel();
    let hold = poll_once(Box::pin(
        store.write_for_test(blocker(started_tx, release_rx)),
    ))
    .await;
    tokio::task::spawn_blocking(move || started.recv_timeout(BOUND))
        .await
        .unwrap()
        .expect("the blocking job runs");
    // The writer is busy with `hold`; two jobs fill the queue of 2.
    let q1 = poll_once(Box::pin(store.upsert_subscription(def("q1"), 1_000))).await;
    let q2 = poll_once(Box::pin(store.upsert_subscription(def("q2"), 1_000))).await;
    match bounded(store.upsert_subscription(def("refused"), 1_000)).await {
        Err(e @ StoreError::Busy(_)) => {
            assert_eq!(e.code(), tb_core::ErrorCode::Unavailable);
            assert_eq!(e.code().http_status(), 503);
        }
        other => panic!("a full queue is Busy, got {other:?}"),
    }
    assert!(matches!(
        store.ping_writer().await,
        Err(StoreError::Busy(_))
    ));
    release.send(()).unwrap();
    bounded(hold).await.unwrap();
    assert_eq!(bounded(q1).await.unwrap().id, "q1");
    assert_eq!(bounded(q2).await.unwrap().id, "q2");
    let ids: Vec<String> = store
        .list_subscriptions()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(ids, vec!["q1", "q2"], "the refused write left nothing");
    store.ping_writer().await.unwrap();
}

#[tokio::test]
async fn a_dead_writer_makes_the_store_unavailable() {
    let (store, _dir) = open(16, Duration::from_secs(1));
    store.ping_writer().await.unwrap();
    store.crash_writer_for_test().unwrap();
    bounded(async {
        while store.writer_alive() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(matches!(
        store.ping_writer().await,
        Err(StoreError::Unavailable(_))
    ));
    match bounded(store.upsert_subscription(def("s"), 1_000)).await {
        Err(e @ StoreError::Unavailable(_)) => assert_eq!(e.code().http_status(), 503),
        other => panic!("writes after the writer died are Unavailable, got {other:?}"),
    }
    // Refused before it ran: the subscription was not written.
    let db = rusqlite::Connection::open(store.path()).unwrap();
    let n: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM subscriptions WHERE id = 's'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 0, "a refused write was committed");
}

#[tokio::test]
async fn a_locked_database_fails_the_batch_with_busy_in_bounded_time() {
    let (store, dir) = open(16, Duration::from_millis(200));
    store.upsert_subscription(def("s"), 1_000).await.unwrap();
    // Another process holds the write lock.
    let other = rusqlite::Connection::open(dir.path().join("trigger-bridge.db")).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let t0 = std::time::Instant::now();
    match bounded(store.commit_receipt(unmatched(Bytes::from_static(b"{}")))).await {
        Err(e @ StoreError::Busy(_)) => assert_eq!(e.code().http_status(), 503),
        other => panic!("a locked database is Busy, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    other.execute_batch("ROLLBACK").unwrap();
    let r = unmatched(Bytes::from_static(b"{}"));
    let id = r.id.clone();
    store.commit_receipt(r).await.unwrap();
    assert_eq!(store.get_receipt(&id).await.unwrap().id, id);
}

#[tokio::test]
async fn a_full_disk_is_unavailable_and_rolls_the_write_back() {
    let (store, _dir) = open(16, Duration::from_secs(1));
    store.upsert_subscription(def("s"), 1_000).await.unwrap();
    // Simulate a full disk: the writer's connection may not grow the file any more.
    store
        .write_for_test(|c| {
            let pages: i64 = c.value("PRAGMA page_count", p![]).unwrap().unwrap();
            let _: Option<i64> = c
                .value(&format!("PRAGMA max_page_count = {pages}"), p![])
                .unwrap();
            Ok(())
        })
        .await
        .unwrap();
    let big = unmatched(Bytes::from(vec![b'x'; 256 * 1024]));
    let id = big.id.clone();
    match bounded(store.commit_receipt(big)).await {
        Err(e @ StoreError::Unavailable(_)) => assert_eq!(e.code().http_status(), 503),
        other => panic!("a full disk is Unavailable, got {other:?}"),
    }
    assert!(matches!(
        store.get_receipt(&id).await,
        Err(StoreError::NotFound { .. })
    ));
    let n = store
        .write_for_test(|c| count(c, "receipts"))
        .await
        .unwrap();
    assert_eq!(n, 0, "no partial state");
    store
        .write_for_test(|c| {
            let _: Option<i64> = c.value("PRAGMA max_page_count = 1073741823", p![]).unwrap();
            Ok(())
        })
        .await
        .unwrap();
    let r = unmatched(Bytes::from(vec![b'y'; 256 * 1024]));
    let id = r.id.clone();
    store.commit_receipt(r).await.unwrap();
    assert_eq!(store.get_body(&id).await.unwrap().len(), 256 * 1024);
}
