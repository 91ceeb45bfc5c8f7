//! Abuse quarantine (docs/limits.md "Quarantine"): by hand and by the automatic rule, a
//! quarantined subscription answers 403 `subscription_quarantined` before reading the body, shows as
//! such, is audited, and takes requests again once released.
//!
//! One test: it moves the process clock forward ([`tb_engine::clock::advance_for_tests`]).

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::*;
use tb_core::connector::ConnectorSpec;
use tb_core::quarantine::QuarantinePolicy;
use tb_core::workflow::{Executor, Workflow};
use tb_engine::{Catalog, SubscriptionConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A request whose headers promise 10 MB that never come: the answer must not wait for them.
async fn headers_only(base: &str, sub: &str) -> String {
    let addr = base.trim_start_matches("http://");
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /v1/trigger-subscriptions/{sub}/ingest HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         x-github-event: pull_request\r\nx-github-delivery: d\r\ncontent-length: 10000000\r\n\r\n"
    );
    sock.write_all(req.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf))
        .await
        .expect("answered without the body")
        .unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

async fn audit_actions(s: &Server, target: &str) -> Vec<(String, String)> {
    let v = s.get(&format!("/v1/audit?target={target}&limit=50")).await;
    v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_string(),
                e["actor"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantine_by_hand_and_by_rule_refuses_cheaply_until_released() {
    // Start early in a minute, so each minute's forged requests stay in it.
    let into = tb_engine::clock::now_ms().rem_euclid(60_000);
    if into > 40_000 {
        tb_engine::clock::advance_for_tests(60_000 - into + 100);
    }
    let (dir, store) = store();
    let sub = |id: &str, policy| SubscriptionConfig {
        quarantine: policy,
        ..SubscriptionConfig::webhook(id, ConnectorSpec::Github, GH_SECRET.as_bytes())
    };
    let binding = |id: &str, sub: &str| opened_binding(id, sub, "wf", 0);
    let rule = QuarantinePolicy {
        refusals_per_min: 20,
        minutes: 2,
    };
    let s = serve(
        dir,
        store,
        Catalog::new(
            vec![sub("github", Default::default()), sub("watched", rule)],
            vec![binding("b1", "github"), binding("b2", "watched")],
            vec![Workflow {
                id: "wf".into(),
                executor: Executor::Noop,
            }],
        ),
        Vec::new(),
    )
    .await;

    // By hand: a reason is required.
    let (st, e) = s
        .post(
            "/v1/trigger-subscriptions/github/quarantine",
            json!({"reason": "  "}),
        )
        .await;
    assert_eq!(
        (st.as_u16(), e["error"].as_str()),
        (400, Some("validation_error"))
    );
    let (st, e) = s
        .post(
            "/v1/trigger-subscriptions/nope/quarantine",
            json!({"reason": "x"}),
        )
        .await;
    assert_eq!(st.as_u16(), 404, "{e}");
    for bad in ["two\nlines", "\u{1b}[31mred", &"x".repeat(501)] {
        let (st, e) = s
            .post(
                "/v1/trigger-subscriptions/github/quarantine",
                json!({ "reason": bad }),
            )
            .await;
        assert_eq!(
            (st.as_u16(), e["error"].as_str()),
            (400, Some("validation_error")),
            "{e}"
        );
    }
    assert!(
        s.engine.quarantined("github").is_none(),
        "nothing kept from a refused call"
    );
    let (st, q) = s
        .post(
            "/v1/trigger-subscriptions/github/quarantine",
            json!({"reason": "forged deliveries from 203.0.113.0/24"}),
        )
        .await;
    assert_eq!(st.as_u16(), 200, "{q}");
    assert_eq!(q["created"], true);
    assert_eq!(q["quarantine"]["quarantinedBy"], "anonymous");
    let (_, again) = s
        .post(
            "/v1/trigger-subscriptions/github/quarantine",
            json!({"reason": "other"}),
        )
        .await;
    assert_eq!(again["created"], false);
    assert_eq!(
        again["quarantine"]["reason"], "forged deliveries from 203.0.113.0/24",
        "the first quarantine is kept"
    );

    // A correctly signed request is refused too, and the answer does not wait for the body.
    let (st, v) = s
        .post_github("pull_request", "real-1", opened(), GH_SECRET)
        .await;
    assert_eq!(
        (st.as_u16(), v["error"].as_str()),
        (403, Some("subscription_quarantined"))
    );
    let m = v["message"].as_str().unwrap();
    assert!(
        m.contains("quarantined") && !m.contains("forged") && !m.contains("203.0.113"),
        "the operator's reason is not shown to the sender: {m}"
    );
    let raw = headers_only(&s.base, "github").await;
    assert!(raw.starts_with("HTTP/1.1 403"), "{raw}");
    assert_eq!(
        s.get("/v1/receipts").await["receipts"]
            .as_array()
            .unwrap()
            .len(),
        0,
        "nothing stored"
    );

    // Visible: on the subscription, in the list, and audited as the operator.
    let d = s.get("/v1/trigger-subscriptions/github").await;
    assert_eq!(
        d["stateDetail"]["quarantine"]["reason"],
        "forged deliveries from 203.0.113.0/24"
    );
    assert_eq!(
        d["subscription"]["state"], "active",
        "quarantine is not a state change"
    );
    let all = s.get("/v1/quarantines").await;
    assert_eq!(all["quarantines"].as_array().unwrap().len(), 1, "{all}");
    let audit = s
        .get("/v1/audit?target=github&action=subscription.quarantine&limit=10")
        .await;
    assert!(
        audit
            .to_string()
            .contains("forged deliveries from 203.0.113.0/24"),
        "the audit entry keeps the reason: {audit}"
    );
    assert!(audit_actions(&s, "github")
        .await
        .contains(&("subscription.quarantine".into(), "anonymous".into())));

    // Released: taken again.
    let (st, r) = s
        .post("/v1/trigger-subscriptions/github/release", Value::Null)
        .await;
    assert_eq!((st.as_u16(), &r["released"]), (200, &json!(true)));
    let (st, r) = s
        .post("/v1/trigger-subscriptions/github/release", Value::Null)
        .await;
    assert_eq!((st.as_u16(), &r["released"]), (200, &json!(false)));
    let (st, v) = s
        .post_github("pull_request", "real-2", opened(), GH_SECRET)
        .await;
    assert_eq!(st.as_u16(), 202, "{v}");
    assert!(audit_actions(&s, "github")
        .await
        .contains(&("subscription.release".into(), "anonymous".into())));
    assert!(
        s.get("/v1/trigger-subscriptions/github").await["stateDetail"]
            .get("quarantine")
            .is_none()
    );

    // By the rule: 20 forged requests a minute for 2 complete minutes. One minute is not enough.
    let forge = |n: usize, tag: &'static str| {
        let s = &s;
        async move {
            for i in 0..n {
                let (st, _) = s
                    .post_github_to(
                        "watched",
                        "pull_request",
                        &format!("{tag}-{i}"),
                        opened(),
                        "wrong",
                    )
                    .await;
                assert_eq!(st.as_u16(), 401);
            }
            s.engine.flush_ingress_counts().await;
        }
    };
    forge(25, "m1").await;
    tb_engine::clock::advance_for_tests(60_000);
    s.engine
        .apply_quarantine_rules(tb_engine::clock::now_ms())
        .await;
    assert!(
        s.engine.quarantined("watched").is_none(),
        "one minute is not sustained"
    );
    forge(25, "m2").await;
    tb_engine::clock::advance_for_tests(60_000);
    s.engine
        .apply_quarantine_rules(tb_engine::clock::now_ms())
        .await;
    let q = s
        .engine
        .quarantined("watched")
        .expect("quarantined by the rule");
    assert_eq!(q.quarantined_by, None);
    assert!(
        q.reason
            .contains("at least 20 refused requests a minute for 2 minutes"),
        "{}",
        q.reason
    );
    assert!(audit_actions(&s, "watched")
        .await
        .contains(&("subscription.quarantine".into(), "rule:quarantine".into())));
    let (st, v) = s
        .post_github_to("watched", "pull_request", "real-3", opened(), GH_SECRET)
        .await;
    assert_eq!(
        (st.as_u16(), v["error"].as_str()),
        (403, Some("subscription_quarantined"))
    );
    // The refusals the rule read, and the quarantined answers, are counted per minute.
    s.engine.flush_ingress_counts().await;
    let c = s
        .get("/v1/trigger-subscriptions/watched/ingress-counts?minutes=5")
        .await;
    let n = |outcome: &str| -> u64 {
        c["counts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["outcome"] == outcome)
            .map(|r| r["n"].as_u64().unwrap())
            .sum()
    };
    assert_eq!((n("signature_invalid"), n("quarantined")), (50, 1), "{c}");
}
