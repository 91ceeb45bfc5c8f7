//! Arming, cancelling and stepping a run's wait over a [`SessionSnapshot`] (DESIGN §4 Wait). Which
//! candidate wins is [`resolve`](super::resolve); this module gathers the candidates from the snapshot
//! and turns the resolution into writes.

use super::{resolve, Candidates, Resolution, WaitSpec, WaitState, WinnerKind};
use crate::run::RunStatus;
use crate::session::{
    live, CancelReason, Counters, Ctx, Op, Refusal, SessionEvent, SessionSnapshot, TurnContent,
    Winner, Writes,
};
use crate::signal::SignalState;
use crate::turn::TurnKind;

/// What one resolution step did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Stepped {
    /// The wait it resolved or interrupted (`None`: nothing armed, or it stays armed).
    pub wait_id: Option<String>,
    /// The `seq` of the signal the wait consumed, when a signal won.
    pub consumed_signal: Option<u64>,
}

/// One resolution step of the run's armed wait (signals-and-connectors §5.4, §5.5): the candidates are
/// `stop` (the run is ending), the snapshot's unseen user input, its oldest buffered signal whose name
/// the wait takes, and the deadline when it is `<= now`; [`resolve`] picks the winner. Writes, in order:
///
/// - interrupt: input marked seen, `interrupted_by`, status `running`, `tb.wait.interrupted`;
/// - a signal winner: signal `consumed` by the wait, `tb.signal.consumed`, its delivery consumed;
/// - an input winner: input marked seen;
/// - any winner: wait `resolved` with winner and losers, `tb.wait.resolved` / `tb.wait.timeout`; unless
///   the winner is stop: status `running` and a `wait` turn (with `tb.turn.queued`).
///
/// Backends call it after each change that can make a candidate visible (the other rules here already
/// do), and for a due timer (`fire_timers`: waits `armed`, deadline `<= now`, not interrupted).
pub fn step(snap: &SessionSnapshot, stop: bool, ctx: &mut Ctx) -> (Writes, Stepped) {
    let mut w = Writes::new(snap.counters);
    let s = step_into(snap, stop, &mut w, ctx);
    (w, s)
}

/// [`step`] appending to `w` (whose counters continue from earlier ops of the same rule).
pub(crate) fn step_into(
    snap: &SessionSnapshot,
    stop: bool,
    w: &mut Writes,
    ctx: &mut Ctx,
) -> Stepped {
    let Some(wait) = &snap.wait else {
        return Stepped::default();
    };
    let signal = snap.buffered.iter().find(|s| wait.spec.takes(&s.name));
    let cand = Candidates {
        stop,
        user_input: snap.unseen_input.is_some(),
        signal: signal.is_some(),
        timer: wait.deadline.is_some_and(|d| d <= ctx.now),
    };
    let res = resolve(
        wait.spec.kind,
        wait.spec.user_input,
        wait.interrupted_by.is_some(),
        cand,
    );
    let mut done = Stepped {
        wait_id: Some(wait.id.clone()),
        consumed_signal: None,
    };
    match res {
        Resolution::Stay => return Stepped::default(),
        Resolution::Interrupt => {
            let turn = snap.unseen_input.clone().expect("interrupt implies input");
            w.push(Op::MarkInputSeen {
                turn_id: turn.clone(),
                wait_id: wait.id.clone(),
            });
            w.push(Op::InterruptWait {
                id: wait.id.clone(),
                turn_id: turn.clone(),
            });
            w.push(Op::SetStatus {
                status: RunStatus::Running,
                reason: None,
            });
            w.event(SessionEvent::WaitInterrupted {
                wait_id: wait.id.clone(),
                turn_id: turn,
            });
        }
        Resolution::Resolve { winner, losers } => {
            let mut win = Winner {
                kind: winner,
                signal_seq: None,
                turn_id: None,
                deadline: None,
            };
            match winner {
                WinnerKind::Signal => {
                    let s = signal.expect("signal winner");
                    w.push(Op::SettleSignal {
                        seq: s.seq,
                        state: SignalState::Consumed,
                        consumed_by: Some(wait.id.clone()),
                    });
                    w.event(SessionEvent::SignalConsumed {
                        signal_id: s.signal_id.clone(),
                        name: s.name.clone(),
                        seq: s.seq,
                        wait_id: wait.id.clone(),
                    });
                    if let Some(d) = &s.delivery_id {
                        w.push(Op::ConsumeDelivery {
                            delivery_id: d.clone(),
                        });
                    }
                    win.signal_seq = Some(s.seq);
                    done.consumed_signal = Some(s.seq);
                }
                WinnerKind::UserInput => {
                    let turn = snap.unseen_input.clone().expect("input winner");
                    w.push(Op::MarkInputSeen {
                        turn_id: turn.clone(),
                        wait_id: wait.id.clone(),
                    });
                    win.turn_id = Some(turn);
                }
                WinnerKind::Timer => win.deadline = wait.deadline,
                WinnerKind::Stop => {}
            }
            w.push(Op::SettleWait {
                id: wait.id.clone(),
                state: WaitState::Resolved,
                winner: Some(win),
                losers: losers.clone(),
                waited_ms: (ctx.now - wait.created_at).max(0),
            });
            w.event(SessionEvent::WaitResolved {
                wait_id: wait.id.clone(),
                winner,
                losers,
            });
            if winner != WinnerKind::Stop {
                w.push(Op::SetStatus {
                    status: RunStatus::Running,
                    reason: None,
                });
                w.turn(
                    ctx,
                    TurnKind::Wait,
                    TurnContent::WaitSettled {
                        wait_id: wait.id.clone(),
                    },
                    None,
                    false,
                );
            }
        }
    }
    done
}

