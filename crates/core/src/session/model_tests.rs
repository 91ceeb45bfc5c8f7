//! The session rules composed over an in-memory run that applies their writes the way a backend must:
//! each test drives one session through several rule calls and checks the state the ops leave, and that
//! every number handed out comes from the counters, in order, never twice.

use super::*;
use crate::signal::{
    raise, DataPlacement, FirstSignal, IncomingSignal, Overflow, Raised, SourceKind,
};
use crate::turn::{ack, claim, enqueue, AckedTurn, Claim, HeadTurn, IncomingPrompt, TurnState};
use crate::wait::{arm, step, WaitKind, WinnerKind};
use serde_json::Value;

#[derive(Debug, Clone)]
struct Sig {
    seq: u64,
    id: String,
    name: String,
    state: SignalState,
    delivery: Option<String>,
    consumed_by: Option<String>,
}

#[derive(Debug, Clone)]
struct Turn {
    id: String,
    seq: u64,
    kind: TurnKind,
    state: TurnState,
    claims: u32,
    lease_until: Option<i64>,
    user_input: bool,
    seen_by: Option<String>,
    delivery: Option<String>,
}

#[derive(Debug, Clone)]
struct Wait {
    id: String,
    spec: WaitSpec,
    deadline: Option<i64>,
    state: WaitState,
    interrupted_by: Option<String>,
    winner: Option<Winner>,
    created_at: i64,
}

/// One run as a backend stores it.
struct Run {
    status: RunStatus,
    reason: Option<String>,
    counters: Counters,
    mailbox: MailboxPolicy,
    signals: Vec<Sig>,
    turns: Vec<Turn>,
    waits: Vec<Wait>,
    events: Vec<(u64, &'static str)>,
    expired_receipts: Vec<String>,
    consumed_deliveries: Vec<String>,
    /// The signal being raised by the current call (what `BufferSignal` inserts).
    incoming: Option<(String, String)>,
    now: i64,
    minted: u32,
}

impl Run {
    fn new(mailbox: MailboxPolicy) -> Self {
        Run {
            status: RunStatus::Running,
            reason: None,
            counters: Counters::NEW_RUN,
            mailbox,
            signals: vec![],
            turns: vec![],
            waits: vec![],
            events: vec![],
            expired_receipts: vec![],
            consumed_deliveries: vec![],
            incoming: None,
            now: 1_000,
            minted: 0,
        }
    }

    /// The snapshot, loaded with the queries `SessionSnapshot` documents.
    fn snapshot(&self, excluding_turn: Option<&str>) -> SessionSnapshot {
        SessionSnapshot {
            status: self.status,
            counters: self.counters,
            mailbox: self.mailbox,
            buffered: self
                .signals
                .iter()
                .filter(|s| s.state == SignalState::Buffered)
                .map(|s| BufferedSignal {
                    seq: s.seq,
                    signal_id: s.id.clone(),
                    name: s.name.clone(),
                    delivery_id: s.delivery.clone(),
                })
                .collect(),
            wait: self
                .waits
                .iter()
                .find(|w| w.state == WaitState::Armed)
                .map(|w| ArmedWait {
                    id: w.id.clone(),
                    spec: w.spec.clone(),
                    deadline: w.deadline,
                    interrupted_by: w.interrupted_by.clone(),
                    created_at: w.created_at,
                }),
            unseen_input: self
                .turns
                .iter()
                .find(|t| {
                    t.user_input
                        && !matches!(t.state, TurnState::Acked | TurnState::Expired)
                        && t.seen_by.is_none()
                        && Some(t.id.as_str()) != excluding_turn
                })
                .map(|t| t.id.clone()),
        }
    }

    /// Runs a rule with a context at the run's clock.
    fn call<T>(&mut self, f: impl FnOnce(&SessionSnapshot, &mut Ctx) -> T) -> T {
        self.call_excluding(None, f)
    }

    fn call_excluding<T>(
        &mut self,
        excluding: Option<&str>,
        f: impl FnOnce(&SessionSnapshot, &mut Ctx) -> T,
    ) -> T {
        let snap = self.snapshot(excluding);
        let mut n = self.minted;
        let out = {
            let mut mint = || {
                n += 1;
                format!("turn_{n}")
            };
            let mut ctx = Ctx {
                now: self.now,
                new_turn_id: &mut mint,
            };
            f(&snap, &mut ctx)
        };
        self.minted = n;
        out
    }

