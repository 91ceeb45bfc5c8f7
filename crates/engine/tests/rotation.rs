//! Signing-secret rotation with an overlap window, for GitHub, Standard Webhooks and the
//! generic HMAC connector: while the window lasts a request signed with the previous secret is
//! accepted beside the current one; after it, only the current one; a third secret never.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;
use tb_core::connector::{ConnectorSpec, SignatureEncoding};
use tb_core::ErrorCode;
use tb_store::sqlite::SqliteStore;
use trigger_bridge_engine::catalog::PreviousSecret;
use trigger_bridge_engine::ingest::{ingest, IngestAnswer};
use trigger_bridge_engine::{clock, Catalog, Engine, SubscriptionConfig};

const BODY: &[u8] = br#"{"ref":"refs/heads/main","repository":{"full_name":"o/r","id":1}}"#;

fn hmac_spec() -> ConnectorSpec {
    ConnectorSpec::Hmac {
        signature_header: "x-signature".into(),
        signature_prefix: Some("sha256=".into()),
        encoding: SignatureEncoding::Hex,
        timestamp_header: None,
        tolerance_s: 300,
        id_header: Some("x-id".into()),
        event_header: None,
    }
}

/// The headers of a request to `sub` (`github` and `ended`: GitHub; `sw`; `hmac`) signed with `key`.
fn signed(sub: &str, key: &[u8], id: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("content-type", "application/json".parse().unwrap());
    match sub {
        "github" | "ended" => {
            h.insert("x-github-event", "push".parse().unwrap());
            h.insert("x-github-delivery", id.parse().unwrap());
            let sig = tb_ingress::github::sign(key, BODY);
            h.insert("x-hub-signature-256", sig.parse().unwrap());
        }
        "sw" => {
            let ts = clock::now_s();
            h.insert("webhook-id", id.parse().unwrap());
            h.insert("webhook-timestamp", ts.to_string().parse().unwrap());
            let sig = tb_ingress::standard_webhooks::sign(key, id, ts, BODY);
            h.insert("webhook-signature", sig.parse().unwrap());
        }
        _ => {
            h.insert("x-id", id.parse().unwrap());
            let sig = tb_ingress::hmac_generic::sign(&hmac_spec(), key, None, BODY);
            h.insert("x-signature", sig.parse().unwrap());
        }
    }
    h
}

async fn post(engine: &Engine, sub: &str, key: &[u8], id: &str) -> Result<IngestAnswer, ErrorCode> {
    ingest(engine, sub, &signed(sub, key, id), Bytes::from_static(BODY))
        .await
        .map_err(|e| e.code)
}

#[tokio::test]
async fn the_previous_secret_is_accepted_until_the_overlap_ends() {
    let old: &[u8] = b"old-secret-old-secret-old-secret";
    let new: &[u8] = b"new-secret-new-secret-new-secret";
    let other: &[u8] = b"not-ours-not-ours-not-ours-not-o";
    let until = clock::now_ms() + 3_600_000;
    let sub = |id: &str, spec: ConnectorSpec, until_ms: i64| SubscriptionConfig {
        previous_secret: Some(PreviousSecret {
            secret: old.to_vec(),
            until_ms,
        }),
        ..SubscriptionConfig::webhook(id, spec, new)
    };
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    let engine = Engine::start(
        store,
        Catalog::new(
            vec![
                sub("github", ConnectorSpec::Github, until),
                sub(
                    "sw",
                    ConnectorSpec::StandardWebhooks { tolerance_s: 300 },
                    until,
                ),
                sub("hmac", hmac_spec(), until),
                // A rotation whose window has ended.
                sub("ended", ConnectorSpec::Github, clock::now_ms() - 1),
            ],
            vec![],
            vec![],
        ),
    )
    .await
    .unwrap();
    for s in ["github", "sw", "hmac"] {
        let ok = |r: &Result<IngestAnswer, ErrorCode>| {
            matches!(
                r,
                Ok(IngestAnswer::Unmatched { .. } | IngestAnswer::Accepted { .. })
            )
        };
        let r = post(&engine, s, new, &format!("msg_{s}_new_000000001")).await;
        assert!(ok(&r), "{s}: the current secret: {r:?}");
        let r = post(&engine, s, old, &format!("msg_{s}_old_000000001")).await;
        assert!(ok(&r), "{s}: the previous secret within the window: {r:?}");
        let r = post(&engine, s, other, &format!("msg_{s}_oth_000000001")).await;
        assert_eq!(
            r.unwrap_err(),
            ErrorCode::SignatureInvalid,
            "{s}: a third secret"
        );
    }
    let r = post(&engine, "ended", old, "ended-old").await;
    assert_eq!(
        r.unwrap_err(),
        ErrorCode::SignatureInvalid,
        "after the window only the current secret is accepted"
    );
    let r = post(&engine, "ended", new, "ended-new").await;
    assert!(r.is_ok(), "{r:?}");
}
