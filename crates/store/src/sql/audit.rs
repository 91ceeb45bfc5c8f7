//! The audit log and console logins. Appends lock the one `audit_head` row (PostgreSQL
//! `FOR UPDATE`; SQLite's one writer) so concurrent appenders take turns and every `seq` follows the one
//! before; the chain itself, its key and what to do with rows planted past the head are
//! `tb_core::audit`'s.

use super::Db;
use crate::model::{AuditQuery, ConsoleLogin};
use crate::{p, StoreError, StoreResult};
use tb_core::audit::{self, Entry, NewEntry};

const COLUMNS: &str = "seq, at, actor, action, target, outcome, detail, prev_hash, hash";

fn entry(r: &super::Row) -> StoreResult<Entry> {
    Ok(Entry {
        seq: r.get(0)?,
        entry: NewEntry {
            at: r.get(1)?,
            actor: r.get(2)?,
            action: r.get(3)?,
            target: r.get(4)?,
            outcome: r.get(5)?,
            detail: r.get(6)?,
        },
        prev_hash: r.get(7)?,
        hash: r.get(8)?,
    })
}

/// The head `(seq, hash)` (the newest entry as the store recorded it; `(0, GENESIS)` when empty), the
/// largest `seq` stored, the recorded breaks and the rows stored below seq 1, in one statement (one
/// snapshot on both backends).
pub(crate) fn head(c: &dyn Db) -> StoreResult<crate::model::AuditHead> {
    c.row(
        "SELECT h.seq, h.hash, COALESCE((SELECT MAX(seq) FROM audit_log), 0), h.breaks, h.last_break_seq, \
         (SELECT COUNT(*) FROM audit_log WHERE seq < 1) FROM audit_head h WHERE h.id = 1",
        p![],
        |r| {
            Ok(crate::model::AuditHead {
                seq: r.get(0)?,
                hash: r.get(1)?,
                max_seq: r.get(2)?,
                breaks: r.get(3)?,
                last_break_seq: r.get(4)?,
                below_one: r.get(5)?,
            })
        },
    )?
    .ok_or_else(no_head)
}

fn no_head() -> StoreError {
    StoreError::Database("audit_head has no row (migration 0017/0011 not applied?)".into())
}

/// Appends `e` after the head and moves the head to it, under the audit key `key` (unkeyed without
/// one). The head row is locked (PostgreSQL `FOR UPDATE`; SQLite's one writer), and on PostgreSQL the
/// log itself against other writers' inserts (`SHARE ROW EXCLUSIVE`), so the largest `seq` read here
/// stays the largest until commit. Rows lying past the head are stepped over as
/// `tb_core::audit::append` decides (a break entry first), and the head counts the break. Errors:
/// `Conflict` when no seq is left after the head (`tb_core::audit::NoRoom`; nothing written).
pub(crate) fn append(
    c: &dyn Db,
    e: NewEntry,
    key: Option<&audit::Key>,
) -> StoreResult<audit::Appended> {
    if c.dialect() == super::Dialect::Postgres {
        c.exec("LOCK TABLE audit_log IN SHARE ROW EXCLUSIVE MODE", p![])?;
    }
    let (seq, hash, last_break_seq) = c
        .row(
            &format!(
                "SELECT seq, hash, last_break_seq FROM audit_head WHERE id = 1{}",
                c.dialect().for_update()
            ),
            p![],
            |r| Ok((r.get::<i64>(0)?, r.get::<String>(1)?, r.get::<i64>(2)?)),
        )?
        .ok_or_else(no_head)?;
    let max_seq: i64 = c
        .value("SELECT COALESCE(MAX(seq), 0) FROM audit_log", p![])?
        .unwrap_or(0);
    // What `tb_core::audit::append` needs only when rows lie past the head: the first seq after the
    // head that is free with the one after it (the head itself, or a stored row, followed by two free
    // seqs; rows at i64::MAX - 1 and above have no two seqs after them), and the newest break's detail.
    let past = if max_seq > seq {
        let room = c
            .value::<Option<i64>>(
                "SELECT MIN(s) + 1 FROM (SELECT CAST(?1 AS BIGINT) AS s \
                 UNION ALL SELECT seq FROM audit_log WHERE seq > ?1) c \
                 WHERE s < 9223372036854775806 \
                 AND NOT EXISTS (SELECT 1 FROM audit_log b WHERE b.seq = c.s + 1 OR b.seq = c.s + 2)",
                p![seq],
            )?
            .flatten();
        let last_break = if last_break_seq > 0 {
            c.value::<String>(
                "SELECT detail FROM audit_log WHERE seq = ?1",
                p![last_break_seq],
            )?
        } else {
            None
        };
        Some(audit::Past { room, last_break })
    } else {
        None
    };
    let a = audit::append(seq, &hash, max_seq, past.as_ref(), e, key)
        .map_err(|n| StoreError::Conflict(n.to_string()))?;
    for n in a.break_entry.iter().chain([&a.entry]) {
        c.exec(
            &format!(
                "INSERT INTO audit_log ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
            ),
            p![
                n.seq,
                n.entry.at,
                n.entry.actor.as_str(),
                n.entry.action.as_str(),
                n.entry.target.as_str(),
                n.entry.outcome.as_str(),
                n.entry.detail.as_str(),
                n.prev_hash.as_str(),
                n.hash.as_str()
            ],
        )?;
    }
    match &a.break_entry {
        Some(b) => c.exec(
            "UPDATE audit_head SET seq = ?1, hash = ?2, breaks = breaks + 1, last_break_seq = ?3 WHERE id = 1",
            p![a.entry.seq, a.entry.hash.as_str(), b.seq],
        )?,
        None => c.exec(
            "UPDATE audit_head SET seq = ?1, hash = ?2 WHERE id = 1",
            p![a.entry.seq, a.entry.hash.as_str()],
        )?,
    };
    Ok(a)
}

