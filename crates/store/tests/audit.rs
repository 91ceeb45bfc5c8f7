//! The audit log on both backends: appends from many tasks at once get `seq` 1..N with no
//! gap and one chain; UPDATE and DELETE are refused by the database; a row edited by hand (with the
//! guard dropped, as a database owner could) is found by the verifier at that row. A row planted past
//! the head does not stop appends (a recorded break); an entry forged without the audit key, and the
//! newest rows deleted with the head moved back, are caught (the latter by a checkpoint). Console
//! logins expire. Runs against SQLite and, when reachable, PostgreSQL.

use std::sync::Arc;

use tb_core::audit::{Break, Checkpoint, Key, NewEntry, Verifier};
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

/// A backend under test: its name, the store, its raw access, and what keeps its storage alive.
type Backend = (&'static str, Arc<dyn Store>, Raw, Option<tempfile::TempDir>);

async fn backends() -> Vec<Backend> {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = SqliteStore::open_dir(dir.path()).expect("open sqlite");
    let file = dir.path().join("trigger-bridge.db");
    let mut out: Vec<Backend> = vec![("sqlite", Arc::new(s), Raw::Sqlite(file), Some(dir))];
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

/// The audit key of these tests.
fn key() -> Key {
    Key::from_bytes([3; 32])
}

/// Appends `e` under [`key`] and returns the new entry.
async fn append(s: &dyn Store, e: NewEntry) -> tb_core::audit::Entry {
    s.append_audit(e, Some(key())).await.unwrap().entry
}

/// `tasks` tasks append `each` keyed entries apiece at the same time (actor `key{t}`, via
/// `append_audit`); every result, in no particular order. Panics on a refused append.
async fn racing_appends(
    s: &Arc<dyn Store>,
    tasks: usize,
    each: usize,
) -> Vec<tb_core::audit::Appended> {
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let s = s.clone();
            tokio::spawn(async move {
                let mut out = Vec::new();
                for i in 0..each {
                    out.push(
                        s.append_audit(entry(&format!("key{t}"), i), Some(key()))
                            .await
                            .expect("an append racing others"),
                    );
                }
                out
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.await.unwrap());
    }
    all
}

/// Checks the chain as `GET /v1/audit/verify` does: up to the head read first, then the bounds of a
/// snapshot taken after.
async fn verify(s: &dyn Store) -> Result<u64, Break> {
    verify_at(s, None).await
}

/// [`verify`] against a checkpoint.
async fn verify_at(s: &dyn Store, cp: Option<Checkpoint>) -> Result<u64, Break> {
    let head = s.audit_head().await.unwrap();
    let mut v = Verifier::new(Some(key()), cp);
    // Paged by the last row read (after a problem the verifier's own position stops advancing).
    let mut after = 0;
    'pages: while after < head.seq {
        let page = s
            .audit_entries(AuditQuery {
                after_seq: Some(after),
                limit: 7,
                ..AuditQuery::default()
            })
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        after = last.seq;
        for e in &page {
            if e.seq > head.seq {
                break 'pages;
            }
            v.feed(e);
        }
    }
    let now = s.audit_head().await.unwrap();
    if let Some(b) = tb_core::audit::bounds(now.seq, now.max_seq, now.below_one) {
        return Err(b);
    }
    v.finish(head.seq, &head.hash, head.seq)
}

#[tokio::test]
async fn racing_appends_make_one_chain_and_a_hand_edit_is_found() {
    for (name, s, raw, _dir) in backends().await {
        assert_eq!(verify(&*s).await, Ok(0), "{name}: empty log");
        // Four tasks append 10 entries each at once.
        let mut all: Vec<i64> = racing_appends(&s, 4, 10)
            .await
            .into_iter()
            .map(|a| a.entry.seq)
            .collect();
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
            append(&*s, entry("ops", i)).await;
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

/// A row inserted by hand just past the head used to make every later append fail (`UNIQUE constraint
/// failed: audit_log.seq`). Now the next append steps over it with a recorded break, racing appenders
/// all land, the head counts the break, and the verifier reports the break (not a broken chain).
#[tokio::test]
async fn a_row_planted_past_the_head_does_not_stop_appends() {
    for (name, s, raw, _dir) in backends().await {
        for i in 0..5 {
            append(&*s, entry("ops", i)).await;
        }
        let head = s.audit_head().await.unwrap();
        raw.exec("INSERT INTO audit_log VALUES (6, 1, 'x', 'y', 'z', 'ok', '{}', 'bad', 'bad')")
            .unwrap();
        // Four tasks append 5 entries each at once, right after the plant.
        let appended = racing_appends(&s, 4, 5).await;
        let breaks: Vec<_> = appended
            .iter()
            .filter_map(|a| a.break_entry.clone())
            .collect();
        assert_eq!(breaks.len(), 1, "{name}: one break, by the first append");
        let b = &breaks[0];
        assert_eq!(b.seq, 7, "{name}");
        assert_eq!(b.prev_hash, head.hash, "{name}: linked to the real head");
        assert_eq!(b.entry.action, "audit.break", "{name}");
        assert_eq!(b.entry.actor, "rule:audit", "{name}");
        assert_eq!(b.entry.detail, r#"{"headSeq":5,"maxSeq":6}"#, "{name}");
        let mut seqs: Vec<i64> = appended.iter().map(|a| a.entry.seq).collect();
        seqs.sort();
        assert_eq!(seqs, (8..=27).collect::<Vec<i64>>(), "{name}");
        let now = s.audit_head().await.unwrap();
        assert_eq!(
            (now.seq, now.max_seq, now.breaks, now.last_break_seq),
            (27, 27, 1, 7),
            "{name}"
        );
        assert_eq!(
            verify(&*s).await,
            Err(Break::Recorded {
                seq: 7,
                head_seq: 5,
                max_seq: 6
            }),
            "{name}: the chain holds around the planted row, which is reported"
        );
        // A second plant, two rows past the head: stepped over again.
        raw.exec("INSERT INTO audit_log VALUES (29, 1, 'x', 'y', 'z', 'ok', '{}', 'bad', 'bad2')")
            .unwrap();
        let a = s.append_audit(entry("ops", 99), Some(key())).await.unwrap();
        assert_eq!(a.break_entry.map(|b| b.seq), Some(30), "{name}");
        assert_eq!(a.entry.seq, 31, "{name}");
        let now = s.audit_head().await.unwrap();
        assert_eq!((now.breaks, now.last_break_seq), (2, 30), "{name}");
        assert_eq!(
            verify(&*s).await,
            Err(Break::Recorded {
                seq: 7,
                head_seq: 5,
                max_seq: 6
            }),
            "{name}"
        );
    }
}

/// Whoever can write the database but lacks the key: an entry appended with a correctly computed
/// plain hash (and the head moved to it) is forged; the newest rows deleted with the head moved back
/// pass the chain alone but not a checkpoint exported before.
#[tokio::test]
async fn a_forged_entry_and_a_rolled_back_head_are_caught() {
    for (name, s, raw, _dir) in backends().await {
        for i in 0..5 {
            append(&*s, entry("ops", i)).await;
        }
        let head = s.audit_head().await.unwrap();
        let cp = Checkpoint::of(&key(), head.seq, &head.hash);
        assert_eq!(verify_at(&*s, Some(cp.clone())).await, Ok(5), "{name}");

        // Forge entry 6 without the key, hashed exactly as an unkeyed writer would.
        let f = tb_core::audit::next(head.seq, &head.hash, entry("mallory", 6), None);
        raw.exec(&format!(
            "INSERT INTO audit_log VALUES (6, {}, 'mallory', '{}', '{}', 'ok', '{}', '{}', '{}'); \
             UPDATE audit_head SET seq = 6, hash = '{}' WHERE id = 1;",
            f.entry.at, f.entry.action, f.entry.target, f.entry.detail, f.prev_hash, f.hash, f.hash
        ))
        .unwrap();
        assert_eq!(verify(&*s).await, Err(Break::Forged { seq: 6 }), "{name}");

        // Roll back: the newest rows deleted and the head moved to entry 3.
        let drop_guard = match raw {
            Raw::Sqlite(_) => "DROP TRIGGER audit_log_no_delete;",
            Raw::Postgres(_) => "DROP TRIGGER audit_log_append_only ON audit_log;",
        };
        raw.exec(drop_guard).unwrap();
        let third = s
            .audit_entries(AuditQuery {
                after_seq: Some(2),
                limit: 1,
                ..AuditQuery::default()
            })
            .await
            .unwrap()
            .remove(0);
        raw.exec(&format!(
            "DELETE FROM audit_log WHERE seq > 3; UPDATE audit_head SET seq = 3, hash = '{}' WHERE id = 1;",
            third.hash
        ))
        .unwrap();
        assert_eq!(
            verify(&*s).await,
            Ok(3),
            "{name}: the chain alone cannot tell"
        );
        assert_eq!(
            verify_at(&*s, Some(cp.clone())).await,
            Err(Break::Truncated {
                checkpoint_seq: 5,
                last_seq: 3
            }),
            "{name}: the checkpoint can"
        );
        // Appends go on from the rolled-back head; entry 5 is then another entry, not the checkpoint's.
        append(&*s, entry("ops", 7)).await;
        append(&*s, entry("ops", 8)).await;
        assert_eq!(
            verify_at(&*s, Some(cp)).await,
            Err(Break::CheckpointMismatch { seq: 5 }),
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

/// A row planted at `seq = i64::MAX` leaves no `seq` after it: the next append must not overflow (a
/// panic in the writer, or a wrap to i64::MIN and then UNIQUE failures forever). The chain goes on in
/// the free seqs after the head, one break entry records the planted row once, and later appends
/// write no further break; the verifier reports the break.
#[tokio::test]
async fn a_row_planted_at_the_largest_seq_does_not_stop_appends() {
    for (name, s, raw, _dir) in backends().await {
        for i in 0..5 {
            append(&*s, entry("ops", i)).await;
        }
        let head = s.audit_head().await.unwrap();
        raw.exec(&format!(
            "INSERT INTO audit_log VALUES ({}, 1, 'x', 'y', 'z', 'ok', '{{}}', 'bad', 'bad')",
            i64::MAX
        ))
        .unwrap();
        let first = s
            .append_audit(entry("ops", 5), Some(key()))
            .await
            .expect("an append after a row planted at i64::MAX");
        let b = first.break_entry.clone().expect("a break entry");
        assert_eq!(
            (b.seq, b.prev_hash.as_str(), b.entry.action.as_str()),
            (6, head.hash.as_str(), "audit.break"),
            "{name}: the break takes the first free seq after the head"
        );
        assert_eq!(
            b.entry.detail,
            format!(r#"{{"headSeq":5,"maxSeq":5,"topSeq":{}}}"#, i64::MAX),
            "{name}: nothing stepped over, the row at the top named"
        );
        assert_eq!(first.entry.seq, 7, "{name}");
        // Several more appends, one of them racing another: no further break, seqs go on.
        let mut seqs = Vec::new();
        for a in racing_appends(&s, 2, 3).await {
            assert_eq!(
                a.break_entry, None,
                "{name}: the planted row is recorded once"
            );
            seqs.push(a.entry.seq);
        }
        seqs.sort();
        assert_eq!(seqs, (8..=13).collect::<Vec<i64>>(), "{name}");
        let now = s.audit_head().await.unwrap();
        assert_eq!(
            (now.seq, now.max_seq, now.breaks, now.last_break_seq),
            (13, i64::MAX, 1, 6),
            "{name}"
        );
        // The chain up to the head holds; the planted row still lies past it and is reported.
        assert_eq!(
            verify(&*s).await,
            Err(Break::BeyondHead {
                head_seq: 13,
                max_seq: i64::MAX
            }),
            "{name}"
        );
        let mut v = Verifier::new(Some(key()), None);
        for e in s
            .audit_entries(AuditQuery {
                after_seq: Some(0),
                limit: 13,
                ..AuditQuery::default()
            })
            .await
            .unwrap()
        {
            v.feed(&e);
        }
        assert_eq!(
            v.finish(13, &now.hash, 13),
            Err(Break::Recorded {
                seq: 6,
                head_seq: 5,
                max_seq: 5
            }),
            "{name}: the break entry is reported"
        );
        assert_eq!((v.checked(), v.breaks()), (13, 1), "{name}");
        // A row planted right after the head now: stepped over by a second break, below the top.
        raw.exec("INSERT INTO audit_log VALUES (14, 1, 'x', 'y', 'z', 'ok', '{}', 'bad', 'bad2')")
            .unwrap();
        let a = s.append_audit(entry("ops", 9), Some(key())).await.unwrap();
        assert_eq!(
            a.break_entry.map(|b| (b.seq, b.entry.detail)),
            Some((
                15,
                format!(r#"{{"headSeq":13,"maxSeq":14,"topSeq":{}}}"#, i64::MAX)
            )),
            "{name}"
        );
        assert_eq!(a.entry.seq, 16, "{name}");
    }
}

/// Someone who can write the database but lacks the key rewrites the whole log and its head with plain
/// SHA-256 entries: every entry is "written before the key", yet a verifier holding the key knows a
/// server with the key always ends the log on a keyed entry (its start appends `config.load`).
#[tokio::test]
async fn a_log_rewritten_with_plain_hashes_is_forged_for_a_key_holder() {
    for (name, s, raw, _dir) in backends().await {
        for i in 0..4 {
            append(&*s, entry("ops", i)).await;
        }
        let drop_guard = match raw {
            Raw::Sqlite(_) => "DROP TRIGGER audit_log_no_delete;",
            Raw::Postgres(_) => "DROP TRIGGER audit_log_append_only ON audit_log;",
        };
        raw.exec(drop_guard).unwrap();
        let mut sql = String::from("DELETE FROM audit_log;");
        let (mut seq, mut hash) = (0, tb_core::audit::GENESIS.to_string());
        for i in 0..3 {
            let f = tb_core::audit::next(seq, &hash, entry("mallory", i), None);
            sql.push_str(&format!(
                "INSERT INTO audit_log VALUES ({}, {}, 'mallory', '{}', '{}', 'ok', '{}', '{}', '{}');",
                f.seq, f.entry.at, f.entry.action, f.entry.target, f.entry.detail, f.prev_hash, f.hash
            ));
            (seq, hash) = (f.seq, f.hash);
        }
        sql.push_str(&format!(
            "UPDATE audit_head SET seq = {seq}, hash = '{hash}' WHERE id = 1;"
        ));
        raw.exec(&sql).unwrap();
        assert_eq!(
            verify(&*s).await,
            Err(Break::ForgedHead { seq: 3 }),
            "{name}: a key holder does not accept a log that ends unkeyed"
        );
        // Without the key the same log is an old, never keyed log: nothing to tell.
        let mut v = Verifier::new(None, None);
        for e in s
            .audit_entries(AuditQuery {
                after_seq: Some(0),
                limit: 10,
                ..AuditQuery::default()
            })
            .await
            .unwrap()
        {
            v.feed(&e);
        }
        assert_eq!(v.finish(3, &hash, 3), Ok(3), "{name}");
    }
}

/// Rows planted with `seq` 0 or below lie before the first entry: the verifier reads from seq 1 and
/// the head knows only the largest seq, yet `GET /v1/audit` lists them. Both the check and the head
/// (for `/ready`) see them.
#[tokio::test]
async fn rows_planted_below_seq_one_are_found() {
    for (name, s, raw, _dir) in backends().await {
        for i in 0..3 {
            append(&*s, entry("ops", i)).await;
        }
        assert_eq!(verify(&*s).await, Ok(3), "{name}");
        raw.exec(
            "INSERT INTO audit_log VALUES (0, 1, 'x', 'y', 'z', 'ok', '{}', 'bad', 'bad'); \
             INSERT INTO audit_log VALUES (-5, 1, 'x', 'y', 'z', 'ok', '{}', 'bad', 'bad2');",
        )
        .unwrap();
        let listed = s
            .audit_entries(AuditQuery {
                newest_first: true,
                limit: 10,
                ..AuditQuery::default()
            })
            .await
            .unwrap();
        assert_eq!(listed.len(), 5, "{name}: the list shows them");
        assert_eq!(s.audit_head().await.unwrap().below_one, 2, "{name}");
        assert_eq!(
            verify(&*s).await,
            Err(Break::BeforeFirst { rows: 2 }),
            "{name}"
        );
        // Appends go on; the rows stay reported.
        assert_eq!(append(&*s, entry("ops", 3)).await.seq, 4, "{name}");
        assert_eq!(
            verify(&*s).await,
            Err(Break::BeforeFirst { rows: 2 }),
            "{name}"
        );
    }
}