    /// Applies writes in order, checking that every number is the next one of its counter.
    fn apply(&mut self, w: &Writes) {
        for op in &w.ops {
            match op {
                Op::BufferSignal { seq, delivery_id } => {
                    assert_eq!(
                        *seq, self.counters.next_signal_seq,
                        "signal seq from the counter"
                    );
                    assert!(
                        self.signals.iter().all(|s| s.seq != *seq),
                        "seq {seq} reused"
                    );
                    self.counters.next_signal_seq += 1;
                    let (id, name) = self.incoming.take().expect("a signal being raised");
                    self.signals.push(Sig {
                        seq: *seq,
                        id,
                        name,
                        state: SignalState::Buffered,
                        delivery: delivery_id.clone(),
                        consumed_by: None,
                    });
                }
                Op::SettleSignal {
                    seq,
                    state,
                    consumed_by,
                } => {
                    let s = self.signals.iter_mut().find(|s| s.seq == *seq).unwrap();
                    assert_eq!(
                        s.state,
                        SignalState::Buffered,
                        "only a buffered signal settles"
                    );
                    s.state = *state;
                    s.consumed_by = consumed_by.clone();
                }
                Op::ExpireReceipt { delivery_id } => {
                    self.expired_receipts.push(delivery_id.clone())
                }
                Op::ConsumeDelivery { delivery_id } => {
                    self.consumed_deliveries.push(delivery_id.clone())
                }
                Op::InsertTurn {
                    id,
                    seq,
                    kind,
                    delivery_id,
                    user_input,
                    ..
                } => {
                    assert_eq!(
                        *seq, self.counters.next_turn_seq,
                        "turn seq from the counter"
                    );
                    self.counters.next_turn_seq += 1;
                    self.turns.push(Turn {
                        id: id.clone(),
                        seq: *seq,
                        kind: *kind,
                        state: TurnState::Queued,
                        claims: 0,
                        lease_until: None,
                        user_input: *user_input,
                        seen_by: None,
                        delivery: delivery_id.clone(),
                    });
                }
                Op::LeaseTurn {
                    id,
                    lease_until,
                    claims,
                } => {
                    let t = self.turn_mut(id);
                    assert_eq!(t.claims + 1, *claims, "fenced by the claim count");
                    t.state = TurnState::Leased;
                    t.lease_until = Some(*lease_until);
                    t.claims = *claims;
                }
                Op::AckTurn { id, claims } => {
                    let t = self.turn_mut(id);
                    assert_eq!(t.claims, *claims, "fenced by the claim count");
                    t.state = TurnState::Acked;
                    t.lease_until = None;
                }
                Op::ExpireTurn { id } => self.turn_mut(id).state = TurnState::Expired,
                Op::MarkInputSeen { turn_id, wait_id } => {
                    self.turn_mut(turn_id).seen_by = Some(wait_id.clone())
                }
                Op::InsertWait { id, spec, deadline } => {
                    assert!(
                        self.waits.iter().all(|w| w.state != WaitState::Armed),
                        "one armed wait per run"
                    );
                    self.waits.push(Wait {
                        id: id.clone(),
                        spec: spec.clone(),
                        deadline: *deadline,
                        state: WaitState::Armed,
                        interrupted_by: None,
                        winner: None,
                        created_at: self.now,
                    });
                }
                Op::SettleWait {
                    id, state, winner, ..
                } => {
                    let w = self.wait_mut(id);
                    assert_eq!(w.state, WaitState::Armed);
                    w.state = *state;
                    w.winner = winner.clone();
                    w.interrupted_by = None;
                }
                Op::InterruptWait { id, turn_id } => {
                    self.wait_mut(id).interrupted_by = Some(turn_id.clone())
                }
                Op::ResumeWait { id } => self.wait_mut(id).interrupted_by = None,
                Op::SetStatus { status, reason } => {
                    self.status = *status;
                    self.reason = reason.clone();
                }
                Op::Event { seq, event } => {
                    assert_eq!(
                        *seq, self.counters.next_event_seq,
                        "event seq from the counter"
                    );
                    self.counters.next_event_seq += 1;
                    self.events.push((*seq, event.event_type()));
                }
            }
        }
        assert_eq!(self.counters, w.counters, "the counters the rule returned");
    }

    fn turn_mut(&mut self, id: &str) -> &mut Turn {
        self.turns.iter_mut().find(|t| t.id == id).unwrap()
    }

    fn wait_mut(&mut self, id: &str) -> &mut Wait {
        self.waits.iter_mut().find(|w| w.id == id).unwrap()
    }

