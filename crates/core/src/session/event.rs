//! The content-free run events the session rules append (DESIGN §5.6): their types and payloads, in
//! one place, so every backend writes the same log.

use serde_json::{json, Value};

use super::Winner;
use crate::signal::SourceKind;
use crate::turn::TurnKind;
use crate::wait::{Disposition, WaitKind, WinnerKind};

/// Why a wait was cancelled (`tb.wait.cancelled{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// A new wait replaced it.
    Replaced,
    /// The driver cancelled it.
    Cancelled,
}

/// One session event. Ids and names only: never signal data, prompt text or turn content.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionEvent {
    /// `tb.signal.duplicate {signalId, name}`: a repeated `signalId` was suppressed.
    SignalDuplicate { signal_id: String, name: String },
    /// `tb.signal.dropped {signalId, name, seq, reason: "mailbox_full"}` (`drop_oldest`).
    SignalDropped {
        signal_id: String,
        name: String,
        seq: u64,
    },
    /// `tb.signal.buffered {signalId, name, seq, source, wake}`.
    SignalBuffered {
        signal_id: String,
        name: String,
        seq: u64,
        source: SourceKind,
        wake: bool,
    },
    /// `tb.signal.consumed {signalId, name, seq, waitId}`: a wait took it.
    SignalConsumed {
        signal_id: String,
        name: String,
        seq: u64,
        wait_id: String,
    },
    /// `tb.turn.queued {turnId, kind}`.
    TurnQueued { turn_id: String, kind: TurnKind },
    /// `tb.turn.acked {turnId, kind}`.
    TurnAcked { turn_id: String, kind: TurnKind },
    /// `tb.wait.started {waitId, kind, names, deadline}`: `deadline` is RFC 3339 or `null`.
    WaitStarted {
        wait_id: String,
        kind: WaitKind,
        names: Vec<String>,
        /// Absolute, Unix ms.
        deadline: Option<i64>,
    },
    /// `tb.wait.cancelled {waitId, reason: "replaced" | "cancelled"}`.
    WaitCancelled {
        wait_id: String,
        reason: CancelReason,
    },
    /// `tb.wait.interrupted {waitId, turnId}`: user input broke into a signal wait for one turn.
    WaitInterrupted { wait_id: String, turn_id: String },
    /// `tb.wait.resumed {waitId}`: the interrupting turn was acknowledged.
    WaitResumed { wait_id: String },
    /// `tb.wait.resolved` (or `tb.wait.timeout` when the timer won) `{waitId, winner, losers}`.
    WaitResolved {
        wait_id: String,
        winner: WinnerKind,
        losers: Vec<(WinnerKind, Disposition)>,
    },
}

impl SessionEvent {
    /// The event type, e.g. `tb.signal.buffered`.
    pub fn event_type(&self) -> &'static str {
        use SessionEvent::*;
        match self {
            SignalDuplicate { .. } => "tb.signal.duplicate",
            SignalDropped { .. } => "tb.signal.dropped",
            SignalBuffered { .. } => "tb.signal.buffered",
            SignalConsumed { .. } => "tb.signal.consumed",
            TurnQueued { .. } => "tb.turn.queued",
            TurnAcked { .. } => "tb.turn.acked",
            WaitStarted { .. } => "tb.wait.started",
            WaitCancelled { .. } => "tb.wait.cancelled",
            WaitInterrupted { .. } => "tb.wait.interrupted",
            WaitResumed { .. } => "tb.wait.resumed",
            WaitResolved {
                winner: WinnerKind::Timer,
                ..
            } => "tb.wait.timeout",
            WaitResolved { .. } => "tb.wait.resolved",
        }
    }

    /// The JSON payload. `rfc3339` formats a Unix-ms instant (the store's `model::rfc3339`; core has
    /// no calendar).
    pub fn payload(&self, rfc3339: impl Fn(i64) -> String) -> Value {
        use SessionEvent::*;
        match self {
            SignalDuplicate { signal_id, name } => json!({"signalId": signal_id, "name": name}),
            SignalDropped {
                signal_id,
                name,
                seq,
            } => {
                json!({"signalId": signal_id, "name": name, "seq": seq, "reason": "mailbox_full"})
            }
            SignalBuffered {
                signal_id,
                name,
                seq,
                source,
                wake,
            } => {
                json!({"signalId": signal_id, "name": name, "seq": seq, "source": source, "wake": wake})
            }
            SignalConsumed {
                signal_id,
                name,
                seq,
                wait_id,
            } => json!({"signalId": signal_id, "name": name, "seq": seq, "waitId": wait_id}),
            TurnQueued { turn_id, kind } | TurnAcked { turn_id, kind } => {
                json!({"turnId": turn_id, "kind": kind.as_str()})
            }
            WaitStarted {
                wait_id,
                kind,
                names,
                deadline,
            } => {
                json!({"waitId": wait_id, "kind": kind, "names": names, "deadline": deadline.map(rfc3339)})
            }
            WaitCancelled { wait_id, reason } => json!({"waitId": wait_id, "reason": match reason {
                CancelReason::Replaced => "replaced",
                CancelReason::Cancelled => "cancelled",
            }}),
            WaitInterrupted { wait_id, turn_id } => json!({"waitId": wait_id, "turnId": turn_id}),
            WaitResumed { wait_id } => json!({"waitId": wait_id}),
            WaitResolved {
                wait_id,
                winner,
                losers,
            } => json!({"waitId": wait_id, "winner": winner, "losers": losers_json(losers)}),
        }
    }
}

