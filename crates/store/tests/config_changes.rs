//! The configuration change log (DESIGN §9): each change another replica must see appends
//! one row in its own transaction, a no-op appends none, and ids become visible in increasing order
//! with no gap even when several store handles append at once (a poller that read id N never sees
//! N-1 appear later). Runs against SQLite and, when reachable, PostgreSQL.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tb_core::subscription::{Source, SubscriptionInput};
use trigger_bridge_store::postgres::testing::TestDatabase;
use trigger_bridge_store::postgres::{PgStore, PoolOptions};
use trigger_bridge_store::sqlite::SqliteStore;
use trigger_bridge_store::{ChangeKind, Store, SubscriptionDef, WebhookRecord};

type Guard = Box<dyn std::any::Any + Send>;

async fn backends() -> Vec<(&'static str, Arc<dyn Store>, Guard)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = SqliteStore::open_dir(dir.path()).expect("open sqlite");
    let mut out: Vec<(&'static str, Arc<dyn Store>, Guard)> =
        vec![("sqlite", Arc::new(s), Box::new(dir))];
    if let Some(db) = TestDatabase::create() {
        let pg = PgStore::connect(db.url(), PoolOptions::default())
            .await
            .expect("open postgres");
        out.push(("postgres", Arc::new(pg), Box::new(db)));
    }
    out
}

fn def(id: &str) -> SubscriptionDef {
    SubscriptionDef {
        id: id.into(),
        source: Source::Webhook,
        connector: "github".into(),
        config: json!({}),
        failure_threshold: 5,
    }
}

fn kinds(changes: &[trigger_bridge_store::ConfigChange]) -> Vec<(Option<ChangeKind>, &str)> {
    changes
        .iter()
        .map(|c| (c.kind, c.record_id.as_str()))
        .collect()
}

#[tokio::test]
async fn every_change_appends_one_row_and_a_no_op_none() {
    for (name, s, _g) in backends().await {
        assert_eq!(s.config_change_head().await.unwrap(), 0, "{name}");
        s.upsert_subscription(def("gh"), 1_000).await.unwrap();
        // Seeding from the config file is not a change another replica needs (each has the file).
        assert!(s.changes_since(0, 100).await.unwrap().is_empty(), "{name}");

        let pause = SubscriptionInput::OperatorPause;
        assert!(s
            .apply_subscription_input("gh", pause, 2_000)
            .await
            .unwrap()
            .is_some());
        assert!(s
            .apply_subscription_input("gh", pause, 2_001)
            .await
            .unwrap()
            .is_none());
        assert!(s.revoke_binding("b1", None, 3_000).await.unwrap());
        assert!(!s.revoke_binding("b1", None, 3_001).await.unwrap());
        assert!(s.restore_binding("b1").await.unwrap());
        assert!(!s.restore_binding("b1").await.unwrap());
        s.register_subscription(def("sub_r"), vec![("sub_r".into(), vec![1, 2, 3])], 4_000)
            .await
            .unwrap();
        let w = WebhookRecord {
            id: "wh_1".into(),
            url: "http://127.0.0.1:9/".into(),
            events: vec!["*".into()],
            tenant_id: "t".into(),
            secret_file: "store:webhook:wh_1".into(),
            standard_secret_file: None,
            created_at: 5_000,
        };
        s.create_webhook_sealed(w, def("wh_1"), vec![("webhook:wh_1".into(), vec![9; 40])])
            .await
            .unwrap();
        s.delete_webhook("wh_1", "t").await.unwrap();

        let all = s.changes_since(0, 100).await.unwrap();
        assert_eq!(
            kinds(&all),
            vec![
                (Some(ChangeKind::Subscription), "gh"),
                (Some(ChangeKind::Binding), "b1"),
                (Some(ChangeKind::Binding), "b1"),
                (Some(ChangeKind::Registration), "sub_r"),
                (Some(ChangeKind::Webhook), "wh_1"),
                (Some(ChangeKind::Webhook), "wh_1"),
            ],
            "{name}"
        );
        assert_eq!(
            all.iter().map(|c| c.id).collect::<Vec<_>>(),
            vec![1, 2, 3, 4, 5, 6],
            "{name}"
        );
        assert_eq!(
            (all[0].at, all[1].at, all[3].at),
            (2_000, 3_000, 4_000),
            "{name}"
        );
        assert_eq!(s.config_change_head().await.unwrap(), 6, "{name}");
        assert_eq!(
            kinds(&s.changes_since(4, 1).await.unwrap()),
            vec![(Some(ChangeKind::Webhook), "wh_1")]
        );
        assert!(s.changes_since(6, 100).await.unwrap().is_empty(), "{name}");
        // The sealed secrets are kept as given.
        assert_eq!(
            s.sealed_secret("sub_r").await.unwrap(),
            Some(vec![1, 2, 3]),
            "{name}"
        );
        assert_eq!(
            s.sealed_secret("webhook:wh_1").await.unwrap(),
            Some(vec![9; 40]),
            "{name}"
        );
        assert_eq!(s.sealed_secret("nope").await.unwrap(), None, "{name}");
        // A failed change appends nothing: deleting an unknown webhook rolls back whole.
        assert!(s.delete_webhook("wh_none", "t").await.is_err());
        assert_eq!(s.config_change_head().await.unwrap(), 6, "{name}");
    }
}

/// Four writers on two PostgreSQL handles append 200 changes at once while a poller on a third
/// handle reads on from its cursor: every page it reads continues exactly where the last one ended
/// (no id is skipped and later filled in), and it ends with all 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_become_visible_in_id_order_without_gaps() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let open = || async {
        let s: Arc<dyn Store> = Arc::new(
            PgStore::connect(db.url(), PoolOptions::default())
                .await
                .unwrap(),
        );
        s
    };
    let (w1, w2, reader) = (open().await, open().await, open().await);
    let mut writers = Vec::new();
    for t in 0..4 {
        let s = if t % 2 == 0 { w1.clone() } else { w2.clone() };
        writers.push(tokio::spawn(async move {
            for i in 0..50 {
                assert!(s
                    .revoke_binding(&format!("b{t}_{i}"), None, 1)
                    .await
                    .unwrap());
            }
        }));
    }
    let poller = tokio::spawn(async move {
        let (mut cursor, mut seen, mut pages) = (0i64, BTreeSet::new(), 0);
        let deadline = Instant::now() + Duration::from_secs(30);
        while cursor < 200 && Instant::now() < deadline {
            let page = reader.changes_since(cursor, 17).await.unwrap();
            for c in &page {
                assert_eq!(
                    c.id,
                    cursor + 1,
                    "a change became visible after a later one"
                );
                cursor = c.id;
                assert!(seen.insert(c.record_id.clone()));
            }
            pages += 1;
            tokio::task::yield_now().await;
        }
        (cursor, seen.len(), pages)
    });
    for w in writers {
        w.await.unwrap();
    }
    let (cursor, distinct, pages) = poller.await.unwrap();
    println!("poller read 200 changes in {pages} pages");
    assert_eq!((cursor, distinct), (200, 200));
}

