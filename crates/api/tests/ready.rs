//! `GET /ready`: public; 200 while the store's writer commits; 503 with
//! `Retry-After: 1` when the writer is stopped, dead or its queue is full; dead-lettered subscriptions
//! are warnings, not failures. A full writer queue answers API writes 503 `unavailable`.

mod support;

use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tb_core::connector::ConnectorSpec;
use tb_core::subscription::SubscriptionInput;
use tb_engine::{Catalog, SubscriptionConfig};
use tb_store::sqlite::writer::WriterOptions;
use tb_store::sqlite::{SqliteStore, StoreOptions};
use tb_store::Store;

use support::*;

const BOUND: Duration = Duration::from_secs(10);

async fn ready(s: &Server) -> (u16, Option<String>, Value) {
    let r = s
        .http
        .get(format!("{}/ready", s.base))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let retry = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    (status, retry, r.json().await.unwrap())
}

/// `GET /ready` until `f` holds on its answer (a probe's result answers for
/// `tb_engine::readiness::PROBE_INTERVAL`, so a change shows within about a second); at most [`BOUND`].
async fn ready_until(s: &Server, f: impl Fn(u16, &Value) -> bool) -> (u16, Option<String>, Value) {
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let r = ready(s).await;
        if f(r.0, &r.2) || tokio::time::Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A server over a SQLite store the test keeps a handle on (to block or crash its writer).
async fn server_with(capacity: usize) -> (Server, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions {
        writer: WriterOptions {
            queue_capacity: capacity,
        },
        ..Default::default()
    };
    let sqlite = Arc::new(SqliteStore::open_dir_with(dir.path(), opts).unwrap());
    let store: Arc<dyn Store> = sqlite.clone();
    let sub = SubscriptionConfig::webhook("github", ConnectorSpec::Github, GH_SECRET.as_bytes());
    let s = serve(dir, store, Catalog::new(vec![sub], vec![], vec![]), vec![]).await;
    (s, sqlite)
}

#[tokio::test]
async fn ready_is_public_200_and_lists_dead_lettered_subscriptions_as_warnings() {
    let key = trigger_bridge_api::auth::ApiKey::full_scope("ops", "k-123");
    let s = start_with_keys(None, fast_retry(1), 0, vec![key]).await;
    let (status, retry, body) = ready(&s).await;
    assert_eq!((status, retry), (200, None), "{body}");
    assert_eq!(
        body,
        json!({
            "status": "ready",
            "checks": {"writer": "ok", "reads": "ok", "shutdown": "no"},
            "store": {"backend": "sqlite", "reachable": true},
            "warnings": {"subscriptions": {"dead-lettered": [], "failed": []}, "schedules": {"late": []}, "queues": {"degraded": {}}, "secrets": {"unsealable": {}},
                "auditLog": {"status": "unkeyed", "keyed": false, "message": trigger_bridge_api::audit::UNKEYED}},
        })
    );
    // A dead-lettered subscription is an operator matter: still 200, named under warnings.
    s.engine
        .store
        .apply_subscription_input(
            "github",
            // A streak of 10 failures over 5 days: continuous failure under the default policy.
            SubscriptionInput::DeliveryExhausted {
                streak: tb_core::subscription::FailureStreak {
                    last_success_at: None,
                    failures_since: 10,
                    first_failure_at: 0,
                    now: 5 * 86_400_000,
                },
                policy: tb_core::subscription::FailurePolicy::default(),
            },
            5_000,
        )
        .await
        .unwrap()
        .expect("active -> dead-lettered");
    let (status, _, body) = ready_until(&s, |_, b| {
        b["warnings"]["subscriptions"]["dead-lettered"] != json!([])
    })
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "ready");
    assert_eq!(
        body["warnings"]["subscriptions"],
        json!({"dead-lettered": ["github"], "failed": []})
    );
    // Management endpoints still need the key.
    let r = s
        .http
        .get(format!("{}/v1/receipts", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_writer_makes_ready_503_while_health_stays_ok() {
    let (s, sqlite) = server_with(16).await;
    assert_eq!(ready(&s).await.0, 200);
    sqlite.crash_writer_for_test().unwrap();
    tokio::time::timeout(BOUND, async {
        while sqlite.writer_alive() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the writer thread ends");
    let (status, retry, body) = ready_until(&s, |st, _| st == 503).await;
    assert_eq!((status, retry.as_deref()), (503, Some("1")), "{body}");
    assert_eq!(body["status"], "unavailable");
    assert_eq!(
        body["checks"]["writer"],
        "store unavailable: the writer thread is not running"
    );
    assert_eq!(body["checks"]["reads"], "ok");
    // Liveness is unchanged: the process answers.
    let h: Value = s.get("/health").await;
    assert_eq!(h, json!({"status": "ok"}));
    // A write is refused in the envelope, 503 unavailable with Retry-After: 1.
    let r = s
        .http
        .post(format!("{}/v1/trigger-subscriptions/github/pause", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"], "unavailable");
}

#[tokio::test]
async fn a_stopped_writer_makes_ready_503() {
    let (s, sqlite) = server_with(16).await;
    sqlite.close().await;
    let (status, retry, body) = ready(&s).await;
    assert_eq!((status, retry.as_deref()), (503, Some("1")), "{body}");
    assert_eq!(body["status"], "unavailable");
    assert_eq!(
        body["checks"]["writer"],
        "store unavailable: the writer thread is not running"
    );
    assert_eq!(
        body["store"],
        json!({"backend": "sqlite", "reachable": false})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_writer_queue_answers_503_unavailable_with_retry_after() {
    let (s, sqlite) = server_with(1).await;
    // Block the writer, then fill its one queue slot.
    let (started_tx, started) = std_mpsc::channel();
    let (release, release_rx) = std_mpsc::channel::<()>();
    let blocker = {
        let sqlite = sqlite.clone();
        tokio::spawn(async move {
            sqlite
                .write_for_test(move |_| {
                    started_tx.send(()).unwrap();
                    release_rx.recv_timeout(BOUND).expect("released");
                    Ok(())
                })
                .await
        })
    };
    tokio::task::spawn_blocking(move || started.recv_timeout(BOUND))
        .await
        .unwrap()
        .expect("the blocking job runs");
    // Fill the one slot: queue a job (polled once, so it is enqueued now). If a background loop (worker,
    // timers) took the slot first, this one is refused Busy instead: either way the queue is full.
    let mut filler = Box::pin(sqlite.write_for_test(|_| Ok(())));
    let filled_by_us = std::future::poll_fn(|cx| {
        std::task::Poll::Ready(std::future::Future::poll(filler.as_mut(), cx).is_pending())
    })
    .await;
    let r = s
        .http
        .post(format!("{}/v1/trigger-subscriptions/github/pause", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"], "unavailable");
    assert!(
        v["message"].as_str().unwrap().contains("queue is full"),
        "{v}"
    );
    let (status, retry, body) = ready(&s).await;
    assert_eq!((status, retry.as_deref()), (503, Some("1")), "{body}");
    assert!(
        body["checks"]["writer"]
            .as_str()
            .unwrap()
            .starts_with("store busy: the write queue is full (1 jobs)"),
        "{body}"
    );
    release.send(()).unwrap();
    blocker.await.unwrap().unwrap();
    if filled_by_us {
        tokio::time::timeout(BOUND, filler).await.unwrap().unwrap();
    }
    assert_eq!(ready_until(&s, |st, _| st == 200).await.0, 200);
    let sub = s.get("/v1/trigger-subscriptions/github").await;
    assert_eq!(
        sub["subscription"]["state"], "active",
        "the refused pause left nothing"
    );
}

/// Before: every `GET /ready` committed its own no-op job, so a flood of probes was a flood of store
/// writes. Now 64 callers at once share one probe, and the next probe waits for the interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_ready_calls_share_one_store_probe_per_interval() {
    let (s, sqlite) = server_with(1024).await;
    // A long interval first, so a slow machine cannot make the burst span two intervals.
    s.engine.set_ready_probe_interval(Duration::from_secs(60));
    let before = sqlite.writer_pings();
    let n = 64;
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let mut calls = Vec::new();
    for _ in 0..n {
        let (http, url, b) = (s.http.clone(), format!("{}/ready", s.base), barrier.clone());
        calls.push(tokio::spawn(async move {
            b.wait().await;
            http.get(url).send().await.unwrap().status().as_u16()
        }));
    }
    for c in calls {
        assert_eq!(c.await.unwrap(), 200);
    }
    assert_eq!(
        sqlite.writer_pings() - before,
        1,
        "one probe write for {n} callers"
    );
    // Within the interval: answered from that probe.
    assert_eq!(ready(&s).await.0, 200);
    assert_eq!(sqlite.writer_pings() - before, 1);
    // Once the interval has passed: one new probe.
    s.engine
        .set_ready_probe_interval(Duration::from_millis(200));
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(ready(&s).await.0, 200);
    assert_eq!(sqlite.writer_pings() - before, 2);
    assert_eq!(tb_engine::readiness::PROBE_INTERVAL, Duration::from_secs(1));
}
