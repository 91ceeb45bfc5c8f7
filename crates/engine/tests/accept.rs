//! Every edge goes through the one entry (`trigger_bridge_engine::accept`): a webhook to a registered
//! subscription, its refused (forged) post, an API run and a capability URL each leave a receipt whose
//! typed `source` and deliveries' `kind` are read back from the store, and the worker dispatches the
//! API run by its kind.

use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;
use tb_core::delivery::{DeliveryKind, DeliveryState};
use tb_core::receipt::{ReceiptSource, ReceiptState};
use tb_core::run::RunStatus;
use tb_core::workflow::{Executor, Workflow};
use tb_core::ErrorCode;
use tb_store::sqlite::SqliteStore;
use tb_store::{ListQuery, ReceiptRecord, Store};
use trigger_bridge_engine::capability::{self, MintRequest};
use trigger_bridge_engine::catalog::Verification;
use trigger_bridge_engine::ingest::{ingest, IngestAnswer};
use trigger_bridge_engine::registration::{register, RegistrationRequest, SecretStore};
use trigger_bridge_engine::{Catalog, Engine, API_SOURCE};

const BODY: &[u8] = br#"{"type":"order.created","data":{"id":1}}"#;

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

async fn receipt_of(store: &dyn Store, id: &str) -> ReceiptRecord {
    store.get_receipt(id).await.unwrap()
}

