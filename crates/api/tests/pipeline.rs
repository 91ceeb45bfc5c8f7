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

/// Posts a new `pull_request.opened` and waits until its delivery settled (one webhook at a time);
/// returns the ingest answer and the delivery view.
async fn post_and_settle(s: &Server, id: &str) -> (StatusCode, Value, Value) {
    let (st, a) = s.post_github("pull_request", id, opened(), GH_SECRET).await;
    let d_id = a["deliveries"][0]["deliveryId"]
        .as_str()
        .unwrap()
        .to_string();
    let d = s
        .wait_for(&format!("/v1/deliveries/{d_id}"), |v| {
            v["delivery"]["state"] == "delivered" || v["delivery"]["state"] == "dead-lettered"
        })
        .await;
    (st, a, d)
}

async fn state_changes(s: &Server) -> Vec<(String, String)> {
    s.engine
        .store
        .subscription_events("github", 1000)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.event_type == "trigger.subscription.state.changed")
        .map(|e| {
            (
                e.payload["fromState"].as_str().unwrap().to_string(),
                e.payload["toState"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A worker failing half the time (deterministically: fail, fail, succeed, ...,
/// so runs of two consecutive failures occur) with one attempt per delivery. Before the fix the first
/// exhausted delivery dead-lettered the subscription and the breaker (threshold 2) flapped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sporadically_failing_worker_never_dead_letters_or_flaps_the_subscription() {
    let codes: Vec<u16> = (0..100)
        .map(|i| if i % 3 == 2 { 200 } else { 500 })
        .collect();
    let (url, hits) = worker(codes).await;
    let policy = FailurePolicy {
        failure_window_ms: 10_000,
        dead_letter_after_ms: 10_000,
        dead_letter_min_failures: 3,
    };
    let s = start_with(Some(url), fast_retry(1), 2, policy, Default::default()).await;
    let mut outcomes = Vec::new();
    for i in 0..12 {
        let (st, a, d) = post_and_settle(&s, &format!("half-{i}")).await;
        assert_eq!(
            (st, a["outcome"].as_str()),
            (StatusCode::ACCEPTED, Some("accepted")),
            "webhook {i}: {a}"
        );
        outcomes.push(d["delivery"]["state"].as_str().unwrap().to_string());
        let sub = s.get("/v1/trigger-subscriptions/github").await;
        assert_eq!(sub["subscription"]["state"], "active", "after webhook {i}");
    }
    assert_eq!(
        hits.load(Ordering::SeqCst),
        12,
        "every webhook reached the worker"
    );
    assert_eq!(outcomes.iter().filter(|o| *o == "delivered").count(), 4);
    assert_eq!(outcomes.iter().filter(|o| *o == "dead-lettered").count(), 8);
    assert_eq!(
        state_changes(&s).await,
        vec![],
        "no transition at all: no flapping"
    );
}

/// 100 % failure dead-letters the subscription only once failure was continuous
/// for `dead_letter_after_ms` with at least `dead_letter_min_failures` failures; an operator resume
/// and a success recover it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continuous_failure_dead_letters_after_the_window_and_a_resume_recovers() {
    let (url, hits) = worker(vec![500; 4]).await;
    let policy = FailurePolicy {
        failure_window_ms: 0,
        dead_letter_after_ms: 1_500,
        dead_letter_min_failures: 3,
    };
    let s = start_with(Some(url), fast_retry(1), 2, policy, Default::default()).await;
    let mut first_failure = None;
    for i in 0..3 {
        let (_, _, d) = post_and_settle(&s, &format!("all-{i}")).await;
        assert_eq!(d["delivery"]["state"], "dead-lettered");
        first_failure.get_or_insert(
            chrono::DateTime::parse_from_rfc3339(d["attempts"][0]["startedAt"].as_str().unwrap())
                .unwrap(),
        );
    }
    let sub = s.get("/v1/trigger-subscriptions/github").await;
    assert_eq!(
        sub["subscription"]["state"], "failed",
        "the breaker tripped, no dead-lettering yet"
    );
    assert_eq!(sub["stateDetail"]["failuresSinceSuccess"], 3);
    assert_eq!(sub["stateDetail"]["lastError"], "http_500: HTTP 500");
    // Let the continuous-failure window pass (the rule is about elapsed time), then fail once more.
    let first = first_failure.unwrap();
    let elapsed = chrono::Utc::now()
        .signed_duration_since(first)
        .num_milliseconds();
    tokio::time::sleep(std::time::Duration::from_millis(
        (1_600 - elapsed).max(0) as u64
    ))
    .await;
    let (_, _, d4) = post_and_settle(&s, "all-3").await;
    assert_eq!(d4["delivery"]["state"], "dead-lettered");
    let sub = s.get("/v1/trigger-subscriptions/github").await;
    assert_eq!(sub["subscription"]["state"], "dead-lettered");
    assert_eq!(
        state_changes(&s).await,
        vec![
            ("active".to_string(), "failed".to_string()),
            ("failed".to_string(), "dead-lettered".to_string())
        ]
    );
    let listed = s
        .engine
        .subscriptions_in_state(tb_core::subscription::SubscriptionState::DeadLettered)
        .await
        .unwrap();
    assert_eq!(
        listed.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        vec!["github"]
    );
    // Dead-lettered: answered 202 dead_lettered, never sent.
    let (st, v) = s
        .post_github("pull_request", "all-4", opened(), GH_SECRET)
        .await;
    assert_eq!(
        (st, v["outcome"].as_str()),
        (StatusCode::ACCEPTED, Some("dead_lettered"))
    );
    assert_eq!(hits.load(Ordering::SeqCst), 4);
    // Recovery: resume, and the (now healthy) worker delivers; the streak starts over.
    let (st, _) = s
        .post("/v1/trigger-subscriptions/github/resume", json!({}))
        .await;
    assert_eq!(st, StatusCode::OK);
    let (st, a, d) = post_and_settle(&s, "all-5").await;
    assert_eq!(
        (st, a["outcome"].as_str()),
        (StatusCode::ACCEPTED, Some("accepted"))
    );
    assert_eq!(d["delivery"]["state"], "delivered");
    let sub = s.get("/v1/trigger-subscriptions/github").await;
    assert_eq!(sub["subscription"]["state"], "active");
    assert_eq!(sub["stateDetail"]["failuresSinceSuccess"], 0);
}

/// A worker slower than the lease (lease 300 ms, work 1 s) gets exactly one POST:
/// the lease is renewed while the attempt is in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_shorter_than_the_work_is_renewed_and_the_worker_gets_one_post() {
    let hits = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let h = hits.clone();
    let app = axum::Router::new().route(
        "/run",
        axum::routing::post(move || {
            let h = h.clone();
            async move {
                h.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(1_000)).await;
                StatusCode::OK
            }
        }),
    );
    let (url, hits) = serve_worker(app, hits).await;
    let worker = tb_engine::worker::WorkerConfig {
        lease_ms: 300,
        ..Default::default()
    };
    let s = start_with(Some(url), fast_retry(3), 0, IMMEDIATE, worker).await;
    let (_, _, d) = post_and_settle(&s, "slow-1").await;
    assert_eq!(d["delivery"]["state"], "delivered");
    assert_eq!(
        d["attempts"].as_array().unwrap().len(),
        1,
        "one attempt recorded"
    );
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "exactly one POST reached the worker"
    );
}

