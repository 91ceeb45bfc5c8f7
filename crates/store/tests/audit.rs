//! The audit log on both backends (issue #13): appends from many tasks at once get `seq` 1..N with no
//! gap and one chain; UPDATE and DELETE are refused by the database; a row edited by hand (with the
//! guard dropped, as a database owner could) is found by the verifier at that row. Console logins
//! expire. Runs against SQLite and, when reachable, PostgreSQL.

use std::sync::Arc;

use tb_core::audit::{Break, NewEntry, Verifier};
use trigger_bridge_store::postgres::testing::TestDatabase;
use trigger_bridge_store::postgres::{PgStore, PoolOptions};
use trigger_bridge_store::sqlite::SqliteStore;
use trigger_bridge_store::{AuditQuery, ConsoleLogin, Store};

enum Raw {
    Sqlite(std::path::PathBuf),
    Postgres(TestDatabase),
}

impl Raw {
    /// Runs `sql` outside the store, as someone with the database would.
    fn exec(&self, sql: &str) -> Result<(), String> {
        match self {
            Raw::Sqlite(p) => rusqlite::Connection::open(p)
                .unwrap()
                .execute_batch(sql)
                .map_err(|e| e.to_string()),
            // The synchronous client runs its own runtime: on a thread of its own.
            Raw::Postgres(db) => std::thread::scope(|t| {
                t.spawn(|| {
                    let mut c = trigger_bridge_store::postgres::connect(&db.config()).unwrap();
                    c.batch_execute(sql).map_err(|e| {
                        e.as_db_error()
                            .map(|d| d.message().to_string())
                            .unwrap_or_else(|| e.to_string())
                    })
                })
                .join()
                .unwrap()
            }),
        }
    }
}

async fn backends() -> Vec<(&'static str, Arc<dyn Store>, Raw, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = SqliteStore::open_dir(dir.path()).expect("open sqlite");
    let file = dir.path().join("trigger-bridge.db");
    let mut out: Vec<(&'static str, Arc<dyn Store>, Raw, Option<tempfile::TempDir>)> =
        vec![("sqlite", Arc::new(s), Raw::Sqlite(file), Some(dir))];
    if let Some(db) = TestDatabase::create() {
        let pg = PgStore::connect(db.url(), PoolOptions::default())
            .await
            .expect("open postgres");
        out.push(("postgres", Arc::new(pg), Raw::Postgres(db), None));
    }
    out
}

fn entry(actor: &str, i: usize) -> NewEntry {
    NewEntry {
        at: 1_700_000_000_000 + i as i64,
        actor: actor.into(),
        action: "subscription.pause".into(),
        target: format!("sub_{i}"),
        outcome: "ok".into(),
        detail: r#"{"status":200}"#.into(),
    }
}

/// Checks the chain as `GET /v1/audit/verify` does: up to the head read first, then the bounds of a
/// snapshot taken after.
async fn verify(s: &dyn Store) -> Result<u64, Break> {
    let head = s.audit_head().await.unwrap();
    let mut v = Verifier::default();
    'pages: while v.last_seq() < head.seq {
        let page = s
            .audit_entries(AuditQuery {
                after_seq: Some(v.last_seq()),
                limit: 7,
                ..AuditQuery::default()
            })
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        for e in &page {
            if e.seq > head.seq {
                break 'pages;
            }
            v.feed(e)?;
        }
    }
    let now = s.audit_head().await.unwrap();
    if now.max_seq > now.seq {
        return Err(Break::BeyondHead {
            head_seq: now.seq,
            max_seq: now.max_seq,
        });
    }
    v.finish(head.seq, &head.hash, head.seq)
}

