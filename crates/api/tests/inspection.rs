//! The read endpoints the console is built on: list filters by the sender's delivery id
//! and by time, `/v1/activity`, the redacted body, and the binding policy in `/v1/bindings`.

mod support;

use axum::http::StatusCode;
use serde_json::Value;
use support::*;

async fn status_of(s: &Server, path: &str) -> (StatusCode, Value) {
    let r = s
        .http
        .get(format!("{}{path}", s.base))
        .send()
        .await
        .unwrap();
    let st = StatusCode::from_u16(r.status().as_u16()).unwrap();
    (st, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_are_found_by_the_senders_delivery_id_and_by_time() {
    let s = start(None, fast_retry(3), 0).await;
    let (st, a) = s
        .post_github("pull_request", "sender-a", opened(), GH_SECRET)
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{a}");
    let (st, _) = s
        .post_github("pull_request", "sender-b", opened(), GH_SECRET)
        .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    let ids = |v: &Value| -> Vec<String> {
        v["receipts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["providerEventId"].as_str().unwrap().to_string())
            .collect()
    };
    let v = s.get("/v1/receipts?providerEventId=sender-a").await;
    assert_eq!(ids(&v), ["sender-a"]);
    assert_eq!(v["receipts"][0]["receiptId"], a["receiptId"]);
    assert!(ids(&s.get("/v1/receipts?providerEventId=nobody").await).is_empty());
    assert_eq!(ids(&s.get("/v1/receipts").await).len(), 2);
    // A time range is an id range: all of them from an hour ago, none from tomorrow, none up to yesterday.
    let now = chrono::Utc::now();
    let t = |d: chrono::Duration| (now + d).to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let hour = chrono::Duration::hours(1);
    let day = chrono::Duration::days(1);
    assert_eq!(
        ids(&s.get(&format!("/v1/receipts?from={}", t(-hour))).await).len(),
        2
    );
    assert!(ids(&s.get(&format!("/v1/receipts?from={}", t(day))).await).is_empty());
    assert!(ids(&s.get(&format!("/v1/receipts?to={}", t(-day))).await).is_empty());
    assert_eq!(
        ids(&s
            .get(&format!("/v1/receipts?from={}&to={}", t(-hour), t(hour)))
            .await)
        .len(),
        2
    );
    // The runs are made by the deliveries' attempts, a moment after the answers.
    let v = s
        .wait_for(&format!("/v1/runs?from={}&workflow=wf", t(-hour)), |v| {
            v["runs"].as_array().is_some_and(|r| r.len() == 2)
        })
        .await;
    assert_eq!(v["runs"].as_array().unwrap().len(), 2, "{v}");
    assert!(s.get("/v1/runs?workflow=other").await["runs"]
        .as_array()
        .unwrap()
        .is_empty());
    // Bad times are refused, never ignored.
    for bad in [
        format!("from={}&to={}", t(hour), t(-hour)),
        "from=yesterday".into(),
        "to=2026-13-01T00:00:00Z".into(),
    ] {
        let (st, v) = status_of(&s, &format!("/v1/receipts?{bad}")).await;
        assert_eq!(
            (st, v["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some("validation_error")),
            "{bad}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activity_counts_the_last_hour_per_subscription() {
    let s = start(None, fast_retry(3), 0).await;
    for i in 0..3 {
        let (st, _) = s
            .post_github("pull_request", &format!("act-{i}"), opened(), GH_SECRET)
            .await;
        assert_eq!(st, StatusCode::ACCEPTED);
    }
    let v = s
        .wait_for("/v1/activity", |v| {
            v["attemptsByOutcome"]["delivered"] == 3 && v["receiptsByState"]["consumed"] == 3
        })
        .await;
    assert_eq!(v["minutes"], 60);
    assert_eq!(v["receiptsByState"]["consumed"], 3, "{v}");
    let gh = v["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["subscriptionId"] == "github")
        .unwrap();
    assert_eq!(gh["receipts"], 3);
    assert_eq!(gh["failedAttempts"], 0);
    let per_minute = gh["receiptsPerMinute"].as_array().unwrap();
    assert_eq!(per_minute.len(), 60);
    assert_eq!(
        per_minute.iter().map(|n| n.as_u64().unwrap()).sum::<u64>(),
        3
    );
    assert_eq!(v["pending"], 0);
    for bad in ["minutes=0", "minutes=1441", "window=5"] {
        let (st, _) = status_of(&s, &format!("/v1/activity?{bad}")).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{bad}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redacted_body_hides_credentials_and_contacts() {
    let s = start(None, fast_retry(3), 0).await;
    let mut payload: Value = serde_json::from_slice(&opened()).unwrap();
    payload["sender"]["email"] = "octo@example.com".into();
    payload["hook"] =
        serde_json::json!({"config": {"secret": "hunter2", "url": "https://example.com"}});
    payload["installation"] = serde_json::json!({"access_token": "ghs_abc", "id": 7});
    let body = serde_json::to_vec(&payload).unwrap();
    let (st, a) = s
        .post_github("pull_request", "body-1", body.clone(), GH_SECRET)
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{a}");
    let id = a["receiptId"].as_str().unwrap();
    let v = s.get(&format!("/v1/receipts/{id}/redacted-body")).await;
    assert_eq!(v["json"], true);
    assert_eq!(v["bodyBytes"], body.len());
    let r = &v["redacted"];
    assert_eq!(
        r["pull_request"]["number"],
        payload["pull_request"]["number"]
    );
    assert_eq!(
        r["repository"]["full_name"],
        payload["repository"]["full_name"]
    );
    assert_eq!(r["sender"]["email"], "[redacted]");
    assert_eq!(
        r["hook"]["config"],
        serde_json::json!({"secret": "[redacted]", "url": "https://example.com"})
    );
    assert_eq!(
        r["installation"],
        serde_json::json!({"access_token": "[redacted]", "id": 7})
    );
    let text = r.to_string();
    assert!(
        !text.contains("hunter2")
            && !text.contains("ghs_abc")
            && !text.contains("octo@example.com")
    );
    let (st, _) = status_of(
        &s,
        "/v1/receipts/rcpt_00000000000000000000000000000000/redacted-body",
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    // The binding policy is listed with its filter, inputs and action parameters.
    let b = s.get("/v1/bindings").await;
    let pr = b["bindings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["bindingId"] == "pr-opened")
        .unwrap()
        .clone();
    assert!(pr["filter"].is_object() && pr["inputs"].is_object(), "{pr}");
    assert_eq!(pr["actionConfig"]["workflow"], "wf", "{pr}");
}
