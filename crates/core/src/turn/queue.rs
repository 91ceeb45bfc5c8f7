//! The per-run turn queue a session's driver works through (DESIGN §2 turn): prompts enqueued as user
//! input, one turn claimed at a time under a lease, acknowledged with the claim it was handed.

use super::{prompt_content, TurnKind, TurnState};
use crate::run::RunStatus;
use crate::session::{live, Ctx, Op, Refusal, SessionEvent, SessionSnapshot, TurnContent, Writes};
use crate::wait::{step_into, Stepped};

/// A prompt to enqueue (the store's `NewPrompt`, borrowed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IncomingPrompt<'a> {
    /// Server-owned text.
    pub text: &'a str,
    /// Values the text refers to (untrusted), kept apart from it.
    pub variables: &'a serde_json::Value,
    /// Who it came from, for the system line (`binding pr-session`, `api`).
    pub from: &'a str,
    pub delivery_id: Option<&'a str>,
}

/// Enqueues a prompt as accepted user input (a `prompt` turn, framed by [`prompt_content`]), then runs
/// one wait step: the input interrupts an armed `wait_for_signal`, or races a `wait_for_any` that takes
/// user input. Returns the new turn's id with the writes. Errors: `Rejected(target_terminal)`.
pub fn enqueue(
    snap: &SessionSnapshot,
    p: &IncomingPrompt,
    ctx: &mut Ctx,
) -> Result<(String, Writes, Stepped), Refusal> {
    live(snap.status)?;
    let mut w = Writes::new(snap.counters);
    let content = prompt_content(p.text, p.variables, p.from);
    let id = w.turn(
        ctx,
        TurnKind::Prompt,
        TurnContent::Framed(content),
        p.delivery_id.map(Into::into),
        true,
    );
    let mut after = snap.clone();
    after.unseen_input.get_or_insert_with(|| id.clone());
    let stepped = step_into(&after, false, &mut w, ctx);
    Ok((id, w, stepped))
}

/// The head of the run's queue: its oldest turn that is `queued` or `leased` (lowest `seq`). Load it
/// `... WHERE run_id = ? AND state IN ('queued', 'leased') ORDER BY seq LIMIT 1` under the run's lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadTurn {
    pub id: String,
    pub state: TurnState,
    /// Unix ms.
    pub lease_until: Option<i64>,
    /// Times claimed so far.
    pub claims: u32,
}

/// What a claim gets.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// Nothing queued.
    Empty,
    /// The head is leased until `until` (Unix ms): turns go one at a time, so nothing is claimable.
    Held { turn_id: String, until: i64 },
    /// Lease the head (the op to apply); `claims` is the count the driver must acknowledge with
    /// (more than 1: redelivered after a lapsed lease).
    Lease {
        turn_id: String,
        claims: u32,
        op: Op,
    },
}

/// Claims the run's next turn in order (`POST .../turns:claim`): the head, if it is `queued` or its
/// lease has lapsed (`lease_until <= now`), is leased until `now + lease_ms` with `claims + 1`.
/// Errors: `Rejected(target_terminal)`.
pub fn claim(
    status: RunStatus,
    head: Option<&HeadTurn>,
    lease_ms: u64,
    now: i64,
) -> Result<Claim, Refusal> {
    live(status)?;
    let Some(h) = head else {
        return Ok(Claim::Empty);
    };
    if h.state == TurnState::Leased {
        if let Some(until) = h.lease_until.filter(|l| *l > now) {
            return Ok(Claim::Held {
                turn_id: h.id.clone(),
                until,
            });
        }
    }
    let claims = h.claims + 1;
    Ok(Claim::Lease {
        turn_id: h.id.clone(),
        claims,
        op: Op::LeaseTurn {
            id: h.id.clone(),
            lease_until: now + lease_ms as i64,
            claims,
        },
    })
}

/// The turn being acknowledged, as stored (load it by `(id, run_id)`; `NotFound` when absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AckedTurn {
    pub id: String,
    pub kind: TurnKind,
    pub state: TurnState,
    pub claims: u32,
    /// The delivery whose prompt or wake this turn carries.
    pub delivery_id: Option<String>,
}

