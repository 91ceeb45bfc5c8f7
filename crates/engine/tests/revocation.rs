//! A revoked binding stops routing at once: the next request matches nothing, and a delivery
//! already queued for it is refused when the worker reaches it (`binding_revoked`, receipt
//! `disabled`). Restoring it routes again. Drives the engine directly so the worker step is explicit.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;
use tb_core::binding::{Binding, BindingAction};
use tb_core::connector::ConnectorSpec;
use tb_core::receipt::ReceiptState;
use tb_core::workflow::{Executor, Workflow};
use tb_store::sqlite::SqliteStore;
use tb_store::Store;
use trigger_bridge_engine::ingest::{ingest, IngestAnswer};
use trigger_bridge_engine::{Catalog, Engine, SubscriptionConfig};

const SECRET: &str = "revocation-secret";

fn headers(delivery: &str, body: &[u8]) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("content-type", "application/json".parse().unwrap());
    h.insert("x-github-event", "push".parse().unwrap());
    h.insert("x-github-delivery", delivery.parse().unwrap());
    h.insert(
        "x-hub-signature-256",
        tb_ingress::github::sign(SECRET.as_bytes(), body)
            .parse()
            .unwrap(),
    );
    h
}

async fn post(engine: &Engine, delivery: &str) -> IngestAnswer {
    let body = br#"{"ref":"refs/heads/main","repository":{"full_name":"o/r","id":1}}"#;
    ingest(
        engine,
        "github",
        &headers(delivery, body),
        Bytes::from_static(body),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn a_revoked_binding_routes_nothing_and_its_queued_delivery_is_disabled() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    let sub = SubscriptionConfig::webhook("github", ConnectorSpec::Github, SECRET.as_bytes());
    let binding = Binding {
        rate_limit_per_min: 0,
        id: "on-push".into(),
        subscription: "github".into(),
        event_types: vec!["push".into()],
        filter: Default::default(),
        action: BindingAction::start_run("noop"),
        inputs: Default::default(),
    };
    let wf = Workflow {
        id: "noop".into(),
        executor: Executor::Noop,
    };
    let engine = Engine::start(
        store.clone(),
        Catalog::new(vec![sub], vec![binding], vec![wf]),
    )
    .await
    .unwrap();

    // Queued before the revocation, performed after it.
    let IngestAnswer::Accepted { receipt_id, .. } = post(&engine, "d-1").await else {
        panic!("expected accepted")
    };
    assert!(engine
        .set_binding_revoked("on-push", true, Some("ops".into()))
        .await
        .unwrap());
    assert!(
        !engine
            .set_binding_revoked("on-push", true, None)
            .await
            .unwrap(),
        "revoking twice changes nothing"
    );
    let leases = store
        .lease_due("w", i64::MAX / 2, 60_000, 10)
        .await
        .unwrap();
    assert_eq!(leases.len(), 1);
    trigger_bridge_engine::worker::attempt(&engine, leases.into_iter().next().unwrap()).await;
    let d = &store.deliveries_of_receipt(&receipt_id).await.unwrap()[0];
    assert_eq!(d.dead_letter_reason.as_deref(), Some("binding_revoked"));
    assert_eq!(d.attempts, 1, "refused at once, not retried");
    assert_eq!(
        store.get_receipt(&receipt_id).await.unwrap().state,
        ReceiptState::Disabled
    );
    assert!(store
        .list_runs(Default::default())
        .await
        .unwrap()
        .is_empty());

    // The next request matches nothing.
    assert!(matches!(
        post(&engine, "d-2").await,
        IngestAnswer::Unmatched { .. }
    ));

    // The revocation is durable: a restarted engine still has it.
    let again = Engine::start(
        store.clone(),
        engine.catalog().with_revoked(Default::default()),
    )
    .await
    .unwrap();
    assert!(matches!(
        post(&again, "d-3").await,
        IngestAnswer::Unmatched { .. }
    ));

    // Restored: routes again.
    assert!(engine
        .set_binding_revoked("on-push", false, None)
        .await
        .unwrap());
    assert!(matches!(
        post(&engine, "d-4").await,
        IngestAnswer::Accepted { .. }
    ));
    assert!(engine
        .set_binding_revoked("nope", true, None)
        .await
        .is_err_and(|e| e.code == tb_core::ErrorCode::NotFound));
}
