//! One scheduler pass over one schedule, as a pure function: from the schedule's durable
//! cursor (the last nominal instant it handled) and "now", which ticks fire, which are counted as
//! missed or skipped, and where the cursor goes.
//!
//! **Exactly once per tick, by construction.** The cursor only ever moves from the last *nominal*
//! instant to a later nominal instant (never to "now": recomputing from now would skip a tick due
//! exactly now), by compare-and-set in the store. What fires is committed through the ordinary
//! receipt path with the tick's dedup key, unique in the store: [`Fire::dedup_id`]. Two loops (two
//! replicas, or a restart mid-pass) that plan from the same cursor plan the same fires and keys, so the
//! second commit is a duplicate and the second compare-and-set loses; no leader is needed.

use super::{MissedTicks, Overlap, Schedule};

/// The durable per-schedule state the store keeps (`schedule_cursors`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cursor {
    /// The last nominal instant handled (fired, skipped or missed), Unix ms; the anchor when the
    /// schedule was first seen.
    pub last_nominal_ms: i64,
    /// Ticks never fired since the schedule was created: missed (`skip`, the rest of `run_once` and
    /// `all`), skipped while paused, or skipped by the overlap policy.
    pub missed_total: u64,
    /// With `overlap = buffer_one`: the nominal instant of the tick waiting for the previous run.
    pub buffered_ms: Option<i64>,
    /// The receipt of the last fired tick (whose runs the overlap policy looks at).
    pub last_receipt: Option<String>,
}

/// The facts of one pass besides the cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PassInput {
    /// Now, Unix ms.
    pub now_ms: i64,
    /// Whether ticks fire: false while the subscription is `paused` (every due tick is skipped, no
    /// catch-up on resume). `failed` and `dead-lettered` fire as for webhooks: a dead-lettered
    /// subscription's receipts go straight to its dead letters, visible, until an operator resumes it.
    pub active: bool,
    /// Whether a run started by the last fired tick is still running (only looked up when the
    /// overlap policy is not `allow`).
    pub previous_running: bool,
}

/// One tick to commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fire {
    /// The nominal instant it is stamped with, Unix ms.
    pub nominal_ms: i64,
    /// `Some(from)` for the one `run_once` catch-up run: its dedup identity is the cursor it catches up
    /// from, so two loops that disagree on "now" still commit one catch-up.
    pub catch_up_from: Option<i64>,
    /// Ticks this fire stands for that will never fire themselves (`run_once`: the other missed ones).
    pub missed: u64,
}

impl Fire {
    /// The on-time (or `all` catch-up) fire of the tick at `nominal_ms`.
    pub fn on_time(nominal_ms: i64) -> Fire {
        Fire {
            nominal_ms,
            catch_up_from: None,
            missed: 0,
        }
    }

    /// The provider event id its dedup key is derived from (`tick:<nominal ms>`, or
    /// `catch-up:<cursor ms>` for the `run_once` catch-up).
    pub fn dedup_id(&self) -> String {
        match self.catch_up_from {
            Some(from) => format!("catch-up:{from}"),
            None => format!("tick:{}", self.nominal_ms),
        }
    }
}

/// What one pass decided.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Ticks to commit, in nominal order.
    pub fire: Vec<Fire>,
    /// Due ticks older than the grace that will not fire (missed-tick policy).
    pub missed: u64,
    /// Due ticks skipped because the subscription is not active.
    pub paused: u64,
    /// Due ticks skipped (or replaced in the buffer) by the overlap policy.
    pub overlap_skipped: u64,
    /// The cursor to compare-and-set, or `None` when nothing changes.
    pub cursor: Option<Cursor>,
    /// The next nominal instant after the new cursor (`None` past the schedule's end).
    pub next_nominal_ms: Option<i64>,
}

/// The due ticks of a pass, as walked so far.
#[derive(Default)]
struct Walk {
    /// (nominal instant, on time), in order; of the missed ones only the latest `catch_up_max`
    /// are kept (and only with `missed = all`).
    due: Vec<(i64, bool)>,
    last: i64,
    missed_count: u64,
    latest_missed: Option<i64>,
    walked: usize,
}

impl Walk {
    /// Walks due ticks after `self.last` until one is not due yet or `limit` ticks are walked.
    fn walk(&mut self, schedule: &Schedule, id: &str, now_ms: i64, limit: usize) {
        let spec = schedule.spec();
        while self.walked < limit {
            let Some(n) = schedule.next_after(self.last) else {
                break;
            };
            let fire_at = schedule.fire_at(id, n);
            if fire_at > now_ms {
                break;
            }
            self.walked += 1;
            self.last = n;
            if now_ms - fire_at <= spec.grace_ms as i64 {
                self.due.push((n, true));
                continue;
            }
            self.missed_count += 1;
            self.latest_missed = Some(n);
            if spec.missed == MissedTicks::All {
                self.due.push((n, false));
                let kept = self.due.iter().filter(|(_, t)| !t).count();
                if kept > spec.catch_up_max as usize {
                    let first = self.due.iter().position(|(_, t)| !t).expect("one is kept");
                    self.due.remove(first);
                }
            }
        }
    }
}

/// At most this many due ticks are walked one by one in a pass; past it the cursor jumps to the last
/// tick that is missed for sure (see [`plan`]). Bounds the work of a pass after a long outage of a
/// seconds schedule.
pub const MAX_WALK: usize = 10_000;

