//! Coalescing (signals-and-connectors §0.2; DESIGN "One session per key"): one live session per
//! `(workflow, coalesce key)`. A coalescing `start_run` starts the session only when no live session
//! holds the key; later deliveries take `on_existing` on the holder; a `raise_signal` /
//! `enqueue_prompt` aimed at a key lands on its live holder, or waits while a start for the key is
//! queued ([`target`]).

use super::OnExisting;
use crate::error::ErrorCode;
use crate::run::RunStatus;
use crate::session::Refusal;

/// The run holding a coalesce key (`coalesce_keys` row joined to its run), loaded after the key row is
/// claimed or locked (see [`coalesce`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub run_id: String,
    pub status: RunStatus,
}

/// What a coalescing start does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coalesce {
    /// No holder: the key is this new run's (the insert that claimed it stands).
    StartNew,
    /// The holder has ended: this new run takes the key over from `from` (update the row fenced by
    /// `run_id = from`; zero rows = another start took it first: retry the attempt).
    TakeOver { from: String },
    /// A live session holds it: no new run; take `on_existing` ([`join`]) on `run_id`.
    JoinExisting { run_id: String },
}

/// The coalescing rule: start, take over only from an ended holder, or join the live one.
///
/// Backend: `INSERT INTO coalesce_keys (workflow_id, key, run_id, created_at) ... ON CONFLICT DO NOTHING
/// RETURNING run_id`; a row returned means [`Coalesce::StartNew`] without a call. Otherwise load the
/// holder `SELECT k.run_id, r.status FROM coalesce_keys k JOIN runs r ... FOR UPDATE` (locks the key
/// and the holder's run: a run ending concurrently commits first or waits), call this, apply.
pub fn coalesce(holder: Option<&Holder>) -> Coalesce {
    match holder {
        None => Coalesce::StartNew,
        Some(h) if h.status.is_terminal() => Coalesce::TakeOver {
            from: h.run_id.clone(),
        },
        Some(h) => Coalesce::JoinExisting {
            run_id: h.run_id.clone(),
        },
    }
}

/// What a delivery does to the live session it joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Join {
    /// Nothing: the delivery is delivered, names the existing run, and its effect is consumed.
    Nothing,
    /// Raise the delivery's rendered signal on it (`signal::raise`); consumed when a wait takes it.
    RaiseSignal,
    /// Enqueue the delivery's prompt on it (`turn::enqueue`); consumed when its turn is acknowledged.
    EnqueuePrompt,
}

impl Join {
    /// Whether the delivery's effect is consumed by the join itself.
    pub fn consumed(self) -> bool {
        self == Join::Nothing
    }
}

/// The `on_existing` action of a joining delivery. `has_signal` / `has_prompt`: the delivery carries
/// a rendered signal / prompt. Errors: `Rejected(validation_error)` when `signal` / `prompt` is asked
/// for but missing (a binding configured without it).
pub fn join(on_existing: OnExisting, has_signal: bool, has_prompt: bool) -> Result<Join, Refusal> {
    match on_existing {
        OnExisting::Noop => Ok(Join::Nothing),
        OnExisting::Signal if has_signal => Ok(Join::RaiseSignal),
        OnExisting::Signal => Err(Refusal::Rejected {
            code: ErrorCode::ValidationError,
            message: "on_existing = signal needs a signal name".into(),
        }),
        OnExisting::Prompt if has_prompt => Ok(Join::EnqueuePrompt),
        OnExisting::Prompt => Err(Refusal::Rejected {
            code: ErrorCode::ValidationError,
            message: "on_existing = prompt needs a prompt".into(),
        }),
    }
}

/// Whether [`target`] needs to know if a start for the key is pending: when no live session holds it
/// (no holder, or the holder has ended). A backend reads the pending start only then.
pub fn start_matters(holder: Option<&Holder>) -> bool {
    holder.is_none_or(|h| h.status.is_terminal())
}