/// A failed attempt's message is masked with the one credential list (`tb_core::credentials`, corpus
/// in tests/fixtures/credentials) before it is stored: a worker that echoes a key, an AWS key id or a
/// token in its error body leaves `[redacted]` in the attempt log, the subscription's `lastError`
/// and the console, and a token cut by the 256-byte limit is masked too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempts_message_is_stored_with_its_credentials_masked() {
    let corpus = tb_core::credentials::corpus(
        &std::fs::read_to_string(fixtures().join("credentials/positives.txt")).unwrap(),
    );
    let example = |name: &str| {
        corpus
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, e)| e.clone())
            .unwrap()
    };
    let (tbk, akia, ghp) = (
        example("trigger-bridge-api-key"),
        example("aws-access-key-id"),
        example("github-token"),
    );
    let head = format!(r#"{{"error":"denied","key":"{tbk}","aws":"{akia}","pad":""#);
    // The GitHub token starts 16 bytes before the 256-byte cut: only its first 16 are read.
    let pad = "x".repeat(256 - 16 - head.len() - r#"","gh":""#.len());
    let body = format!(r#"{head}{pad}","gh":"{ghp}"}}"#);
    assert_eq!(body.find(&ghp), Some(240));
    let app = axum::Router::new().route(
        "/run",
        axum::routing::post(move || {
            let body = body.clone();
            async move { (StatusCode::INTERNAL_SERVER_ERROR, body) }
        }),
    );
    let (url, _) = serve_worker(app, Default::default()).await;
    let s = start(Some(url), fast_retry(1), 0).await;
    let (_, _, d) = post_and_settle(&s, "cred-1").await;
    let m = d["attempts"][0]["message"].as_str().unwrap();
    assert_eq!(
        m,
        format!(
            r#"HTTP 500: {{"error":"denied","key":"[redacted]","aws":"[redacted]","pad":"{pad}","gh":"[redacted]"#
        )
    );
    let sub = s.get("/v1/trigger-subscriptions/github").await;
    let last = sub["stateDetail"]["lastError"].as_str().unwrap();
    for secret in [tbk.as_str(), akia.as_str(), &ghp[..16]] {
        assert!(!last.contains(secret), "{last}");
    }
}

/// A failed attempt keeps a short sanitized message (status and the first bytes of
/// the body, printable only, capped), shown as `attempts[].message`; connect errors read as a sentence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_attempts_keep_a_short_sanitized_message() {
    let mut body = b"{\"error\":\"database is down\"}\n\x1b[2J".to_vec();
    body.extend(std::iter::repeat_n(b'x', 5_000));
    let app = axum::Router::new().route(
        "/run",
        axum::routing::post(move || {
            let body = body.clone();
            async move {
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    [("x-secret-header", "hunter2")],
                    body,
                )
            }
        }),
    );
    let (url, _) = serve_worker(app, Default::default()).await;
    let s = start(Some(url), fast_retry(1), 0).await;
    let (_, _, d) = post_and_settle(&s, "msg-1").await;
    let m = d["attempts"][0]["message"].as_str().unwrap();
    assert!(
        m.starts_with("HTTP 500: {\"error\":\"database is down\"} [2Jxxx"),
        "{m}"
    );
    assert_eq!(
        m.len(),
        "HTTP 500: ".len() + 256 - 1,
        "256 body bytes, one space collapsed: {m}"
    );
    assert!(!m.contains("hunter2"));
    assert_eq!(d["attempts"][0]["errorClass"], "http_500");

    // Nothing listens on the port: a plain sentence.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let s = start(
        Some(format!("http://127.0.0.1:{port}/run")),
        fast_retry(1),
        0,
    )
    .await;
    let (_, _, d) = post_and_settle(&s, "msg-2").await;
    assert_eq!(d["attempts"][0]["errorClass"], "connect");
    assert_eq!(
        d["attempts"][0]["message"],
        "could not connect to the worker"
    );
}
