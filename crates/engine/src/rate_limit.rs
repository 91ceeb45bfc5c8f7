//! Request rate limits and refusal counts (the rules are [`tb_core::rate`]).
//!
//! Each level (global, source, subscription, binding, capability endpoint) counts what it admitted in
//! the running UTC minute. A replica adds its counts to the store's `ingress_counts` once a second
//! ([`run`]) and reads back the total, so a level's count is its own admissions plus what the other
//! replicas had flushed by then: across N replicas a limit can be overrun by at most what they admit
//! in about one second. Refused requests are counted the same way, per subscription and outcome; only
//! the first [`tb_core::rate::RECORDS_PER_MINUTE`] a minute per subscription are also written one by
//! one (a `rate_limited` receipt, a `verification_failed` dead letter), so a flood of forged or
//! rate-limited requests costs one batched write a second, not one fsync each.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tb_core::rate::{self, Refusal, Scope};
use tb_store::IngressCount;

use crate::{clock, Engine};

/// Most `(level, key)` counters of one minute. Past it, new source addresses share the key `other`
/// (so a flood from many addresses cannot grow memory; they are then limited together).
const MAX_CELLS: usize = 100_000;
/// The shared source key of new addresses past `MAX_CELLS` (not an address, so never a real one).
pub const OVERFLOW: &str = "*overflow*";
/// Most pending refusal and earlier-minute counts held while the store refuses the flush.
const MAX_PENDING: usize = 100_000;
/// Rows of earlier minutes are removed after this many minutes (seven days).
const KEEP_MINUTES: i64 = 7 * 24 * 60;

/// One level a request is checked at: its scope, what it counts, and its limit a minute (0 = none).
#[derive(Debug, Clone, Copy)]
pub struct Level<'a> {
    pub scope: Scope,
    pub key: &'a str,
    pub limit: u32,
}

#[derive(Debug, Default, Clone, Copy)]
struct Cell {
    /// Admitted here this minute.
    local: u64,
    /// Of `local`, already added to the store.
    flushed: u64,
    /// Admitted by the other replicas this minute, as of the last flush.
    others: u64,
}