#[tokio::test]
async fn racing_appends_make_one_chain_and_a_hand_edit_is_found() {
    for (name, s, raw, _dir) in backends().await {
        assert_eq!(verify(&*s).await, Ok(0), "{name}: empty log");
        // Four tasks append 10 entries each at once.
        let mut tasks = Vec::new();
        for t in 0..4 {
            let s = s.clone();
            tasks.push(tokio::spawn(async move {
                let mut seqs = Vec::new();
                for i in 0..10 {
                    seqs.push(
                        s.append_audit(entry(&format!("key{t}"), i))
                            .await
                            .unwrap()
                            .seq,
                    );
                }
                seqs
            }));
        }
        let mut all: Vec<i64> = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all.sort();
        assert_eq!(
            all,
            (1..=40).collect::<Vec<i64>>(),
            "{name}: seqs 1..=40, no gap, no twice"
        );
        assert_eq!(verify(&*s).await, Ok(40), "{name}");

        // Filters and newest-first paging.
        let newest = s
            .audit_entries(AuditQuery {
                newest_first: true,
                actor: Some("key2".into()),
                limit: 3,
                ..AuditQuery::default()
            })
            .await
            .unwrap();
        assert_eq!(newest.len(), 3, "{name}");
        assert!(newest.iter().all(|e| e.entry.actor == "key2"), "{name}");
        assert!(newest[0].seq > newest[1].seq, "{name}: newest first");
        let by_prefix = s
            .audit_entries(AuditQuery {
                action: Some("subscription".into()),
                limit: 1000,
                ..AuditQuery::default()
            })
            .await
            .unwrap();
        assert_eq!(
            by_prefix.len(),
            40,
            "{name}: an action prefix matches its actions"
        );

        // The database refuses edits and deletes of the log.
        let edit = "UPDATE audit_log SET actor = 'mallory' WHERE seq = 17";
        let refused = raw.exec(edit).unwrap_err();
        assert!(refused.contains("append-only"), "{name}: {refused}");
        assert!(
            raw.exec("DELETE FROM audit_log WHERE seq = 40").is_err(),
            "{name}"
        );
        assert_eq!(verify(&*s).await, Ok(40), "{name}: nothing changed");

        // Someone who owns the database drops the guard and edits a row: the verifier names it.
        let drop_guard = match raw {
            Raw::Sqlite(_) => "DROP TRIGGER audit_log_no_update; DROP TRIGGER audit_log_no_delete;",
            Raw::Postgres(_) => "DROP TRIGGER audit_log_append_only ON audit_log;",
        };
        raw.exec(drop_guard).unwrap();
        raw.exec(edit).unwrap();
        assert_eq!(verify(&*s).await, Err(Break::Edited { seq: 17 }), "{name}");
    }
}

#[tokio::test]
async fn a_deleted_tail_is_caught_by_the_head() {
    for (name, s, raw, _dir) in backends().await {
        for i in 0..5 {
            s.append_audit(entry("ops", i)).await.unwrap();
        }
        let drop_guard = match raw {
            Raw::Sqlite(_) => "DROP TRIGGER audit_log_no_delete;",
            Raw::Postgres(_) => "DROP TRIGGER audit_log_append_only ON audit_log;",
        };
        raw.exec(drop_guard).unwrap();
        // A row inserted past the head (no guard stops an INSERT) is found, well-chained or not.
        raw.exec("INSERT INTO audit_log VALUES (9, 1, 'x', 'y', 'z', 'ok', '{}', 'bad', 'bad')")
            .unwrap();
        assert_eq!(
            verify(&*s).await,
            Err(Break::BeyondHead {
                head_seq: 5,
                max_seq: 9
            }),
            "{name}"
        );
        raw.exec("DELETE FROM audit_log WHERE seq = 9").unwrap();
        raw.exec("DELETE FROM audit_log WHERE seq >= 4").unwrap();
        assert_eq!(
            verify(&*s).await,
            Err(Break::HeadMismatch {
                last_seq: 3,
                head_seq: 5
            }),
            "{name}"
        );
        raw.exec("DELETE FROM audit_log WHERE seq = 2").unwrap();
        assert_eq!(
            verify(&*s).await,
            Err(Break::Gap {
                expected: 2,
                found: 3
            }),
            "{name}"
        );
    }
}

#[tokio::test]
async fn console_logins_expire_and_end() {
    for (name, s, _raw, _dir) in backends().await {
        let login = |token: &str, at: i64| ConsoleLogin {
            token_sha256: token.into(),
            key_name: "ops".into(),
            key_sha256: "ef".repeat(32),
            csrf: "c0ffee".into(),
            created_at: at,
            expires_at: at + 1_000,
        };
        s.create_console_login(login("t1", 0)).await.unwrap();
        assert_eq!(
            s.console_login("t1", 500).await.unwrap(),
            Some(login("t1", 0)),
            "{name}"
        );
        assert_eq!(
            s.console_login("t1", 1_001).await.unwrap(),
            None,
            "{name}: expired"
        );
        assert_eq!(s.console_login("nope", 500).await.unwrap(), None, "{name}");
        s.create_console_login(login("t2", 5_000)).await.unwrap();
        assert!(s.delete_console_login("t2").await.unwrap(), "{name}");
        assert!(
            !s.delete_console_login("t2").await.unwrap(),
            "{name}: ended once"
        );
        assert_eq!(s.console_login("t2", 5_001).await.unwrap(), None, "{name}");
        // Logins of keys no longer configured end; the others stay.
        let mut other = login("t3", 6_000);
        other.key_name = "gone".into();
        s.create_console_login(login("t4", 6_000)).await.unwrap();
        s.create_console_login(other).await.unwrap();
        let keep = vec![format!("ops:{}", "ef".repeat(32))];
        assert_eq!(s.prune_console_logins(keep).await.unwrap(), 1, "{name}");
        assert!(
            s.console_login("t4", 6_001).await.unwrap().is_some(),
            "{name}"
        );
        assert_eq!(s.console_login("t3", 6_001).await.unwrap(), None, "{name}");
    }
}
