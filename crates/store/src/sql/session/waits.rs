//! Waits: arming (`tb_core::wait::arm`), cancelling (`wait::cancel`), the resolution step of a due timer
//! (`wait::step`) and a run's end (`tb_core::session::end`), each applied under the run's lock.

use super::*;
use crate::p;
use crate::sql::{Db, Dialect, Row};
use serde_json::json;
use tb_core::wait::{self, WaitSpec};

pub(super) const WAIT_COLS: &str =
    "id, run_id, spec, deadline, state, interrupted_by, winner, losers, created_at, settled_at";

pub(super) fn wait_row(r: &Row) -> StoreResult<WaitRecord> {
    let spec: String = r.get(2)?;
    let state: String = r.get(4)?;
    Ok(WaitRecord {
        id: r.get(0)?,
        run_id: r.get(1)?,
        spec: serde_json::from_str(&spec)
            .map_err(|e| StoreError::Database(format!("bad wait spec in the store: {e}")))?,
        deadline: r.get(3)?,
        state: WaitState::parse(&state).unwrap_or(WaitState::Armed),
        interrupted_by: r.get(5)?,
        winner: json_col(r.get(6)?),
        losers: json_col(r.get(7)?).unwrap_or_else(|| json!([])),
        created_at: r.get(8)?,
        settled_at: r.get(9)?,
    })
}

pub(crate) fn get_wait(c: &dyn Db, run_id: &str, id: &str) -> StoreResult<WaitRecord> {
    one_of_run(
        c,
        &format!("SELECT {WAIT_COLS} FROM waits WHERE id = ?1 AND run_id = ?2"),
        run_id,
        id,
        wait_row,
        RecordKind::Wait,
    )
}

pub(crate) fn list_waits(c: &dyn Db, run_id: &str) -> StoreResult<Vec<WaitRecord>> {
    all_of_run(
        c,
        &format!("SELECT {WAIT_COLS} FROM waits WHERE run_id = ?1 ORDER BY created_at, id"),
        run_id,
        wait_row,
    )
}

/// Arms a wait on a run (rule: `tb_core::wait::arm`): replaces (cancels) an armed one, sets the absolute
/// deadline `now + timeoutMs`, and steps at once, so a buffered match (oldest first), unseen user input
/// or a past deadline resolves it immediately. Errors: `NotFound("run")`; `Rejected(target_terminal)`.
pub(crate) fn create_wait(
    c: &dyn Db,
    run_id: &str,
    wait_id: &str,
    spec: &WaitSpec,
    now: i64,
) -> StoreResult<WaitRecord> {
    let snap = snapshot::load(c, run_id, None)?;
    let (w, _) = with_ctx(now, |ctx| wait::arm(&snap, wait_id, spec, ctx)).map_err(refused)?;
    apply::apply(c, run_id, snap.counters, &w, None, now)?;
    get_wait(c, run_id, wait_id)
}

/// Cancels an armed wait (the driver's `{action: "cancel"}`; rule: `tb_core::wait::cancel`). Errors:
/// `NotFound("run" | "wait")`; `Conflict` when the wait is no longer armed.
pub(crate) fn cancel_wait(
    c: &dyn Db,
    run_id: &str,
    wait_id: &str,
    now: i64,
) -> StoreResult<WaitRecord> {
    let head = snapshot::lock_head(c, run_id)?;
    let state = snapshot::wait_state(c, run_id, wait_id)?;
    let w = wait::cancel(head.counters, wait_id, state).map_err(refused)?;
    apply::apply(c, run_id, head.counters, &w, None, now)?;
    get_wait(c, run_id, wait_id)
}

/// One resolution step of a run's armed wait (rule: `tb_core::wait::step`, without `stop`) under the
/// run's lock. Returns whether it resolved or interrupted a wait.
fn step_run(c: &dyn Db, run_id: &str, now: i64) -> StoreResult<bool> {
    let snap = snapshot::load(c, run_id, None)?;
    let (w, stepped) = with_ctx(now, |ctx| wait::step(&snap, false, ctx));
    apply::apply(c, run_id, snap.counters, &w, None, now)?;
    Ok(stepped.wait_id.is_some())
}

/// The API view of a wait: `{waitId, runId, kind, names, state, reason, deadline?, interrupted,
/// winner?, losers}`.
pub fn wait_view(w: &WaitRecord) -> Value {
    let mut v = json!({
        "waitId": w.id,
        "runId": w.run_id,
        "kind": w.spec.kind,
        "names": w.spec.names,
        "state": w.state,
        "reason": w.spec.reason,
        "interrupted": w.interrupted_by.is_some(),
        "losers": w.losers,
        "createdAt": rfc3339(w.created_at),
    });
    if w.spec.kind == WaitKind::Any {
        v["userInput"] = json!(w.spec.user_input);
    }
    if let Some(d) = w.deadline {
        v["deadline"] = json!(rfc3339(d));
    }
    if let Some(win) = &w.winner {
        v["winner"] = win.clone();
    }
    if let Some(s) = w.settled_at {
        v["settledAt"] = json!(rfc3339(s));
    }
    v
}

/// Resolves armed waits whose deadline has passed at `now` (at most `limit` runs); returns how many
/// resolved. Each due run is stepped under its lock. On PostgreSQL the due runs are taken
/// `FOR UPDATE SKIP LOCKED`: a replica never waits for (or steps a second time) a run another
/// replica's timer loop or a racing signal holds; what it skips is still due on its next pass unless
/// the holder resolved it.
pub(crate) fn fire_timers(c: &dyn Db, now: i64, limit: u32) -> StoreResult<u32> {
    let sql = match c.dialect() {
        Dialect::Sqlite => {
            "SELECT run_id FROM waits INDEXED BY waits_due WHERE state = 'armed' AND deadline IS NOT NULL \
             AND deadline <= ?1 AND interrupted_by IS NULL ORDER BY deadline LIMIT ?2"
        }
        Dialect::Postgres => {
            "SELECT r.id FROM runs r JOIN waits w ON w.run_id = r.id WHERE w.state = 'armed' \
             AND w.deadline IS NOT NULL AND w.deadline <= ?1 AND w.interrupted_by IS NULL \
             ORDER BY w.deadline LIMIT ?2 FOR UPDATE OF r SKIP LOCKED"
        }
    };
    let runs: Vec<String> = c.rows(sql, p![now, limit], |r| r.get(0))?;
    let mut n = 0;
    for r in runs {
        if step_run(c, &r, now)? {
            n += 1;
        }
    }
    Ok(n)
}

pub(crate) fn next_timer_at(c: &dyn Db) -> StoreResult<Option<i64>> {
    Ok(c
        .value::<Option<i64>>(
            "SELECT MIN(deadline) FROM waits WHERE state = 'armed' AND deadline IS NOT NULL AND interrupted_by IS NULL",
            p![],
        )?
        .flatten())
}

/// On a run's end (rule: `tb_core::session::end`), before its terminal status and event: the armed
/// wait resolves with winner `stop`; signals still buffered, turns not yet acknowledged, and their
/// queued receipts end `expired`. The caller holds the run's lock already (`finish_run`).
pub(crate) fn on_run_end(c: &dyn Db, run_id: &str, now: i64) -> StoreResult<()> {
    let snap = snapshot::load(c, run_id, None)?;
    let open = snapshot::open_turns(c, run_id)?;
    let w = with_ctx(now, |ctx| tb_core::session::end(&snap, &open, ctx));
    apply::apply(c, run_id, snap.counters, &w, None, now)?;
    Ok(())
}