#[derive(Default)]
struct State {
    minute: i64,
    cells: HashMap<(Scope, String), Cell>,
    /// Unflushed admissions of minutes that have ended: `(minute, scope, key) -> n`.
    ended: HashMap<(i64, Scope, String), u64>,
    /// Unflushed refusals: `(minute, scope, key, outcome) -> n`.
    refusals: HashMap<(i64, Scope, String, String), u64>,
    /// Refusals written as their own record this minute, per subscription and outcome.
    kept: HashMap<(String, &'static str), u64>,
    /// The minute rows were last pruned at.
    pruned: i64,
}

impl State {
    /// Moves to `minute`: what the ended minute did not flush yet waits in `ended`.
    fn roll(&mut self, minute: i64) {
        if minute <= self.minute {
            return;
        }
        let old = self.minute;
        for ((scope, key), c) in self.cells.drain() {
            let rest = c.local - c.flushed;
            if rest > 0 && scope != Scope::Source && self.ended.len() < MAX_PENDING {
                *self.ended.entry((old, scope, key)).or_default() += rest;
            }
        }
        self.kept.clear();
        self.minute = minute;
    }
}

/// The counters of one replica.
#[derive(Default)]
pub struct RateLimits {
    state: Mutex<State>,
    /// One flush at a time (the periodic task and a caller's explicit flush), so the `flushed` marks
    /// and the totals read back stay in step.
    flushing: tokio::sync::Mutex<()>,
}

/// A taken batch: the rows to add, and for each row of the running minute's admissions the cell it came
/// from (to give its delta back if the store refuses the batch).
pub struct Batch {
    rows: Vec<IngressCount>,
    marks: Vec<Option<(Scope, String)>>,
    minute: i64,
    prune_before: Option<i64>,
}

impl RateLimits {
    /// Checks `levels` at `now_ms` and, when every one admits, counts the request at each (atomically:
    /// concurrent requests cannot both take a level's last place). A level with limit 0 is neither
    /// checked nor counted. `Err`: the first full level, in the order given.
    pub fn admit(&self, now_ms: i64, levels: &[Level<'_>]) -> Result<(), Refusal> {
        let mut st = self.state.lock().expect("rate limit lock");
        st.roll(rate::minute_of(now_ms));
        let mut keys = Vec::with_capacity(levels.len());
        for l in levels.iter().filter(|l| l.limit > 0) {
            let mut key = (l.scope, l.key.to_string());
            // Only client addresses are unbounded (subscriptions, bindings and endpoints are the
            // operator's): past the cap, new addresses share one bucket.
            if l.scope == Scope::Source
                && st.cells.len() >= MAX_CELLS
                && !st.cells.contains_key(&key)
            {
                key.1 = OVERFLOW.into();
            }
            let seen = st.cells.get(&key).map_or(0, |c| c.local + c.others);
            if !rate::admits(seen, l.limit) {
                return Err(Refusal {
                    scope: l.scope,
                    key: key.1,
                    limit: l.limit,
                    retry_after_s: rate::retry_after_s(now_ms),
                });
            }
            keys.push(key);
        }
        for k in keys {
            st.cells.entry(k).or_default().local += 1;
        }
        Ok(())
    }

    /// Counts one refused request of `outcome` under `(scope, key)` (a subscription, or `global` / `""`
    /// when no subscription is known). Returns whether it is among the first
    /// [`rate::RECORDS_PER_MINUTE`] of its subscription and outcome this minute, for the outcomes that
    /// are written as their own record ([`RECORDED`]), i.e. whether it should also be written.
    pub fn refused(&self, now_ms: i64, scope: Scope, key: &str, outcome: &'static str) -> bool {
        let mut st = self.state.lock().expect("rate limit lock");
        let minute = rate::minute_of(now_ms);
        st.roll(minute);
        let k = (minute, scope, key.to_string(), outcome.to_string());
        if st.refusals.len() < MAX_PENDING || st.refusals.contains_key(&k) {
            *st.refusals.entry(k).or_default() += 1;
        }
        if scope != Scope::Subscription || !RECORDED.contains(&outcome) {
            return false;
        }
        let nth = st.kept.entry((key.to_string(), outcome)).or_default();
        let keep = rate::keep_record(*nth);
        *nth += 1;
        keep
    }

    /// What `(scope, key)` has admitted this minute, here and (as of the last flush) elsewhere.
    pub fn seen(&self, scope: Scope, key: &str) -> u64 {
        let st = self.state.lock().expect("rate limit lock");
        st.cells
            .get(&(scope, key.to_string()))
            .map_or(0, |c| c.local + c.others)
    }

    /// Takes everything not yet flushed, marking the running minute's admissions as flushed.
    pub fn take(&self, now_ms: i64) -> Batch {
        let mut st = self.state.lock().expect("rate limit lock");
        let minute = rate::minute_of(now_ms);
        st.roll(minute);
        let mut rows = Vec::new();
        let mut marks = Vec::new();
        let row = |minute, scope: Scope, key: String, outcome: &str, n| IngressCount {
            minute,
            scope: scope.as_str().into(),
            key,
            outcome: outcome.into(),
            n,
        };
        for ((scope, key), c) in st.cells.iter_mut() {
            let delta = c.local - c.flushed;
            // Client addresses stay in this replica (unbounded keys: persisting them would be a row
            // per address): the source level is per replica.
            if *scope == Scope::Source {
                c.flushed = c.local;
                continue;
            }
            // A cell with nothing new is still read back while others may be counting: flushing 0
            // refreshes `others` at the cost of a row write, so only the cells used this second are.
            if delta == 0 {
                continue;
            }
            c.flushed = c.local;
            rows.push(row(minute, *scope, key.clone(), "admitted", delta));
            marks.push(Some((*scope, key.clone())));
        }
        for ((m, scope, key), n) in st.ended.drain() {
            rows.push(row(m, scope, key, "admitted", n));
            marks.push(None);
        }
        for ((m, scope, key, outcome), n) in st.refusals.drain() {
            rows.push(row(m, scope, key, &outcome, n));
            marks.push(None);
        }
        let prune_before = (st.pruned < minute).then(|| {
            st.pruned = minute;
            minute - KEEP_MINUTES
        });
        Batch {
            rows,
            marks,
            minute,
            prune_before,
        }
    }

    /// Learns what every replica together admitted this minute (`totals`: the store's `admitted`
    /// rows of `minute`): each level's count from the others is the total less what this replica has
    /// flushed. A level this replica has not used yet this minute starts from the others' count.
    fn learn(&self, minute: i64, totals: &[IngressCount]) {
        let mut st = self.state.lock().expect("rate limit lock");
        if st.minute != minute {
            return;
        }
        for t in totals {
            let Some(scope) = Scope::parse(&t.scope) else {
                continue;
            };
            let key = (scope, t.key.clone());
            if !st.cells.contains_key(&key) && st.cells.len() >= MAX_CELLS {
                continue;
            }
            let c = st.cells.entry(key).or_default();
            c.others = t.n.saturating_sub(c.flushed);
        }
    }

    /// Puts back a batch the store refused, to go with the next flush.
    fn put_back(&self, batch: Batch) {
        let mut st = self.state.lock().expect("rate limit lock");
        if batch.prune_before.is_some() {
            st.pruned = batch.minute - 1;
        }
        for (row, mark) in batch.rows.into_iter().zip(batch.marks) {
            let Some(scope) = Scope::parse(&row.scope) else {
                continue;
            };
            match mark {
                Some((scope, key)) if st.minute == batch.minute => {
                    if let Some(c) = st.cells.get_mut(&(scope, key)) {
                        c.flushed -= row.n.min(c.flushed);
                    }
                }
                _ if row.outcome == "admitted" => {
                    if st.ended.len() < MAX_PENDING {
                        *st.ended.entry((row.minute, scope, row.key)).or_default() += row.n;
                    }
                }
                _ => {
                    if st.refusals.len() < MAX_PENDING {
                        *st.refusals
                            .entry((row.minute, scope, row.key, row.outcome))
                            .or_default() += row.n;
                    }
                }
            }
        }
    }
}

/// The running minute of `r`'s counters.
fn running_minute(r: &RateLimits) -> i64 {
    r.state.lock().expect("rate limit lock").minute
}

/// The refusals that may also be written as their own record: a `rate_limited` receipt, a
/// `verification_failed` dead letter. Others are only counted, so they cannot use up the budget.
pub const RECORDED: [&str; 2] = ["rate_limited", "signature_invalid"];

impl Engine {
    /// Adds this replica's counts to the store and reads the shared totals back (see the module docs).
    /// A batch the store refuses is kept for the next flush.
    pub async fn flush_ingress_counts(&self) {
        let _one = self.rate_limits.flushing.lock().await;
        let batch = self.rate_limits.take(clock::now_ms());
        if !batch.rows.is_empty() || batch.prune_before.is_some() {
            match self
                .store
                .add_ingress_counts(batch.rows.clone(), batch.prune_before)
                .await
            {
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, rows = batch.rows.len(), "recording ingress counts failed; kept for the next flush");
                    self.rate_limits.put_back(batch);
                    return;
                }
            }
        }
        // What the other replicas admitted, also at levels this one has not used yet this minute, so
        // its first requests there count theirs (one indexed read a second).
        let minute = running_minute(&self.rate_limits);
        match self.store.admitted_totals(minute).await {
            Ok(totals) => self.rate_limits.learn(minute, &totals),
            Err(e) => tracing::debug!(error = %e, "reading shared rate-limit counts failed"),
        }
    }
}

