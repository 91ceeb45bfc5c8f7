//! Rate limits at every level (docs/limits.md "Rate limits"), over real HTTP with requests
//! that really race: each level admits exactly its limit in a minute, answers the rest 429 with
//! `Retry-After` naming the level and the key that sets it, admits again the next minute, and a flood
//! of refusals is a bounded number of rows.
//!
//! One test: it moves the process clock a minute forward ([`tb_engine::clock::advance_for_tests`]),
//! which no other test in this binary may see.

mod support;

use std::sync::Arc;

use serde_json::Value;
use support::*;
use tb_core::binding::Binding;
use tb_core::connector::ConnectorSpec;
use tb_core::rate::RECORDS_PER_MINUTE;
use tb_core::workflow::{Executor, Workflow};
use tb_engine::edge::IngressQuotas;
use tb_engine::{Catalog, SubscriptionConfig};

fn binding(id: &str, sub: &str, per_min: u32) -> Binding {
    opened_binding(id, sub, "wf", per_min)
}

fn github(id: &str, per_min: u32) -> SubscriptionConfig {
    SubscriptionConfig {
        rate_limit_per_min: per_min,
        ..SubscriptionConfig::webhook(id, ConnectorSpec::Github, GH_SECRET.as_bytes())
    }
}

/// One signed GitHub request to `sub`: `(status, Retry-After, body)`.
async fn post(
    http: &reqwest::Client,
    base: &str,
    sub: &str,
    delivery: &str,
    forwarded_for: Option<&str>,
) -> (u16, Option<u64>, Value) {
    let body = opened();
    let mut req = http
        .post(format!("{base}/v1/trigger-subscriptions/{sub}/ingest"))
        .header("content-type", "application/json")
        .header("x-github-event", "pull_request")
        .header("x-github-delivery", delivery)
        .header(
            "x-hub-signature-256",
            tb_ingress::github::sign(GH_SECRET.as_bytes(), &body),
        );
    if let Some(f) = forwarded_for {
        req = req.header("x-forwarded-for", f);
    }
    let r = req.body(body).send().await.unwrap();
    let status = r.status().as_u16();
    let wait = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    (status, wait, r.json().await.unwrap_or(Value::Null))
}

