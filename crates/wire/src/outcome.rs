//! What a service does with a message after its handler ran (wire spec §9.2), as one pure rule.
//! A message that cannot reach a handler (undecodable, no action, bad envelope) never gets here: it
//! is dead-lettered and terminated at once.
//! Attempts are JetStream's `delivered` count (1-based); per-action limits live here, not in the
//! consumer (several actions may share one consumer, whose `max_deliver` is only a backstop: the
//! most attempts of any action + 20, at least 100).

use crate::manifest::Retry;

/// How one attempt at a message ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The handler returned its result.
    Done,
    /// The handler failed or timed out; `permanent` failures are not retried.
    Failed { message: String, permanent: bool },
}

/// What to do with the message, in order: publish what is named, then answer JetStream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition {
    /// CompletionEvent `ok`, then `+ACK`.
    Ack,
    /// `-NAK {"delay": delay_ms}` (no CompletionEvent yet).
    Retry { delay_ms: u64 },
    /// DLQ entry (kind `action`), CompletionEvent `error`, then `+ACK`.
    DeadLetter,
}

/// The disposition of `outcome` at attempt `attempt` (1-based) under `retry`
/// ([`Retry::attempts`]: no policy = 1 attempt).
pub fn decide(outcome: &Outcome, attempt: i64, retry: Option<&Retry>) -> Disposition {
    match outcome {
        Outcome::Done => Disposition::Ack,
        Outcome::Failed {
            permanent: true, ..
        } => Disposition::DeadLetter,
        Outcome::Failed { .. } if attempt < Retry::attempts(retry) => Disposition::Retry {
            delay_ms: retry.map_or(0, |r| r.delay_ms(attempt)),
        },
        Outcome::Failed { .. } => Disposition::DeadLetter,
    }
}

/// A DLQ publish that failed is retried later: the message is never acknowledged before its entry
/// was written (§9.2). The delay in ms before that retry.
pub const DLQ_RETRY_DELAY_MS: u64 = 1_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_retry_with_backoff_then_dead_letter() {
        let r = Retry {
            max_attempts: 3,
            initial_backoff_ms: 100,
            backoff_factor: 2.0,
            max_backoff_ms: 5000,
        };
        let fail = Outcome::Failed {
            message: "boom".into(),
            permanent: false,
        };
        assert_eq!(
            decide(&fail, 1, Some(&r)),
            Disposition::Retry { delay_ms: 100 }
        );
        assert_eq!(
            decide(&fail, 2, Some(&r)),
            Disposition::Retry { delay_ms: 200 }
        );
        assert_eq!(decide(&fail, 3, Some(&r)), Disposition::DeadLetter);
        assert_eq!(decide(&fail, 9, Some(&r)), Disposition::DeadLetter);
        assert_eq!(
            decide(&fail, 1, None),
            Disposition::DeadLetter,
            "no policy: one attempt"
        );
        let perm = Outcome::Failed {
            message: "no".into(),
            permanent: true,
        };
        assert_eq!(decide(&perm, 1, Some(&r)), Disposition::DeadLetter);
        assert_eq!(decide(&Outcome::Done, 3, Some(&r)), Disposition::Ack);
    }
}
