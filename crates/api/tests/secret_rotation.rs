//! Rotating the signing secret of a registered subscription: `POST
//! /v1/trigger-subscriptions/{id}/rotate-secret` gives a new secret once; the old one is accepted
//! beside it until the overlap ends (also after a reload from the store, as another replica or a
//! restart does), or refused at once with no overlap; the rotation is audited without a secret.

mod support;

use serde_json::{json, Value};
use support::*;

/// [`support::post_sw`] of a fixed body, now: the status.
async fn post(s: &Server, path: &str, secret: &str, id: &str) -> u16 {
    let body = br#"{"type":"invoice.paid","data":{"n":1}}"#;
    post_sw(s, path, secret, id, body, chrono_now()).await.0
}

/// A registered subscription: `(id, ingest path, signing secret)` and the whole 201 answer.
async fn register(s: &Server) -> (String, String, String, Value) {
    let (st, reg) = s
        .post(
            "/v1/trigger-subscriptions",
            json!({"source": "webhook", "workflowId": "wf"}),
        )
        .await;
    assert_eq!(st.as_u16(), 201, "{reg}");
    let field = |p: &str| reg.pointer(p).and_then(Value::as_str).unwrap().to_string();
    let (id, ingest, secret) = (
        field("/subscription/subscriptionId"),
        field("/binding/ingestUrl"),
        field("/binding/signingSecret"),
    );
    (id, ingest, secret, reg)
}

