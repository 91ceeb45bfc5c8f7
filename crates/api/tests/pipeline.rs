//! Black-box tests of the ingest -> delivery -> run pipeline over real HTTP, against a server on an
//! ephemeral port with a SQLite store in a temp dir and real GitHub payloads from `tests/fixtures`.

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{json, Value};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_then_duplicates_give_the_first_receipt_and_run() {
    let s = start(None, fast_retry(3), 0).await;
    let (st, first) = s
        .post_github("pull_request", "dup-1", opened(), GH_SECRET)
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{first}");
    assert_eq!(first["outcome"], "accepted");
    let run_id = first["runId"].as_str().unwrap().to_string();
    let receipt_id = first["receiptId"].as_str().unwrap().to_string();
    assert_eq!(first["deliveries"].as_array().unwrap().len(), 1);

    let (st, dup) = s
        .post_github("pull_request", "dup-1", opened(), GH_SECRET)
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        dup,
        json!({"outcome": "duplicate", "receiptId": receipt_id, "runId": run_id})
    );

    // 50 concurrent posts of a new delivery id: one accepted, 49 duplicates, never 5xx, one run.
    let body = opened();
    let mut tasks = Vec::new();
    let s = Arc::new(s);
    for _ in 0..50 {
        let (s, body) = (s.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            s.post_github("pull_request", "dup-50", body, GH_SECRET)
                .await
        }));
    }
    let mut statuses = Vec::new();
    let mut runs = std::collections::HashSet::new();
    for t in tasks {
        let (st, v) = t.await.unwrap();
        statuses.push(st.as_u16());
        runs.insert(v["runId"].as_str().unwrap().to_string());
    }
    assert_eq!(
        statuses.iter().filter(|&&c| c == 202).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&c| c == 200).count(),
        49,
        "{statuses:?}"
    );
    assert_eq!(runs.len(), 1, "every answer names the same run");
    let run_id = runs.into_iter().next().unwrap();
    let run = s
        .wait_for(&format!("/v1/runs/{run_id}"), |v| {
            v["status"] == "completed"
        })
        .await;
    let fixture: Value = serde_json::from_slice(&opened()).unwrap();
    assert_eq!(
        run["inputs"],
        json!({"number": fixture["pull_request"]["number"]})
    );
    assert!(fixture["pull_request"]["number"].is_u64());
    let all = s.get("/v1/runs?limit=100").await;
    assert_eq!(
        all["runs"].as_array().unwrap().len(),
        2,
        "two distinct delivery ids, two runs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_started_carries_the_delivered_attempts_event_id() {
    let s = start(None, fast_retry(3), 0).await;
    let (_, a) = s
        .post_github("pull_request", "cause-1", opened(), GH_SECRET)
        .await;
    let run_id = a["runId"].as_str().unwrap();
    s.wait_for(&format!("/v1/runs/{run_id}"), |v| {
        v["status"] == "completed"
    })
    .await;
    let evs = s.get(&format!("/v1/runs/{run_id}/events/poll")).await;
    let evs = evs["events"].as_array().unwrap();
    assert_eq!(
        evs.iter()
            .map(|e| e["type"].as_str().unwrap())
            .collect::<Vec<_>>(),
        vec!["run.started", "trigger.delivery.attempted", "run.completed"]
    );
    assert_eq!(evs[0]["sequence"], 0);
    let delivery_id = a["deliveries"][0]["deliveryId"].as_str().unwrap();
    let d = s.get(&format!("/v1/deliveries/{delivery_id}")).await;
    assert_eq!(d["delivery"]["state"], "delivered");
    assert_eq!(d["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(evs[0]["causationId"], d["attempts"][0]["eventId"]);
    // The attempt event is recorded with exactly the spec fields.
    let sev = s
        .engine
        .store
        .subscription_events("github", 10)
        .await
        .unwrap();
    assert_eq!(
        sev[0].event_id,
        d["attempts"][0]["eventId"].as_str().unwrap()
    );
    assert_eq!(
        sev[0]
            .payload
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect::<Vec<_>>(),
        vec!["attempt", "dedupKey", "outcome", "runId", "subscriptionId"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_write_nothing() {
    let s = start(None, fast_retry(3), 0).await;
    let (st, v) = s
        .post_github("pull_request", "bad-1", opened(), "wrong-secret")
        .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    assert_eq!(v["error"], "signature_invalid");
    let r = s
        .http
        .post(format!("{}/v1/trigger-subscriptions/nope/ingest", s.base))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "not_found");
    let r = s
        .http
        .post(format!("{}/v1/trigger-subscriptions/github/ingest", s.base))
        .header("content-type", "text/plain")
        .header(
            "x-hub-signature-256",
            tb_ingress::github::sign(GH_SECRET.as_bytes(), b"hi"),
        )
        .body("hi")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 415);
    let big = vec![b' '; (1 << 20) + 1];
    let (st, v) = s.post_github("pull_request", "big-1", big, GH_SECRET).await;
    assert_eq!(
        (st, v["error"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("payload_too_large"))
    );
    assert!(
        s.get("/v1/receipts").await["receipts"]
            .as_array()
            .unwrap()
            .is_empty(),
        "nothing committed"
    );

    // Paused: 409, nothing committed; resumed: accepted.
    let p: Value = s
        .http
        .post(format!("{}/v1/trigger-subscriptions/github/pause", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(p["subscription"]["state"], "paused");
    let (st, v) = s
        .post_github("pull_request", "p-1", opened(), GH_SECRET)
        .await;
    assert_eq!(
        (st, v["error"].as_str()),
        (StatusCode::CONFLICT, Some("subscription_not_active"))
    );
    s.http
        .post(format!("{}/v1/trigger-subscriptions/github/resume", s.base))
        .send()
        .await
        .unwrap();
    let (st, _) = s
        .post_github("pull_request", "p-1", opened(), GH_SECRET)
        .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    let changes: Vec<_> = s
        .engine
        .store
        .subscription_events("github", 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.event_type == "trigger.subscription.state.changed")
        .map(|e| e.payload)
        .collect();
    assert_eq!(changes[0]["reason"], "operator-paused");
    assert_eq!(
        (
            changes[1]["fromState"].as_str(),
            changes[1]["toState"].as_str()
        ),
        (Some("paused"), Some("active"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_body_is_byte_identical() {
    let s = start(None, fast_retry(3), 0).await;
    let body = b"{\"zen\" :  \"\\u00e9t\\u00e9 \xc3\xa9\",\n\t\"action\":\"opened\", \"b\":[ 1 ,2 ],\"a\":{}}\r\n\n".to_vec();
    let (st, v) = s
        .post_github("pull_request", "bytes-1", body.clone(), GH_SECRET)
        .await;
    assert_eq!(st, StatusCode::ACCEPTED, "{v}");
    let stored = s
        .engine
        .store
        .get_body(v["receiptId"].as_str().unwrap())
        .await
        .unwrap();
    assert_eq!(&stored[..], &body[..]);
    assert_eq!(
        v["outcome"], "accepted",
        "action opened matches even without repository fields"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_failing_twice_then_succeeding_gives_three_attempts_and_one_run() {
    let (url, hits) = worker(vec![500, 503]).await;
    let s = start(Some(url), fast_retry(5), 0).await;
    let (_, a) = s
        .post_github("pull_request", "flaky-1", opened(), GH_SECRET)
        .await;
    let d_id = a["deliveries"][0]["deliveryId"]
        .as_str()
        .unwrap()
        .to_string();
    let d = s
        .wait_for(&format!("/v1/deliveries/{d_id}"), |v| {
            v["delivery"]["state"] == "delivered"
        })
        .await;
    let attempts = d["attempts"].as_array().unwrap();
    assert_eq!(
        attempts
            .iter()
            .map(|a| a["attempt"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert_eq!(
        attempts
            .iter()
            .map(|a| a["outcome"].as_str().unwrap())
            .collect::<Vec<_>>(),
        vec!["retrying", "retrying", "delivered"]
    );
    assert_eq!(attempts[0]["errorClass"], "http_500");
    assert_eq!(attempts[1]["errorClass"], "http_503");
    // Retry-After: 1 s after the 503 is clamped to [base, 2 x base] = [20, 40] ms by the policy.
    let ms = |v: &Value| {
        chrono::DateTime::parse_from_rfc3339(v.as_str().unwrap())
            .unwrap()
            .timestamp_millis()
    };
    let end_of_2 = ms(&attempts[1]["startedAt"]) + attempts[1]["durationMs"].as_i64().unwrap();
    let delay = ms(&attempts[1]["nextAttemptAt"]) - end_of_2;
    assert!(
        (38..=42).contains(&delay),
        "Retry-After honoured and clamped to 40 ms, got {delay} ms"
    );
    let delay1 = ms(&attempts[0]["nextAttemptAt"])
        - ms(&attempts[0]["startedAt"])
        - attempts[0]["durationMs"].as_i64().unwrap();
    assert!(
        (18..=22).contains(&delay1),
        "plain fixed backoff is 20 ms, got {delay1} ms"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    let runs = s.get("/v1/runs").await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1);
    assert_eq!(runs["runs"][0]["status"], "completed");
    assert_eq!(runs["runs"][0]["causationId"], attempts[2]["eventId"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_always_failing_dead_letters_and_moves_the_subscription() {
    let (url, hits) = worker(vec![500; 100]).await;
    let s = start(Some(url), fast_retry(4), 2).await;
    let (_, a) = s
        .post_github("pull_request", "dead-1", opened(), GH_SECRET)
        .await;
    let d_id = a["deliveries"][0]["deliveryId"]
        .as_str()
        .unwrap()
        .to_string();
    let d = s
        .wait_for(&format!("/v1/deliveries/{d_id}"), |v| {
            v["delivery"]["state"] == "dead-lettered"
        })
        .await;
    assert_eq!(d["attempts"].as_array().unwrap().len(), 4);
    assert_eq!(d["delivery"]["deadLetterReason"], "retries_exhausted");
    assert_eq!(hits.load(Ordering::SeqCst), 4);
    assert!(
        s.get("/v1/runs").await["runs"]
            .as_array()
            .unwrap()
            .is_empty(),
        "no run without a delivered attempt"
    );
    let listed = s.get("/v1/deliveries?state=dead-lettered").await;
    assert_eq!(listed["deliveries"].as_array().unwrap().len(), 1);
    let r = s
        .get(&format!(
            "/v1/receipts/{}",
            a["receiptId"].as_str().unwrap()
        ))
        .await;
    assert_eq!(r["receipt"]["state"], "dead_lettered");
    let sub = s.get("/v1/trigger-subscriptions/github").await;
    assert_eq!(sub["subscription"]["state"], "dead-lettered");
    // Dead-lettered subscription: new receipts are still committed, straight to dead letters.
    let (st, v) = s
        .post_github("pull_request", "dead-2", opened(), GH_SECRET)
        .await;
    assert_eq!(
        (st, v["outcome"].as_str()),
        (StatusCode::ACCEPTED, Some("dead_lettered"))
    );
    let outcomes: Vec<_> = s
        .engine
        .store
        .subscription_events("github", 100)
        .await
        .unwrap()
        .into_iter()
        .map(|e| {
            (
                e.event_type,
                e.payload["outcome"].as_str().map(String::from),
                e.payload["toState"].as_str().map(String::from),
            )
        })
        .collect();
    let expect = |t: &str, o: Option<&str>, s: Option<&str>| {
        (t.to_string(), o.map(String::from), s.map(String::from))
    };
    assert_eq!(
        outcomes,
        vec![
            expect("trigger.delivery.attempted", Some("retrying"), None),
            expect("trigger.delivery.attempted", Some("retrying"), None),
            expect("trigger.subscription.state.changed", None, Some("failed")),
            expect("trigger.delivery.attempted", Some("retrying"), None),
            expect("trigger.delivery.attempted", Some("dead-lettered"), None),
            expect(
                "trigger.subscription.state.changed",
                None,
                Some("dead-lettered")
            ),
            // dead-2, dead-lettered at ingest, is recorded as a dead-lettered attempt 1.
            expect("trigger.delivery.attempted", Some("dead-lettered"), None),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_checks_the_signature_first_and_still_answers_duplicates() {
    let s = start(None, fast_retry(3), 0).await;
    let (st, first) = s
        .post_github("pull_request", "pz-1", opened(), GH_SECRET)
        .await;
    assert_eq!(st, StatusCode::ACCEPTED);
    s.http
        .post(format!("{}/v1/trigger-subscriptions/github/pause", s.base))
        .send()
        .await
        .unwrap();
    // A forged request learns nothing about the state: 401, not 409.
    let (st, v) = s
        .post_github("pull_request", "pz-2", opened(), "forged")
        .await;
    assert_eq!(
        (st, v["error"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("signature_invalid"))
    );
    // A redelivery of an accepted id is still a duplicate; a new id is refused.
    let (st, v) = s
        .post_github("pull_request", "pz-1", opened(), GH_SECRET)
        .await;
    assert_eq!((st, &v["receiptId"]), (StatusCode::OK, &first["receiptId"]));
    let (st, v) = s
        .post_github("pull_request", "pz-3", opened(), GH_SECRET)
        .await;
    assert_eq!(
        (st, v["error"].as_str()),
        (StatusCode::CONFLICT, Some("subscription_not_active"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_enveloped_and_never_echo_the_request() {
    let s = start(None, fast_retry(3), 0).await;
    let probe = "<zqprobe>";
    let enc = "%3Czqprobe%3E";
    for (method, path, code, status) in [
        (
            "GET",
            format!("/v1/receipts?state={enc}"),
            "validation_error",
            400,
        ),
        (
            "GET",
            "/v1/receipts?limit=abc".to_string(),
            "validation_error",
            400,
        ),
        (
            "GET",
            format!("/v1/receipts?before={enc}"),
            "validation_error",
            400,
        ),
        ("GET", format!("/v1/runs/{enc}/signals"), "not_found", 404),
        ("GET", format!("/v1/receipts/{enc}"), "not_found", 404),
        (
            "POST",
            format!("/v1/trigger-subscriptions/{enc}/ingest"),
            "not_found",
            404,
        ),
        (
            "GET",
            "/v1/trigger-subscriptions/github/ingest".to_string(),
            "method_not_allowed",
            405,
        ),
        ("GET", format!("/v1/nothing/{enc}"), "not_found", 404),
    ] {
        let r = s
            .http
            .request(method.parse().unwrap(), format!("{}{path}", s.base))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), status, "{method} {path}");
        let text = r.text().await.unwrap();
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|_| panic!("{method} {path}: not an envelope: {text}"));
        assert_eq!(v["error"], code, "{method} {path}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()));
        assert!(
            !text.contains("zqprobe"),
            "{method} {path} echoes the request {probe}: {text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_replayed_once_and_a_duplicate_never_names_a_run_that_does_not_exist() {
    let (url, hits) = worker(vec![500, 500, 200]).await;
    let s = start(Some(url), fast_retry(2), 0).await;
    let (_, a) = s
        .post_github("pull_request", "replay-1", opened(), GH_SECRET)
        .await;
    let d_id = a["deliveries"][0]["deliveryId"]
        .as_str()
        .unwrap()
        .to_string();
    s.wait_for(&format!("/v1/deliveries/{d_id}"), |v| {
        v["delivery"]["state"] == "dead-lettered"
    })
    .await;
    // The redelivery's answer names no run: none was started.
    let (st, dup) = s
        .post_github("pull_request", "replay-1", opened(), GH_SECRET)
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(dup["receiptId"], a["receiptId"]);
    assert!(dup.get("runId").is_none(), "{dup}");
    // Replay: one more attempt (attempt 3), delivered; the run is the one first announced.
    let r: Value = s
        .http
        .post(format!("{}/v1/deliveries/{d_id}/replay", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["delivery"]["state"], "pending");
    assert_eq!(r["delivery"]["replays"], 1);
    let d = s
        .wait_for(&format!("/v1/deliveries/{d_id}"), |v| {
            v["delivery"]["state"] == "delivered"
        })
        .await;
    let attempts: Vec<u64> = d["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["attempt"].as_u64().unwrap())
        .collect();
    assert_eq!(
        attempts,
        vec![1, 2, 3],
        "attempt numbers continue after a replay"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 3);
    let run_id = a["runId"].as_str().unwrap();
    s.wait_for(&format!("/v1/runs/{run_id}"), |v| {
        v["status"] == "completed"
    })
    .await;
    let r = s
        .get(&format!(
            "/v1/receipts/{}",
            a["receiptId"].as_str().unwrap()
        ))
        .await;
    assert_eq!(r["receipt"]["state"], "consumed");
    // Replaying a delivered delivery is a conflict.
    let again = s
        .http
        .post(format!("{}/v1/deliveries/{d_id}/replay", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status().as_u16(), 409);
}
