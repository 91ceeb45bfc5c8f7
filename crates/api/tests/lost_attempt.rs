//! An attempt recorded `lost` (its lease lapsed with no outcome recorded and the delivery was leased
//! again: docs/operations.md "Lost attempts") is shown by `GET /v1/deliveries/{id}`, the receipt's
//! timeline and `/v1/activity` like any other attempt.

mod support;

use axum::http::StatusCode;
use support::*;
use tb_engine::worker::WorkerConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_attempt_is_shown_with_its_number_outcome_and_class() {
    // The server's own worker takes nothing (no slots): this test holds the leases itself.
    let idle = WorkerConfig {
        concurrency: 0,
        ..Default::default()
    };
    let s = start_with(None, fast_retry(3), 0, Default::default(), idle).await;
    let (st, a) = s
        .post_github("pull_request", "lost-1", opened(), GH_SECRET)
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{a}");
    let rid = a["receiptId"].as_str().unwrap();
    let did = a["deliveries"][0]["deliveryId"]
        .as_str()
        .unwrap()
        .to_string();
    let store = s.engine.store.clone();
    // A worker takes it for 1 ms and never records an outcome (it died, or its commit was cut).
    let now = tb_engine::clock::now_ms();
    let ghost = store.lease_due("ghost", now, 1, 10).await.unwrap();
    assert_eq!(ghost.len(), 1);
    // Another takes the lapsed lease over and completes attempt 2.
    let lease = store
        .lease_due("w", now + 10, 60_000, 10)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        (lease.delivery.id.as_str(), lease.lost),
        (did.as_str(), Some(1))
    );
    tb_engine::worker::attempt(&s.engine, lease).await;

    let v = s.get(&format!("/v1/deliveries/{did}")).await;
    assert_eq!(v["delivery"]["state"], "delivered", "{v}");
    assert_eq!(v["delivery"]["attempts"], 2, "{v}");
    let attempts = v["attempts"].as_array().unwrap();
    let shown: Vec<(u64, &str, Option<&str>)> = attempts
        .iter()
        .map(|a| {
            (
                a["attempt"].as_u64().unwrap(),
                a["outcome"].as_str().unwrap(),
                a["errorClass"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        vec![(1, "lost", Some("lease_expired")), (2, "delivered", None)]
    );
    assert_eq!(attempts[0]["durationMs"], 0);
    assert_eq!(
        attempts[0]["message"].as_str(),
        Some(tb_core::attempt::LOST_MESSAGE)
    );

    let r = s.get(&format!("/v1/receipts/{rid}")).await;
    let attempted: Vec<&str> = r["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["state"] == "attempted")
        .map(|e| e["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(attempted, ["lost", "delivered"], "{r}");
    let act = s.get("/v1/activity?minutes=60").await;
    assert_eq!(act["attemptsByOutcome"]["lost"], 1, "{act}");
}