/// PostgreSQL `LISTEN` hints: another handle's configuration change wakes this handle's hint counter
/// within 1 s; a write that is not a configuration change, and a change in another schema, do not.
/// SQLite has no hints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_hints_follow_configuration_changes_only() {
    let dir = tempfile::tempdir().unwrap();
    assert!(SqliteStore::open_dir(dir.path())
        .unwrap()
        .config_change_hints()
        .is_none());
    let (Some(db), Some(other)) = (TestDatabase::create(), TestDatabase::create()) else {
        return;
    };
    let opts = || PoolOptions {
        connections: 2,
        ..Default::default()
    };
    let a = PgStore::connect(db.url(), opts()).await.unwrap();
    let b = PgStore::connect(db.url(), opts()).await.unwrap();
    let elsewhere = PgStore::connect(other.url(), opts()).await.unwrap();
    let mut hints = b.config_change_hints().expect("PostgreSQL has hints");
    // The listener bumps once when it is listening.
    tokio::time::timeout(Duration::from_secs(5), hints.changed())
        .await
        .expect("listener connected")
        .unwrap();
    hints.borrow_and_update();

    a.upsert_subscription(def("gh"), 1_000).await.unwrap();
    elsewhere.revoke_binding("b1", None, 1).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), hints.changed())
            .await
            .is_err(),
        "no hint for a non-configuration write or another schema's change"
    );

    let t0 = Instant::now();
    a.revoke_binding("b1", None, 2).await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), hints.changed())
        .await
        .expect("hint within 1 s")
        .unwrap();
    println!("hint arrived {:?} after the commit returned", t0.elapsed());
    assert_eq!(b.changes_since(0, 10).await.unwrap().len(), 1);
}