/// How long after a keyed `raise_signal` / `enqueue_prompt` delivery was accepted it still waits for
/// a session start accepted together with it, in ms (docs/sessions.md "Coalescing", docs/limits.md).
/// Two events sent at the same moment are committed by two transactions in either order, and a
/// delivery is attempted as soon as it commits: a start accepted a moment after its signal is not
/// visible yet to the signal's first attempt.
pub const START_SETTLE_MS: i64 = 2_000;

/// Whether a keyed delivery accepted at `accepted_at` (`deliveries.created_at`, Unix ms) may still
/// have a start accepted together with it that has not committed at `now` (Unix ms): less than
/// [`START_SETTLE_MS`] has passed.
pub fn settling(accepted_at: i64, now: i64) -> bool {
    now.saturating_sub(accepted_at) < START_SETTLE_MS
}

/// The delay in ms before the next attempt of a keyed delivery accepted at `accepted_at` whose attempt
/// at `now` (both Unix ms) was refused `target_starting` ([`target`]): the retry policy's
/// `policy_delay_ms`, but never before the settle window ends, so the next attempt no longer
/// [`settling`] decides for good (a refusal while settling costs one attempt at most, whatever the
/// backoff).
pub fn starting_retry_delay(policy_delay_ms: u64, accepted_at: i64, now: i64) -> u64 {
    let settled = accepted_at
        .saturating_add(START_SETTLE_MS)
        .saturating_sub(now);
    policy_delay_ms.max(u64::try_from(settled).unwrap_or(0))
}