/// `n` requests to `sub` released together; the answers, in no order.
async fn race(s: &Server, sub: &str, tag: &str, n: usize) -> Vec<(u16, Option<u64>, Value)> {
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (http, base, sub, b) = (
            s.http.clone(),
            s.base.clone(),
            sub.to_string(),
            barrier.clone(),
        );
        let id = format!("{tag}-{i}");
        tasks.push(tokio::spawn(async move {
            b.wait().await;
            post(&http, &base, &sub, &id, None).await
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// The 202s and the 429s of `answers`; every 429 has a `Retry-After` of 1 to 60 s and a message
/// containing `names`.
fn split(answers: &[(u16, Option<u64>, Value)], names: &str) -> (usize, usize) {
    let ok = answers.iter().filter(|a| a.0 == 202).count();
    let limited: Vec<_> = answers.iter().filter(|a| a.0 == 429).collect();
    assert_eq!(
        ok + limited.len(),
        answers.len(),
        "only 202 and 429: {answers:?}"
    );
    for (_, wait, body) in &limited {
        assert!(wait.is_some_and(|w| (1..=60).contains(&w)), "{wait:?}");
        assert_eq!(body["error"], "rate_limited");
        let m = body["message"].as_str().unwrap();
        assert!(m.contains(names), "{m}");
    }
    (ok, limited.len())
}

async fn counts(s: &Server, sub: &str) -> Vec<(String, u64)> {
    s.engine.flush_ingress_counts().await;
    let v = s
        .get(&format!(
            "/v1/trigger-subscriptions/{sub}/ingress-counts?minutes=10"
        ))
        .await;
    let mut by: std::collections::BTreeMap<String, u64> = Default::default();
    for c in v["counts"].as_array().unwrap() {
        *by.entry(c["outcome"].as_str().unwrap().to_string())
            .or_default() += c["n"].as_u64().unwrap();
    }
    by.into_iter().collect()
}

async fn receipts_in(s: &Server, state: &str) -> usize {
    s.get(&format!("/v1/receipts?state={state}&limit=500"))
        .await["receipts"]
        .as_array()
        .unwrap()
        .len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_level_holds_under_concurrency_and_admits_again_the_next_minute() {
    // Start at the beginning of a minute, so one race never spans two.
    let now = tb_engine::clock::now_ms();
    let into = now.rem_euclid(60_000);
    if into > 45_000 {
        tb_engine::clock::advance_for_tests(60_000 - into + 100);
    }
    let (dir, store) = store();
    let wf = Workflow {
        id: "wf".into(),
        executor: Executor::Noop,
    };
    let s = serve(
        dir,
        store,
        Catalog::new(
            vec![
                github("limited", 10),
                github("by-binding", 0),
                github("open", 0),
            ],
            vec![
                binding("limited-b", "limited", 0),
                binding("capped", "by-binding", 4),
                binding("open-b", "open", 0),
            ],
            vec![wf],
        ),
        Vec::new(),
    )
    .await;

    // The subscription's own limit: exactly 10 of 30 racing requests.
    let a = race(&s, "limited", "sub", 30).await;
    assert_eq!(split(&a, "subscription \"limited\" accepts 10 requests a minute ([[subscriptions]].rate_limit_per_min)"), (10, 20));
    // Only the first few refusals of the minute are written one by one; all are counted.
    assert_eq!(
        receipts_in(&s, "rate_limited").await,
        RECORDS_PER_MINUTE as usize
    );
    assert_eq!(
        counts(&s, "limited").await,
        vec![("admitted".into(), 10), ("rate_limited".into(), 20)]
    );

    // A binding's limit: exactly 4 of 12.
    let b = race(&s, "by-binding", "bind", 12).await;
    assert_eq!(
        split(
            &b,
            "binding \"capped\" accepts 4 requests a minute ([[bindings]].rate_limit_per_min)"
        ),
        (4, 8)
    );

    // The per-source limit: exactly 15 of 40 from 127.0.0.1.
    s.engine.set_ingress_quotas(IngressQuotas {
        source_per_min: 15,
        trusted_proxies: vec!["127.0.0.1/32".parse().unwrap()],
        ..Default::default()
    });
    let c = race(&s, "open", "src", 40).await;
    assert_eq!(
        split(
            &c,
            "source 127.0.0.1 accepts 15 requests a minute ([rate_limits].source_per_min)"
        ),
        (15, 25)
    );
    // Behind a trusted proxy the forwarded client has its own bucket; a forwarded address from an
    // untrusted peer would be ignored (tb_core::rate unit tests).
    let (st, _, v) = post(&s.http, &s.base, "open", "fwd-1", Some("198.51.100.7")).await;
    assert_eq!(st, 202, "{v}");
    let (st, _, _) = post(&s.http, &s.base, "open", "direct", None).await;
    assert_eq!(st, 429, "127.0.0.1's own bucket is still full");

    // The global limit: exactly 20 of 30 (sources unlimited).
    s.engine.set_ingress_quotas(IngressQuotas {
        global_per_min: 20,
        ..Default::default()
    });
    let d = race(&s, "open", "global", 30).await;
    assert_eq!(
        split(
            &d,
            "this server accepts 20 requests a minute ([rate_limits].global_per_min)"
        ),
        (20, 10)
    );
    // An unknown id is limited like any other request (429 before the 404).
    let (st, _, _) = post(&s.http, &s.base, "no-such-subscription", "x", None).await;
    assert_eq!(st, 429);
    // Server-wide and per-address refusals are counted apart from the subscription's own limit
    // (they do not count towards its quarantine rule).
    let open = counts(&s, "open").await;
    assert!(
        open.contains(&("rate_limited_global".into(), 10))
            && open.contains(&("rate_limited_source".into(), 26))
            && !open.iter().any(|(o, _)| o == "rate_limited"),
        "{open:?}"
    );

    // The next minute every level admits again.
    tb_engine::clock::advance_for_tests(60_000);
    for (sub, tag) in [
        ("limited", "again-1"),
        ("by-binding", "again-2"),
        ("open", "again-3"),
    ] {
        let (st, _, v) = post(&s.http, &s.base, sub, tag, None).await;
        assert_eq!(st, 202, "{sub}: {v}");
    }
    // Every admitted request has its receipt; a refusal before the body has none, and a refusal
    // after the signature only its content-free `rate_limited` record (8 for the binding's).
    let all = s.get("/v1/receipts?limit=500").await["receipts"]
        .as_array()
        .unwrap()
        .len();
    let limited = receipts_in(&s, "rate_limited").await;
    assert_eq!(limited, RECORDS_PER_MINUTE as usize + 8);
    assert_eq!(
        all - limited,
        10 + 4 + 15 + 1 + 20 + 3,
        "one receipt per admitted request"
    );
}
