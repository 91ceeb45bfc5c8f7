//! `ingress_counts` and `subscription_quarantines` on both backends: concurrent adds from
//! several "replicas" lose no count and each gets the running total back; the reads filter and order
//! as documented; pruning removes only older minutes; a quarantine is kept once and released once,
//! each with its configuration change row. Runs against SQLite and, when reachable, PostgreSQL.

use std::sync::Arc;

use trigger_bridge_store::postgres::testing::TestDatabase;
use trigger_bridge_store::postgres::{PgStore, PoolOptions};
use trigger_bridge_store::sqlite::SqliteStore;
use trigger_bridge_store::{ChangeKind, IngressCount, IngressCountQuery, QuarantineRecord, Store};

/// A backend under test: its name, the store, and what keeps its storage alive.
type Backend = (
    &'static str,
    Arc<dyn Store>,
    Option<TestDatabase>,
    tempfile::TempDir,
);

async fn backends() -> Vec<Backend> {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = SqliteStore::open_dir(dir.path()).expect("open sqlite");
    let mut out: Vec<Backend> = vec![("sqlite", Arc::new(s), None, dir)];
    if let Some(db) = TestDatabase::create() {
        let pg = PgStore::connect(db.url(), PoolOptions::default())
            .await
            .expect("open postgres");
        out.push((
            "postgres",
            Arc::new(pg),
            Some(db),
            tempfile::tempdir().unwrap(),
        ));
    }
    out
}

fn count(minute: i64, scope: &str, key: &str, outcome: &str, n: u64) -> IngressCount {
    IngressCount {
        minute,
        scope: scope.into(),
        key: key.into(),
        outcome: outcome.into(),
        n,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_adds_lose_nothing_and_reads_filter_and_prune() {
    for (name, store, _db, _dir) in backends().await {
        // Eight writers add 1..=50 each to the same two rows at once.
        let mut tasks = Vec::new();
        for _ in 0..8 {
            let s = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut last = Vec::new();
                for _ in 0..50 {
                    last = s
                        .add_ingress_counts(
                            vec![
                                count(100, "subscription", "gh", "admitted", 1),
                                count(100, "source", "192.0.2.1", "admitted", 2),
                            ],
                            None,
                        )
                        .await
                        .unwrap();
                }
                last
            }));
        }
        let mut max_seen = 0;
        for t in tasks {
            let last = t.await.unwrap();
            assert_eq!(last.len(), 2, "{name}: one total per row");
            max_seen = max_seen.max(last[0]);
        }
        assert_eq!(max_seen, 400, "{name}: the last add saw every one");
        store
            .add_ingress_counts(
                vec![
                    count(99, "subscription", "gh", "signature_invalid", 5),
                    count(100, "subscription", "gh", "rate_limited", 3),
                    count(100, "binding", "b1", "admitted", 4),
                    count(101, "subscription", "other", "admitted", 1),
                ],
                None,
            )
            .await
            .unwrap();
        // The rate limits' read: admitted rows of one minute, no source rows.
        let mut t: Vec<_> = store
            .admitted_totals(100)
            .await
            .unwrap()
            .into_iter()
            .map(|c| (c.scope, c.key, c.n))
            .collect();
        t.sort();
        assert_eq!(
            t,
            vec![
                ("binding".into(), "b1".into(), 4),
                ("subscription".into(), "gh".into(), 400)
            ],
            "{name}"
        );
        // The operators' read: one key, newest minute first.
        let rows = store
            .ingress_counts(IngressCountQuery {
                since_minute: 99,
                scope: Some("subscription".into()),
                key: Some("gh".into()),
                limit: 100,
            })
            .await
            .unwrap();
        let got: Vec<_> = rows
            .iter()
            .map(|c| (c.minute, c.outcome.as_str(), c.n))
            .collect();
        assert_eq!(
            got,
            vec![
                (100, "admitted", 400),
                (100, "rate_limited", 3),
                (99, "signature_invalid", 5)
            ],
            "{name}"
        );
        let all = store
            .ingress_counts(IngressCountQuery {
                since_minute: 0,
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(all.len(), 6, "{name}: {all:?}");
        // Pruning before minute 100 removes minute 99 only.
        store.add_ingress_counts(vec![], Some(100)).await.unwrap();
        let left = store
            .ingress_counts(IngressCountQuery {
                since_minute: 0,
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(left.len(), 5, "{name}");
        assert!(left.iter().all(|c| c.minute >= 100), "{name}");
    }
}

#[tokio::test]
async fn a_quarantine_is_kept_once_released_once_and_each_is_a_change() {
    for (name, store, _db, _dir) in backends().await {
        let head = store.config_change_head().await.unwrap();
        let q = QuarantineRecord {
            subscription_id: "gh".into(),
            since: 1_000,
            reason: "flood".into(),
            quarantined_by: None,
        };
        assert!(
            store.quarantine_subscription(q.clone()).await.unwrap(),
            "{name}"
        );
        let second = QuarantineRecord {
            reason: "other".into(),
            since: 2_000,
            ..q.clone()
        };
        assert!(
            !store.quarantine_subscription(second).await.unwrap(),
            "{name}"
        );
        assert_eq!(
            store.quarantines().await.unwrap(),
            vec![q],
            "{name}: the first is kept"
        );
        assert!(
            store.release_subscription("gh", 3_000).await.unwrap(),
            "{name}"
        );
        assert!(
            !store.release_subscription("gh", 3_001).await.unwrap(),
            "{name}"
        );
        assert!(store.quarantines().await.unwrap().is_empty(), "{name}");
        let changes = store.changes_since(head, 100).await.unwrap();
        let kinds: Vec<_> = changes
            .iter()
            .map(|c| (c.kind, c.record_id.as_str()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (Some(ChangeKind::Quarantine), "gh"),
                (Some(ChangeKind::Quarantine), "gh")
            ],
            "{name}: one change per quarantine and release, none for the no-ops"
        );
    }
}