/// Arms a wait (`POST /v1/runs/{runId}/waits`; `spec` already validated by [`WaitSpec::validate`]),
/// replacing an armed one, with the absolute deadline `now + timeoutMs`, then runs one [`step`] at once:
/// a buffered match (oldest first), unseen user input or a deadline already past resolves it
/// immediately. Writes: the old wait `cancelled` + `tb.wait.cancelled{replaced}`; the new wait; status
/// `waiting-external` with the spec's reason; `tb.wait.started`; the step's writes.
/// Errors: `Rejected(target_terminal)`.
pub fn arm(
    snap: &SessionSnapshot,
    wait_id: &str,
    spec: &WaitSpec,
    ctx: &mut Ctx,
) -> Result<(Writes, Stepped), Refusal> {
    live(snap.status)?;
    let mut w = Writes::new(snap.counters);
    if let Some(old) = &snap.wait {
        settle_cancelled(&mut w, &old.id, CancelReason::Replaced);
    }
    let deadline = spec.timeout_ms.map(|t| ctx.now + t as i64);
    w.push(Op::InsertWait {
        id: wait_id.into(),
        spec: spec.clone(),
        deadline,
    });
    w.push(Op::SetStatus {
        status: RunStatus::WaitingExternal,
        reason: Some(spec.reason.clone()),
    });
    w.event(SessionEvent::WaitStarted {
        wait_id: wait_id.into(),
        kind: spec.kind,
        names: spec.names.clone(),
        deadline,
    });
    let mut after = snap.clone();
    after.wait = Some(crate::session::ArmedWait {
        id: wait_id.into(),
        spec: spec.clone(),
        deadline,
        interrupted_by: None,
        created_at: ctx.now,
    });
    let stepped = step_into(&after, false, &mut w, ctx);
    Ok((w, stepped))
}

/// Cancels a wait (the driver's `{action: "cancel"}`): `cancelled`, `tb.wait.cancelled{cancelled}`,
/// status `running`. `state` is the wait's stored state (load it `FOR UPDATE` with the run row).
/// Errors: `Conflict` `"the wait is already <state>"` when it is no longer armed.
pub fn cancel(counters: Counters, wait_id: &str, state: WaitState) -> Result<Writes, Refusal> {
    if state != WaitState::Armed {
        return Err(Refusal::Conflict(format!(
            "the wait is already {}",
            state.as_str()
        )));
    }
    let mut w = Writes::new(counters);
    settle_cancelled(&mut w, wait_id, CancelReason::Cancelled);
    w.push(Op::SetStatus {
        status: RunStatus::Running,
        reason: None,
    });
    Ok(w)
}

