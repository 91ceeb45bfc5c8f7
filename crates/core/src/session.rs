//! The session rules' shared data (DESIGN §9 step 1): the snapshot of one run that a backend loads under
//! the run's row lock, and the writes a rule returns for the backend to apply in that same transaction.
//!
//! Every session rule (`signal::raise`, `turn::enqueue` / `claim` / `ack`, `wait::arm` / `cancel` /
//! `step`, `binding::coalesce`, [`end`]) is a pure function: it reads a [`SessionSnapshot`] (or a part of
//! one), decides, and returns [`Writes`]: an ordered list of [`Op`]s plus the run's new [`Counters`]. A
//! backend applies the ops in order and stores the counters; it decides nothing. Sequence numbers
//! (signals, turns, run events) come from the counters on the run row, never from `MAX(seq) + 1`, so
//! two replicas holding the run's lock one after the other never hand out the same number.

use crate::error::ErrorCode;
use crate::run::RunStatus;
use crate::signal::{MailboxPolicy, SignalState};
use crate::turn::TurnKind;
use crate::wait::{Disposition, WaitSpec, WaitState, WinnerKind};

mod end;
mod event;
#[cfg(test)]
mod model_tests;

pub use end::*;
pub use event::*;

/// The per-run counters kept on the run row: each is the NEXT number to hand out. A new run starts at
/// `{next_signal_seq: 1, next_turn_seq: 1, next_event_seq: 0}` (signals and turns count from 1, run events
/// from 0, OpenWOP `sequence`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    /// Next `signals.seq` (arrival order in the mailbox).
    pub next_signal_seq: u64,
    /// Next `turns.seq` (order of the turn queue).
    pub next_turn_seq: u64,
    /// Next `run_events.sequence` (today's column `runs.next_sequence`).
    pub next_event_seq: u64,
}

impl Counters {
    /// The counters of a run that has no signal, turn or event yet.
    pub const NEW_RUN: Counters = Counters {
        next_signal_seq: 1,
        next_turn_seq: 1,
        next_event_seq: 0,
    };
}

/// One buffered signal of the mailbox, as a rule needs it (no envelope: the backend reads that by
/// `seq` when it applies an op that needs it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferedSignal {
    pub seq: u64,
    pub signal_id: String,
    pub name: String,
    /// The webhook delivery that raised it, if any (its receipt settles or expires with the signal).
    pub delivery_id: Option<String>,
}

/// The run's armed wait (at most one: `waits_one_armed`).
#[derive(Debug, Clone, PartialEq)]
pub struct ArmedWait {
    pub id: String,
    pub spec: WaitSpec,
    /// Absolute deadline, Unix ms, if any.
    pub deadline: Option<i64>,
    /// The user-input turn interrupting it, while interrupted.
    pub interrupted_by: Option<String>,
    /// When it was armed, Unix ms (for `tb_wait_duration_seconds`).
    pub created_at: i64,
}

/// What a backend loads, under the run's row lock (`SELECT ... FROM runs WHERE id = ? FOR UPDATE` on
/// PostgreSQL; the writer's transaction on SQLite), before calling a session rule:
///
/// | field | query (run `r`) |
/// |---|---|
/// | `status`, `counters`, `mailbox` | the run row itself (locked) |
/// | `buffered` | `signals WHERE run_id = r AND state = 'buffered' ORDER BY seq` (at most the mailbox bound) |
/// | `wait` | `waits WHERE run_id = r AND state = 'armed'` |
/// | `unseen_input` | first `turns WHERE run_id = r AND user_input AND state NOT IN ('acked', 'expired') AND seen_by IS NULL ORDER BY seq` |
///
/// Locking the run row serializes every session rule of that run; the rows above need no lock of their
/// own because every writer of them holds the run's lock first.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSnapshot {
    pub status: RunStatus,
    pub counters: Counters,
    /// The run's mailbox policy (`runs.mailbox`, default when NULL).
    pub mailbox: MailboxPolicy,
    /// Buffered signals, oldest (lowest `seq`) first.
    pub buffered: Vec<BufferedSignal>,
    pub wait: Option<ArmedWait>,
    /// Id of the oldest accepted user-input turn no wait has seen yet (not acknowledged, not expired).
    pub unseen_input: Option<String>,
}

