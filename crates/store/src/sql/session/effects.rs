//! A delivery's local effect inside its attempt's transaction: a session start (with coalescing by
//! constraint, rule `tb_core::binding::coalesce` / `join`), a signal or a prompt aimed at a run or at the
//! session holding a coalesce key (rule `tb_core::binding::target`).

use super::*;
use crate::p;
use crate::sql::{Db, Dialect};
use tb_core::binding::{self, Holder, Join};

/// Resolves a target to a run id (rule: `tb_core::binding::target`): a fixed run, or the run holding
/// the `(workflow, key)` coalesce key. When no live session holds the key, whether a start for it is
/// pending is read first and the holder again after it (the rule's read order: a start committing
/// between the reads shows as the new live holder). Errors: `Rejected(unavailable)` while a session
/// start for the key is queued (a key never held, or one whose session ended), or while the delivery
/// accepted at `accepted_at` (Unix ms) is settling (`tb_core::binding::settling` at `now`);
/// `Rejected(not_found)` when no session holds the key.
pub(super) fn target_run(
    c: &dyn Db,
    t: &Target,
    accepted_at: i64,
    now: i64,
) -> StoreResult<String> {
    let (workflow_id, key) = match t {
        Target::Run(r) => return Ok(r.clone()),
        Target::Session { workflow_id, key } => (workflow_id, key),
    };
    let mut holder = key_holder(c, workflow_id, key)?;
    let mut pending = false;
    if binding::start_matters(holder.as_ref()) {
        pending = start_pending(c, workflow_id, key)?;
        holder = key_holder(c, workflow_id, key)?;
    }
    binding::target(
        holder.as_ref(),
        pending,
        binding::settling(accepted_at, now),
    )
    .map_err(refused)
}

/// The run holding coalesce key `(workflow_id, key)` and its status (unlocked: the rule that acts on
/// the run locks it next), `None` when no row holds the key.
fn key_holder(c: &dyn Db, workflow_id: &str, key: &str) -> StoreResult<Option<Holder>> {
    c.row(
        "SELECT k.run_id, r.status FROM coalesce_keys k JOIN runs r ON r.id = k.run_id \
         WHERE k.workflow_id = ?1 AND k.key = ?2",
        p![workflow_id, key],
        |r| {
            let status: String = r.get(1)?;
            Ok(Holder {
                run_id: r.get(0)?,
                status: tb_core::run::RunStatus::parse(&status)
                    .ok_or_else(|| read::bad("run status", &status))?,
            })
        },
    )
}

/// Whether a `start_run` delivery of `workflow_id` for coalesce key `key` is still `pending` or
/// `retrying`, leased or not (a lease keeps the state; the key inside the delivery's JSON params:
/// `json_extract` on SQLite, `->>` on PostgreSQL).
fn start_pending(c: &dyn Db, workflow_id: &str, key: &str) -> StoreResult<bool> {
    let sql = match c.dialect() {
        Dialect::Sqlite => "SELECT EXISTS (SELECT 1 FROM deliveries INDEXED BY deliveries_due WHERE state IN ('pending', 'retrying') \
             AND action = 'start_run' AND workflow_id = ?1 AND json_extract(params, '$.coalesceKey') = ?2)",
        Dialect::Postgres => "SELECT EXISTS (SELECT 1 FROM deliveries WHERE state IN ('pending', 'retrying') \
             AND action = 'start_run' AND workflow_id = ?1 AND params::jsonb ->> 'coalesceKey' = ?2)",
    };
    c.value(sql, p![workflow_id, key])?.ok_or_else(no_row)
}

/// What an effect did: the run it started or targeted, whether a new run is to be written, and whether
/// its effect is consumed already.
pub(crate) struct EffectDone {
    pub run_id: String,
    pub start: bool,
    pub consumed: bool,
}