fn settle_cancelled(w: &mut Writes, wait_id: &str, reason: CancelReason) {
    w.push(Op::SettleWait {
        id: wait_id.into(),
        state: WaitState::Cancelled,
        winner: None,
        losers: Vec::new(),
        waited_ms: 0,
    });
    w.event(SessionEvent::WaitCancelled {
        wait_id: wait_id.into(),
        reason,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use crate::session::testing::*;
    use crate::wait::{Disposition, WaitKind};

    #[test]
    fn nothing_armed_means_no_writes() {
        let (w, s) = with_ctx(5_000, |ctx| step(&snap(), true, ctx));
        assert!(w.is_empty());
        assert_eq!(s, Stepped::default());
        assert_eq!(w.counters, snap().counters);
    }

    #[test]
    fn an_unmatched_wait_stays() {
        let mut s = snap();
        s.wait = Some(wait(WaitKind::Signal, &["pr.closed"], Some(9_000)));
        s.buffered = vec![buffered(2, "pr.opened", None)];
        let (w, st) = with_ctx(5_000, |ctx| step(&s, false, ctx));
        assert!(w.is_empty());
        assert_eq!(st.wait_id, None);
    }

    #[test]
    fn the_oldest_matching_signal_wins_and_is_consumed() {
        let mut s = snap();
        s.wait = Some(wait(
            WaitKind::Any,
            &["pr.closed", "pr.merged"],
            Some(9_000),
        ));
        s.buffered = vec![
            buffered(2, "pr.opened", None),
            buffered(3, "pr.merged", Some("dlv_3")),
            buffered(4, "pr.closed", None),
        ];
        let (w, st) = with_ctx(5_000, |ctx| step(&s, false, ctx));
        assert_eq!(
            st,
            Stepped {
                wait_id: Some("w1".into()),
                consumed_signal: Some(3)
            }
        );
        assert_eq!(
            w.ops[..3],
            [
                Op::SettleSignal {
                    seq: 3,
                    state: SignalState::Consumed,
                    consumed_by: Some("w1".into())
                },
                Op::Event {
                    seq: 10,
                    event: SessionEvent::SignalConsumed {
                        signal_id: "sig3".into(),
                        name: "pr.merged".into(),
                        seq: 3,
                        wait_id: "w1".into()
                    }
                },
                Op::ConsumeDelivery {
                    delivery_id: "dlv_3".into()
                },
            ]
        );
        assert_eq!(
            w.ops[3],
            Op::SettleWait {
                id: "w1".into(),
                state: WaitState::Resolved,
                winner: Some(Winner {
                    kind: WinnerKind::Signal,
                    signal_seq: Some(3),
                    turn_id: None,
                    deadline: None
                }),
                losers: vec![],
                waited_ms: 4_000
            }
        );
        assert_eq!(
            events(&w),
            vec![
                (10, "tb.signal.consumed"),
                (11, "tb.wait.resolved"),
                (12, "tb.turn.queued")
            ]
        );
        assert!(w.ops.contains(&Op::InsertTurn {
            id: "turn_n1".into(),
            seq: 3,
            kind: TurnKind::Wait,
            content: TurnContent::WaitSettled {
                wait_id: "w1".into()
            },
            delivery_id: None,
            user_input: false
        }));
        assert!(w.ops.contains(&Op::SetStatus {
            status: RunStatus::Running,
            reason: None
        }));
        assert_eq!(w.counters.next_turn_seq, 4);
    }

    #[test]
    fn a_passed_deadline_times_out_at_the_deadline_not_before() {
        let mut s = snap();
        s.wait = Some(wait(WaitKind::Signal, &["x"], Some(9_000)));
        let (w, _) = with_ctx(8_999, |ctx| step(&s, false, ctx));
        assert!(w.is_empty());
        let (w, st) = with_ctx(9_000, |ctx| step(&s, false, ctx));
        assert_eq!(st.wait_id.as_deref(), Some("w1"));
        assert_eq!(events(&w)[0], (10, "tb.wait.timeout"));
        assert!(matches!(
            &w.ops[0],
            Op::SettleWait {
                winner: Some(Winner {
                    kind: WinnerKind::Timer,
                    deadline: Some(9_000),
                    ..
                }),
                waited_ms: 8_000,
                ..
            }
        ));
    }

    #[test]
    fn stop_wins_and_queues_no_turn() {
        let mut s = snap();
        s.wait = Some(wait(WaitKind::Any, &["x"], Some(2_000)));
        s.buffered = vec![buffered(1, "x", Some("dlv_1"))];
        let (w, st) = with_ctx(5_000, |ctx| step(&s, true, ctx));
        assert_eq!(st.consumed_signal, None);
        assert_eq!(
            w.ops,
            vec![
                Op::SettleWait {
                    id: "w1".into(),
                    state: WaitState::Resolved,
                    winner: Some(Winner {
                        kind: WinnerKind::Stop,
                        signal_seq: None,
                        turn_id: None,
                        deadline: None
                    }),
                    losers: vec![
                        (WinnerKind::Signal, Disposition::LeftBuffered),
                        (WinnerKind::Timer, Disposition::Tombstoned)
                    ],
                    waited_ms: 4_000
                },
                Op::Event {
                    seq: 10,
                    event: SessionEvent::WaitResolved {
                        wait_id: "w1".into(),
                        winner: WinnerKind::Stop,
                        losers: vec![
                            (WinnerKind::Signal, Disposition::LeftBuffered),
                            (WinnerKind::Timer, Disposition::Tombstoned)
                        ]
                    }
                }
            ]
        );
    }

    #[test]
    fn user_input_interrupts_a_signal_wait() {
        let mut s = snap();
        s.wait = Some(wait(WaitKind::Signal, &["x"], None));
        s.unseen_input = Some("turn_7".into());
        let (w, st) = with_ctx(5_000, |ctx| step(&s, false, ctx));
        assert_eq!(st.wait_id.as_deref(), Some("w1"));
        assert_eq!(
            w.ops,
            vec![
                Op::MarkInputSeen {
                    turn_id: "turn_7".into(),
                    wait_id: "w1".into()
                },
                Op::InterruptWait {
                    id: "w1".into(),
                    turn_id: "turn_7".into()
                },
                Op::SetStatus {
                    status: RunStatus::Running,
                    reason: None
                },
                Op::Event {
                    seq: 10,
                    event: SessionEvent::WaitInterrupted {
                        wait_id: "w1".into(),
                        turn_id: "turn_7".into()
                    }
                }
            ]
        );
        // While interrupted, a matching signal does not resolve it.
        s.wait.as_mut().unwrap().interrupted_by = Some("turn_7".into());
        s.unseen_input = None;
        s.buffered = vec![buffered(1, "x", None)];
        assert!(with_ctx(5_000, |ctx| step(&s, false, ctx)).0.is_empty());
    }

    #[test]
    fn user_input_wins_an_any_wait() {
        let mut s = snap();
        s.wait = Some(wait(WaitKind::Any, &["x"], None));
        s.unseen_input = Some("turn_7".into());
        let (w, _) = with_ctx(5_000, |ctx| step(&s, false, ctx));
        assert_eq!(
            w.ops[0],
            Op::MarkInputSeen {
                turn_id: "turn_7".into(),
                wait_id: "w1".into()
            }
        );
        assert!(matches!(
            &w.ops[1],
            Op::SettleWait { winner: Some(Winner { kind: WinnerKind::UserInput, turn_id: Some(t), .. }), .. } if t == "turn_7"
        ));
    }

    #[test]
    fn arming_replaces_the_armed_wait_and_resolves_at_once_on_a_buffered_match() {
        let mut s = snap();
        s.wait = Some(wait(WaitKind::Any, &["old"], None));
        s.buffered = vec![buffered(1, "pr.closed", None)];
        let spec = WaitSpec {
            kind: WaitKind::Signal,
            names: vec!["pr.closed".into()],
            timeout_ms: Some(60_000),
            user_input: false,
            reason: "waiting for the merge".into(),
        };
        let (w, st) = with_ctx(5_000, |ctx| arm(&s, "w2", &spec, ctx)).unwrap();
        assert_eq!(
            w.ops[..4],
            [
                Op::SettleWait {
                    id: "w1".into(),
                    state: WaitState::Cancelled,
                    winner: None,
                    losers: vec![],
                    waited_ms: 0
                },
                Op::Event {
                    seq: 10,
                    event: SessionEvent::WaitCancelled {
                        wait_id: "w1".into(),
                        reason: CancelReason::Replaced
                    }
                },
                Op::InsertWait {
                    id: "w2".into(),
                    spec: spec.clone(),
                    deadline: Some(65_000)
                },
                Op::SetStatus {
                    status: RunStatus::WaitingExternal,
                    reason: Some("waiting for the merge".into())
                },
            ]
        );
        assert_eq!(
            events(&w),
            vec![
                (10, "tb.wait.cancelled"),
                (11, "tb.wait.started"),
                (12, "tb.signal.consumed"),
                (13, "tb.wait.resolved"),
                (14, "tb.turn.queued")
            ]
        );
        assert_eq!(
            st,
            Stepped {
                wait_id: Some("w2".into()),
                consumed_signal: Some(1)
            }
        );
        // Without a match it stays armed: only the three arming writes and the started event.
        let mut quiet = snap();
        quiet.buffered.clear();
        let (w, st) = with_ctx(5_000, |ctx| arm(&quiet, "w2", &spec, ctx)).unwrap();
        assert_eq!(w.ops.len(), 3);
        assert_eq!(st.wait_id, None);
        quiet.status = RunStatus::Completed;
        assert_eq!(
            with_ctx(5_000, |ctx| arm(&quiet, "w2", &spec, ctx))
                .unwrap_err()
                .code(),
            ErrorCode::TargetTerminal
        );
    }

    #[test]
    fn cancelling_needs_an_armed_wait() {
        let w = cancel(snap().counters, "w1", WaitState::Armed).unwrap();
        assert_eq!(events(&w), vec![(10, "tb.wait.cancelled")]);
        assert_eq!(
            w.ops[2],
            Op::SetStatus {
                status: RunStatus::Running,
                reason: None
            }
        );
        assert_eq!(
            cancel(snap().counters, "w1", WaitState::Resolved),
            Err(Refusal::Conflict("the wait is already resolved".into()))
        );
    }
}
