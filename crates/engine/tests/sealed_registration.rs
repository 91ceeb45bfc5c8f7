//! Registration secrets at rest on a single host (SQLite): a registration's `whsec_` secret
//! is sealed in the store under the key file `secrets/secret.key` (mode 0600, made once), reloaded on
//! start with the same key, refused (logged, not served) under another key; a registration made
//! before secrets were sealed in the store, whose secret is a file, still loads from its file.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;
use serde_json::json;
use tb_core::subscription::Source;
use tb_store::sqlite::SqliteStore;
use tb_store::{Store, SubscriptionDef};
use trigger_bridge_engine::catalog::Verification;
use trigger_bridge_engine::ingest::{ingest, IngestAnswer};
use trigger_bridge_engine::registration::{
    load_registered, register, RegistrationRequest, SecretStore, SECRET_KEY_FILE,
};
use trigger_bridge_engine::sealing::SecretKey;
use trigger_bridge_engine::{Catalog, Engine};

fn catalog() -> Catalog {
    let wf = tb_core::workflow::Workflow {
        id: "noop".into(),
        executor: tb_core::workflow::Executor::Noop,
    };
    Catalog::new(vec![], vec![], vec![wf])
}

fn signed(key: &[u8], id: &str, body: &[u8]) -> HeaderMap {
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut h = HeaderMap::new();
    h.insert("content-type", "application/json".parse().unwrap());
    h.insert("webhook-id", id.parse().unwrap());
    h.insert("webhook-timestamp", ts.to_string().parse().unwrap());
    h.insert(
        "webhook-signature",
        tb_ingress::standard_webhooks::sign(key, id, ts, body)
            .parse()
            .unwrap(),
    );
    h
}

const BODY: &[u8] = br#"{"type":"order.created","data":{"id":1}}"#;

#[tokio::test]
async fn a_sealed_registration_reloads_with_its_key_and_not_with_another() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    let secrets_dir = dir.path().join("secrets");
    let secrets = SecretStore::open(&secrets_dir).unwrap();
    let key_file = secrets_dir.join(SECRET_KEY_FILE);
    let text = std::fs::read_to_string(&key_file).unwrap();
    assert_eq!(text.len(), 64, "32 bytes as hex");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&key_file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    let engine = Engine::start(store.clone(), catalog()).await.unwrap();
    let reg = register(
        &engine,
        &secrets,
        RegistrationRequest {
            workflow_id: "noop".into(),
            dedup_enabled: true,
            retry: None,
            verification: Verification::Required,
        },
    )
    .await
    .unwrap();
    // No secret file any more: the secret is sealed in the store.
    let files: Vec<String> = std::fs::read_dir(&secrets_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".whsec"))
        .collect();
    assert!(files.is_empty(), "{files:?}");
    let row = store.get_subscription(&reg.subscription_id).await.unwrap();
    assert_eq!(row.config["registration"], json!({"workflowId": "noop"}));

    // A restart: a new engine and secret store on the same data dir load it, and it verifies.
    let again = Engine::start(store.clone(), catalog()).await.unwrap();
    let reopened = SecretStore::open(&secrets_dir).unwrap();
    assert_eq!(load_registered(&again, &reopened).await.unwrap(), 1);
    let key = tb_ingress::parse_whsec(&reg.signing_secret).unwrap();
    let a = ingest(
        &again,
        &reg.subscription_id,
        &signed(&key, "msg_restart_000001", BODY),
        Bytes::from_static(BODY),
    )
    .await
    .unwrap();
    assert!(matches!(a, IngestAnswer::Accepted { .. }), "{a:?}");

    // Under another key it does not open: not loaded (logged), so not served.
    let other = Engine::start(store.clone(), catalog()).await.unwrap();
    let wrong = SecretStore::with_key(&secrets_dir, Some(SecretKey::generate())).unwrap();
    assert_eq!(load_registered(&other, &wrong).await.unwrap(), 0);
    assert!(other.catalog().subscription(&reg.subscription_id).is_none());
    // GET /ready lists it with the reason (Engine::unsealable), so an operator sees it before a sender does.
    let listed = other.unsealable();
    assert_eq!(listed.keys().collect::<Vec<_>>(), [&reg.subscription_id]);
    // Its webhooks get 503 naming the key (a sender retries; a 404 would read as "gone"), others 404.
    let refused = ingest(
        &other,
        &reg.subscription_id,
        &signed(&key, "msg_wrong_key_000001", BODY),
        Bytes::from_static(BODY),
    )
    .await
    .unwrap_err();
    assert_eq!(
        refused.code,
        tb_core::ErrorCode::Unavailable,
        "{}",
        refused.message
    );
    assert!(
        refused.message.contains("TRIGGER_BRIDGE_SECRET_KEY"),
        "{}",
        refused.message
    );
    let unknown = ingest(
        &other,
        "sub_unknown",
        &signed(&key, "msg_unknown_000001", BODY),
        Bytes::from_static(BODY),
    )
    .await
    .unwrap_err();
    assert_eq!(unknown.code, tb_core::ErrorCode::NotFound);
    let e = wrong
        .open_stored(store.as_ref(), &reg.subscription_id)
        .await
        .unwrap_err();
    assert!(e.message.contains("cannot be decrypted"), "{}", e.message);
}

#[tokio::test]
async fn a_registration_with_a_secret_file_still_loads_from_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    let secrets = SecretStore::open(&dir.path().join("secrets")).unwrap();
    let key = [5u8; 32];
    use base64::Engine as _;
    let whsec = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    );
    secrets.write("sub_old.whsec", whsec.as_bytes()).unwrap();
    store
        .upsert_subscription(
            SubscriptionDef {
                id: "sub_old".into(),
                source: Source::Webhook,
                connector: "standard-webhooks".into(),
                config: json!({"registration": {"workflowId": "noop", "secretFile": "sub_old.whsec"},
                    "dedupEnabled": true}),
                failure_threshold: 5,
            },
            1_000,
        )
        .await
        .unwrap();
    let engine = Engine::start(store, catalog()).await.unwrap();
    assert_eq!(load_registered(&engine, &secrets).await.unwrap(), 1);
    let a = ingest(
        &engine,
        "sub_old",
        &signed(&key, "msg_old_file_000001", BODY),
        Bytes::from_static(BODY),
    )
    .await
    .unwrap();
    assert!(matches!(a, IngestAnswer::Accepted { .. }), "{a:?}");
}