/// Acknowledges a claimed turn with the `claim` count its claim returned: the turn is `acked`
/// (`tb.turn.acked`), its delivery consumed, and a wait it interrupted re-arms with its original
/// absolute deadline (status `waiting-external`, `tb.wait.resumed`) and steps at once. The snapshot's
/// `unseen_input` must not be this turn (load it excluding `id`). A lapsed lease not yet claimed again
/// can still be acknowledged.
/// Errors: `Rejected(target_terminal)`; `Conflict` when the turn is not leased, or leased under another
/// claim (claimed again after this claim's lease lapsed, or a wrong count).
pub fn ack(
    snap: &SessionSnapshot,
    turn: &AckedTurn,
    claim: u32,
    ctx: &mut Ctx,
) -> Result<(Writes, Stepped), Refusal> {
    live(snap.status)?;
    if turn.state == TurnState::Leased && turn.claims != claim {
        let why = if claim < turn.claims && claim > 0 {
            "it was claimed again after this claim's lease lapsed"
        } else {
            "pass the claims count the claim returned"
        };
        return Err(Refusal::Conflict(format!(
            "claim {claim} does not match this turn's current claim {}: {why}",
            turn.claims
        )));
    }
    if turn.state != TurnState::Leased {
        return Err(Refusal::Conflict(format!(
            "only a claimed turn can be acknowledged; this one is {}",
            turn.state.as_str()
        )));
    }
    let mut w = Writes::new(snap.counters);
    w.push(Op::AckTurn {
        id: turn.id.clone(),
        claims: claim,
    });
    w.event(SessionEvent::TurnAcked {
        turn_id: turn.id.clone(),
        kind: turn.kind,
    });
    if let Some(d) = &turn.delivery_id {
        w.push(Op::ConsumeDelivery {
            delivery_id: d.clone(),
        });
    }
    let mut after = snap.clone();
    if after.unseen_input.as_deref() == Some(turn.id.as_str()) {
        after.unseen_input = None;
    }
    let mut stepped = Stepped::default();
    if let Some(wait) = after
        .wait
        .as_mut()
        .filter(|x| x.interrupted_by.as_deref() == Some(turn.id.as_str()))
    {
        wait.interrupted_by = None;
        w.push(Op::ResumeWait {
            id: wait.id.clone(),
        });
        w.push(Op::SetStatus {
            status: RunStatus::WaitingExternal,
            reason: Some(wait.spec.reason.clone()),
        });
        w.event(SessionEvent::WaitResumed {
            wait_id: wait.id.clone(),
        });
        stepped = step_into(&after, false, &mut w, ctx);
    }
    Ok((w, stepped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use crate::session::testing::*;
    use crate::wait::WaitKind;
    use serde_json::{json, Value};

    fn head(state: TurnState, lease_until: Option<i64>, claims: u32) -> HeadTurn {
        HeadTurn {
            id: "turn_1".into(),
            state,
            lease_until,
            claims,
        }
    }

    #[test]
    fn claims_go_in_order_one_at_a_time() {
        let st = RunStatus::Running;
        assert_eq!(claim(st, None, 30_000, 5_000), Ok(Claim::Empty));
        assert_eq!(
            claim(st, Some(&head(TurnState::Queued, None, 0)), 30_000, 5_000),
            Ok(Claim::Lease {
                turn_id: "turn_1".into(),
                claims: 1,
                op: Op::LeaseTurn {
                    id: "turn_1".into(),
                    lease_until: 35_000,
                    claims: 1
                }
            })
        );
        assert_eq!(
            claim(
                st,
                Some(&head(TurnState::Leased, Some(5_001), 1)),
                30_000,
                5_000
            ),
            Ok(Claim::Held {
                turn_id: "turn_1".into(),
                until: 5_001
            })
        );
        // A lapsed lease (until <= now) is redelivered with claims + 1.
        assert!(matches!(
            claim(
                st,
                Some(&head(TurnState::Leased, Some(5_000), 1)),
                30_000,
                5_000
            ),
            Ok(Claim::Lease { claims: 2, .. })
        ));
        assert_eq!(
            claim(RunStatus::Completed, None, 30_000, 5_000)
                .unwrap_err()
                .code(),
            ErrorCode::TargetTerminal
        );
    }

    fn acked(state: TurnState, claims: u32, delivery: Option<&str>) -> AckedTurn {
        AckedTurn {
            id: "turn_1".into(),
            kind: TurnKind::Prompt,
            state,
            claims,
            delivery_id: delivery.map(Into::into),
        }
    }

    #[test]
    fn an_ack_needs_the_current_claim_of_a_leased_turn() {
        let s = snap();
        let (w, st) = with_ctx(5_000, |ctx| {
            ack(&s, &acked(TurnState::Leased, 2, Some("dlv_1")), 2, ctx)
        })
        .unwrap();
        assert_eq!(st, Stepped::default());
        assert_eq!(
            w.ops,
            vec![
                Op::AckTurn {
                    id: "turn_1".into(),
                    claims: 2
                },
                Op::Event {
                    seq: 10,
                    event: SessionEvent::TurnAcked {
                        turn_id: "turn_1".into(),
                        kind: TurnKind::Prompt
                    }
                },
                Op::ConsumeDelivery {
                    delivery_id: "dlv_1".into()
                }
            ]
        );
        let err = |t: AckedTurn, c: u32| with_ctx(5_000, |ctx| ack(&s, &t, c, ctx)).unwrap_err();
        assert_eq!(
            err(acked(TurnState::Leased, 2, None), 1),
            Refusal::Conflict("claim 1 does not match this turn's current claim 2: it was claimed again after this claim's lease lapsed".into())
        );
        assert_eq!(
            err(acked(TurnState::Leased, 2, None), 0),
            Refusal::Conflict("claim 0 does not match this turn's current claim 2: pass the claims count the claim returned".into())
        );
        assert_eq!(
            err(acked(TurnState::Leased, 2, None), 3),
            Refusal::Conflict("claim 3 does not match this turn's current claim 2: pass the claims count the claim returned".into())
        );
        assert_eq!(
            err(acked(TurnState::Acked, 1, None), 1),
            Refusal::Conflict("only a claimed turn can be acknowledged; this one is acked".into())
        );
        assert_eq!(
            err(acked(TurnState::Queued, 0, None), 0),
            Refusal::Conflict("only a claimed turn can be acknowledged; this one is queued".into())
        );
    }

    #[test]
    fn acking_the_interrupting_turn_rearms_the_wait_and_steps() {
        let mut s = snap();
        let mut wt = wait(WaitKind::Signal, &["x"], Some(60_000));
        wt.interrupted_by = Some("turn_1".into());
        s.wait = Some(wt);
        s.buffered = vec![buffered(1, "x", None)];
        let (w, st) = with_ctx(5_000, |ctx| {
            ack(&s, &acked(TurnState::Leased, 1, None), 1, ctx)
        })
        .unwrap();
        assert_eq!(
            w.ops[2..4],
            [
                Op::ResumeWait { id: "w1".into() },
                Op::SetStatus {
                    status: RunStatus::WaitingExternal,
                    reason: Some("waiting for CI".into())
                },
            ]
        );
        assert_eq!(
            events(&w),
            vec![
                (10, "tb.turn.acked"),
                (11, "tb.wait.resumed"),
                (12, "tb.signal.consumed"),
                (13, "tb.wait.resolved"),
                (14, "tb.turn.queued")
            ]
        );
        assert_eq!(st.consumed_signal, Some(1));
        // Another turn's ack leaves the interrupted wait alone.
        let other = AckedTurn {
            id: "turn_2".into(),
            ..acked(TurnState::Leased, 1, None)
        };
        let (w, _) = with_ctx(5_000, |ctx| ack(&s, &other, 1, ctx)).unwrap();
        assert_eq!(events(&w), vec![(10, "tb.turn.acked")]);
    }

    #[test]
    fn a_prompt_is_user_input_that_interrupts_a_signal_wait() {
        let mut s = snap();
        s.wait = Some(wait(WaitKind::Signal, &["x"], None));
        let p = IncomingPrompt {
            text: "Review {pr}",
            variables: &json!({"pr": 7}),
            from: "binding b",
            delivery_id: Some("dlv_2"),
        };
        let (id, w, st) = with_ctx(5_000, |ctx| enqueue(&s, &p, ctx)).unwrap();
        assert_eq!(id, "turn_n1");
        assert_eq!(st.wait_id.as_deref(), Some("w1"));
        match &w.ops[0] {
            Op::InsertTurn {
                id,
                seq,
                kind,
                content: TurnContent::Framed(c),
                delivery_id,
                user_input,
            } => {
                assert_eq!((id.as_str(), *seq, *kind), ("turn_n1", 3, TurnKind::Prompt));
                assert_eq!(c["prompt"], "Review {pr}");
                assert_eq!(c["untrusted"]["variables"], json!({"pr": 7}));
                assert_eq!(delivery_id.as_deref(), Some("dlv_2"));
                assert!(*user_input);
            }
            o => panic!("{o:?}"),
        }
        assert_eq!(
            events(&w),
            vec![(10, "tb.turn.queued"), (11, "tb.wait.interrupted")]
        );
        assert!(w.ops.contains(&Op::InterruptWait {
            id: "w1".into(),
            turn_id: "turn_n1".into()
        }));
        // An older unseen input is the candidate, not the new one.
        s.unseen_input = Some("turn_0".into());
        let (_, w, _) = with_ctx(5_000, |ctx| enqueue(&s, &p, ctx)).unwrap();
        assert!(w.ops.contains(&Op::InterruptWait {
            id: "w1".into(),
            turn_id: "turn_0".into()
        }));
        s.status = RunStatus::Cancelled;
        let p0 = IncomingPrompt {
            variables: &Value::Null,
            ..p
        };
        assert_eq!(
            with_ctx(5_000, |ctx| enqueue(&s, &p0, ctx))
                .unwrap_err()
                .code(),
            ErrorCode::TargetTerminal
        );
    }
}
