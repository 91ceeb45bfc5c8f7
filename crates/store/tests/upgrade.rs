//! A store written before the typed `receipts.source` / `deliveries.kind` columns (SQLite version 10,
//! PostgreSQL version 4) upgrades in place: the migration backfills each row from the old encoding
//! (pseudo-subscription `api`, `sgep_` capability endpoint ids, action `webhook` for outbound
//! webhooks), and the store reads the typed values back.

use std::sync::Arc;

use tb_core::delivery::DeliveryKind;
use tb_core::receipt::ReceiptSource;
use trigger_bridge_store::postgres::testing::TestDatabase;
use trigger_bridge_store::postgres::{self as pg, PgStore, PoolOptions};
use trigger_bridge_store::sqlite::SqliteStore;
use trigger_bridge_store::Store;

/// Rows as the previous release wrote them, in SQL both backends take.
const OLD_ROWS: &str = "
INSERT INTO receipts (id, subscription_id, dedup_key, provider_event_id, event_type, normalized, state,
    body_bytes, received_at, updated_at, dedup_until) VALUES
  ('rcpt_web', 'gh', 'k1', 'p1', 'push', '{}', 'routed', 0, 1, 1, 1),
  ('rcpt_api', 'api', 'k2', 'rcpt_api', 'run.requested', '{}', 'routed', 0, 1, 1, 1),
  ('rcpt_cap', 'sgep_0001', 'k3', 'none', 'capability', '{}', 'routed', 0, 1, 1, 1);
INSERT INTO deliveries (id, receipt_id, subscription_id, binding_id, dedup_key, action, inputs, state,
    created_at, updated_at, due_at) VALUES
  ('dlv_web', 'rcpt_web', 'gh', 'on-push', 'k1', 'start_run', '{}', 'pending', 1, 1, 1),
  ('dlv_api', 'rcpt_api', 'api', 'api', 'k2', 'start_run', '{}', 'pending', 1, 1, 1),
  ('dlv_cap', 'rcpt_cap', 'sgep_0001', 'sgep_0001', 'k3', 'raise_signal', '{}', 'pending', 1, 1, 1),
  ('dlv_hook', 'evt_0001', 'whk_0001', 'whk_0001', 'evt_0001', 'webhook', '{}', 'pending', 1, 1, 1);
";

async fn assert_backfilled(store: &dyn Store) {
    for (id, source) in [
        ("rcpt_web", ReceiptSource::Webhook),
        ("rcpt_api", ReceiptSource::Api),
        ("rcpt_cap", ReceiptSource::Capability),
    ] {
        assert_eq!(store.get_receipt(id).await.unwrap().source, source, "{id}");
    }
    for (id, kind) in [
        ("dlv_web", DeliveryKind::Binding),
        ("dlv_api", DeliveryKind::ApiRun),
        ("dlv_cap", DeliveryKind::CapabilitySignal),
        ("dlv_hook", DeliveryKind::OutboundWebhook),
    ] {
        assert_eq!(store.get_delivery(id).await.unwrap().kind, kind, "{id}");
    }
    // Leases carry the kind too (the worker dispatches on it).
    let mut leased: Vec<(String, DeliveryKind)> = store
        .lease_due("w", i64::MAX / 2, 60_000, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|l| (l.delivery.id, l.delivery.kind))
        .collect();
    leased.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        leased,
        [
            ("dlv_api".to_string(), DeliveryKind::ApiRun),
            ("dlv_cap".to_string(), DeliveryKind::CapabilitySignal),
            ("dlv_hook".to_string(), DeliveryKind::OutboundWebhook),
            ("dlv_web".to_string(), DeliveryKind::Binding),
        ]
    );
}

#[tokio::test]
async fn a_sqlite_store_from_version_10_is_backfilled() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trigger-bridge.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        assert_eq!(
            trigger_bridge_store::sqlite::migrate_to(&conn, 10).unwrap(),
            (0, 10)
        );
        conn.execute_batch(OLD_ROWS).unwrap();
        let has_kind: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM pragma_table_info('deliveries') WHERE name = 'kind'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(has_kind, 0, "version 10 has no kind column");
    }
    // Opening the store migrates it to the newest version.
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open(&path).unwrap());
    assert_backfilled(&*store).await;
}

#[tokio::test]
async fn a_postgres_store_from_version_4_is_backfilled() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let cfg = db.config();
    tokio::task::spawn_blocking(move || {
        let mut c = pg::connect(&cfg).unwrap();
        for (v, sql) in pg::MIGRATIONS.iter().filter(|(v, _)| *v <= 4) {
            c.batch_execute(sql).unwrap();
            c.batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, \
                 applied_at BIGINT NOT NULL); INSERT INTO schema_migrations VALUES ({v}, 0)"
            ))
            .unwrap();
        }
        c.batch_execute(OLD_ROWS).unwrap();
        assert_eq!(pg::schema_version(&mut c).unwrap(), 4);
    })
    .await
    .unwrap();
    // Connecting migrates it to the newest version.
    let store = PgStore::connect(db.url(), PoolOptions::default())
        .await
        .unwrap();
    assert_backfilled(&store).await;
}
