//! Raising a signal on a run (signals-and-connectors §5.2; DESIGN §5.8) over a [`SessionSnapshot`]:
//! duplicate suppression by `signalId`, mailbox admission by [`admit`](super::admit), FIFO sequencing
//! from the run's counter, the wake turn, and the wait step the new signal may trigger.

use super::{admit, Admit, DataPlacement, SourceKind};
use crate::error::ErrorCode;
use crate::session::{live, Ctx, Op, Refusal, SessionEvent, SessionSnapshot, TurnContent, Writes};
use crate::turn::TurnKind;
use crate::wait::step_into;

/// State of a signal in the mailbox: `buffered` until a wait consumes it, or `dropped` (overflow,
/// `drop_oldest`), or `expired` (the run ended first). Only `buffered` counts toward the bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalState {
    Buffered,
    Consumed,
    Dropped,
    Expired,
}

impl SignalState {
    /// Wire and column string.
    pub fn as_str(self) -> &'static str {
        match self {
            SignalState::Buffered => "buffered",
            SignalState::Consumed => "consumed",
            SignalState::Dropped => "dropped",
            SignalState::Expired => "expired",
        }
    }
    /// Parses the wire string.
    pub fn parse(s: &str) -> Option<Self> {
        use SignalState::*;
        [Buffered, Consumed, Dropped, Expired]
            .into_iter()
            .find(|x| x.as_str() == s)
    }
}

/// The signal being raised (the store's `NewSignal`, borrowed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IncomingSignal<'a> {
    pub signal_id: &'a str,
    pub name: &'a str,
    /// `source.kind`, stamped by the server.
    pub source: SourceKind,
    /// Where its data goes ([`super::place_data`]); compared with a first signal of the same id.
    pub data: &'a DataPlacement,
    pub wake: bool,
    /// The webhook delivery raising it, if any.
    pub delivery_id: Option<&'a str>,
}

/// The signal already stored on the run under the same `signalId` (load it by `(run_id, signal_id)`):
/// its name and its data as a placement: `Inline(data)`, `Reference(bytes of its payloadRef)` or `None`.
#[derive(Debug, Clone, PartialEq)]
pub struct FirstSignal {
    pub name: String,
    pub data: DataPlacement,
}

/// Queued or suppressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaiseStatus {
    /// Buffered at this `seq` (arrival order, from the run's `next_signal_seq`).
    Queued { seq: u64 },
    /// The `signalId` was seen before on this run with the same name and data: answered with the first
    /// signal's envelope, nothing buffered.
    Duplicate,
}

/// What [`raise`] decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Raised {
    pub status: RaiseStatus,
    /// `signalId`s dropped to make room (`drop_oldest`), oldest first.
    pub dropped: Vec<String>,
    /// The wait that consumed the new signal at once, if any.
    pub consumed_by: Option<String>,
    pub writes: Writes,
}

impl Raised {
    /// Whether the raising delivery's effect is consumed already: only a duplicate is (it was consumed,
    /// or is still buffered, under its first delivery); a queued signal is consumed when a wait takes it.
    pub fn settles_delivery(&self) -> bool {
        self.status == RaiseStatus::Duplicate
    }
}