/// Performs the local effect (see [`Effect`]) of a delivery accepted at `accepted_at` (Unix ms: a keyed
/// target's rule reads it). Errors: the refusals of the rules it applies (`Rejected`, `Conflict`);
/// `Retryable` when a coalesce take-over lost its compare-and-set.
pub(crate) fn apply_effect(
    c: &dyn Db,
    e: &Effect,
    accepted_at: i64,
    now: i64,
) -> StoreResult<EffectDone> {
    match e {
        Effect::StartSession { run, coalesce } => {
            if let Some(co) = coalesce {
                if let Some(existing) = claim_key(c, co, &run.id, now)? {
                    return join_existing(c, co, existing, now);
                }
            }
            Ok(EffectDone {
                run_id: run.id.clone(),
                start: true,
                consumed: true,
            })
        }
        Effect::RaiseSignal { target, signal } => {
            let run_id = target_run(c, target, accepted_at, now)?;
            let consumed = raise_for_delivery(c, &run_id, signal, now)?;
            Ok(EffectDone {
                run_id,
                start: false,
                consumed,
            })
        }
        Effect::EnqueuePrompt { target, prompt } => {
            let run_id = target_run(c, target, accepted_at, now)?;
            enqueue_prompt(c, &run_id, prompt, now)?;
            Ok(EffectDone {
                run_id,
                start: false,
                consumed: false,
            })
        }
    }
}

/// Claims the coalesce key for the new run `run_id` by constraint, or finds the live holder:
///
/// 1. `INSERT ... ON CONFLICT DO NOTHING RETURNING run_id`: a row back means the key is this run's
///    (`Coalesce::StartNew`); concurrent first events wait on the key's unique index, and all but one
///    find it taken;
/// 2. otherwise lock the key row (`FOR UPDATE`), then its run, and let `binding::coalesce` decide:
///    take over from an ended holder (compare-and-set on that holder: zero rows = another start took
///    it first, `Retryable`), or join the live one.
///
/// Returns the live holder to join, or `None` when the new run holds the key.
fn claim_key(c: &dyn Db, co: &Coalesce, run_id: &str, now: i64) -> StoreResult<Option<String>> {
    let claimed: Option<String> = c.value(
        "INSERT INTO coalesce_keys (workflow_id, key, run_id, created_at) VALUES (?1, ?2, ?3, ?4) \
         ON CONFLICT (workflow_id, key) DO NOTHING RETURNING run_id",
        p![co.workflow_id, co.key, run_id, now],
    )?;
    if claimed.is_some() {
        return Ok(None);
    }
    let held: String = c
        .value(
            &format!(
                "SELECT run_id FROM coalesce_keys WHERE workflow_id = ?1 AND key = ?2{}",
                c.dialect().for_update()
            ),
            p![co.workflow_id, co.key],
        )?
        .ok_or_else(|| StoreError::Retryable("the coalesce key's row is gone".into()))?;
    let status = snapshot::lock_head(c, &held)?.status;
    let holder = Holder {
        run_id: held,
        status,
    };
    match binding::coalesce(Some(&holder)) {
        binding::Coalesce::JoinExisting { run_id } => Ok(Some(run_id)),
        binding::Coalesce::TakeOver { from } => {
            let n = c.exec(
                "UPDATE coalesce_keys SET run_id = ?3, created_at = ?4 \
                 WHERE workflow_id = ?1 AND key = ?2 AND run_id = ?5",
                p![co.workflow_id, co.key, run_id, now, from],
            )?;
            if n == 0 {
                return Err(StoreError::Retryable(
                    "another start took the coalesce key over first".into(),
                ));
            }
            Ok(None)
        }
        binding::Coalesce::StartNew => Err(StoreError::Retryable(
            "the coalesce key has no holder".into(),
        )),
    }
}

/// A coalescing start that found a live session: no new run; `on_existing` on the holder
/// (rule: `tb_core::binding::join`).
fn join_existing(c: &dyn Db, co: &Coalesce, existing: String, now: i64) -> StoreResult<EffectDone> {
    let join =
        binding::join(co.on_existing, co.signal.is_some(), co.prompt.is_some()).map_err(refused)?;
    let consumed = match (join, &co.signal, &co.prompt) {
        (Join::RaiseSignal, Some(s), _) => raise_for_delivery(c, &existing, s, now)?,
        (Join::EnqueuePrompt, _, Some(p)) => {
            enqueue_prompt(c, &existing, p, now)?;
            false
        }
        (j, ..) => j.consumed(),
    };
    Ok(EffectDone {
        run_id: existing,
        start: false,
        consumed,
    })
}
