//! `/v1/schedules` over HTTP: create, read, preview, pause, resume, retire, and the
//! refusals, with the values read back.

mod support;

use serde_json::{json, Value};
use support::{fast_retry, start};

async fn call(
    s: &support::Server,
    m: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut r = s.http.request(m, format!("{}{path}", s.base));
    if let Some(b) = body {
        r = r.json(&b);
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_is_created_previewed_paused_resumed_and_retired() {
    use reqwest::Method as M;
    let s = start(None, fast_retry(2), 0).await;
    let (st, b) = call(
        &s,
        M::POST,
        "/v1/schedules",
        Some(json!({"id": "nightly", "cron": "30 2 * * *", "timezone": "Europe/Berlin", "workflowId": "wf", "missed": "run_once"})),
    )
    .await;
    assert_eq!(st, 201, "{b}");
    assert_eq!(b["schedule"]["id"], "nightly");
    assert_eq!(b["schedule"]["state"], "active");
    assert_eq!(b["schedule"]["missed"], "run_once");
    assert_eq!(b["schedule"]["origin"], "api");
    assert_eq!(b["schedule"]["workflowId"], "wf");

    let (st, b) = call(&s, M::GET, "/v1/schedules/nightly/next?count=3", None).await;
    assert_eq!(st, 200, "{b}");
    let next = b["next"].as_array().unwrap();
    assert_eq!(next.len(), 3);
    for n in next {
        // 02:30 local is 00:30 or 01:30 UTC (or 01:00 UTC on a spring-forward day).
        let local = n["localTime"].as_str().unwrap();
        assert!(
            local.contains("T02:30:00+0") || local.contains("T03:00:00+02:00"),
            "{n}"
        );
        assert!(n["nominalTime"].as_str().unwrap().ends_with('Z'));
    }

    let (st, b) = call(&s, M::GET, "/v1/schedules", None).await;
    assert_eq!(st, 200);
    assert_eq!(b["schedules"].as_array().unwrap().len(), 1);
    // It is a trigger subscription as well.
    let (st, b) = call(&s, M::GET, "/v1/trigger-subscriptions/nightly", None).await;
    assert_eq!(
        (st, b["subscription"]["source"].as_str()),
        (200, Some("schedule"))
    );
    // A schedule has no ingest URL.
    let (st, b) = call(
        &s,
        M::POST,
        "/v1/trigger-subscriptions/nightly/ingest",
        Some(json!({})),
    )
    .await;
    assert_eq!((st, b["error"].as_str()), (404, Some("not_found")));

    let (st, b) = call(&s, M::POST, "/v1/schedules/nightly/pause", None).await;
    assert_eq!((st, b["schedule"]["state"].as_str()), (200, Some("paused")));
    let (st, b) = call(&s, M::POST, "/v1/schedules/nightly/resume", None).await;
    assert_eq!((st, b["schedule"]["state"].as_str()), (200, Some("active")));

    let (st, _) = call(&s, M::DELETE, "/v1/schedules/nightly", None).await;
    assert_eq!(st, 204);
    let (st, _) = call(&s, M::GET, "/v1/schedules/nightly", None).await;
    assert_eq!(st, 404);
    assert!(s.engine.catalog().subscription("nightly").is_none());
    // Ids are never reused.
    let (st, b) = call(
        &s,
        M::POST,
        "/v1/schedules",
        Some(json!({"id": "nightly", "cron": "* * * * *", "workflowId": "wf"})),
    )
    .await;
    assert_eq!((st, b["error"].as_str()), (409, Some("conflict")), "{b}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_schedules_are_refused_with_the_field_named_and_nothing_written() {
    use reqwest::Method as M;
    let s = start(None, fast_retry(2), 0).await;
    for (body, says) in [
        (json!({"cron": "* * * *", "workflowId": "wf"}), "4 fields"),
        (
            json!({"cron": "0 0 30 2 *", "workflowId": "wf"}),
            "never fires",
        ),
        (
            json!({"cron": "* * * * *", "timezone": "Europe/Atlantis", "workflowId": "wf"}),
            "timezone",
        ),
        (
            json!({"cron": "* * * * *", "workflowId": "nope"}),
            "workflowId",
        ),
        (
            json!({"cron": "* * * * *", "workflowId": "wf", "start": "yesterday"}),
            "start",
        ),
        (
            json!({"cron": "* * * * *", "workflowId": "wf", "missed": "sometimes"}),
            "missed",
        ),
        (
            json!({"cron": "* * * * *", "workflowId": "wf", "cronn": "x"}),
            "cronn",
        ),
    ] {
        let (st, b) = call(&s, M::POST, "/v1/schedules", Some(body.clone())).await;
        assert_eq!(
            (st, b["error"].as_str()),
            (400, Some("validation_error")),
            "{body}: {b}"
        );
        assert!(b["message"].as_str().unwrap().contains(says), "{body}: {b}");
    }
    let (_, b) = call(&s, M::GET, "/v1/schedules", None).await;
    assert_eq!(b["schedules"], json!([]));
    let (st, _) = call(&s, M::GET, "/v1/schedules/nope/next", None).await;
    assert_eq!(st, 404);
    let (st, _) = call(&s, M::GET, "/v1/schedules/github", None).await;
    assert_eq!(st, 404, "a webhook subscription is not a schedule");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_creates_of_one_id_give_one_schedule() {
    let s = std::sync::Arc::new(start(None, fast_retry(2), 0).await);
    let mut tasks = Vec::new();
    for i in 0..8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let (st, _) = call(
                &s,
                reqwest::Method::POST,
                "/v1/schedules",
                Some(json!({"id": "raced", "cron": format!("{i} * * * *"), "workflowId": "wf"})),
            )
            .await;
            st
        }));
    }
    let mut codes = Vec::new();
    for t in tasks {
        codes.push(t.await.unwrap());
    }
    codes.sort();
    assert_eq!(codes, [201, 409, 409, 409, 409, 409, 409, 409], "{codes:?}");
    let (_, b) = call(&s, reqwest::Method::GET, "/v1/schedules", None).await;
    assert_eq!(b["schedules"].as_array().unwrap().len(), 1);
}