/// Why a rule refused; nothing of its writes may be applied. Maps onto the store's errors:
/// `Rejected` is `StoreError::Rejected { code, message }`, `Conflict` is `StoreError::Conflict(message)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A refusal with a stable code (e.g. `target_terminal`, `signal_buffer_full`, `unavailable`).
    Rejected { code: ErrorCode, message: String },
    /// A state conflict (409 `conflict`): e.g. acknowledging a turn that is not leased.
    Conflict(String),
}

impl Refusal {
    /// The stable code this refusal is answered with (`conflict` for [`Refusal::Conflict`]).
    pub fn code(&self) -> ErrorCode {
        match self {
            Refusal::Rejected { code, .. } => *code,
            Refusal::Conflict(_) => ErrorCode::Conflict,
        }
    }

    pub(crate) fn rejected(code: ErrorCode, message: impl Into<String>) -> Self {
        Refusal::Rejected {
            code,
            message: message.into(),
        }
    }
}

/// The one liveness check of every session rule: signals, prompts, waits and claims reach a run only
/// while it is not terminal. Errors: `Rejected(target_terminal)` `"the run has ended (<status>)"`.
pub fn live(status: RunStatus) -> Result<(), Refusal> {
    if status.is_terminal() {
        return Err(Refusal::rejected(
            ErrorCode::TargetTerminal,
            format!("the run has ended ({})", status.as_str()),
        ));
    }
    Ok(())
}

/// What a new turn carries. Framed content is built by `crate::turn::*_content`; the two references are
/// rendered by the backend when it applies the op, from rows written earlier in the same op list.
#[derive(Debug, Clone, PartialEq)]
pub enum TurnContent {
    /// Already framed (a prompt turn).
    Framed(serde_json::Value),
    /// The start turn of a new session: stored as this reference to its session configuration
    /// (`turn::config_ref`, a `session_configs` row) and rendered on read with `turn::start_content`
    /// from the run's workflow id and inputs (the configuration is not copied per session).
    Start { config_ref: String },
    /// The wake turn of the signal at this `seq`: `turn::signal_content(envelope)`.
    SignalWake { signal_seq: u64 },
    /// The turn of the wait just settled: `turn::wait_content(view of the wait after the op list)`.
    WaitSettled { wait_id: String },
}

/// A wait's winner as stored on the wait (`waits.winner`): `{kind, signal?, turnId?, deadline?}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Winner {
    pub kind: WinnerKind,
    /// Signal winner: the `seq` of the consumed signal (its envelope goes under `signal`).
    pub signal_seq: Option<u64>,
    /// User-input winner: the input turn's id.
    pub turn_id: Option<String>,
    /// Timer winner: the deadline that passed, Unix ms (stored as RFC 3339).
    pub deadline: Option<i64>,
}