#[tokio::test]
async fn the_four_edges_write_typed_sources_and_delivery_kinds() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    let secrets = SecretStore::open(&dir.path().join("secrets")).unwrap();
    let workflows = vec![
        Workflow {
            id: "noop".into(),
            executor: Executor::Noop,
        },
        Workflow {
            id: "s".into(),
            executor: Executor::Session {
                config: serde_json::json!({}),
                mailbox: Default::default(),
            },
        },
    ];
    let engine = Engine::start(store.clone(), Catalog::new(vec![], vec![], workflows))
        .await
        .unwrap();

    // 1. Webhook front end: a signed post to a registered subscription.
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
    let key = tb_ingress::parse_whsec(&reg.signing_secret).unwrap();
    let IngestAnswer::Accepted {
        receipt_id: webhook_receipt,
        deliveries,
        ..
    } = ingest(
        &engine,
        &reg.subscription_id,
        &signed(&key, "msg_accept_000001", BODY),
        Bytes::from_static(BODY),
    )
    .await
    .unwrap()
    else {
        panic!("not accepted")
    };
    let r = receipt_of(&*store, &webhook_receipt).await;
    assert_eq!(
        (r.source, r.state, r.subscription_id.as_str()),
        (
            ReceiptSource::Webhook,
            ReceiptState::Routed,
            reg.subscription_id.as_str()
        )
    );
    let d = store
        .get_delivery(&deliveries[0].delivery_id)
        .await
        .unwrap();
    assert_eq!(
        (d.kind, d.action.as_str()),
        (DeliveryKind::Binding, "start_run")
    );
    // The same id again is a duplicate of the first receipt (the probe in accept), with nothing written.
    let dup = ingest(
        &engine,
        &reg.subscription_id,
        &signed(&key, "msg_accept_000001", BODY),
        Bytes::from_static(BODY),
    )
    .await
    .unwrap();
    assert!(
        matches!(&dup, IngestAnswer::Duplicate { receipt_id, .. } if *receipt_id == webhook_receipt),
        "{dup:?}"
    );

    // 2. The refusal record: a forged post is 401 and kept as a content-free `rejected` receipt whose
    //    delivery is dead-lettered `verification_failed`.
    let forged = ingest(
        &engine,
        &reg.subscription_id,
        &signed(
            b"not-the-key-not-the-key-not-the!",
            "msg_forged_000001",
            BODY,
        ),
        Bytes::from_static(BODY),
    )
    .await
    .unwrap_err();
    assert_eq!(forged.code, ErrorCode::SignatureInvalid);
    let rejected: Vec<ReceiptRecord> = store
        .list_receipts(ListQuery {
            limit: 100,
            state: Some("rejected".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    let r = &rejected[0];
    assert_eq!(
        (r.source, r.body_bytes, r.provider_event_id.as_str()),
        (ReceiptSource::Webhook, 0, "unverified")
    );
    let ds = store.deliveries_of_receipt(&r.id).await.unwrap();
    assert_eq!(ds.len(), 1);
    assert_eq!(
        (ds[0].kind, ds[0].state, ds[0].dead_letter_reason.as_deref()),
        (
            DeliveryKind::Binding,
            DeliveryState::DeadLettered,
            Some("verification_failed")
        )
    );

    // 2b. A flood of forged posts is a bounded number of writes: only the first
    //     RECORDS_PER_MINUTE refusals of the minute are kept one by one (the one above included),
    //     the rest only counted, and one flush adds them all as one row.
    let minute = tb_core::rate::minute_of(trigger_bridge_engine::clock::now_ms());
    let floods = (0..199).map(|i| {
        let engine = engine.clone();
        let id = reg.subscription_id.clone();
        async move {
            let h = signed(
                b"not-the-key-not-the-key-not-the!",
                &format!("msg_forged_{i:06}"),
                BODY,
            );
            ingest(&engine, &id, &h, Bytes::from_static(BODY)).await
        }
    });
    for r in futures_util::future::join_all(floods).await {
        assert_eq!(r.unwrap_err().code, ErrorCode::SignatureInvalid);
    }
    let rejected = store
        .list_receipts(ListQuery {
            limit: 500,
            state: Some("rejected".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let same_minute = tb_core::rate::minute_of(trigger_bridge_engine::clock::now_ms()) == minute;
    let kept = tb_core::rate::RECORDS_PER_MINUTE as usize;
    if same_minute {
        assert_eq!(rejected.len(), kept, "200 forged posts, {kept} records");
    } else {
        assert!(rejected.len() <= 2 * kept, "{} records", rejected.len());
    }
    engine.flush_ingress_counts().await;
    let counted: u64 = store
        .ingress_counts(tb_store::IngressCountQuery {
            since_minute: minute,
            scope: Some("subscription".into()),
            key: Some(reg.subscription_id.clone()),
            limit: 100,
        })
        .await
        .unwrap()
        .iter()
        .filter(|c| c.outcome == "signature_invalid")
        .map(|c| c.n)
        .sum();
    assert_eq!(counted, 200, "every forged post counted");

    // 3. API run: an `api` receipt with one `api_run` delivery; the worker starts it by its kind.
    let run_id = trigger_bridge_engine::runs::start(&engine, "s", serde_json::json!({"n": 1}))
        .await
        .unwrap();
    let d = store
        .get_delivery(&tb_core::ids::delivery_id_for_run(&run_id).unwrap())
        .await
        .unwrap();
    assert_eq!(
        (d.kind, d.subscription_id.as_str()),
        (DeliveryKind::ApiRun, API_SOURCE)
    );
    let r = receipt_of(&*store, &d.receipt_id).await;
    assert_eq!(
        (r.source, r.state, r.event_type.as_str()),
        (ReceiptSource::Api, ReceiptState::Routed, "run.requested")
    );
    assert_eq!(
        r.provider_event_id, r.id,
        "an API run's provider id is its receipt's"
    );
    for lease in store
        .lease_due("w", i64::MAX / 2, 60_000, 10)
        .await
        .unwrap()
    {
        trigger_bridge_engine::worker::attempt(&engine, lease).await;
    }
    assert_eq!(
        store.get_run(&run_id).await.unwrap().status,
        RunStatus::Running
    );

    // 4. Capability URL: a `capability` receipt with one `capability_signal` delivery on that run.
    let minted = capability::mint(
        &engine,
        None,
        MintRequest {
            run_id: run_id.clone(),
            signal: "ci.done".into(),
            ..Default::default()
        },
        None,
    )
    .await
    .unwrap();
    let c = capability::find(&engine, &minted.token).await.unwrap();
    let mut h = HeaderMap::new();
    h.insert("content-type", "application/json".parse().unwrap());
    h.insert("idempotency-key", "k-1".parse().unwrap());
    let IngestAnswer::Accepted {
        receipt_id: cap_receipt,
        deliveries,
        run_id: cap_run,
    } = capability::ingest(&engine, None, &c, &h, Bytes::from_static(b"{\"ok\":true}"))
        .await
        .unwrap()
    else {
        panic!("not accepted")
    };
    assert_eq!(cap_run.as_deref(), Some(run_id.as_str()));
    let r = receipt_of(&*store, &cap_receipt).await;
    assert_eq!(
        (
            r.source,
            r.subscription_id.as_str(),
            r.provider_event_id.as_str()
        ),
        (ReceiptSource::Capability, c.id.as_str(), "k-1")
    );
    let d = store
        .get_delivery(&deliveries[0].delivery_id)
        .await
        .unwrap();
    assert_eq!(
        (d.kind, d.action.as_str(), d.run_id.as_deref()),
        (
            DeliveryKind::CapabilitySignal,
            "raise_signal",
            Some(run_id.as_str())
        )
    );
    // The same key with another body is refused by accept's same-body rule; with the same body it is a
    // duplicate of the first receipt.
    let other = capability::ingest(&engine, None, &c, &h, Bytes::from_static(b"{\"ok\":false}"))
        .await
        .unwrap_err();
    assert_eq!(other.code, ErrorCode::Conflict);
    let same = capability::ingest(&engine, None, &c, &h, Bytes::from_static(b"{\"ok\":true}"))
        .await
        .unwrap();
    assert!(
        matches!(&same, IngestAnswer::Duplicate { receipt_id, .. } if *receipt_id == cap_receipt),
        "{same:?}"
    );

    // Four receipts in all (the duplicates wrote none), one per edge, and the kept refusal records
    // of the forged flood (webhook receipts too).
    let mut sources: Vec<&str> = store
        .list_receipts(ListQuery {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .iter()
        .map(|r| r.source.as_str())
        .collect();
    sources.sort();
    let mut want = vec!["api", "capability", "webhook", "webhook"];
    want.extend(std::iter::repeat_n("webhook", rejected.len() - 1));
    assert_eq!(sources, want);
}

/// On PostgreSQL the commit, not a probe before it, finds a taken dedup key (`Store::probe_before_commit`
/// is false there): a repeat, and eight copies of one new event raced at once, still leave one receipt
/// and are answered `duplicate` naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgresql_the_batched_commit_answers_repeats_without_a_probe() {
    let Some(db) = tb_store::postgres::testing::TestDatabase::create() else {
        return; // the reason is printed by `TestDatabase::create` (never skipped under CI)
    };
    let opts = tb_store::postgres::PoolOptions {
        connections: 8,
        queue_capacity: 1_000,
    };
    let store: Arc<dyn Store> = Arc::new(
        tb_store::postgres::PgStore::connect(db.url(), opts)
            .await
            .unwrap(),
    );
    assert!(!store.probe_before_commit(), "PostgreSQL skips the probe");
    let dir = tempfile::tempdir().unwrap();
    let secrets = SecretStore::open(&dir.path().join("secrets")).unwrap();
    let workflows = vec![Workflow {
        id: "noop".into(),
        executor: Executor::Noop,
    }];
    let engine = Engine::start(store.clone(), Catalog::new(vec![], vec![], workflows))
        .await
        .unwrap();
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
    let key = tb_ingress::parse_whsec(&reg.signing_secret).unwrap();
    let send = |id: &'static str| {
        let (engine, sub, h) = (
            engine.clone(),
            reg.subscription_id.clone(),
            signed(&key, id, BODY),
        );
        async move { ingest(&engine, &sub, &h, Bytes::from_static(BODY)).await }
    };
    let IngestAnswer::Accepted {
        receipt_id: first, ..
    } = send("msg_batch_000001").await.unwrap()
    else {
        panic!("not accepted")
    };
    let again = send("msg_batch_000001").await.unwrap();
    assert!(
        matches!(&again, IngestAnswer::Duplicate { receipt_id, .. } if *receipt_id == first),
        "{again:?}"
    );
    let raced: Vec<_> = (0..8)
        .map(|_| tokio::spawn(send("msg_batch_000002")))
        .collect();
    let mut accepted = Vec::new();
    let mut duplicates = Vec::new();
    for t in raced {
        match tokio::time::timeout(std::time::Duration::from_secs(30), t)
            .await
            .expect("an ingest took too long")
            .unwrap()
            .unwrap()
        {
            IngestAnswer::Accepted { receipt_id, .. } => accepted.push(receipt_id),
            IngestAnswer::Duplicate { receipt_id, .. } => duplicates.push(receipt_id),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(accepted.len(), 1, "one receipt per dedup key");
    assert_eq!(duplicates.len(), 7);
    assert!(
        duplicates.iter().all(|d| *d == accepted[0]),
        "{duplicates:?}"
    );
    let receipts = store
        .list_receipts(ListQuery {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    let mine = receipts
        .iter()
        .filter(|r| r.subscription_id == reg.subscription_id && r.source == ReceiptSource::Webhook)
        .count();
    assert_eq!(mine, 2, "two events, two receipts");
}
