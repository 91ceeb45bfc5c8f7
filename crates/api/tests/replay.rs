//! Bulk dead-letter replay: `POST /v1/trigger-subscriptions/{id}/dead-letters:replay` (preview, filter by
//! error class and time, confirmation by the previewed count, batches, idempotence under a racing
//! single replay).

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use serde_json::{json, Value};
use support::*;

const REPLAY: &str = "/v1/trigger-subscriptions/github/dead-letters:replay";

/// A worker answering `code` (switchable at any time), counting requests per delivery (`webhook-id`).
struct Worker {
    url: String,
    code: Arc<AtomicU16>,
    hits: Arc<Mutex<HashMap<String, u32>>>,
}

async fn switchable_worker(code: u16) -> Worker {
    let code = Arc::new(AtomicU16::new(code));
    let hits: Arc<Mutex<HashMap<String, u32>>> = Default::default();
    let (c, h) = (code.clone(), hits.clone());
    let app = axum::Router::new().route(
        "/run",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let (c, h) = (c.clone(), h.clone());
            async move {
                let id = headers["webhook-id"].to_str().unwrap().to_string();
                *h.lock().unwrap().entry(id).or_default() += 1;
                StatusCode::from_u16(c.load(Ordering::SeqCst)).unwrap()
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/run", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    Worker { url, code, hits }
}

/// Posts one `pull_request.opened` per id and waits until its delivery is dead-lettered by the
/// worker's failures, then resumes the subscription (an exhausted delivery moves it to
/// `dead-lettered`, which would dead-letter the next receipt at ingest). Returns the delivery ids.
async fn dead_letter(s: &Server, ids: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for id in ids {
        let (st, a) = s.post_github("pull_request", id, opened(), GH_SECRET).await;
        assert_eq!(st, StatusCode::ACCEPTED, "{a}");
        assert_eq!(a["outcome"], "accepted", "{a}");
        let d = a["deliveries"][0]["deliveryId"]
            .as_str()
            .unwrap()
            .to_string();
        s.wait_for(&format!("/v1/deliveries/{d}"), |v| {
            v["delivery"]["state"] == "dead-lettered"
        })
        .await;
        let (st, _) = s
            .post("/v1/trigger-subscriptions/github/resume", json!({}))
            .await;
        assert_eq!(st, StatusCode::OK);
        out.push(d);
    }
    out
}

/// Three deliveries dead-lettered with `http_500`, then (after `cut`) two with `http_503`; the worker
/// still fails. Retries: 2 attempts, 20 ms apart; no breaker.
async fn setup() -> (Server, Worker, Vec<String>, Vec<String>, String) {
    let w = switchable_worker(500).await;
    let s = start(Some(w.url.clone()), fast_retry(2), 0).await;
    let first = dead_letter(&s, &["a-1", "a-2", "a-3"]).await;
    let cut = tb_engine::clock::now_ms() + 1;
    w.code.store(503, Ordering::SeqCst);
    let second = dead_letter(&s, &["b-1", "b-2"]).await;
    (s, w, first, second, tb_store::rfc3339(cut))
}

fn set(v: &Value) -> HashSet<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

fn strs(v: &[String]) -> HashSet<String> {
    v.iter().cloned().collect()
}

async fn states(s: &Server, ids: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for d in ids {
        let v = s.get(&format!("/v1/deliveries/{d}")).await;
        out.push(v["delivery"]["state"].as_str().unwrap().to_string());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_counts_and_filters_by_error_class_and_time_without_changing_anything() {
    let (s, w, first, second, cut) = setup().await;
    let hits_before = w.hits.lock().unwrap().clone();
    // No filter, dryRun absent: a preview of all five, oldest first.
    let (st, v) = s.post(REPLAY, json!({})).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["dryRun"], true);
    assert_eq!(v["count"], 5);
    assert_eq!(v["more"], false);
    assert_eq!(v["limit"], 1000);
    let all: Vec<String> = first.iter().chain(&second).cloned().collect();
    assert_eq!(set(&v["sample"]), strs(&all));
    let sample: Vec<String> = v["sample"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().into())
        .collect();
    assert_eq!(strs(&sample[..3]), strs(&first), "oldest first");
    let cases = [
        (json!({"errorClass": "http_500"}), &first[..]),
        (json!({"errorClass": "http_503"}), &second[..]),
        (json!({"errorClass": "connect"}), &[][..]),
        (json!({"from": cut}), &second[..]),
        (json!({"to": cut}), &first[..]),
        (json!({"from": cut, "errorClass": "http_500"}), &[][..]),
        (json!({"to": cut, "errorClass": "http_500"}), &first[..]),
    ];
    for (filter, want) in cases {
        let (st, v) = s
            .post(REPLAY, json!({"filter": filter, "dryRun": true}))
            .await;
        assert_eq!(st, StatusCode::OK, "{filter}: {v}");
        assert_eq!(v["count"], want.len(), "{filter}: {v}");
        assert_eq!(set(&v["sample"]), strs(want), "{filter}");
    }
    // The filter is echoed normalized.
    let (_, v) = s
        .post(
            REPLAY,
            json!({"filter": {"from": "2026-12-01T10:00:00+01:00", "errorClass": "http_500"}}),
        )
        .await;
    assert_eq!(
        v["filter"],
        json!({"from": "2026-12-01T09:00:00.000Z", "to": null, "errorClass": "http_500"})
    );
    // A preview changes nothing: still dead-lettered, no attempt made.
    assert_eq!(states(&s, &all).await, vec!["dead-lettered"; 5]);
    assert_eq!(*w.hits.lock().unwrap(), hits_before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_all_needs_the_previewed_count_then_gives_each_one_more_attempt_and_starts_the_runs()
{
    let (s, w, first, second, _cut) = setup().await;
    let all: Vec<String> = first.iter().chain(&second).cloned().collect();
    w.code.store(200, Ordering::SeqCst);
    let hits_before = w.hits.lock().unwrap().clone();
    // Without expect: refused, nothing replayed.
    let (st, v) = s.post(REPLAY, json!({"dryRun": false})).await;
    assert_eq!(
        (st, v["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("validation_error")),
        "{v}"
    );
    // A mismatched confirmation: 409 replay_count_changed, nothing replayed.
    for expect in [4, 6, 0] {
        let (st, v) = s
            .post(REPLAY, json!({"dryRun": false, "expect": expect}))
            .await;
        assert_eq!(st, StatusCode::CONFLICT, "{v}");
        assert_eq!(v["error"], "replay_count_changed");
        assert!(v["message"].as_str().unwrap().contains("selects 5"), "{v}");
    }
    // Filtered by class, in batches of 1: the two http_503 dead letters only.
    let (_, p) = s
        .post(
            REPLAY,
            json!({"filter": {"errorClass": "http_503"}, "limit": 1}),
        )
        .await;
    assert_eq!(
        (p["count"].as_u64(), p["more"].as_bool()),
        (Some(2), Some(true)),
        "{p}"
    );
    let (st, r1) = s
        .post(
            REPLAY,
            json!({"filter": {"errorClass": "http_503"}, "limit": 1, "dryRun": false, "expect": 2}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{r1}");
    assert_eq!(r1["replayed"], 1);
    assert_eq!(
        (r1["remaining"].as_u64(), r1["more"].as_bool()),
        (Some(1), Some(true))
    );
    assert_eq!(r1["deliveryIds"], json!([second[0]]), "oldest first");
    let (_, r2) = s
        .post(
            REPLAY,
            json!({"filter": {"errorClass": "http_503"}, "limit": 1, "dryRun": false, "expect": r1["remaining"]}),
        )
        .await;
    assert_eq!(r2["deliveryIds"], json!([second[1]]), "{r2}");
    assert_eq!(
        (r2["remaining"].as_u64(), r2["more"].as_bool()),
        (Some(0), Some(false))
    );
    for d in &second {
        s.wait_for(&format!("/v1/deliveries/{d}"), |v| {
            v["delivery"]["state"] == "delivered"
        })
        .await;
    }
    assert_eq!(
        states(&s, &first).await,
        vec!["dead-lettered"; 3],
        "the filter held"
    );
    // The rest, confirmed with the preview's count.
    let (_, p) = s.post(REPLAY, json!({"dryRun": true})).await;
    assert_eq!(p["count"], 3);
    let (st, r) = s
        .post(REPLAY, json!({"dryRun": false, "expect": p["count"]}))
        .await;
    assert_eq!(st, StatusCode::OK, "{r}");
    assert_eq!(r["replayed"], 3);
    assert_eq!(set(&r["deliveryIds"]), strs(&first));
    assert_eq!(r["skipped"], json!([]));
    // Each got exactly one more attempt (3, after 2), was delivered, and its run completed.
    for d in &all {
        let v = s
            .wait_for(&format!("/v1/deliveries/{d}"), |v| {
                v["delivery"]["state"] == "delivered"
            })
            .await;
        assert_eq!(v["delivery"]["replays"], 1, "{v}");
        let n: Vec<u64> = v["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["attempt"].as_u64().unwrap())
            .collect();
        assert_eq!(n, vec![1, 2, 3], "{d}");
        assert_eq!(
            w.hits.lock().unwrap()[d],
            hits_before[d] + 1,
            "{d}: one more request"
        );
    }
    let runs = s.get("/v1/runs").await;
    let runs = runs["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 5);
    assert!(runs.iter().all(|r| r["status"] == "completed"), "{runs:?}");
    // A second replay-all finds nothing.
    let (_, p) = s.post(REPLAY, json!({})).await;
    assert_eq!(
        (p["count"].as_u64(), p["sample"].clone()),
        (Some(0), json!([]))
    );
    let (st, r) = s.post(REPLAY, json!({"dryRun": false, "expect": 0})).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        (r["replayed"].as_u64(), r["more"].as_bool()),
        (Some(0), Some(false))
    );
    assert_eq!(
        w.hits.lock().unwrap().values().sum::<u32>(),
        hits_before.values().sum::<u32>() + 5
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_filters_are_400_and_an_unknown_subscription_is_404() {
    let w = switchable_worker(500).await;
    let s = start(Some(w.url.clone()), fast_retry(2), 0).await;
    let d = dead_letter(&s, &["x-1"]).await;
    let bad = [
        json!({"filter": {"from": "yesterday"}}),
        json!({"filter": {"to": "2026-13-01T00:00:00Z"}}),
        json!({"filter": {"from": "2026-12-01T00:00:00Z", "to": "2026-12-01T00:00:00Z"}}),
        json!({"filter": {"errorClass": ""}}),
        json!({"filter": {"errorClass": "HTTP 500"}}),
        json!({"filter": {"errorclass": "http_500"}}),
        json!({"dryrun": false, "expect": 1}),
        json!({"limit": 0}),
        json!({"limit": 1001}),
        json!({"expect": -1, "dryRun": false}),
        json!({"filter": {"errorClass": "http_500"}, "dryRun": false}),
    ];
    for b in bad {
        let (st, v) = s.post(REPLAY, b.clone()).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{b}: {v}");
        assert_eq!(v["error"], "validation_error", "{b}");
    }
    let (st, v) = s
        .post(
            "/v1/trigger-subscriptions/nope/dead-letters:replay",
            json!({"dryRun": false, "expect": 0}),
        )
        .await;
    assert_eq!(
        (st, v["error"].as_str()),
        (StatusCode::NOT_FOUND, Some("not_found")),
        "{v}"
    );
    assert_eq!(
        states(&s, &d).await,
        vec!["dead-lettered"],
        "nothing replayed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_racing_single_replay_and_replay_all_replay_each_delivery_exactly_once() {
    let (s, w, first, second, _cut) = setup().await;
    let all: Vec<String> = first.iter().chain(&second).cloned().collect();
    w.code.store(200, Ordering::SeqCst);
    let start = Arc::new(tokio::sync::Barrier::new(2));
    let singles = {
        let (http, base, ids, b) = (s.http.clone(), s.base.clone(), all.clone(), start.clone());
        tokio::spawn(async move {
            b.wait().await;
            let mut ok = Vec::new();
            for d in ids.iter().rev() {
                let r = http
                    .post(format!("{base}/v1/deliveries/{d}/replay"))
                    .send()
                    .await
                    .unwrap();
                match r.status().as_u16() {
                    200 => ok.push(d.clone()),
                    409 => {}
                    other => panic!("single replay answered {other}"),
                }
            }
            ok
        })
    };
    start.wait().await;
    // The bulk call confirms the count it saw; when a single replay got in first the count changed
    // (409) and it previews again. Bounded: at most one retry per delivery.
    let mut bulk: Vec<String> = Vec::new();
    let mut skipped = 0;
    for _ in 0..=all.len() {
        let (_, p) = s.post(REPLAY, json!({})).await;
        let (st, r) = s
            .post(REPLAY, json!({"dryRun": false, "expect": p["count"]}))
            .await;
        if st == StatusCode::CONFLICT {
            assert_eq!(r["error"], "replay_count_changed");
            continue;
        }
        assert_eq!(st, StatusCode::OK, "{r}");
        bulk.extend(set(&r["deliveryIds"]));
        for k in r["skipped"].as_array().unwrap() {
            assert_eq!(k["reason"], "not_dead_lettered");
            skipped += 1;
        }
        break;
    }
    let singles = singles.await.unwrap();
    let single_set: HashSet<String> = singles.iter().cloned().collect();
    assert!(
        bulk.iter().all(|d| !single_set.contains(d)),
        "no delivery replayed by both: bulk {bulk:?} single {singles:?}"
    );
    assert_eq!(
        bulk.len() + singles.len(),
        5,
        "bulk {bulk:?} (skipped {skipped}) single {singles:?}"
    );
    for d in &all {
        let v = s
            .wait_for(&format!("/v1/deliveries/{d}"), |v| {
                v["delivery"]["state"] == "delivered"
            })
            .await;
        assert_eq!(v["delivery"]["replays"], 1, "{d} replayed once");
        assert_eq!(v["attempts"].as_array().unwrap().len(), 3);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_all_needs_the_webhooks_manage_scope() {
    let key = |name: &str, scope: &str| trigger_bridge_api::auth::ApiKey {
        name: name.into(),
        sha256: trigger_bridge_api::auth::digest(name),
        scopes: vec![scope.into()],
        tenants: vec!["*".into()],
    };
    let s = start_with_keys(
        None,
        fast_retry(2),
        0,
        vec![
            key("reader", "runs:read"),
            key("operator", "webhooks:manage"),
        ],
    )
    .await;
    let call = |k: &'static str| {
        s.http
            .post(format!("{}{REPLAY}", s.base))
            .bearer_auth(k)
            .json(&json!({}))
            .send()
    };
    let r = call("reader").await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let r = call("operator").await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["count"], 0);
}