/// Plans one pass of `schedule` (`id` seeds its jitter) from `cursor`.
///
/// Due ticks are those after `cursor.last_nominal_ms` whose fire time (nominal + jitter) is at or
/// before `now_ms`, walked in order up to [`MAX_WALK`]. A due tick is on time while now is at most
/// `grace_ms` past its fire time, else missed. Then:
/// * not active: every due tick is skipped (`paused`), the buffer is dropped;
/// * missed ticks follow `missed`: `skip` counts them, `run_once` fires one [`Fire`] stamped with the
///   latest and counts the rest, `all` fires the latest `catch_up_max` and counts the rest;
/// * with `overlap` other than `allow` at most one tick fires per pass (the latest; the others count as
///   `overlap_skipped`), and while the previous run is still running `skip` drops it and `buffer_one`
///   keeps it in the cursor; a buffered tick fires in the first pass that finds the previous run ended.
pub fn plan(schedule: &Schedule, id: &str, cursor: &Cursor, input: PassInput) -> Plan {
    let spec = schedule.spec();
    let mut w = Walk {
        last: cursor.last_nominal_ms,
        ..Walk::default()
    };
    w.walk(schedule, id, input.now_ms, MAX_WALK);
    // A longer outage than one walk: every tick up to (now - grace - jitter) is missed for sure, so
    // jump the cursor to the last of them (counting the jump as one more missed tick: the counts
    // are exact up to MAX_WALK a pass, a lower bound past it) and walk the rest, which are few.
    if w.walked == MAX_WALK {
        let horizon = input.now_ms - spec.grace_ms as i64 - spec.jitter_ms as i64 - 1;
        if let Some(j) = schedule.at_or_before(horizon).filter(|j| *j > w.last) {
            w.last = j;
            w.missed_count += 1;
            w.latest_missed = Some(j);
            w.walked += 1;
            if spec.missed == MissedTicks::All {
                // The latest `catch_up_max` missed ticks, found backwards from the jump.
                w.due.retain(|(_, t)| *t);
                let mut back = vec![j];
                while back.len() < spec.catch_up_max as usize {
                    match schedule.at_or_before(back[back.len() - 1] - 1) {
                        Some(p) if p > cursor.last_nominal_ms => back.push(p),
                        _ => break,
                    }
                }
                back.reverse();
                w.due.extend(back.into_iter().map(|n| (n, false)));
            }
            w.walk(schedule, id, input.now_ms, 2 * MAX_WALK);
        }
    }
    let Walk {
        due,
        last,
        missed_count,
        latest_missed,
        walked,
    } = w;
    let mut out = Plan::default();
    let mut next = Cursor {
        last_nominal_ms: last,
        ..cursor.clone()
    };
    if !input.active {
        out.paused = walked as u64;
        next.buffered_ms = None;
        next.missed_total += out.paused;
        return finish(schedule, cursor, next, out);
    }
    // The missed-tick policy.
    let mut candidates: Vec<Fire> = Vec::new();
    match spec.missed {
        MissedTicks::Skip => out.missed = missed_count,
        MissedTicks::RunOnce => {
            if let Some(n) = latest_missed {
                candidates.push(Fire {
                    nominal_ms: n,
                    catch_up_from: Some(cursor.last_nominal_ms),
                    missed: missed_count - 1,
                });
                out.missed = missed_count - 1;
            }
        }
        MissedTicks::All => {
            let fired = due.iter().filter(|(_, t)| !t).count() as u64;
            out.missed = missed_count - fired;
        }
    }
    for (n, on_time) in &due {
        if *on_time || spec.missed == MissedTicks::All {
            candidates.push(Fire {
                nominal_ms: *n,
                catch_up_from: None,
                missed: 0,
            });
        }
    }
    candidates.sort_by_key(|f| f.nominal_ms);
    // The overlap policy.
    if spec.overlap != Overlap::Allow {
        if candidates.len() > 1 {
            out.overlap_skipped += (candidates.len() - 1) as u64;
            candidates.drain(..candidates.len() - 1);
        }
        if input.previous_running {
            if let Some(latest) = candidates.pop() {
                match spec.overlap {
                    Overlap::BufferOne => {
                        if next.buffered_ms.is_some() {
                            out.overlap_skipped += 1; // the older buffered tick is replaced
                        }
                        next.buffered_ms = Some(latest.nominal_ms);
                    }
                    _ => out.overlap_skipped += 1,
                }
            }
        } else if let Some(b) = next.buffered_ms.take() {
            if candidates.is_empty() {
                candidates.push(Fire {
                    nominal_ms: b,
                    catch_up_from: None,
                    missed: 0,
                });
            } else {
                // A newer tick is due as well: it fires, the buffered one is dropped.
                out.overlap_skipped += 1;
            }
        }
    }
    next.missed_total += out.missed + out.overlap_skipped;
    out.fire = candidates;
    finish(schedule, cursor, next, out)
}

fn finish(schedule: &Schedule, old: &Cursor, next: Cursor, mut out: Plan) -> Plan {
    out.next_nominal_ms = schedule.next_after(next.last_nominal_ms);
    out.cursor = (next != *old).then_some(next);
    out
}

/// How late a schedule is at `now_ms`: ms between the fire time of its next unhandled tick (the first
/// after `cursor`) and now, when that tick is due; 0 when nothing is due. Exposed as
/// `tb_schedule_lag_seconds` and, past the grace, in `GET /ready`.
pub fn lag_ms(schedule: &Schedule, id: &str, cursor: &Cursor, now_ms: i64) -> u64 {
    match schedule.next_after(cursor.last_nominal_ms) {
        Some(n) => (now_ms - schedule.fire_at(id, n)).max(0) as u64,
        None => 0,
    }
}