/// One write, in the order the backend must apply it. "The run" is the run of the snapshot.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Insert a signal `buffered` at `seq`. The backend places the data (`signal::place_data`, a
    /// `signal_payloads` row for a reference), builds the `SessionSignalV1` envelope with `raised_at` =
    /// now, and inserts the row (`UNIQUE (run_id, signal_id)` backs the duplicate rule).
    BufferSignal {
        seq: u64,
        delivery_id: Option<String>,
    },
    /// Move the signal at `seq` from `buffered` to `state` (`dropped`, `consumed` or `expired`), with
    /// `settled_at` = now and `consumed_by` = the wait for `consumed`.
    SettleSignal {
        seq: u64,
        state: SignalState,
        consumed_by: Option<String>,
    },
    /// The receipt of this delivery can never be consumed now: it ends `expired` (only while it is
    /// `queued`).
    ExpireReceipt { delivery_id: String },
    /// This delivery's effect was consumed: `deliveries.consumed_at` = now (once) and its receipt is
    /// settled (`receipt::settled_state`).
    ConsumeDelivery { delivery_id: String },
    /// Insert a `queued` turn.
    InsertTurn {
        id: String,
        seq: u64,
        kind: TurnKind,
        content: TurnContent,
        delivery_id: Option<String>,
        /// Accepted user input (a prompt): it races or interrupts waits.
        user_input: bool,
    },
    /// Lease a turn: `state = 'leased', lease_until, claims` (the new claim count). Fence the update
    /// with the claim count it had (`AND claims = claims - 1`): zero rows = lost the race.
    LeaseTurn {
        id: String,
        /// Unix ms.
        lease_until: i64,
        claims: u32,
    },
    /// `state = 'acked', acked_at = now, lease_until = NULL`, fenced by `claims` (zero rows = lost).
    AckTurn { id: String, claims: u32 },
    /// `state = 'expired', lease_until = NULL` (the run ended before it was acknowledged).
    ExpireTurn { id: String },
    /// The input turn was seen by this wait (it interrupted or won it): `turns.seen_by`.
    MarkInputSeen { turn_id: String, wait_id: String },
    /// Insert an `armed` wait.
    InsertWait {
        id: String,
        spec: WaitSpec,
        /// Absolute, Unix ms.
        deadline: Option<i64>,
    },
    /// Settle a wait: `state` (`resolved` or `cancelled`), winner, losers, `settled_at` = now,
    /// `interrupted_by = NULL`. `waited_ms` is for `tb_wait_duration_seconds{winner}` and
    /// `tb_wait_resolutions_total{winner}`, counted when `state` is `resolved`.
    SettleWait {
        id: String,
        state: WaitState,
        winner: Option<Winner>,
        losers: Vec<(WinnerKind, Disposition)>,
        waited_ms: i64,
    },
    /// `waits.interrupted_by = turn_id`.
    InterruptWait { id: String, turn_id: String },
    /// `waits.interrupted_by = NULL` (re-armed with its original absolute deadline).
    ResumeWait { id: String },
    /// `runs.status`, `runs.wait_reason`.
    SetStatus {
        status: RunStatus,
        reason: Option<String>,
    },
    /// Append this content-free event to the run's log at `seq`.
    Event { seq: u64, event: SessionEvent },
}

/// What a rule returns: the ops in order and the run's counters after them (write them to the run row
/// when they differ from the snapshot's).
#[derive(Debug, Clone, PartialEq)]
pub struct Writes {
    pub ops: Vec<Op>,
    pub counters: Counters,
}

/// The time and the id source of one rule call. `new_turn_id` mints a turn id (`ids::new_id(Turn)` in
/// a backend; a counter in tests), so a rule stays deterministic for its inputs.
pub struct Ctx<'a> {
    /// Unix ms (the database's clock on PostgreSQL).
    pub now: i64,
    pub new_turn_id: &'a mut dyn FnMut() -> String,
}

impl Writes {
    /// No writes yet, counters as loaded.
    pub fn new(counters: Counters) -> Self {
        Writes {
            ops: Vec::new(),
            counters,
        }
    }

    /// True when there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    pub(crate) fn push(&mut self, op: Op) {
        self.ops.push(op);
    }

    /// Appends an event at the next event sequence.
    pub(crate) fn event(&mut self, event: SessionEvent) {
        let seq = self.counters.next_event_seq;
        self.counters.next_event_seq += 1;
        self.ops.push(Op::Event { seq, event });
    }

    /// Takes the next signal sequence.
    pub(crate) fn signal_seq(&mut self) -> u64 {
        let seq = self.counters.next_signal_seq;
        self.counters.next_signal_seq += 1;
        seq
    }

    /// Queues a turn at the next turn sequence, with its `tb.turn.queued` event. Returns its id.
    pub(crate) fn turn(
        &mut self,
        ctx: &mut Ctx,
        kind: TurnKind,
        content: TurnContent,
        delivery_id: Option<String>,
        user_input: bool,
    ) -> String {
        let id = (ctx.new_turn_id)();
        let seq = self.counters.next_turn_seq;
        self.counters.next_turn_seq += 1;
        self.ops.push(Op::InsertTurn {
            id: id.clone(),
            seq,
            kind,
            content,
            delivery_id,
            user_input,
        });
        self.event(SessionEvent::TurnQueued {
            turn_id: id.clone(),
            kind,
        });
        id
    }
}

/// Queues the start turn of a new session run (after the run row exists, with [`Counters::NEW_RUN`] or
/// the counters the run's first events left). `config_ref` is `turn::config_ref(session config)`.
pub fn start(counters: Counters, config_ref: String, ctx: &mut Ctx) -> Writes {
    let mut w = Writes::new(counters);
    w.turn(
        ctx,
        TurnKind::Start,
        TurnContent::Start { config_ref },
        None,
        false,
    );
    w
}