/// Flushes the counts every second until `shutdown`, then once more; once a minute it also runs the
/// automatic quarantine rule ([`Engine::apply_quarantine_rules`]).
pub async fn run(engine: Arc<Engine>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let mut last_rule_minute = rate::minute_of(clock::now_ms());
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {
                engine.flush_ingress_counts().await;
                let now = clock::now_ms();
                if rate::minute_of(now) != last_rule_minute {
                    last_rule_minute = rate::minute_of(now);
                    engine.apply_quarantine_rules(now).await;
                }
            }
            _ = shutdown.changed() => break,
        }
    }
    engine.flush_ingress_counts().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: i64 = 1_700_000_000_000 - 1_700_000_000_000 % 60_000;

    fn lv(scope: Scope, key: &str, limit: u32) -> Level<'_> {
        Level { scope, key, limit }
    }

    #[test]
    fn every_level_must_admit_and_a_refusal_counts_nowhere() {
        let r = RateLimits::default();
        let levels = [lv(Scope::Global, "", 3), lv(Scope::Source, "a", 2)];
        assert!(r.admit(T, &levels).is_ok());
        assert!(r.admit(T, &levels).is_ok());
        let e = r.admit(T + 1500, &levels).unwrap_err();
        assert_eq!((e.scope, e.key.as_str(), e.limit), (Scope::Source, "a", 2));
        assert_eq!(e.retry_after_s, 59);
        assert_eq!(
            r.seen(Scope::Global, ""),
            2,
            "the refused one took no global place"
        );
        assert!(r
            .admit(T, &[lv(Scope::Global, "", 3), lv(Scope::Source, "b", 2)])
            .is_ok());
        let e = r
            .admit(T, &[lv(Scope::Global, "", 3), lv(Scope::Source, "c", 2)])
            .unwrap_err();
        assert_eq!(e.scope, Scope::Global);
        assert!(r.admit(T, &[lv(Scope::Source, "a", 0)]).is_ok(), "0 = none");
        // The next minute starts every level at 0.
        assert!(r.admit(T + 60_000, &levels).is_ok());
        assert_eq!(r.seen(Scope::Source, "a"), 1);
    }

    #[test]
    fn only_the_first_refusals_of_a_minute_are_kept_one_by_one() {
        let r = RateLimits::default();
        let kept = (0..50)
            .filter(|_| r.refused(T, Scope::Subscription, "gh", "signature_invalid"))
            .count() as u64;
        assert_eq!(kept, rate::RECORDS_PER_MINUTE);
        assert!(r.refused(T + 60_000, Scope::Subscription, "gh", "rate_limited"));
        assert!(!r.refused(T, Scope::Global, "", "not_found"));
        let b = r.take(T + 60_000);
        let mut rows: Vec<_> = b
            .rows
            .iter()
            .map(|x| {
                (
                    x.minute - T / 60_000,
                    x.scope.as_str(),
                    x.outcome.as_str(),
                    x.n,
                )
            })
            .collect();
        rows.sort();
        assert_eq!(
            rows,
            vec![
                (0, "global", "not_found", 1),
                (0, "subscription", "signature_invalid", 50),
                (1, "subscription", "rate_limited", 1),
            ]
        );
    }

    #[test]
    fn a_flush_learns_the_other_replicas_share_and_a_failed_one_is_put_back() {
        let r = RateLimits::default();
        let l = [lv(Scope::Subscription, "gh", 10)];
        for _ in 0..3 {
            r.admit(T, &l).unwrap();
        }
        let b = r.take(T);
        assert_eq!(b.rows.len(), 1);
        assert_eq!(b.rows[0].n, 3);
        // The store's total is 9: six came from the other replicas.
        r.learn(
            rate::minute_of(T),
            &[IngressCount {
                minute: rate::minute_of(T),
                scope: "subscription".into(),
                key: "gh".into(),
                outcome: "admitted".into(),
                n: 9,
            }],
        );
        assert_eq!(r.seen(Scope::Subscription, "gh"), 9);
        r.admit(T, &l).unwrap();
        assert!(r.admit(T, &l).is_err(), "3 + 6 + 1 = 10");
        let b = r.take(T);
        assert_eq!(b.rows[0].n, 1);
        r.put_back(b);
        assert_eq!(r.take(T).rows[0].n, 1, "the refused delta goes again");
        // Admissions of an ended minute are flushed under that minute.
        r.admit(T, &l).ok();
        r.refused(T, Scope::Subscription, "gh", "too_large");
        let b = r.take(T + 60_000);
        r.put_back(b);
        let b = r.take(T + 60_000);
        let outcomes: Vec<_> = b.rows.iter().map(|x| x.outcome.as_str()).collect();
        assert!(outcomes.contains(&"too_large"), "{outcomes:?}");
    }

    #[test]
    fn many_sources_share_one_bucket_past_the_cap_and_nothing_else_does() {
        let r = RateLimits::default();
        for i in 0..MAX_CELLS {
            r.admit(T, &[lv(Scope::Source, &i.to_string(), 1)]).unwrap();
        }
        assert!(r.admit(T, &[lv(Scope::Source, "new-1", 1)]).is_ok());
        let e = r.admit(T, &[lv(Scope::Source, "new-2", 1)]).unwrap_err();
        assert_eq!(e.key, OVERFLOW);
        // Subscriptions keep their own count past the cap.
        for sub in ["s2", "s3", "other"] {
            for _ in 0..3 {
                r.admit(T, &[lv(Scope::Subscription, sub, 3)]).unwrap();
            }
            let e = r.admit(T, &[lv(Scope::Subscription, sub, 3)]).unwrap_err();
            assert_eq!(e.key, sub);
        }
        assert!(r.state.lock().unwrap().cells.len() <= MAX_CELLS + 4);
        // And source counts are never written to the store.
        let b = r.take(T);
        assert!(
            b.rows.iter().all(|x| x.scope != "source"),
            "{:?}",
            b.rows.len()
        );
        assert_eq!(b.rows.len(), 3);
    }

    #[test]
    fn the_record_budget_is_per_outcome_and_only_for_recorded_outcomes() {
        let r = RateLimits::default();
        for _ in 0..50 {
            assert!(!r.refused(T, Scope::Subscription, "gh", "unsupported_media_type"));
        }
        assert!(
            r.refused(T, Scope::Subscription, "gh", "rate_limited"),
            "still kept"
        );
        assert!(r.refused(T, Scope::Subscription, "gh", "signature_invalid"));
    }
}