    fn raise(&mut self, id: &str, name: &str, delivery: Option<&str>) -> Result<Raised, Refusal> {
        let data = DataPlacement::None;
        let first = self
            .signals
            .iter()
            .find(|s| s.id == id)
            .map(|s| FirstSignal {
                name: s.name.clone(),
                data: DataPlacement::None,
            });
        let sig = IncomingSignal {
            signal_id: id,
            name,
            source: SourceKind::Api,
            data: &data,
            wake: false,
            delivery_id: delivery,
        };
        self.incoming = Some((id.into(), name.into()));
        let r = self.call(|s, ctx| raise(s, &sig, first.as_ref(), ctx));
        if let Ok(r) = &r {
            self.apply(&r.writes);
        }
        self.incoming = None;
        r
    }

    fn claim_next(&mut self, lease_ms: u64) -> Claim {
        let head = self
            .turns
            .iter()
            .filter(|t| matches!(t.state, TurnState::Queued | TurnState::Leased))
            .min_by_key(|t| t.seq)
            .map(|t| HeadTurn {
                id: t.id.clone(),
                state: t.state,
                lease_until: t.lease_until,
                claims: t.claims,
            });
        let c = claim(self.status, head.as_ref(), lease_ms, self.now).unwrap();
        if let Claim::Lease { op, .. } = &c {
            let w = Writes {
                ops: vec![op.clone()],
                counters: self.counters,
            };
            self.apply(&w);
        }
        c
    }

    fn ack(&mut self, id: &str, claims: u32) -> Result<(), Refusal> {
        let t = self.turns.iter().find(|t| t.id == id).unwrap();
        let turn = AckedTurn {
            id: t.id.clone(),
            kind: t.kind,
            state: t.state,
            claims: t.claims,
            delivery_id: t.delivery.clone(),
        };
        let (w, _) = self.call_excluding(Some(id), |s, ctx| ack(s, &turn, claims, ctx))?;
        self.apply(&w);
        Ok(())
    }

