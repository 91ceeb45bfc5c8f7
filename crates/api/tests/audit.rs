//! The audit log over HTTP: every mutating route is either an audited operator action or
//! named as the worker protocol; operator actions are recorded with actor, target and outcome (a
//! refused one too), and `GET /v1/audit/verify` checks the chain.

mod support;

use reqwest::StatusCode;
use serde_json::{json, Value};
use support::*;
use trigger_bridge_api::audit::{action_of, NOT_AUDITED};
use trigger_bridge_api::auth::{Access, ApiKey};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mutating_route_is_audited_or_named_as_worker_protocol() {
    let s = start(None, fast_retry(2), 0).await;
    let state = trigger_bridge_api::AppState {
        engine: s.engine.clone(),
        metrics: None,
        host: Default::default(),
        keys: Default::default(),
        secrets: None,
    };
    let routes = trigger_bridge_api::routes(state);
    let mut audited = 0;
    for r in routes.table() {
        let m = r.method.as_str();
        if matches!(m, "GET" | "HEAD") || r.access == Access::Public {
            continue;
        }
        let named = NOT_AUDITED.contains(&(m, r.path));
        let action = action_of(&r.method, r.path);
        assert!(
            action.is_some() != named,
            "{m} {}: must be audited xor listed in NOT_AUDITED",
            r.path
        );
        audited += action.is_some() as usize;
    }
    assert!(audited >= 21, "{audited} audited routes");
}

