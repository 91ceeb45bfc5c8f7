//! Applying a session rule's `Writes` (`tb_core::session::Op`s in order, then the run's counters) in the
//! transaction that loaded its snapshot. Each op is one or two statements; nothing is decided here.
//! Updates that the rule fences (a turn's claim count, a signal or wait still open) check their row
//! count: zero rows means the row moved on under us, reported as `Retryable` so the whole transaction
//! runs again and the rule decides from what committed.

use super::*;
use tb_core::session::{losers_json, Counters, Op, TurnContent, Writes};
use tb_core::signal::{DataPlacement, SessionSignalV1};
use tb_core::turn;
use tb_core::wait::WinnerKind;

/// What applying the writes produced that the caller answers with.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    /// The envelope of the signal the writes buffered (`BufferSignal`), if any.
    pub envelope: Option<Value>,
    /// Its `seq`.
    pub buffered_seq: Option<u64>,
    /// The deliveries whose effect the writes consumed (`ConsumeDelivery`), in order.
    pub consumed: Vec<String>,
}

/// Applies `w` to run `run_id`, whose counters were `before` when its snapshot was loaded. `incoming`
/// is the signal a `BufferSignal` op inserts (the raise being applied). `now` is Unix ms.
/// Errors: a statement failed; `Retryable` when a fenced update matched no row; `Database` for ops that
/// need what was not given (a `BufferSignal` without `incoming`).
pub(super) fn apply(
    c: &dyn Db,
    run_id: &str,
    before: Counters,
    w: &Writes,
    incoming: Option<&NewSignal>,
    now: i64,
) -> StoreResult<Applied> {
    let mut out = Applied::default();
    for op in &w.ops {
        apply_op(c, run_id, op, incoming, now, &mut out)?;
    }
    // Every op that numbers something (a signal, a turn, an event) moves a counter: the run row is
    // written only then (a claim alone leaves it as it is).
    if w.counters != before {
        c.exec(
            "UPDATE runs SET next_signal_seq = ?2, next_turn_seq = ?3, next_sequence = ?4, updated_at = ?5 WHERE id = ?1",
            p![
                run_id,
                w.counters.next_signal_seq,
                w.counters.next_turn_seq,
                w.counters.next_event_seq,
                now
            ],
        )?;
    }
    Ok(out)
}

/// A fenced update must have changed exactly one row.
fn fenced(n: u64, what: &str) -> StoreResult<()> {
    if n == 0 {
        return Err(StoreError::Retryable(format!(
            "{what} changed under this transaction"
        )));
    }
    Ok(())
}