/// The run a `raise_signal` / `enqueue_prompt` aimed at `(workflow, key)` lands on (docs/sessions.md
/// "Coalescing", docs/configuration.md "an `opened` and a `synchronize` arriving together lose
/// nothing"):
///
/// 1. a live holder: that run;
/// 2. otherwise, when `start_pending` (a `pending`/`retrying` `start_run` delivery of that workflow and
///    key exists, leased or not: a session start for the key is queued or under way), a retryable
///    refusal, so the signal waits for the session that start begins and is never lost. This holds
///    for a key that never had a session and for one whose session has ended alike: the start will
///    take the key over from the ended run ([`coalesce`]);
/// 3. otherwise, while `settling` ([`settling`]: less than [`START_SETTLE_MS`] since the delivery was
///    accepted), the same retryable refusal: a start accepted together with it may still be
///    committing. The retry comes after the window ([`starting_retry_delay`]), so this costs one
///    attempt at most;
/// 4. otherwise the ended holder (the rule that follows refuses `target_terminal`), or none.
///
/// `holder` is the key's row joined to its run; `start_pending` need only be read when
/// [`start_matters`]. Backend read order (READ COMMITTED): `start_pending` first, then `holder`: a
/// start that commits between the two reads is then seen as the key's new live holder, never missed
/// by both. Errors: `Rejected(unavailable)` "the target session is still starting" (2, 3);
/// `Rejected(not_found)` "no session holds this coalesce key".
pub fn target(
    holder: Option<&Holder>,
    start_pending: bool,
    settling: bool,
) -> Result<String, Refusal> {
    match (holder, start_pending || settling) {
        (Some(h), _) if !h.status.is_terminal() => Ok(h.run_id.clone()),
        (_, true) => Err(Refusal::Rejected {
            code: ErrorCode::Unavailable,
            message: "the target session is still starting".into(),
        }),
        (Some(ended), false) => Ok(ended.run_id.clone()),
        (None, false) => Err(Refusal::Rejected {
            code: ErrorCode::NotFound,
            message: "no session holds this coalesce key".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(status: RunStatus) -> Holder {
        Holder {
            run_id: "run_1".into(),
            status,
        }
    }

    #[test]
    fn start_take_over_or_join() {
        assert_eq!(coalesce(None), Coalesce::StartNew);
        for ended in [
            RunStatus::Completed,
            RunStatus::Failed,
            RunStatus::Cancelled,
        ] {
            assert_eq!(
                coalesce(Some(&holder(ended))),
                Coalesce::TakeOver {
                    from: "run_1".into()
                }
            );
        }
        for live in [
            RunStatus::Pending,
            RunStatus::Running,
            RunStatus::WaitingExternal,
            RunStatus::Cancelling,
        ] {
            assert_eq!(
                coalesce(Some(&holder(live))),
                Coalesce::JoinExisting {
                    run_id: "run_1".into()
                }
            );
        }
    }

    #[test]
    fn joining_takes_on_existing() {
        assert_eq!(join(OnExisting::Noop, false, false), Ok(Join::Nothing));
        assert!(Join::Nothing.consumed());
        assert_eq!(join(OnExisting::Signal, true, false), Ok(Join::RaiseSignal));
        assert!(!Join::RaiseSignal.consumed());
        assert_eq!(
            join(OnExisting::Prompt, false, true),
            Ok(Join::EnqueuePrompt)
        );
        assert!(!Join::EnqueuePrompt.consumed());
        assert_eq!(
            join(OnExisting::Signal, false, true),
            Err(Refusal::Rejected {
                code: ErrorCode::ValidationError,
                message: "on_existing = signal needs a signal name".into()
            })
        );
        assert_eq!(
            join(OnExisting::Prompt, true, false).unwrap_err().code(),
            ErrorCode::ValidationError
        );
    }

    #[test]
    fn a_keyed_target_is_its_holder_or_waits_for_its_start() {
        let live = holder(RunStatus::Running);
        assert_eq!(target(Some(&live), false, false), Ok("run_1".to_string()));
        assert_eq!(target(Some(&live), true, true), Ok("run_1".to_string()));
        assert!(!start_matters(Some(&live)));
        assert!(start_matters(None));
        assert_eq!(
            target(None, true, false).unwrap_err().code(),
            ErrorCode::Unavailable
        );
        assert_eq!(
            target(None, false, false),
            Err(Refusal::Rejected {
                code: ErrorCode::NotFound,
                message: "no session holds this coalesce key".into()
            })
        );
    }

    #[test]
    fn a_start_queued_for_an_ended_key_makes_its_signals_wait() {
        for status in [
            RunStatus::Completed,
            RunStatus::Failed,
            RunStatus::Cancelled,
        ] {
            let ended = holder(status);
            assert!(start_matters(Some(&ended)));
            // A new session for the key is queued or under way: wait for it, never refuse.
            assert_eq!(
                target(Some(&ended), true, false),
                Err(Refusal::Rejected {
                    code: ErrorCode::Unavailable,
                    message: "the target session is still starting".into()
                })
            );
            // Nothing will start again: the ended run, which then refuses `target_terminal`.
            assert_eq!(target(Some(&ended), false, false), Ok("run_1".to_string()));
        }
    }

    #[test]
    fn soon_after_acceptance_a_signal_waits_for_a_start_not_yet_committed() {
        assert!(settling(10_000, 10_000));
        assert!(settling(10_000, 10_000 + START_SETTLE_MS - 1));
        assert!(
            !settling(10_000, 10_000 + START_SETTLE_MS),
            "accepted too long ago"
        );
        for h in [None, Some(holder(RunStatus::Cancelled))] {
            assert_eq!(
                target(h.as_ref(), false, true).unwrap_err().code(),
                ErrorCode::Unavailable
            );
        }
        assert_eq!(
            target(Some(&holder(RunStatus::Running)), false, true),
            Ok("run_1".to_string()),
            "a live holder never waits"
        );
        assert_eq!(
            target(Some(&holder(RunStatus::Cancelled)), false, false),
            Ok("run_1".to_string()),
            "settled: the ended run (target_terminal next)"
        );
        // Refused 300 ms after acceptance with a 20 ms backoff: retried when the window ends, and
        // then no longer settling. A longer backoff is kept.
        assert_eq!(starting_retry_delay(20, 10_000, 10_300), 1_700);
        assert!(!settling(10_000, 10_300 + 1_700));
        assert_eq!(starting_retry_delay(5_000, 10_000, 10_300), 5_000);
        assert_eq!(starting_retry_delay(20, 10_000, 99_000), 20);
    }
}
