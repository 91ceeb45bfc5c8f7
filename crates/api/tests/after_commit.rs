//! Work that must follow a commit survives the request going away, and the
//! subscription-state gauge `tb_subscriptions{state}`. One metrics recorder per process: the
//! tests here share it and run one at a time.

mod support;

use std::future::Future;
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use support::*;
use tb_core::subscription::{SubscriptionInput, SubscriptionState};

fn recorder() -> &'static PrometheusHandle {
    static H: OnceLock<PrometheusHandle> = OnceLock::new();
    H.get_or_init(|| PrometheusBuilder::new().install_recorder().unwrap())
}

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The value of the sample `name{labels}` in the current /metrics text, if present.
fn sample(name_and_labels: &str) -> Option<f64> {
    recorder().run_upkeep();
    recorder()
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.trim().parse().ok())
}

fn github_headers(delivery: &str, body: &[u8]) -> http::HeaderMap {
    let mut h = http::HeaderMap::new();
    h.insert("content-type", "application/json".parse().unwrap());
    h.insert("x-github-event", "pull_request".parse().unwrap());
    h.insert("x-github-delivery", delivery.parse().unwrap());
    let sig = tb_ingress::github::sign(GH_SECRET.as_bytes(), body);
    h.insert("x-hub-signature-256", sig.parse().unwrap());
    h
}

/// The ingest future is polled once (it then waits on the group commit) and dropped, as when the
/// client closes its connection: the receipt is committed, and its counter and the worker's wake-up
/// still happen. The worker's idle poll and lease are 60 s, so only the wake-up can deliver it in time.
/// Before the fix the counter stayed at 1 and the delivery waited for the idle poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_ingest_still_counts_and_wakes_the_worker() {
    let _one = ONE_AT_A_TIME.lock().await;
    recorder();
    let worker = tb_engine::worker::WorkerConfig {
        lease_ms: 60_000,
        idle_poll: Duration::from_secs(60),
        ..Default::default()
    };
    let s = start_with(None, fast_retry(3), 0, IMMEDIATE, worker).await;
    let accepted = r#"tb_receipts_total{connector="github",outcome="accepted"}"#;
    let before = sample(accepted).unwrap_or(0.0);
    // A first request, awaited normally: the worker delivers it and goes back to sleep.
    let (_, a) = s
        .post_github("pull_request", "drop-0", opened(), GH_SECRET)
        .await;
    let first = a["runId"].as_str().unwrap().to_string();
    s.wait_for(&format!("/v1/runs/{first}"), |v| v["status"] == "completed")
        .await;
    assert_eq!(sample(accepted), Some(before + 1.0));

    let body = bytes::Bytes::from(opened());
    let headers = github_headers("drop-1", &body);
    {
        let fut = tb_engine::ingest::ingest(&s.engine, "github", &headers, body);
        let mut fut = std::pin::pin!(fut);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(
            matches!(fut.as_mut().poll(&mut cx), Poll::Pending),
            "the ingest waits on the group commit"
        );
    } // dropped here, never polled again
    let receipts = s
        .wait_for("/v1/receipts?limit=10", |v| {
            v["receipts"].as_array().unwrap().len() == 2
        })
        .await;
    let r = &receipts["receipts"][0];
    assert_eq!(
        r["providerEventId"], "drop-1",
        "the dropped request was committed"
    );
    let d = s
        .engine
        .store
        .deliveries_of_receipt(r["receiptId"].as_str().unwrap())
        .await
        .unwrap();
    let run = d[0].run_id.clone().unwrap();
    // Bounded well below the 60 s idle poll: only the wake-up delivers it this soon.
    let mut done = false;
    for _ in 0..100 {
        if s.engine
            .store
            .get_run(&run)
            .await
            .is_ok_and(|r| r.status.as_str() == "completed")
        {
            done = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        done,
        "the worker was woken for the dropped request's delivery"
    );
    assert_eq!(
        sample(accepted),
        Some(before + 2.0),
        "the dropped request was counted"
    );
}

/// `tb_subscriptions{state}` counts subscriptions per state, at start and on every transition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_state_gauge_follows_every_transition() {
    let _one = ONE_AT_A_TIME.lock().await;
    recorder();
    let s = start(None, fast_retry(3), 0).await;
    let g = |st: &str| sample(&format!("tb_subscriptions{{state=\"{st}\"}}"));
    assert_eq!(
        (g("active"), g("paused"), g("dead-lettered")),
        (Some(1.0), Some(0.0), Some(0.0))
    );
    s.engine
        .operate("github", SubscriptionInput::OperatorPause)
        .await
        .unwrap();
    assert_eq!((g("active"), g("paused")), (Some(0.0), Some(1.0)));
    s.engine
        .operate("github", SubscriptionInput::OperatorResume)
        .await
        .unwrap();
    assert_eq!((g("active"), g("paused")), (Some(1.0), Some(0.0)));
    assert_eq!(
        s.engine.subscription_state("github"),
        Some(SubscriptionState::Active)
    );
}