/// Raises `sig` on the snapshot's run (every path: API, webhook delivery, capability URL). In order:
///
/// 1. the run must be live;
/// 2. a `first` signal with the same id: the same name and data make a duplicate (`tb.signal.duplicate`
///    only), different ones a conflict;
/// 3. the mailbox admits by its policy ([`admit`] over the number buffered): room buffers; full with
///    `reject` refuses; full with `drop_oldest` drops the oldest (each `dropped`, `tb.signal.dropped`,
///    its receipt `expired`);
/// 4. the signal is buffered at `next_signal_seq` (`tb.signal.buffered`), with a `signal` wake turn
///    when `wake`;
/// 5. one wait [`step`](crate::wait::step) over the mailbox as it is now.
///
/// Errors: `Rejected(target_terminal)`; `Conflict` (same id, different signal);
/// `Rejected(signal_buffer_full)` (full mailbox, `reject`: 429 to an API caller, a retry for a webhook).
pub fn raise(
    snap: &SessionSnapshot,
    sig: &IncomingSignal,
    first: Option<&FirstSignal>,
    ctx: &mut Ctx,
) -> Result<Raised, Refusal> {
    live(snap.status)?;
    let mut w = Writes::new(snap.counters);
    if let Some(first) = first {
        if first.name != sig.name || first.data != *sig.data {
            return Err(Refusal::Conflict(
                "this signalId was already used on this run for a different signal (name or data)"
                    .into(),
            ));
        }
        w.event(SessionEvent::SignalDuplicate {
            signal_id: sig.signal_id.into(),
            name: sig.name.into(),
        });
        return Ok(Raised {
            status: RaiseStatus::Duplicate,
            dropped: Vec::new(),
            consumed_by: None,
            writes: w,
        });
    }
    let held = snap.buffered.len();
    let drop = match admit(snap.mailbox, held as u32) {
        Admit::Buffer => 0,
        Admit::Reject => {
            return Err(Refusal::rejected(
                ErrorCode::SignalBufferFull,
                format!("the run's signal mailbox is full ({held} buffered) and its overflow policy is reject; retry after it drains"),
            ))
        }
        Admit::DropOldest(n) => (n as usize).min(held),
    };
    let mut after = snap.clone();
    let mut dropped = Vec::new();
    for s in after.buffered.drain(..drop) {
        w.push(Op::SettleSignal {
            seq: s.seq,
            state: SignalState::Dropped,
            consumed_by: None,
        });
        w.event(SessionEvent::SignalDropped {
            signal_id: s.signal_id.clone(),
            name: s.name.clone(),
            seq: s.seq,
        });
        if let Some(d) = s.delivery_id {
            w.push(Op::ExpireReceipt { delivery_id: d });
        }
        dropped.push(s.signal_id);
    }
    let seq = w.signal_seq();
    w.push(Op::BufferSignal {
        seq,
        delivery_id: sig.delivery_id.map(Into::into),
    });
    w.event(SessionEvent::SignalBuffered {
        signal_id: sig.signal_id.into(),
        name: sig.name.into(),
        seq,
        source: sig.source,
        wake: sig.wake,
    });
    if sig.wake {
        w.turn(
            ctx,
            TurnKind::Signal,
            TurnContent::SignalWake { signal_seq: seq },
            sig.delivery_id.map(Into::into),
            false,
        );
    }
    after.buffered.push(crate::session::BufferedSignal {
        seq,
        signal_id: sig.signal_id.into(),
        name: sig.name.into(),
        delivery_id: sig.delivery_id.map(Into::into),
    });
    let stepped = step_into(&after, false, &mut w, ctx);
    let consumed_by = stepped
        .wait_id
        .filter(|_| stepped.consumed_signal == Some(seq));
    Ok(Raised {
        status: RaiseStatus::Queued { seq },
        dropped,
        consumed_by,
        writes: w,
    })
}

