//! Waits (DESIGN §4 Wait; signals-and-connectors §5.4-§5.5): `wait_for_signal` and `wait_for_any`, their
//! validation, and the ONE resolution rule every store backend applies.
//!
//! A wait is `armed` until exactly one winner resolves it, or it is `cancelled` (by the driver, or by a
//! replacing wait). When several candidates are visible in one resolution step the winner follows the
//! fixed precedence stop/cancel > accepted user input > matching signal > timer; the losers keep their
//! documented disposition (timer tombstoned, signal left buffered, user input left queued).

use serde::{Deserialize, Serialize};

mod arming;

pub(crate) use arming::step_into;
pub use arming::*;

/// `signal` (`wait_for_signal`) or `any` (`wait_for_any`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitKind {
    Signal,
    Any,
}

/// Wait state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitState {
    Armed,
    Resolved,
    Cancelled,
}

impl WaitState {
    /// Wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitState::Armed => "armed",
            WaitState::Resolved => "resolved",
            WaitState::Cancelled => "cancelled",
        }
    }
    /// Parses the wire string.
    pub fn parse(s: &str) -> Option<Self> {
        [WaitState::Armed, WaitState::Resolved, WaitState::Cancelled]
            .into_iter()
            .find(|x| x.as_str() == s)
    }
}

/// Kind of a wait's winner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WinnerKind {
    /// Stop or cancel of the run.
    Stop,
    UserInput,
    Signal,
    Timer,
}

/// A validated wait request (`POST /v1/runs/{runId}/waits`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WaitSpec {
    pub kind: WaitKind,
    /// 1-8 signal names, any of which matches.
    pub names: Vec<String>,
    /// Relative timeout in ms (1 ms .. 86 400 s); `None` waits without a deadline.
    pub timeout_ms: Option<u64>,
    /// `any` only: accepted user input takes part in the race (default true for `any`).
    pub user_input: bool,
    /// Human-readable reason, shown as the run's `waitReason` (1-256 characters).
    pub reason: String,
}

/// Longest wait timeout: 86 400 s (signals-and-connectors §5.4), in ms.
pub const MAX_TIMEOUT_MS: u64 = 86_400_000;
/// Most signal names one wait may list (signals-and-connectors §5.4).
pub const MAX_NAMES: usize = 8;

impl WaitSpec {
    /// Checks the request. Errors: a message naming the field and what is allowed.
    pub fn validate(&self) -> Result<(), String> {
        if self.names.is_empty() || self.names.len() > MAX_NAMES {
            return Err(format!("names must list 1 to {MAX_NAMES} signal names"));
        }
        for (i, n) in self.names.iter().enumerate() {
            crate::signal::validate_name(n).map_err(|e| format!("names: {e}"))?;
            if self.names[..i].contains(n) {
                return Err("names must be distinct".into());
            }
        }
        if let Some(t) = self.timeout_ms {
            if t == 0 || t > MAX_TIMEOUT_MS {
                return Err(format!(
                    "timeoutMs must be between 1 and {MAX_TIMEOUT_MS} (24 h)"
                ));
            }
        }
        if self.reason.trim().is_empty() || self.reason.chars().count() > 256 {
            return Err("reason is required: 1 to 256 characters shown to operators".into());
        }
        if self.kind == WaitKind::Signal && self.user_input {
            return Err("userInput applies to kind \"any\" only; a signal wait is interrupted by user input instead".into());
        }
        Ok(())
    }

    /// True when `name` is one of the names this wait takes.
    pub fn takes(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }
}

/// What is visible to one resolution step of an armed wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Candidates {
    /// The run was stopped or cancelled.
    pub stop: bool,
    /// Accepted user input is queued (and not yet seen by this wait).
    pub user_input: bool,
    /// A buffered signal matches the wait's names.
    pub signal: bool,
    /// The deadline has passed.
    pub timer: bool,
}

/// The outcome of one resolution step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// Nothing resolves it yet.
    Stay,
    /// Resolved with this winner; `losers` are the other visible candidates, each with its disposition.
    Resolve {
        winner: WinnerKind,
        losers: Vec<(WinnerKind, Disposition)>,
    },
    /// A `signal` wait is interrupted by user input for one turn; it re-arms (same id, same absolute
    /// deadline) when that turn is acknowledged.
    Interrupt,
}

/// What happens to a losing candidate (DESIGN §4 Wait).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Disposition {
    /// A losing timer is tombstoned: it never fires.
    Tombstoned,
    /// A losing signal stays buffered for a later wait.
    LeftBuffered,
    /// Losing user input stays ordinary queued input.
    LeftQueued,
}