    fn states(&self) -> Vec<(u64, &'static str)> {
        self.signals
            .iter()
            .map(|s| (s.seq, s.state.as_str()))
            .collect()
    }
}

fn spec(kind: WaitKind, names: &[&str], timeout_ms: Option<u64>) -> WaitSpec {
    WaitSpec {
        kind,
        names: names.iter().map(|s| s.to_string()).collect(),
        timeout_ms,
        user_input: false,
        reason: "waiting for the merge".into(),
    }
}

#[test]
fn a_session_from_start_to_end() {
    let mut run = Run::new(MailboxPolicy::default());
    let w = run.call(|s, ctx| start(s.counters, "cfg".into(), ctx));
    run.apply(&w);
    // The driver takes the start turn.
    let Claim::Lease {
        turn_id, claims, ..
    } = run.claim_next(30_000)
    else {
        panic!("the start turn is claimable")
    };
    assert_eq!((turn_id.as_str(), claims), ("turn_1", 1));
    assert!(matches!(
        run.claim_next(30_000),
        Claim::Held { until: 31_000, .. }
    ));
    run.ack("turn_1", 1).unwrap();
    assert_eq!(run.claim_next(30_000), Claim::Empty);

    // It waits for pr.closed for 60 s; an unrelated signal stays buffered.
    let (w, _) = run
        .call(|s, ctx| {
            arm(
                s,
                "w1",
                &spec(WaitKind::Signal, &["pr.closed"], Some(60_000)),
                ctx,
            )
        })
        .unwrap();
    run.apply(&w);
    assert_eq!(run.status, RunStatus::WaitingExternal);
    run.raise("s1", "pr.opened", Some("dlv_1")).unwrap();

    // User input interrupts the wait for one turn; a matching signal meanwhile stays buffered.
    run.now = 2_000;
    let p = IncomingPrompt {
        text: "what now?",
        variables: &Value::Null,
        from: "api",
        delivery_id: None,
    };
    let (prompt, w, _) = run.call(|s, ctx| enqueue(s, &p, ctx)).unwrap();
    run.apply(&w);
    assert_eq!(prompt, "turn_2");
    assert_eq!(run.status, RunStatus::Running);
    assert_eq!(run.waits[0].interrupted_by.as_deref(), Some("turn_2"));
    let r = run.raise("s2", "pr.closed", Some("dlv_2")).unwrap();
    assert_eq!(r.consumed_by, None);

    // Acknowledging the prompt re-arms the wait, which takes the buffered pr.closed at once.
    let Claim::Lease {
        turn_id, claims, ..
    } = run.claim_next(30_000)
    else {
        panic!("the prompt is claimable")
    };
    assert_eq!(turn_id, "turn_2");
    run.ack("turn_2", claims).unwrap();
    assert_eq!(run.waits[0].state, WaitState::Resolved);
    assert_eq!(
        run.waits[0].winner.as_ref().map(|w| (w.kind, w.signal_seq)),
        Some((WinnerKind::Signal, Some(2)))
    );
    assert_eq!(run.states(), vec![(1, "buffered"), (2, "consumed")]);
    assert_eq!(run.consumed_deliveries, vec!["dlv_2".to_string()]);
    assert_eq!(run.status, RunStatus::Running);
    assert_eq!(
        run.turns.last().map(|t| (t.id.as_str(), t.kind)),
        Some(("turn_3", TurnKind::Wait))
    );

    // A repeated signalId is a duplicate, even now that it is consumed; a reused one is a conflict.
    assert_eq!(
        run.raise("s2", "pr.closed", None).unwrap().status,
        crate::signal::RaiseStatus::Duplicate
    );
    assert!(matches!(
        run.raise("s2", "pr.opened", None),
        Err(Refusal::Conflict(_))
    ));

    // The run ends: the buffered signal and the unclaimed wait turn expire, with s1's receipt.
    let open: Vec<OpenTurn> = run
        .turns
        .iter()
        .filter(|t| matches!(t.state, TurnState::Queued | TurnState::Leased))
        .map(|t| OpenTurn {
            id: t.id.clone(),
            delivery_id: t.delivery.clone(),
        })
        .collect();
    let w = run.call(|s, ctx| end(s, &open, ctx));
    run.apply(&w);
    assert_eq!(run.states(), vec![(1, "expired"), (2, "consumed")]);
    assert_eq!(run.expired_receipts, vec!["dlv_1".to_string()]);
    assert_eq!(run.turns[2].state, TurnState::Expired);
    assert_eq!(
        run.events.iter().map(|e| e.1).collect::<Vec<_>>(),
        vec![
            "tb.turn.queued",
            "tb.turn.acked",
            "tb.wait.started",
            "tb.signal.buffered",
            "tb.turn.queued",
            "tb.wait.interrupted",
            "tb.signal.buffered",
            "tb.turn.acked",
            "tb.wait.resumed",
            "tb.signal.consumed",
            "tb.wait.resolved",
            "tb.turn.queued",
            "tb.signal.duplicate",
        ]
    );
    assert_eq!(
        run.counters,
        Counters {
            next_signal_seq: 3,
            next_turn_seq: 4,
            next_event_seq: 13
        }
    );
}

#[test]
fn an_overflowing_mailbox_never_reuses_a_number_and_a_timer_fires_at_its_deadline() {
    let mut run = Run::new(MailboxPolicy {
        bound: 2,
        overflow: Overflow::DropOldest,
    });
    for (i, d) in ["dlv_a", "dlv_b", "dlv_c", "dlv_d"].iter().enumerate() {
        run.raise(&format!("s{i}"), "noise", Some(d)).unwrap();
    }
    assert_eq!(
        run.states(),
        vec![
            (1, "dropped"),
            (2, "dropped"),
            (3, "buffered"),
            (4, "buffered")
        ]
    );
    assert_eq!(
        run.expired_receipts,
        vec!["dlv_a".to_string(), "dlv_b".to_string()]
    );
    run.mailbox.overflow = Overflow::Reject;
    assert_eq!(
        run.raise("s9", "noise", None).unwrap_err().code(),
        crate::error::ErrorCode::SignalBufferFull
    );

    let (w, _) = run
        .call(|s, ctx| {
            arm(
                s,
                "w1",
                &spec(WaitKind::Any, &["pr.closed"], Some(5_000)),
                ctx,
            )
        })
        .unwrap();
    run.apply(&w);
    run.now = 5_999;
    let (w, st) = run.call(|s, ctx| step(s, false, ctx));
    assert!(
        w.is_empty() && st.wait_id.is_none(),
        "not due before 6 000 ms"
    );
    run.now = 6_000;
    let (w, st) = run.call(|s, ctx| step(s, false, ctx));
    run.apply(&w);
    assert_eq!(st.wait_id.as_deref(), Some("w1"));
    assert_eq!(
        run.waits[0].winner.as_ref().map(|w| (w.kind, w.deadline)),
        Some((WinnerKind::Timer, Some(6_000)))
    );
    assert_eq!(
        run.events
            .iter()
            .filter(|e| e.1 == "tb.wait.timeout")
            .count(),
        1
    );
    // A second timer pass finds nothing armed.
    assert!(run.call(|s, ctx| step(s, false, ctx)).0.is_empty());
    assert_eq!(run.counters.next_signal_seq, 5);
}