/// Entries matching `q`: oldest first after `q.after_seq`, or newest first before `q.before_seq` when
/// `q.newest_first`; at most `q.limit` (1..=1000).
pub(crate) fn list(c: &dyn Db, q: &AuditQuery) -> StoreResult<Vec<Entry>> {
    let limit = q.limit.clamp(1, 1000) as i64;
    let (cmp, bound, order) = if q.newest_first {
        ("<", q.before_seq.unwrap_or(i64::MAX), "DESC")
    } else {
        (">", q.after_seq.unwrap_or(0), "ASC")
    };
    let actor = q.actor.clone().unwrap_or_default();
    let action = q.action.clone().unwrap_or_default();
    let target = q.target.clone().unwrap_or_default();
    c.rows(
        &format!(
            "SELECT {COLUMNS} FROM audit_log WHERE seq {cmp} ?1 \
             AND (?2 = '' OR actor = ?2) AND (?3 = '' OR action = ?3 OR substr(action, 1, length(?3) + 1) = ?3 || '.') \
             AND (?4 = '' OR target = ?4) AND at >= ?5 AND at <= ?6 \
             ORDER BY seq {order} LIMIT ?7"
        ),
        p![
            bound,
            actor.as_str(),
            action.as_str(),
            target.as_str(),
            q.from.unwrap_or(i64::MIN),
            q.to.unwrap_or(i64::MAX),
            limit
        ],
        entry,
    )
}

/// Stores a console login; expired logins are removed in the same transaction.
pub(crate) fn create_login(c: &dyn Db, l: &ConsoleLogin) -> StoreResult<()> {
    c.exec(
        "DELETE FROM console_logins WHERE expires_at < ?1",
        p![l.created_at],
    )?;
    c.exec(
        "INSERT INTO console_logins (token_sha256, key_name, key_sha256, csrf, created_at, expires_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        p![
            l.token_sha256.as_str(),
            l.key_name.as_str(),
            l.key_sha256.as_str(),
            l.csrf.as_str(),
            l.created_at,
            l.expires_at
        ],
    )?;
    Ok(())
}

/// The unexpired login whose token hashes to `token_sha256`.
pub(crate) fn get_login(
    c: &dyn Db,
    token_sha256: &str,
    now: i64,
) -> StoreResult<Option<ConsoleLogin>> {
    c.row(
        "SELECT token_sha256, key_name, key_sha256, csrf, created_at, expires_at FROM console_logins \
         WHERE token_sha256 = ?1 AND expires_at >= ?2",
        p![token_sha256, now],
        |r| {
            Ok(ConsoleLogin {
                token_sha256: r.get(0)?,
                key_name: r.get(1)?,
                key_sha256: r.get(2)?,
                csrf: r.get(3)?,
                created_at: r.get(4)?,
                expires_at: r.get(5)?,
            })
        },
    )
}

/// Ends a login (logout); false when there was none.
pub(crate) fn delete_login(c: &dyn Db, token_sha256: &str) -> StoreResult<bool> {
    Ok(c.exec(
        "DELETE FROM console_logins WHERE token_sha256 = ?1",
        p![token_sha256],
    )? > 0)
}

/// Removes every login whose key (`name:sha256-hex`) is not in `keep`: a key removed or rotated in the
/// configuration ends its logins for good, even if it comes back later. Returns how many went.
pub(crate) fn prune_logins(c: &dyn Db, keep: &[String]) -> StoreResult<u64> {
    if keep.is_empty() {
        return c.exec("DELETE FROM console_logins", p![]);
    }
    let marks: Vec<String> = (1..=keep.len()).map(|i| format!("?{i}")).collect();
    let params: Vec<crate::sql::Param<'_>> =
        keep.iter().map(|k| crate::sql::Param::Text(k)).collect();
    c.exec(
        &format!(
            "DELETE FROM console_logins WHERE (key_name || ':' || key_sha256) NOT IN ({})",
            marks.join(", ")
        ),
        &params,
    )
}