async fn rotate(s: &Server, id: &str, body: &str) -> (u16, Value) {
    let r = s
        .http
        .post(format!(
            "{}/v1/trigger-subscriptions/{id}/rotate-secret",
            s.base
        ))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_secret_overlaps_for_its_window_and_is_audited_without_secrets() {
    let s = start(None, fast_retry(2), 0).await;
    let (id, ingest, s1, reg) = register(&s).await;
    assert_eq!(post(&s, &ingest, &s1, "msg_rotation_000001").await, 202);

    // Rotate with a one-hour overlap: a new secret, shown once; both are accepted.
    let before = tb_engine::clock::now_ms();
    let (st, r) = rotate(&s, &id, r#"{"overlapSeconds": 3600}"#).await;
    assert_eq!(st, 200, "{r}");
    let s2 = r["signingSecret"].as_str().unwrap().to_string();
    assert!(s2.starts_with("whsec_") && s2 != s1);
    assert_eq!(r["overlapSeconds"], 3600);
    assert_ne!(r["secretFingerprint"], reg["binding"]["secretFingerprint"]);
    let until = chrono::DateTime::parse_from_rfc3339(r["previousSecretUntil"].as_str().unwrap())
        .unwrap()
        .timestamp_millis();
    assert!((before + 3_600_000..=before + 3_610_000).contains(&until));
    assert_eq!(post(&s, &ingest, &s1, "msg_rotation_000002").await, 202);
    assert_eq!(post(&s, &ingest, &s2, "msg_rotation_000003").await, 202);
    let forged = "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    assert_eq!(post(&s, &ingest, forged, "msg_rotation_000004").await, 401);
    let detail = s.get(&format!("/v1/trigger-subscriptions/{id}")).await;
    assert_eq!(
        detail["stateDetail"]["previousSecretUntil"], r["previousSecretUntil"],
        "{detail}"
    );
    assert_eq!(
        detail["subscription"]["secretFingerprint"],
        r["secretFingerprint"]
    );

    // What another replica (or a restart) loads from the store: the new secret and the old one with
    // the same end.
    let secrets =
        tb_engine::registration::SecretStore::open(&s._dir.path().join("secrets")).unwrap();
    let other = tb_engine::Engine::start(s.engine.store.clone(), tb_engine::Catalog::default())
        .await
        .unwrap();
    tb_engine::registration::load_registered(&other, &secrets)
        .await
        .unwrap();
    let loaded = other.catalog().subscription(&id).cloned().unwrap();
    assert_eq!(loaded.secret, tb_ingress::parse_whsec(&s2).unwrap());
    let prev = loaded
        .previous_secret
        .clone()
        .expect("the previous secret reloads");
    assert_eq!(prev.secret, tb_ingress::parse_whsec(&s1).unwrap());
    assert_eq!(prev.until_ms, until);

    // Rotate again with no overlap: only the newest secret is accepted, at once.
    let (st, r3) = rotate(&s, &id, r#"{"overlapSeconds": 0}"#).await;
    assert_eq!(st, 200, "{r3}");
    assert_eq!(r3["previousSecretUntil"], Value::Null);
    let s3 = r3["signingSecret"].as_str().unwrap().to_string();
    assert_eq!(post(&s, &ingest, &s2, "msg_rotation_000005").await, 401);
    assert_eq!(post(&s, &ingest, &s1, "msg_rotation_000006").await, 401);
    assert_eq!(post(&s, &ingest, &s3, "msg_rotation_000007").await, 202);
    let detail = s.get(&format!("/v1/trigger-subscriptions/{id}")).await;
    assert!(detail["stateDetail"].get("previousSecretUntil").is_none());

    // Audited: two rotations of this subscription, with the overlap, and no secret anywhere.
    let audit = s
        .http
        .get(format!(
            "{}/v1/audit?action=subscription.rotate_secret",
            s.base
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for secret in [&s1, &s2, &s3] {
        assert!(!audit.contains(&secret[6..]), "a secret in the audit log");
    }
    let audit: Value = serde_json::from_str(&audit).unwrap();
    let entries: Vec<&Value> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["target"] == id.as_str())
        .collect();
    assert_eq!(entries.len(), 2, "{audit}");
    assert!(entries.iter().all(|e| e["outcome"] == "ok"));
    let overlaps: Vec<String> = entries
        .iter()
        .map(|e| e["detail"]["overlapSeconds"].to_string())
        .collect();
    assert!(
        overlaps.contains(&"3600".into()) && overlaps.contains(&"0".into()),
        "{overlaps:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_that_cannot_apply_is_refused_and_changes_nothing() {
    let s = start(None, fast_retry(2), 0).await;
    // A subscription from the config file rotates in the config file.
    let (st, v) = rotate(&s, "github", "").await;
    assert_eq!((st, v["error"].as_str()), (409, Some("conflict")), "{v}");
    assert!(v["message"]
        .as_str()
        .unwrap()
        .contains("[subscriptions.rotation]"));
    let (st, v) = rotate(&s, "nope", "").await;
    assert_eq!((st, v["error"].as_str()), (404, Some("not_found")), "{v}");

    let (id, ingest, s1, _) = register(&s).await;
    let (id, ingest, s1) = (id.as_str(), ingest.as_str(), s1.as_str());
    for (body, why) in [
        (r#"{"overlapSeconds": 2592001}"#, "over 30 days"),
        (r#"{"overlapSeconds": -1}"#, "invalid value: integer `-1`"),
        (r#"{"overlap": 60}"#, "unknown field `overlap`"),
        ("not json", "expected ident"),
    ] {
        let (st, v) = rotate(&s, id, body).await;
        assert_eq!(
            (st, v["error"].as_str()),
            (400, Some("validation_error")),
            "{body}: {v}"
        );
        assert!(v["message"].as_str().unwrap().contains(why), "{body}: {v}");
    }
    // Nothing changed: the registered secret still works and no rotation is in force.
    assert_eq!(post(&s, ingest, s1, "msg_rotation_000101").await, 202);
    let detail = s.get(&format!("/v1/trigger-subscriptions/{id}")).await;
    assert!(detail["stateDetail"].get("previousSecretUntil").is_none());
    // An empty body takes the default overlap of 24 h.
    let (st, v) = rotate(&s, id, "").await;
    assert_eq!(
        (st, v["overlapSeconds"].as_u64()),
        (200, Some(86_400)),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_rotations_form_one_chain_so_no_secret_handed_out_is_lost() {
    let s = start(None, fast_retry(2), 0).await;
    let (id, ingest, original, _) = register(&s).await;
    let (id, ingest, original) = (id.as_str(), ingest.as_str(), original.as_str());
    // Eight rotations at once; each either commits on top of the one before it or is refused.
    let answers = futures_util::future::join_all(
        (0..8).map(|_| rotate(&s, id, r#"{"overlapSeconds": 3600}"#)),
    )
    .await;
    let mut won = Vec::new();
    for (st, v) in &answers {
        match st {
            200 => won.push(v["signingSecret"].as_str().unwrap().to_string()),
            409 => assert!(
                v["message"].as_str().unwrap().contains("changed meanwhile"),
                "{v}"
            ),
            other => panic!("{other}: {v}"),
        }
    }
    assert!(!won.is_empty());
    // The commits form one chain: the last secret and the one it replaced are accepted, and no
    // other. Two rotations that both replaced the original would leave only one of them working.
    let mut accepted = 0;
    for (i, secret) in won.iter().enumerate() {
        if post(&s, ingest, secret, &format!("msg_rotation_race_{i:04}")).await == 202 {
            accepted += 1;
        }
    }
    assert_eq!(accepted, won.len().min(2), "{} rotations won", won.len());
    let original_ok = post(&s, ingest, original, "msg_rotation_race_orig").await == 202;
    assert_eq!(original_ok, won.len() == 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_may_not_start_runs_may_not_rotate() {
    let key = |name: &str, scopes: &[&str]| trigger_bridge_api::auth::ApiKey {
        name: name.into(),
        sha256: trigger_bridge_api::auth::digest(name),
        scopes: scopes.iter().map(|s| s.to_string()).collect(),
        tenants: vec!["*".into()],
    };
    let s = start_with_keys(
        None,
        fast_retry(2),
        0,
        vec![
            key("admin-key", &["*"]),
            key("manage-key", &["webhooks:manage"]),
        ],
    )
    .await;
    let call = |k: &'static str, path: String, body: Value| {
        s.http
            .post(format!("{}{path}", s.base))
            .bearer_auth(k)
            .json(&body)
            .send()
    };
    let reg: Value = call(
        "admin-key",
        "/v1/trigger-subscriptions".into(),
        json!({"source": "webhook", "workflowId": "wf"}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let id = reg["subscription"]["subscriptionId"].as_str().unwrap();
    let path = format!("/v1/trigger-subscriptions/{id}/rotate-secret");
    let r = call("manage-key", path.clone(), json!({})).await.unwrap();
    assert_eq!(r.status().as_u16(), 403);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"], "forbidden");
    assert!(
        v["message"].as_str().unwrap().contains("runs:create"),
        "{v}"
    );
    assert!(v.get("signingSecret").is_none());
    let r = call("admin-key", path, json!({})).await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_replay_of_a_one_time_secret_is_stored_sealed() {
    let s = start(None, fast_retry(2), 0).await;
    let send = |path: String, key: &'static str, body: Value| {
        s.http
            .post(format!("{}{path}", s.base))
            .header("idempotency-key", key)
            .json(&body)
            .send()
    };
    let mut answers = Vec::new();
    for _ in 0..2 {
        let r = send(
            "/v1/trigger-subscriptions".into(),
            "idem-register-1",
            json!({"source": "webhook", "workflowId": "wf"}),
        )
        .await
        .unwrap();
        // The first answer says `false`, a replay `true`.
        let replay = r
            .headers()
            .get("openwop-idempotent-replay")
            .is_some_and(|v| v == "true");
        answers.push((replay, r.json::<Value>().await.unwrap()));
    }
    assert!(
        !answers[0].0 && answers[1].0,
        "the second answer is a replay"
    );
    assert_eq!(answers[0].1, answers[1].1, "replayed unchanged");
    let id = answers[0].1["subscription"]["subscriptionId"]
        .as_str()
        .unwrap()
        .to_string();
    let registered = answers[0].1["binding"]["signingSecret"]
        .as_str()
        .unwrap()
        .to_string();
    let mut rotated = Vec::new();
    for _ in 0..2 {
        let v: Value = send(
            format!("/v1/trigger-subscriptions/{id}/rotate-secret"),
            "idem-rotate-1",
            json!({"overlapSeconds": 60}),
        )
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
        rotated.push(v["signingSecret"].as_str().unwrap().to_string());
    }
    assert_eq!(rotated[0], rotated[1], "one rotation, replayed");
    // What the store keeps for the replays holds neither secret in clear.
    let db = rusqlite::Connection::open(s._dir.path().join("trigger-bridge.db")).unwrap();
    let mut stmt = db.prepare("SELECT body FROM idempotency_keys").unwrap();
    let bodies: Vec<Vec<u8>> = stmt
        .query_map([], |r| r.get::<_, Option<Vec<u8>>>(0))
        .unwrap()
        .filter_map(|b| b.unwrap())
        .collect();
    assert_eq!(bodies.len(), 2, "both replies stored");
    for b in &bodies {
        assert!(b.starts_with(b"tb-sealed-reply-v1:"));
        for secret in [&registered, &rotated[0]] {
            let text = String::from_utf8_lossy(b);
            assert!(!text.contains(&secret[6..]), "a secret stored in clear");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_previous_secret_of_an_ended_overlap_is_removed_from_the_store() {
    let s = start(None, fast_retry(2), 0).await;
    let (id, _, _, _) = register(&s).await;
    let id = id.as_str();
    let (st, r) = rotate(&s, id, r#"{"overlapSeconds": 60}"#).await;
    assert_eq!(st, 200, "{r}");
    let until = chrono::DateTime::parse_from_rfc3339(r["previousSecretUntil"].as_str().unwrap())
        .unwrap()
        .timestamp_millis();
    let prev = tb_engine::registration::previous_secret_id(id);
    let stored = |s: &Server| {
        let (store, prev) = (s.engine.store.clone(), prev.clone());
        async move { store.sealed_secret(&prev).await.unwrap() }
    };
    assert!(stored(&s).await.is_some());
    // While the overlap lasts nothing is removed, even when asked directly.
    let drop = tb_engine::registration::drop_ended_previous_secrets;
    assert_eq!(drop(&s.engine, until - 1).await, 0);
    assert!(!s
        .engine
        .store
        .drop_ended_previous_secret(id, &prev, until - 1)
        .await
        .unwrap());
    assert!(stored(&s).await.is_some());
    // Once it has ended the sweep removes it, once.
    assert_eq!(drop(&s.engine, until).await, 1);
    assert!(stored(&s).await.is_none());
    assert_eq!(drop(&s.engine, until + 1).await, 0);
}