/// Receipt `rcpt_wake{n}` of subscription `gh` holding dedup key `key` (its window never ends), with
/// one pending `start_run` delivery.
fn pending_receipt(n: u32, key: &str) -> trigger_bridge_store::NewReceipt {
    use tb_core::delivery::DeliveryState;
    let id = format!("rcpt_wake{n}");
    trigger_bridge_store::NewReceipt {
        source: tb_core::receipt::ReceiptSource::Webhook,
        id: id.clone(),
        subscription_id: "gh".into(),
        dedup_key: key.into(),
        provider_event_id: id.clone(),
        event_type: "push".into(),
        normalized: json!({"event": "push"}),
        state: tb_core::receipt::ReceiptState::Routed,
        content_type: None,
        body: bytes::Bytes::from_static(b"{}"),
        received_at: 1_000,
        dedup_until: i64::MAX,
        deliveries: vec![trigger_bridge_store::NewDelivery {
            id: format!("dlv_wake{n}"),
            kind: tb_core::delivery::DeliveryKind::Binding,
            binding_id: "b1".into(),
            action: "start_run".into(),
            workflow_id: Some("noop".into()),
            run_id: Some(format!("run_wake{n}")),
            inputs: json!({}),
            params: None,
            state: DeliveryState::Pending,
            dead_letter_reason: None,
        }],
        capability: None,
        lease: None,
        trace_context: None,
    }
}

/// Cross-replica wake-ups on PostgreSQL: a commit of due work through handle A bumps B's `Work`
/// counter within 1 s (debounced NOTIFY from A's notifier), never A's own, and not B's `Sessions`
/// counter; a duplicate commit (nothing new is due) sends nothing. SQLite has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_wake_hints_reach_the_other_handles_only() {
    use trigger_bridge_store::Wake;
    let dir = tempfile::tempdir().unwrap();
    let lite = SqliteStore::open_dir(dir.path()).unwrap();
    assert!(lite.wake_hints(Wake::Work).is_none());
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let opts = || PoolOptions {
        connections: 2,
        ..Default::default()
    };
    let a = PgStore::connect(db.url(), opts()).await.unwrap();
    let b = PgStore::connect(db.url(), opts()).await.unwrap();
    a.upsert_subscription(def("gh"), 1_000).await.unwrap();
    let mut a_work = a.wake_hints(Wake::Work).unwrap();
    let mut b_work = b.wake_hints(Wake::Work).unwrap();
    let mut b_sessions = b.wake_hints(Wake::Sessions).unwrap();
    for h in [&mut a_work, &mut b_work, &mut b_sessions] {
        // Each listener bumps once when it is listening.
        tokio::time::timeout(Duration::from_secs(5), h.changed())
            .await
            .expect("listener connected")
            .unwrap();
        h.borrow_and_update();
    }
    let t0 = Instant::now();
    a.commit_receipt(pending_receipt(1, "k")).await.unwrap();
    tokio::time::timeout(Duration::from_secs(1), b_work.changed())
        .await
        .expect("B woken within 1 s")
        .unwrap();
    println!("work wake-up reached B {:?} after the commit", t0.elapsed());
    b_work.borrow_and_update();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), a_work.changed())
            .await
            .is_err(),
        "A's own wake-up is not echoed to A"
    );
    assert!(
        !b_sessions.has_changed().unwrap(),
        "no session wake-up for a receipt"
    );
    // The same dedup key again: a duplicate, nothing became due.
    let dup = a.commit_receipt(pending_receipt(1, "k")).await.unwrap();
    assert!(
        matches!(dup, trigger_bridge_store::IngestOutcome::Duplicate { .. }),
        "{dup:?}"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), b_work.changed())
            .await
            .is_err(),
        "a duplicate wakes nobody"
    );
}
