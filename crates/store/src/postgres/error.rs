//! Typing of PostgreSQL errors into [`StoreError`]s (PostgreSQL error codes, appendix A of its manual).

use std::error::Error as _;

use postgres::error::SqlState;

use crate::StoreError;

/// Maps a driver error onto a typed store error:
/// - `40001` serialization_failure and `40P01` deadlock_detected: [`StoreError::Retryable`] (the
///   transaction was rolled back; run it again whole);
/// - `55P03` lock_not_available (a `NOWAIT` lock or `lock_timeout`): [`StoreError::Busy`];
/// - class `53` insufficient resources (`53100` disk full, `53200` out of memory, `53300` too many
///   connections), class `08` connection exceptions, `57P01` admin_shutdown, `57P02` crash_shutdown,
///   `57P03` cannot_connect_now, and a lost connection (closed, or an I/O error): [`StoreError::Unavailable`];
/// - anything else: [`StoreError::Database`] with the server's message, detail, constraint and SQLSTATE
///   (e.g. `duplicate key value violates unique constraint "receipts_dedup" ... (SQLSTATE 23505)`).
pub fn classify(e: &postgres::Error) -> StoreError {
    let Some(code) = e.code() else {
        if connection_lost(e) {
            return StoreError::Unavailable(format!(
                "the PostgreSQL connection was lost: {}",
                text(e)
            ));
        }
        return StoreError::Database(text(e));
    };
    let c = code.code();
    if *code == SqlState::T_R_SERIALIZATION_FAILURE || *code == SqlState::T_R_DEADLOCK_DETECTED {
        StoreError::Retryable(format!("{} (SQLSTATE {c})", text(e)))
    } else if *code == SqlState::LOCK_NOT_AVAILABLE {
        StoreError::Busy(format!(
            "a row or table is locked: {} (SQLSTATE {c})",
            text(e)
        ))
    } else if c.starts_with("53")
        || c.starts_with("08")
        || matches!(c, "57P01" | "57P02" | "57P03")
        || e.is_closed()
    {
        StoreError::Unavailable(format!("PostgreSQL: {} (SQLSTATE {c})", text(e)))
    } else {
        StoreError::Database(format!("{} (SQLSTATE {c})", text(e)))
    }
}

/// Whether `e` says the connection is gone (closed by either side, or an I/O error on its socket), so
/// the client must be replaced before the next transaction.
pub fn connection_lost(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(code) = e.code() {
        let c = code.code();
        return c.starts_with("08") || matches!(c, "57P01" | "57P02" | "57P03");
    }
    let mut src = e.source();
    while let Some(s) = src {
        if s.is::<std::io::Error>() {
            return true;
        }
        src = s.source();
    }
    false
}

/// The error's text: the server's message with its detail and constraint when it is a server error,
/// else the driver's description with its cause.
pub(crate) fn text(e: &postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut s = db.message().to_owned();
        if let Some(d) = db.detail() {
            s.push_str(": ");
            s.push_str(d);
        }
        if let Some(c) = db.constraint() {
            s.push_str(&format!(" [constraint {c}]"));
        }
        return s;
    }
    match e.source() {
        Some(src) => format!("{e}: {src}"),
        None => e.to_string(),
    }
}
