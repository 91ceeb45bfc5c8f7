//! What a session run's end expires (DESIGN §4 Wait, §5.3 "nothing silently dropped").

use super::{Ctx, Op, SessionSnapshot, Writes};
use crate::signal::SignalState;
use crate::wait::step_into;

/// A turn not yet acknowledged (`queued` or `leased`): load `turns WHERE run_id = ? AND state IN
/// ('queued', 'leased')` under the run's lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenTurn {
    pub id: String,
    pub delivery_id: Option<String>,
}

/// On a run's end (`finish_run`, before its terminal status and event; the transition itself is the
/// run rule's): the armed wait resolves with winner `stop` (a wait step with `stop`); the signals still
/// buffered and the turns not yet acknowledged can never be consumed now: each is `expired`, and so is
/// the receipt of each one's delivery while it is `queued`. Writes, in order: the step's; the receipts;
/// the signals; the turns.
pub fn end(snap: &SessionSnapshot, open_turns: &[OpenTurn], ctx: &mut Ctx) -> Writes {
    let mut w = Writes::new(snap.counters);
    step_into(snap, true, &mut w, ctx);
    let deliveries = snap
        .buffered
        .iter()
        .filter_map(|s| s.delivery_id.as_ref())
        .chain(open_turns.iter().filter_map(|t| t.delivery_id.as_ref()));
    for d in deliveries {
        w.push(Op::ExpireReceipt {
            delivery_id: d.clone(),
        });
    }
    for s in &snap.buffered {
        w.push(Op::SettleSignal {
            seq: s.seq,
            state: SignalState::Expired,
            consumed_by: None,
        });
    }
    for t in open_turns {
        w.push(Op::ExpireTurn { id: t.id.clone() });
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::testing::*;
    use crate::session::{SessionEvent, Winner};
    use crate::wait::{Disposition, WaitKind, WaitState, WinnerKind};

    #[test]
    fn the_end_stops_the_wait_and_expires_what_is_left() {
        let mut s = snap();
        s.wait = Some(wait(WaitKind::Signal, &["x"], None));
        s.buffered = vec![buffered(1, "x", Some("dlv_1")), buffered(2, "y", None)];
        let open = [
            OpenTurn {
                id: "turn_4".into(),
                delivery_id: Some("dlv_4".into()),
            },
            OpenTurn {
                id: "turn_5".into(),
                delivery_id: None,
            },
        ];
        let w = with_ctx(5_000, |ctx| end(&s, &open, ctx));
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
                    losers: vec![(WinnerKind::Signal, Disposition::LeftBuffered)],
                    waited_ms: 4_000
                },
                Op::Event {
                    seq: 10,
                    event: SessionEvent::WaitResolved {
                        wait_id: "w1".into(),
                        winner: WinnerKind::Stop,
                        losers: vec![(WinnerKind::Signal, Disposition::LeftBuffered)]
                    }
                },
                Op::ExpireReceipt {
                    delivery_id: "dlv_1".into()
                },
                Op::ExpireReceipt {
                    delivery_id: "dlv_4".into()
                },
                Op::SettleSignal {
                    seq: 1,
                    state: SignalState::Expired,
                    consumed_by: None
                },
                Op::SettleSignal {
                    seq: 2,
                    state: SignalState::Expired,
                    consumed_by: None
                },
                Op::ExpireTurn {
                    id: "turn_4".into()
                },
                Op::ExpireTurn {
                    id: "turn_5".into()
                },
            ]
        );
        assert_eq!(w.counters.next_event_seq, 11);
        assert_eq!(w.counters.next_turn_seq, 3, "a stopped wait queues no turn");
    }

    #[test]
    fn an_idle_run_ends_with_nothing_to_write() {
        let w = with_ctx(5_000, |ctx| end(&snap(), &[], ctx));
        assert!(w.is_empty());
    }
}
