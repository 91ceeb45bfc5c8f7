//! Rate limits (signals-and-connectors §0.5): past its `rate_limit_per_min`, an authenticated request
//! gets 429 `rate_limited` with `Retry-After`, and is kept as a content-free `rate_limited` receipt
//! naming its provider delivery id, so an operator can ask for a redelivery.

mod support;

use axum::http::StatusCode;
use support::*;
use tb_core::binding::{Binding, BindingAction};
use tb_core::connector::ConnectorSpec;
use tb_core::workflow::{Executor, Workflow};
use tb_engine::{Catalog, SubscriptionConfig};

#[tokio::test]
async fn over_its_rate_a_subscription_answers_429_and_records_the_refusal() {
    let (dir, store) = store();
    let sub = SubscriptionConfig {
        retry: fast_retry(3),
        rate_limit_per_min: 2,
        ..SubscriptionConfig::webhook("github", ConnectorSpec::Github, GH_SECRET.as_bytes())
    };
    let binding = Binding {
        rate_limit_per_min: 0,
        id: "pr-opened".into(),
        subscription: "github".into(),
        event_types: vec!["pull_request.opened".into()],
        filter: Default::default(),
        action: BindingAction::start_run("wf"),
        inputs: Default::default(),
    };
    let wf = Workflow {
        id: "wf".into(),
        executor: Executor::Noop,
    };
    let s = serve(
        dir,
        store,
        Catalog::new(vec![sub], vec![binding], vec![wf]),
        Vec::new(),
    )
    .await;
    for i in 0..2 {
        let (st, _) = s
            .post_github("pull_request", &format!("ok-{i}"), opened(), GH_SECRET)
            .await;
        assert_eq!(st, StatusCode::ACCEPTED);
    }
    // A forged request is refused by its signature first: it never uses the bucket or gets a 429.
    let (st, _) = s
        .post_github("pull_request", "forged", opened(), "wrong")
        .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let r = s
        .http
        .post(format!("{}/v1/trigger-subscriptions/github/ingest", s.base))
        .header("content-type", "application/json")
        .header("x-github-event", "pull_request")
        .header("x-github-delivery", "too-many")
        .header(
            "x-hub-signature-256",
            tb_ingress::github::sign(GH_SECRET.as_bytes(), &opened()),
        )
        .body(opened())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    let wait: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "{wait}");
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"], "rate_limited");
    // A redelivery of an accepted event is still a duplicate, not a refusal.
    let (st, dup) = s
        .post_github("pull_request", "ok-0", opened(), GH_SECRET)
        .await;
    assert_eq!(st, StatusCode::OK, "{dup}");
    let list = s.get("/v1/receipts?state=rate_limited").await;
    let refused = list["receipts"].as_array().unwrap();
    assert_eq!(refused.len(), 1, "{list}");
    assert_eq!(refused[0]["providerEventId"], "too-many");
    assert_eq!(refused[0]["bodyBytes"], 0, "content-free");
    let runs = s.get("/v1/runs").await["runs"].as_array().unwrap().len();
    assert!(
        runs <= 2,
        "the refused request started nothing: {runs} runs"
    );
}