/// The resolution rule (signals-and-connectors §5.4, §5.5). `interrupted`: the wait is currently
/// interrupted by user input, so only stop/cancel resolves it until it re-arms.
pub fn resolve(
    kind: WaitKind,
    user_input_races: bool,
    interrupted: bool,
    c: Candidates,
) -> Resolution {
    let races_input = kind == WaitKind::Any && user_input_races;
    let mut visible = Vec::new();
    if c.stop {
        visible.push(WinnerKind::Stop);
    }
    if interrupted {
        return if c.stop {
            Resolution::Resolve {
                winner: WinnerKind::Stop,
                losers: Vec::new(),
            }
        } else {
            Resolution::Stay
        };
    }
    if c.user_input {
        if races_input {
            visible.push(WinnerKind::UserInput);
        } else if kind == WaitKind::Signal && !c.stop {
            // User input breaks into wait_for_signal for one turn (§5.4), whatever else is visible.
            return Resolution::Interrupt;
        }
    }
    if c.signal {
        visible.push(WinnerKind::Signal);
    }
    if c.timer {
        visible.push(WinnerKind::Timer);
    }
    visible.sort();
    let mut it = visible.into_iter();
    match it.next() {
        None => Resolution::Stay,
        Some(winner) => Resolution::Resolve {
            winner,
            losers: it
                .filter_map(|k| {
                    let d = match k {
                        WinnerKind::Timer => Disposition::Tombstoned,
                        WinnerKind::Signal => Disposition::LeftBuffered,
                        WinnerKind::UserInput => Disposition::LeftQueued,
                        WinnerKind::Stop => return None,
                    };
                    Some((k, d))
                })
                .collect(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Disposition::*;
    use WinnerKind::*;

    fn c(stop: bool, user_input: bool, signal: bool, timer: bool) -> Candidates {
        Candidates {
            stop,
            user_input,
            signal,
            timer,
        }
    }

    #[test]
    fn precedence_over_every_combination() {
        for bits in 0u8..16 {
            let cand = c(bits & 1 != 0, bits & 2 != 0, bits & 4 != 0, bits & 8 != 0);
            let r = resolve(WaitKind::Any, true, false, cand);
            let expect = if cand.stop {
                Some(Stop)
            } else if cand.user_input {
                Some(UserInput)
            } else if cand.signal {
                Some(Signal)
            } else if cand.timer {
                Some(Timer)
            } else {
                None
            };
            match (r, expect) {
                (Resolution::Stay, None) => {}
                (Resolution::Resolve { winner, losers }, Some(w)) => {
                    assert_eq!(winner, w, "{cand:?}");
                    let n = [cand.user_input, cand.signal, cand.timer]
                        .iter()
                        .filter(|x| **x)
                        .count();
                    let expected_losers = if w == Stop { n } else { n - 1 };
                    assert_eq!(losers.len(), expected_losers, "{cand:?}");
                }
                (r, e) => panic!("{cand:?}: got {r:?}, expected {e:?}"),
            }
        }
    }

    #[test]
    fn loser_dispositions() {
        assert_eq!(
            resolve(WaitKind::Any, true, false, c(false, true, true, true)),
            Resolution::Resolve {
                winner: UserInput,
                losers: vec![(Signal, LeftBuffered), (Timer, Tombstoned)]
            }
        );
        assert_eq!(
            resolve(WaitKind::Any, true, false, c(true, true, false, false)),
            Resolution::Resolve {
                winner: Stop,
                losers: vec![(UserInput, LeftQueued)]
            }
        );
    }

    #[test]
    fn user_input_interrupts_a_signal_wait() {
        assert_eq!(
            resolve(WaitKind::Signal, false, false, c(false, true, true, true)),
            Resolution::Interrupt
        );
        // While interrupted only stop counts.
        assert_eq!(
            resolve(WaitKind::Signal, false, true, c(false, false, true, true)),
            Resolution::Stay
        );
        assert!(matches!(
            resolve(WaitKind::Signal, false, true, c(true, false, true, false)),
            Resolution::Resolve { winner: Stop, .. }
        ));
        // `any` without userInput ignores input: it stays queued.
        assert_eq!(
            resolve(WaitKind::Any, false, false, c(false, true, false, false)),
            Resolution::Stay
        );
    }

    #[test]
    fn validation() {
        let mut s = WaitSpec {
            kind: WaitKind::Signal,
            names: vec!["pr.closed".into()],
            timeout_ms: Some(1000),
            user_input: false,
            reason: "waiting for CI".into(),
        };
        assert!(s.validate().is_ok());
        s.timeout_ms = Some(0);
        assert!(s.validate().is_err());
        s.timeout_ms = Some(MAX_TIMEOUT_MS + 1);
        assert!(s.validate().is_err());
        s.timeout_ms = None;
        s.names = vec![];
        assert!(s.validate().is_err());
        s.names = (0..9).map(|i| format!("n{i}")).collect();
        assert!(s.validate().is_err());
        s.names = vec!["a".into(), "a".into()];
        assert!(s.validate().is_err());
        s.names = vec!["Bad Name".into()];
        assert!(s.validate().is_err());
        s.names = vec!["ok".into()];
        s.reason = " ".into();
        assert!(s.validate().is_err());
    }
}