/// `[{kind, disposition}]`: the losers as stored on the wait (`waits.losers`) and in its event.
pub fn losers_json(losers: &[(WinnerKind, Disposition)]) -> Value {
    Value::Array(
        losers
            .iter()
            .map(|(k, d)| json!({"kind": k, "disposition": d}))
            .collect(),
    )
}

impl Winner {
    /// The stored winner `{kind, signal?, turnId?, deadline?}`. `envelope` is the consumed signal's
    /// `SessionSignalV1` (read by [`Winner::signal_seq`]); `rfc3339` formats the deadline.
    pub fn to_json(&self, envelope: Option<Value>, rfc3339: impl Fn(i64) -> String) -> Value {
        let mut v = json!({"kind": self.kind});
        if let Some(env) = envelope.filter(|_| self.signal_seq.is_some()) {
            v["signal"] = env;
        }
        if let Some(t) = &self.turn_id {
            v["turnId"] = json!(t);
        }
        if self.kind == WinnerKind::Timer {
            v["deadline"] = json!(self.deadline.map(rfc3339));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> String {
        format!("t{ms}")
    }

    #[test]
    fn payloads_are_the_logged_shapes() {
        let e = SessionEvent::SignalBuffered {
            signal_id: "s1".into(),
            name: "pr.closed".into(),
            seq: 3,
            source: SourceKind::Webhook,
            wake: true,
        };
        assert_eq!(e.event_type(), "tb.signal.buffered");
        assert_eq!(
            e.payload(t),
            json!({"signalId": "s1", "name": "pr.closed", "seq": 3, "source": "webhook", "wake": true})
        );
        let d = SessionEvent::SignalDropped {
            signal_id: "s0".into(),
            name: "a".into(),
            seq: 1,
        };
        assert_eq!(
            d.payload(t),
            json!({"signalId": "s0", "name": "a", "seq": 1, "reason": "mailbox_full"})
        );
        let w = SessionEvent::WaitStarted {
            wait_id: "w1".into(),
            kind: WaitKind::Any,
            names: vec!["a".into()],
            deadline: None,
        };
        assert_eq!(
            w.payload(t),
            json!({"waitId": "w1", "kind": "any", "names": ["a"], "deadline": null})
        );
        let c = SessionEvent::WaitCancelled {
            wait_id: "w1".into(),
            reason: CancelReason::Replaced,
        };
        assert_eq!(c.payload(t), json!({"waitId": "w1", "reason": "replaced"}));
        let q = SessionEvent::TurnAcked {
            turn_id: "turn_1".into(),
            kind: TurnKind::Wait,
        };
        assert_eq!(q.event_type(), "tb.turn.acked");
        assert_eq!(q.payload(t), json!({"turnId": "turn_1", "kind": "wait"}));
    }

    #[test]
    fn a_timer_win_is_logged_as_timeout() {
        let r = SessionEvent::WaitResolved {
            wait_id: "w1".into(),
            winner: WinnerKind::Timer,
            losers: vec![],
        };
        assert_eq!(r.event_type(), "tb.wait.timeout");
        let s = SessionEvent::WaitResolved {
            wait_id: "w1".into(),
            winner: WinnerKind::Signal,
            losers: vec![(WinnerKind::Timer, Disposition::Tombstoned)],
        };
        assert_eq!(s.event_type(), "tb.wait.resolved");
        assert_eq!(
            s.payload(t),
            json!({"waitId": "w1", "winner": "signal", "losers": [{"kind": "timer", "disposition": "tombstoned"}]})
        );
    }

    #[test]
    fn winners_render_their_one_detail() {
        let sig = Winner {
            kind: WinnerKind::Signal,
            signal_seq: Some(4),
            turn_id: None,
            deadline: None,
        };
        assert_eq!(
            sig.to_json(Some(json!({"signalId": "s4"})), t),
            json!({"kind": "signal", "signal": {"signalId": "s4"}})
        );
        let timer = Winner {
            kind: WinnerKind::Timer,
            signal_seq: None,
            turn_id: None,
            deadline: Some(61_000),
        };
        assert_eq!(
            timer.to_json(None, t),
            json!({"kind": "timer", "deadline": "t61000"})
        );
        let input = Winner {
            kind: WinnerKind::UserInput,
            signal_seq: None,
            turn_id: Some("turn_9".into()),
            deadline: None,
        };
        assert_eq!(
            input.to_json(None, t),
            json!({"kind": "user_input", "turnId": "turn_9"})
        );
    }
}