/// The `outcome` label of `tb_signals_total{outcome, source}` for a raise's result (`Err`: the code of
/// whatever refused it, including a `not_found` run): `queued`, `queued_with_drop`, `duplicate`,
/// `rejected_full` or `refused`.
pub fn outcome_label(r: Result<&Raised, ErrorCode>) -> &'static str {
    match r {
        Ok(r) if r.status == RaiseStatus::Duplicate => "duplicate",
        Ok(r) if !r.dropped.is_empty() => "queued_with_drop",
        Ok(_) => "queued",
        Err(ErrorCode::SignalBufferFull) => "rejected_full",
        Err(_) => "refused",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::RunStatus;
    use crate::session::testing::*;
    use crate::signal::Overflow;
    use crate::wait::WaitKind;
    use serde_json::json;

    const NONE: DataPlacement = DataPlacement::None;

    fn sig<'a>(
        id: &'a str,
        name: &'a str,
        data: &'a DataPlacement,
        wake: bool,
    ) -> IncomingSignal<'a> {
        IncomingSignal {
            signal_id: id,
            name,
            source: SourceKind::Webhook,
            data,
            wake,
            delivery_id: Some("dlv_9"),
        }
    }

    #[test]
    fn room_buffers_at_the_run_counter() {
        let s = snap();
        let r = with_ctx(5_000, |ctx| {
            raise(&s, &sig("a", "pr.opened", &NONE, false), None, ctx)
        })
        .unwrap();
        assert_eq!(r.status, RaiseStatus::Queued { seq: 5 });
        assert_eq!(
            r.writes.ops,
            vec![
                Op::BufferSignal {
                    seq: 5,
                    delivery_id: Some("dlv_9".into())
                },
                Op::Event {
                    seq: 10,
                    event: SessionEvent::SignalBuffered {
                        signal_id: "a".into(),
                        name: "pr.opened".into(),
                        seq: 5,
                        source: SourceKind::Webhook,
                        wake: false
                    }
                }
            ]
        );
        assert_eq!(r.writes.counters.next_signal_seq, 6);
        assert_eq!(r.writes.counters.next_event_seq, 11);
        assert_eq!(r.consumed_by, None);
        assert!(!r.settles_delivery());
        assert_eq!(outcome_label(Ok(&r)), "queued");
    }

    #[test]
    fn wake_queues_a_signal_turn_for_the_same_delivery() {
        let r = with_ctx(5_000, |ctx| {
            raise(&snap(), &sig("a", "x", &NONE, true), None, ctx)
        })
        .unwrap();
        assert_eq!(
            r.writes.ops[2],
            Op::InsertTurn {
                id: "turn_n1".into(),
                seq: 3,
                kind: TurnKind::Signal,
                content: TurnContent::SignalWake { signal_seq: 5 },
                delivery_id: Some("dlv_9".into()),
                user_input: false
            }
        );
        assert_eq!(
            events(&r.writes),
            vec![(10, "tb.signal.buffered"), (11, "tb.turn.queued")]
        );
    }

    #[test]
    fn a_full_mailbox_refuses_under_reject() {
        let mut s = snap();
        s.buffered = vec![buffered(1, "a", None), buffered(2, "b", None)];
        let e = with_ctx(5_000, |ctx| {
            raise(&s, &sig("c", "c", &NONE, false), None, ctx)
        })
        .unwrap_err();
        assert_eq!(
            e,
            Refusal::Rejected {
                code: ErrorCode::SignalBufferFull,
                message: "the run's signal mailbox is full (2 buffered) and its overflow policy is reject; retry after it drains".into()
            }
        );
        assert_eq!(outcome_label(Err(e.code())), "rejected_full");
        assert_eq!(outcome_label(Err(ErrorCode::NotFound)), "refused");
    }

    #[test]
    fn a_full_mailbox_drops_the_oldest_under_drop_oldest() {
        let mut s = snap();
        s.mailbox.overflow = Overflow::DropOldest;
        s.buffered = vec![buffered(1, "a", Some("dlv_1")), buffered(2, "b", None)];
        let r = with_ctx(5_000, |ctx| {
            raise(&s, &sig("c", "c", &NONE, false), None, ctx)
        })
        .unwrap();
        assert_eq!(r.dropped, vec!["sig1".to_string()]);
        assert_eq!(
            r.writes.ops[..3],
            [
                Op::SettleSignal {
                    seq: 1,
                    state: SignalState::Dropped,
                    consumed_by: None
                },
                Op::Event {
                    seq: 10,
                    event: SessionEvent::SignalDropped {
                        signal_id: "sig1".into(),
                        name: "a".into(),
                        seq: 1
                    }
                },
                Op::ExpireReceipt {
                    delivery_id: "dlv_1".into()
                },
            ]
        );
        assert_eq!(r.status, RaiseStatus::Queued { seq: 5 });
        assert_eq!(outcome_label(Ok(&r)), "queued_with_drop");
        // A mailbox over its bound (the bound was lowered) drops down to bound - 1 before buffering.
        s.mailbox.bound = 1;
        let r = with_ctx(5_000, |ctx| {
            raise(&s, &sig("c", "c", &NONE, false), None, ctx)
        })
        .unwrap();
        assert_eq!(r.dropped, vec!["sig1".to_string(), "sig2".to_string()]);
    }

    #[test]
    fn a_repeated_signal_id_is_a_duplicate_or_a_conflict() {
        let mut s = snap();
        s.buffered = vec![buffered(1, "a", None), buffered(2, "b", None)];
        let data = DataPlacement::Inline(json!({"n": 1}));
        let first = FirstSignal {
            name: "x".into(),
            data: data.clone(),
        };
        // Even on a full mailbox: the duplicate is answered, nothing is buffered.
        let r = with_ctx(5_000, |ctx| {
            raise(&s, &sig("a", "x", &data, false), Some(&first), ctx)
        })
        .unwrap();
        assert_eq!(r.status, RaiseStatus::Duplicate);
        assert!(r.settles_delivery());
        assert_eq!(outcome_label(Ok(&r)), "duplicate");
        assert_eq!(
            r.writes.ops,
            vec![Op::Event {
                seq: 10,
                event: SessionEvent::SignalDuplicate {
                    signal_id: "a".into(),
                    name: "x".into()
                }
            }]
        );
        assert_eq!(r.writes.counters.next_signal_seq, 5);
        let other = DataPlacement::Inline(json!({"n": 2}));
        for (name, d) in [("x", &other), ("y", &data), ("x", &NONE)] {
            assert!(matches!(
                with_ctx(5_000, |ctx| raise(
                    &s,
                    &sig("a", name, d, false),
                    Some(&first),
                    ctx
                )),
                Err(Refusal::Conflict(_))
            ));
        }
        let big = FirstSignal {
            name: "x".into(),
            data: DataPlacement::Reference(b"[1]".to_vec()),
        };
        let same = DataPlacement::Reference(b"[1]".to_vec());
        assert!(with_ctx(5_000, |ctx| raise(
            &s,
            &sig("a", "x", &same, false),
            Some(&big),
            ctx
        ))
        .is_ok());
    }

    #[test]
    fn a_terminal_run_refuses_before_the_duplicate_check() {
        let mut s = snap();
        s.status = RunStatus::Failed;
        let first = FirstSignal {
            name: "x".into(),
            data: NONE,
        };
        let e = with_ctx(5_000, |ctx| {
            raise(&s, &sig("a", "x", &NONE, false), Some(&first), ctx)
        })
        .unwrap_err();
        assert_eq!(e.code(), ErrorCode::TargetTerminal);
    }

    #[test]
    fn a_matching_wait_consumes_the_new_signal_at_once() {
        let mut s = snap();
        s.wait = Some(wait(WaitKind::Signal, &["pr.closed"], None));
        let r = with_ctx(5_000, |ctx| {
            raise(&s, &sig("a", "pr.closed", &NONE, false), None, ctx)
        })
        .unwrap();
        assert_eq!(r.consumed_by.as_deref(), Some("w1"));
        assert_eq!(
            events(&r.writes),
            vec![
                (10, "tb.signal.buffered"),
                (11, "tb.signal.consumed"),
                (12, "tb.wait.resolved"),
                (13, "tb.turn.queued")
            ]
        );
        assert!(r.writes.ops.contains(&Op::ConsumeDelivery {
            delivery_id: "dlv_9".into()
        }));
        // An older buffered match wins instead: the new signal stays buffered.
        s.buffered = vec![buffered(2, "pr.closed", None)];
        let r = with_ctx(5_000, |ctx| {
            raise(&s, &sig("b", "pr.closed", &NONE, false), None, ctx)
        })
        .unwrap();
        assert_eq!(r.consumed_by, None);
        assert!(r.writes.ops.contains(&Op::SettleSignal {
            seq: 2,
            state: SignalState::Consumed,
            consumed_by: Some("w1".into())
        }));
    }

    #[test]
    fn signal_states_parse() {
        for s in ["buffered", "consumed", "dropped", "expired"] {
            assert_eq!(SignalState::parse(s).unwrap().as_str(), s);
        }
        assert_eq!(SignalState::parse("gone"), None);
    }
}