fn apply_op(
    c: &dyn Db,
    run_id: &str,
    op: &Op,
    incoming: Option<&NewSignal>,
    now: i64,
    out: &mut Applied,
) -> StoreResult<()> {
    match op {
        Op::BufferSignal { seq, delivery_id } => {
            let s = incoming.ok_or_else(|| {
                StoreError::Database("a BufferSignal op without the signal being raised".into())
            })?;
            let env = buffer_signal(c, run_id, *seq, s, delivery_id.as_deref(), now)?;
            out.envelope = Some(env);
            out.buffered_seq = Some(*seq);
        }
        Op::SettleSignal {
            seq,
            state,
            consumed_by,
        } => {
            let n = c.exec(
                "UPDATE signals SET state = ?3, consumed_by = ?4, settled_at = ?5 \
                 WHERE run_id = ?1 AND seq = ?2 AND state = 'buffered'",
                p![run_id, seq, state.as_str(), consumed_by, now],
            )?;
            fenced(n, "a buffered signal")?;
        }
        Op::ExpireReceipt { delivery_id } => {
            c.exec(
                "UPDATE receipts SET state = 'expired', updated_at = ?2 WHERE state = 'queued' \
                 AND id = (SELECT receipt_id FROM deliveries WHERE id = ?1)",
                p![delivery_id, now],
            )?;
        }
        Op::ConsumeDelivery { delivery_id } => {
            consume_delivery(c, delivery_id, now)?;
            out.consumed.push(delivery_id.clone());
        }
        Op::InsertTurn {
            id,
            seq,
            kind,
            content,
            delivery_id,
            user_input,
        } => {
            // A start turn stores only its configuration's reference; `turns::turn_row` renders it.
            let (content, config_ref) = match content {
                TurnContent::Framed(v) => (v.to_string(), None),
                TurnContent::Start { config_ref } => (String::new(), Some(config_ref.as_str())),
                TurnContent::SignalWake { signal_seq } => (
                    turn::signal_content(&signal_envelope(c, run_id, *signal_seq, out)?)
                        .to_string(),
                    None,
                ),
                TurnContent::WaitSettled { wait_id } => (
                    turn::wait_content(&wait_view(&get_wait(c, run_id, wait_id)?)).to_string(),
                    None,
                ),
            };
            c.exec(
                "INSERT INTO turns (id, run_id, seq, kind, content, state, delivery_id, user_input, created_at, config_ref) \
                 VALUES (?1, ?2, ?3, ?4, ?5, 'queued', ?6, ?7, ?8, ?9)",
                p![id, run_id, seq, kind.as_str(), content, delivery_id, user_input, now, config_ref],
            )?;
        }
        Op::LeaseTurn {
            id,
            lease_until,
            claims,
        } => {
            let n = c.exec(
                "UPDATE turns SET state = 'leased', lease_until = ?2, claims = ?3 \
                 WHERE id = ?1 AND claims = ?4 AND state IN ('queued', 'leased')",
                p![id, lease_until, claims, claims.saturating_sub(1)],
            )?;
            fenced(n, "the turn's claim")?;
        }
        Op::AckTurn { id, claims } => {
            let n = c.exec(
                "UPDATE turns SET state = 'acked', acked_at = ?2, lease_until = NULL \
                 WHERE id = ?1 AND claims = ?3 AND state = 'leased'",
                p![id, now, claims],
            )?;
            fenced(n, "the turn's claim")?;
        }
        Op::ExpireTurn { id } => {
            c.exec(
                "UPDATE turns SET state = 'expired', lease_until = NULL WHERE id = ?1",
                p![id],
            )?;
        }
        Op::MarkInputSeen { turn_id, wait_id } => {
            c.exec(
                "UPDATE turns SET seen_by = ?2 WHERE id = ?1",
                p![turn_id, wait_id],
            )?;
        }
        Op::InsertWait { id, spec, deadline } => {
            c.exec(
                "INSERT INTO waits (id, run_id, spec, deadline, state, created_at) VALUES (?1, ?2, ?3, ?4, 'armed', ?5)",
                p![id, run_id, serde_json::to_string(spec).expect("serializable"), deadline, now],
            )?;
        }
        Op::SettleWait {
            id,
            state,
            winner,
            losers,
            waited_ms,
        } => {
            let winner_json = match winner {
                Some(w) => {
                    let env = match w.signal_seq {
                        Some(seq) => Some(signal_envelope(c, run_id, seq, out)?),
                        None => None,
                    };
                    Some(w.to_json(env, rfc3339).to_string())
                }
                None => None,
            };
            let n = c.exec(
                "UPDATE waits SET state = ?2, winner = ?3, losers = ?4, settled_at = ?5, interrupted_by = NULL \
                 WHERE id = ?1 AND state = 'armed'",
                p![id, state.as_str(), winner_json, losers_json(losers).to_string(), now],
            )?;
            fenced(n, "the armed wait")?;
            if let (WaitState::Resolved, Some(w)) = (state, winner) {
                // Bounded labels only (DESIGN §11): the winner kind, never ids.
                let kind = match w.kind {
                    WinnerKind::Stop => "stop",
                    WinnerKind::UserInput => "user_input",
                    WinnerKind::Signal => "signal",
                    WinnerKind::Timer => "timer",
                };
                crate::after_commit::record(crate::after_commit::Fact::WaitResolved {
                    winner: kind,
                    waited_ms: *waited_ms,
                });
            }
        }
        Op::InterruptWait { id, turn_id } => {
            c.exec(
                "UPDATE waits SET interrupted_by = ?2 WHERE id = ?1",
                p![id, turn_id],
            )?;
        }
        Op::ResumeWait { id } => {
            c.exec(
                "UPDATE waits SET interrupted_by = NULL WHERE id = ?1",
                p![id],
            )?;
        }
        Op::SetStatus { status, reason } => {
            c.exec(
                "UPDATE runs SET status = ?2, wait_reason = ?3, updated_at = ?4 WHERE id = ?1",
                p![run_id, status.as_str(), reason, now],
            )?;
        }
        Op::Event { seq, event } => {
            super::super::log::insert_run_event(
                c,
                run_id,
                *seq,
                event.event_type(),
                &event.payload(rfc3339),
                None,
                now,
            )?;
        }
    }
    Ok(())
}

/// Inserts the raised signal `buffered` at `seq`: its data placed inline or, by reference, in a
/// `signal_payloads` row; its `SessionSignalV1` envelope raised at `now`. Returns the envelope.
fn buffer_signal(
    c: &dyn Db,
    run_id: &str,
    seq: u64,
    s: &NewSignal,
    delivery_id: Option<&str>,
    now: i64,
) -> StoreResult<Value> {
    let (data, payload_ref) = match &s.data {
        DataPlacement::None => (None, None),
        DataPlacement::Inline(v) => (Some(v.clone()), None),
        DataPlacement::Reference(bytes) => {
            let r = format!("sigp_{}", &new_id(IdKind::Signal)[4..]);
            c.exec(
                "INSERT INTO signal_payloads (ref, run_id, data, created_at) VALUES (?1, ?2, ?3, ?4)",
                p![r, run_id, bytes, now],
            )?;
            (None, Some(r))
        }
    };
    let env = serde_json::to_value(SessionSignalV1 {
        version: 1,
        signal_id: s.signal_id.clone(),
        name: s.name.clone(),
        source: s.source.clone(),
        raised_at: rfc3339(now),
        data,
        payload_ref,
        wake: s.wake,
    })
    .expect("serializable");
    c.exec(
        "INSERT INTO signals (run_id, seq, signal_id, name, envelope, state, delivery_id, raised_at) \
         VALUES (?1, ?2, ?3, ?4, ?5, 'buffered', ?6, ?7)",
        p![run_id, seq, s.signal_id, s.name, env.to_string(), delivery_id, now],
    )?;
    Ok(env)
}

/// The envelope of the run's signal at `seq`: the one just buffered by these writes, else the stored one.
fn signal_envelope(c: &dyn Db, run_id: &str, seq: u64, out: &Applied) -> StoreResult<Value> {
    if let (Some(env), Some(at)) = (&out.envelope, out.buffered_seq) {
        if at == seq {
            return Ok(env.clone());
        }
    }
    let env: String = c
        .value(
            "SELECT envelope FROM signals WHERE run_id = ?1 AND seq = ?2",
            p![run_id, seq],
        )?
        .ok_or_else(no_row)?;
    Ok(read::json(env))
}
