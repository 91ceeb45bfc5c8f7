//! Webhook effects on SQLite: a delivery's session start (with coalescing), signal or prompt, inside its
//! attempt's transaction.

use super::*;
use crate::p;
use crate::sql::{Db, Dialect};

/// Resolves a target to a run id. Errors: `Rejected(not_found)` "target_missing" when no live session
/// holds the key.
pub(super) fn target_run(c: &dyn Db, t: &Target) -> StoreResult<String> {
    let (workflow_id, key) = match t {
        Target::Run(r) => return Ok(r.clone()),
        Target::Session { workflow_id, key } => (workflow_id, key),
    };
    let held: Option<String> = c.row(
        "SELECT run_id FROM coalesce_keys WHERE workflow_id = ?1 AND key = ?2",
        p![workflow_id, key],
        |r| r.get(0),
    )?;
    if let Some(run) = held {
        return Ok(run);
    }
    // The session's own start may still be queued or in flight (an `opened` and a `synchronize`
    // arriving together): then the signal waits for it (a retryable refusal), never lost.
    // The coalesce key inside a delivery's JSON params: json_extract in SQLite, ->> in PostgreSQL.
    let sql = match c.dialect() {
        Dialect::Sqlite => "SELECT EXISTS (SELECT 1 FROM deliveries INDEXED BY deliveries_due WHERE state IN ('pending', 'retrying') \
             AND action = 'start_run' AND workflow_id = ?1 AND json_extract(params, '$.coalesceKey') = ?2)",
        Dialect::Postgres => "SELECT EXISTS (SELECT 1 FROM deliveries WHERE state IN ('pending', 'retrying') \
             AND action = 'start_run' AND workflow_id = ?1 AND params::jsonb ->> 'coalesceKey' = ?2)",
    };
    let starting: bool = c.value(sql, p![workflow_id, key])?.ok_or_else(no_row)?;
    Err(if starting {
        rejected(
            ErrorCode::Unavailable,
            "the target session is still starting",
        )
    } else {
        rejected(ErrorCode::NotFound, "no session holds this coalesce key")
    })
}

/// What an effect did: the run it started or targeted, whether a new run is to be written, and whether
/// its effect is consumed already.
pub(crate) struct EffectDone {
    pub run_id: String,
    pub start: bool,
    pub consumed: bool,
}

/// Performs a delivery's local effect (see [`Effect`]).
pub(crate) fn apply_effect(c: &dyn Db, e: &Effect, now: i64) -> StoreResult<EffectDone> {
    match e {
        Effect::StartSession { run, coalesce } => {
            if let Some(co) = coalesce {
                let held: Option<String> = c.row(
                    "SELECT run_id FROM coalesce_keys WHERE workflow_id = ?1 AND key = ?2",
                    p![co.workflow_id, co.key],
                    |r| r.get(0),
                )?;
                let live = match &held {
                    Some(r) => !read::get_run(c, r)?.status.is_terminal(),
                    None => false,
                };
                if let (true, Some(existing)) = (live, held) {
                    let consumed = match co.on_existing {
                        tb_core::binding::OnExisting::Noop => true,
                        tb_core::binding::OnExisting::Signal => {
                            let s = co.signal.as_ref().ok_or_else(|| {
                                rejected(
                                    ErrorCode::ValidationError,
                                    "on_existing = signal needs a signal name",
                                )
                            })?;
                            raise_signal(c, &existing, s, now)?;
                            false
                        }
                        tb_core::binding::OnExisting::Prompt => {
                            let p = co.prompt.as_ref().ok_or_else(|| {
                                rejected(
                                    ErrorCode::ValidationError,
                                    "on_existing = prompt needs a prompt",
                                )
                            })?;
                            enqueue_prompt(c, &existing, p, now)?;
                            false
                        }
                    };
                    return Ok(EffectDone {
                        run_id: existing,
                        start: false,
                        consumed,
                    });
                }
                // First event for the key, or the session holding it has ended: this run takes it.
                c.exec(
                    "INSERT INTO coalesce_keys (workflow_id, key, run_id, created_at) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT (workflow_id, key) DO UPDATE SET run_id = excluded.run_id, created_at = excluded.created_at", p![co.workflow_id, co.key, run.id, now])?;
            }
            Ok(EffectDone {
                run_id: run.id.clone(),
                start: true,
                consumed: true,
            })
        }
        Effect::RaiseSignal { target, signal } => {
            let run_id = target_run(c, target)?;
            let out = raise_signal(c, &run_id, signal, now)?;
            Ok(EffectDone {
                run_id,
                start: false,
                // A duplicate raise was consumed (or is buffered) under its first delivery.
                consumed: out.status == "duplicate",
            })
        }
        Effect::EnqueuePrompt { target, prompt } => {
            let run_id = target_run(c, target)?;
            enqueue_prompt(c, &run_id, prompt, now)?;
            Ok(EffectDone {
                run_id,
                start: false,
                consumed: false,
            })
        }
    }
}

/// Writes a new session run's start turn and its mailbox policy (after the run row exists).
pub(crate) fn start_session(
    c: &dyn Db,
    run_id: &str,
    content: &Value,
    mailbox: &MailboxPolicy,
    now: i64,
) -> StoreResult<()> {
    c.exec(
        "UPDATE runs SET mailbox = ?2 WHERE id = ?1",
        p![run_id, serde_json::to_string(mailbox).expect("json")],
    )?;
    insert_turn(c, run_id, TurnKind::Start, content, None, false, now)?;
    Ok(())
}
