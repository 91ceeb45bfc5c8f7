//! Metrics a write job gives rise to, emitted once its fate is known (docs/architecture.md §7: "metrics
//! and other effects happen after commit"). A job's closure may run more than once (PostgreSQL retries
//! a transaction that lost a race) and may be rolled back (a SQLite job's savepoint, a failed commit), so
//! the shared SQL code never calls `metrics::` itself: it [`record`]s a [`Fact`], and the backend that
//! ran the job takes the facts of its last run ([`start`] before it, [`take`] after it) and [`emit`]s them
//! when it answers the caller.
//!
//! The facts live in a thread-local list: a job runs on one thread (the SQLite writer, a PostgreSQL
//! connection thread) from [`start`] to [`take`].

use std::cell::RefCell;

/// Something a write job did that a metric counts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Fact {
    /// A signal was offered to a run: `outcome` is `tb_core::signal::outcome_label`'s, `source` the
    /// signal source's kind. It describes the answer, so it is counted when the job refused too.
    Signal {
        outcome: &'static str,
        source: &'static str,
    },
    /// A wait was resolved by `winner` (a bounded label) after `waited_ms`. Counted only if committed.
    WaitResolved {
        winner: &'static str,
        waited_ms: i64,
    },
}

/// How a job ended, as its caller is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// The job's closure succeeded and its transaction committed (and, on SQLite, was flushed).
    Committed,
    /// The job's closure returned an error (its writes rolled back); the caller gets that error.
    Refused,
    /// The transaction did not commit for another reason (commit failure, store stopped).
    Lost,
}

thread_local! {
    static FACTS: RefCell<Vec<Fact>> = const { RefCell::new(Vec::new()) };
}

/// Notes `fact` for the job running on this thread.
pub(crate) fn record(fact: Fact) {
    FACTS.with(|f| f.borrow_mut().push(fact));
}

/// Forgets what an earlier run left on this thread: called before each run of a job's closure.
pub(crate) fn start() {
    FACTS.with(|f| f.borrow_mut().clear());
}

/// The facts the job's run recorded since [`start`].
pub(crate) fn take() -> Vec<Fact> {
    FACTS.with(|f| std::mem::take(&mut *f.borrow_mut()))
}

/// Whether `fact` is counted for a job that ended as `fate`: every fact when it committed; only those
/// describing the caller's answer ([`Fact::Signal`]) when the job refused; none when the transaction
/// was lost.
fn counted(fact: &Fact, fate: Fate) -> bool {
    match (fact, fate) {
        (_, Fate::Lost) => false,
        (Fact::Signal { .. }, _) => true,
        (Fact::WaitResolved { .. }, fate) => fate == Fate::Committed,
    }
}

/// Emits the [`counted`] `facts` of a job that ended as `fate`, as metrics.
pub(crate) fn emit(facts: Vec<Fact>, fate: Fate) {
    for fact in facts.into_iter().filter(|f| counted(f, fate)) {
        match fact {
            Fact::Signal { outcome, source } => {
                metrics::counter!("tb_signals_total", "outcome" => outcome, "source" => source)
                    .increment(1);
            }
            Fact::WaitResolved { winner, waited_ms } => {
                metrics::counter!("tb_wait_resolutions_total", "winner" => winner).increment(1);
                metrics::histogram!("tb_wait_duration_seconds", "winner" => winner)
                    .record(waited_ms as f64 / 1000.0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_takes_only_its_own_facts() {
        record(Fact::WaitResolved {
            winner: "timer",
            waited_ms: 5,
        });
        start();
        assert!(take().is_empty(), "an earlier run's facts are forgotten");
        let signal = Fact::Signal {
            outcome: "queued",
            source: "api",
        };
        record(signal.clone());
        assert_eq!(take(), vec![signal]);
        assert!(take().is_empty());
    }

    #[test]
    fn a_refused_job_counts_its_answer_and_a_lost_one_nothing() {
        let signal = Fact::Signal {
            outcome: "refused",
            source: "api",
        };
        let wait = Fact::WaitResolved {
            winner: "signal",
            waited_ms: 1,
        };
        assert!(counted(&signal, Fate::Committed) && counted(&wait, Fate::Committed));
        assert!(counted(&signal, Fate::Refused) && !counted(&wait, Fate::Refused));
        assert!(!counted(&signal, Fate::Lost) && !counted(&wait, Fate::Lost));
    }
}