#[cfg(test)]
pub(crate) mod testing {
    //! Snapshots and an id source for the session rules' tests.
    use super::*;

    /// A live session run with an empty mailbox (bound 2, reject) and counters (5, 3, 10).
    pub fn snap() -> SessionSnapshot {
        SessionSnapshot {
            status: RunStatus::Running,
            counters: Counters {
                next_signal_seq: 5,
                next_turn_seq: 3,
                next_event_seq: 10,
            },
            mailbox: MailboxPolicy {
                bound: 2,
                overflow: crate::signal::Overflow::Reject,
            },
            buffered: Vec::new(),
            wait: None,
            unseen_input: None,
        }
    }

    /// A buffered signal.
    pub fn buffered(seq: u64, name: &str, delivery: Option<&str>) -> BufferedSignal {
        BufferedSignal {
            seq,
            signal_id: format!("sig{seq}"),
            name: name.into(),
            delivery_id: delivery.map(Into::into),
        }
    }

    /// An armed wait `w1` created at 1000 ms.
    pub fn wait(kind: crate::wait::WaitKind, names: &[&str], deadline: Option<i64>) -> ArmedWait {
        ArmedWait {
            id: "w1".into(),
            spec: WaitSpec {
                kind,
                names: names.iter().map(|s| s.to_string()).collect(),
                timeout_ms: deadline.map(|d| (d - 1000) as u64),
                user_input: kind == crate::wait::WaitKind::Any,
                reason: "waiting for CI".into(),
            },
            deadline,
            interrupted_by: None,
            created_at: 1000,
        }
    }

    /// Runs `f` with a context at `now` whose turn ids are `turn_n1`, `turn_n2`, ...
    pub fn with_ctx<T>(now: i64, f: impl FnOnce(&mut Ctx) -> T) -> T {
        let mut n = 0;
        let mut mint = move || {
            n += 1;
            format!("turn_n{n}")
        };
        let mut ctx = Ctx {
            now,
            new_turn_id: &mut mint,
        };
        f(&mut ctx)
    }

    /// The event types of `w`, in order, with their sequences.
    pub fn events(w: &Writes) -> Vec<(u64, &'static str)> {
        w.ops
            .iter()
            .filter_map(|o| match o {
                Op::Event { seq, event } => Some((*seq, event.event_type())),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;
    use serde_json::json;

    #[test]
    fn a_terminal_run_refuses_with_its_status() {
        assert_eq!(live(RunStatus::WaitingExternal), Ok(()));
        let r = live(RunStatus::Cancelled).unwrap_err();
        assert_eq!(r.code(), ErrorCode::TargetTerminal);
        assert_eq!(
            r,
            Refusal::Rejected {
                code: ErrorCode::TargetTerminal,
                message: "the run has ended (cancelled)".into()
            }
        );
        assert_eq!(Refusal::Conflict("x".into()).code(), ErrorCode::Conflict);
    }

    #[test]
    fn counters_hand_out_numbers_in_order() {
        let w = with_ctx(5_000, |ctx| {
            let mut w = Writes::new(snap().counters);
            assert_eq!(w.signal_seq(), 5);
            assert_eq!(w.signal_seq(), 6);
            let id = w.turn(
                ctx,
                TurnKind::Prompt,
                TurnContent::Framed(json!({})),
                None,
                true,
            );
            assert_eq!(id, "turn_n1");
            w
        });
        assert_eq!(
            w.counters,
            Counters {
                next_signal_seq: 7,
                next_turn_seq: 4,
                next_event_seq: 11
            }
        );
        assert_eq!(events(&w), vec![(10, "tb.turn.queued")]);
    }

    #[test]
    fn a_session_starts_with_turn_1_and_event_0() {
        let w = with_ctx(5_000, |ctx| start(Counters::NEW_RUN, "c0ffee".into(), ctx));
        assert_eq!(
            w.ops[0],
            Op::InsertTurn {
                id: "turn_n1".into(),
                seq: 1,
                kind: TurnKind::Start,
                content: TurnContent::Start {
                    config_ref: "c0ffee".into()
                },
                delivery_id: None,
                user_input: false
            }
        );
        assert_eq!(events(&w), vec![(0, "tb.turn.queued")]);
        assert_eq!(w.counters.next_turn_seq, 2);
    }
}