async fn call(
    s: &Server,
    key: &str,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut r = s
        .http
        .request(method, format!("{}{path}", s.base))
        .bearer_auth(key);
    if let Some(b) = body {
        r = r.json(&b);
    }
    let r = r.send().await.unwrap();
    let st = r.status();
    (st, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_actions_are_recorded_with_actor_target_and_outcome() {
    let mut reader = ApiKey::full_scope("auditor", "auditor-key");
    reader.scopes = vec!["audit:read".into()];
    let s = start_with_keys(
        None,
        fast_retry(2),
        0,
        vec![ApiKey::full_scope("ops", "ops-key"), reader],
    )
    .await;
    let post = reqwest::Method::POST;
    let (st, _) = call(
        &s,
        "ops-key",
        post.clone(),
        "/v1/trigger-subscriptions/github/pause",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let (st, _) = call(
        &s,
        "ops-key",
        post.clone(),
        "/v1/trigger-subscriptions/nope/pause",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, v) = call(
        &s,
        "ops-key",
        post.clone(),
        "/v1/trigger-subscriptions/github/dead-letters:replay",
        Some(json!({})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    // A worker-protocol call is not an operator action; a read is not either.
    let (st, _) = call(&s, "ops-key", reqwest::Method::GET, "/v1/receipts", None).await;
    assert_eq!(st, StatusCode::OK);
    // Only audit:read may read the log.
    let (st, _) = call(
        &s,
        "auditor-key",
        post.clone(),
        "/v1/trigger-subscriptions/github/resume",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN);

    let (st, page) = call(&s, "auditor-key", reqwest::Method::GET, "/v1/audit", None).await;
    assert_eq!(st, StatusCode::OK, "{page}");
    let rows: Vec<(String, String, String, String)> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap().to_string(),
                e["action"].as_str().unwrap().to_string(),
                e["target"].as_str().unwrap().to_string(),
                e["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let r = |a: &str, b: &str, c: &str, d: &str| (a.into(), b.into(), c.into(), d.into());
    assert_eq!(
        rows,
        vec![
            r("ops", "dead_letters.replay", "github", "ok"),
            r("ops", "subscription.pause", "nope", "not_found"),
            r("ops", "subscription.pause", "github", "ok"),
        ],
        "newest first; the 403 never reached the handler and is not an action"
    );
    let replay = &page["entries"][0];
    assert_eq!(replay["detail"]["dryRun"], true);
    assert_eq!(replay["detail"]["count"], 0);
    assert_eq!(replay["detail"]["status"], 200);
    assert_eq!(replay["seq"], 3);
    assert_eq!(page["entries"][2]["prevHash"], tb_core::audit::GENESIS);

    let (_, filtered) = call(
        &s,
        "auditor-key",
        reqwest::Method::GET,
        "/v1/audit?action=subscription&target=github",
        None,
    )
    .await;
    assert_eq!(
        filtered["entries"].as_array().unwrap().len(),
        1,
        "{filtered}"
    );

    let (st, v) = call(
        &s,
        "auditor-key",
        reqwest::Method::GET,
        "/v1/audit/verify",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        v,
        json!({"ok": true, "checked": 3, "unkeyed": 3, "breaks": 0, "keyed": false, "headSeq": 3}),
        "a server without the audit key writes and checks plain hashes"
    );
    let (st, v) = call(
        &s,
        "auditor-key",
        reqwest::Method::GET,
        "/v1/audit?limit=0",
        None,
    )
    .await;
    assert_eq!(
        (st, v["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("validation_error"))
    );
}

/// With the audit key: entries carry its MAC, `verify` hands out the head's checkpoint and checks one
/// given back; a malformed checkpoint is 400, and a server without the key cannot check one (503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_chain_hands_out_and_checks_checkpoints() {
    let s = start_with_keys(
        None,
        fast_retry(2),
        0,
        vec![ApiKey::full_scope("ops", "ops-key")],
    )
    .await;
    let get = reqwest::Method::GET;
    let (st, v) = call(
        &s,
        "ops-key",
        get.clone(),
        "/v1/audit/verify?checkpoint=1:00",
        None,
    )
    .await;
    assert_eq!(
        (st, v["error"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("unavailable")),
        "no key, no checkpoint: {v}"
    );
    let key = tb_core::audit::Key::from_bytes([4; 32]);
    s.engine.set_audit_key(Some(key.clone()));
    for path in ["pause", "resume"] {
        let (st, _) = call(
            &s,
            "ops-key",
            reqwest::Method::POST,
            &format!("/v1/trigger-subscriptions/github/{path}"),
            None,
        )
        .await;
        assert_eq!(st, StatusCode::OK);
    }
    let newest = s
        .engine
        .store
        .audit_entries(tb_store::AuditQuery {
            newest_first: true,
            limit: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .remove(0);
    assert_eq!(newest.seq, 2);
    assert_eq!(
        newest.hash,
        tb_core::audit::mac(&key, &newest.prev_hash, 2, &newest.entry),
        "the entry's hash is its MAC under the key"
    );
    let (st, v) = call(&s, "ops-key", get.clone(), "/v1/audit/verify", None).await;
    assert_eq!(st, StatusCode::OK);
    let cp = tb_core::audit::Checkpoint::of(&key, 2, &newest.hash);
    assert_eq!(
        v,
        json!({"ok": true, "checked": 2, "unkeyed": 0, "breaks": 0, "keyed": true, "headSeq": 2,
               "checkpoint": cp.to_string()})
    );
    let (st, v) = call(
        &s,
        "ops-key",
        get.clone(),
        &format!("/v1/audit/verify?checkpoint={cp}"),
        None,
    )
    .await;
    assert_eq!((st, &v["ok"]), (StatusCode::OK, &json!(true)), "{v}");
    let ahead = tb_core::audit::Checkpoint::of(&key, 3, &newest.hash);
    let (_, v) = call(
        &s,
        "ops-key",
        get.clone(),
        &format!("/v1/audit/verify?checkpoint={ahead}"),
        None,
    )
    .await;
    assert_eq!(
        v["problem"],
        json!({"problem": "truncated", "checkpointSeq": 3, "lastSeq": 2}),
        "{v}"
    );
    for bad in ["2", "0:ab", "2:xyz"] {
        let (st, v) = call(
            &s,
            "ops-key",
            get.clone(),
            &format!("/v1/audit/verify?checkpoint={bad}"),
            None,
        )
        .await;
        assert_eq!(
            (st, v["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some("validation_error")),
            "{bad}: {v}"
        );
    }
}
