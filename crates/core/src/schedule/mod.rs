//! Cron schedules: what a `schedule` subscription fires, and when.
//!
//! A [`ScheduleSpec`] is data (config file, API, store); [`Schedule::new`] compiles it once. The cron
//! arithmetic, time zones and daylight-saving rules are the pinned `croner` crate's (with `chrono-tz`),
//! never ours: 5 fields (minute hour day-of-month month day-of-week), or 6 with seconds first.
//!
//! **Nominal instants.** A tick's identity is its nominal UTC instant (Unix ms, a whole second), the
//! instant the expression names in the schedule's zone. Jitter delays when it fires, never what it is:
//! the dedup key is (schedule id, nominal instant), so a late, jittered or twice-computed tick is still
//! one tick.
//!
//! **DST** (held by the vectors in `tests.rs`, Europe/Berlin and America/New_York):
//! * a fixed local time that does not exist on the spring-forward day (02:30 in Berlin on 2026-03-29)
//!   fires once, at the first valid instant after the gap (03:00 CEST = 01:00 UTC);
//! * a fixed local time that happens twice on the fall-back day (02:30 in Berlin on 2026-10-25) fires
//!   once, at its first occurrence (02:30 CEST = 00:30 UTC);
//! * interval and wildcard schedules (`*/15 * * * *`, `0 * * * *`) keep real-time spacing through both:
//!   no 15-minute slot is lost in the gap, and the repeated hour fires on each real quarter.
//!
//! The planning of one pass (missed ticks, pause, overlap) is [`plan::plan`].

pub mod plan;
#[cfg(test)]
mod tests;

use std::str::FromStr;

use chrono::{DateTime, TimeZone, Utc};
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What a pass does with ticks that came due while nobody could fire them (the server was down, or
/// every replica's loop was stopped), i.e. ticks older than [`ScheduleSpec::grace_ms`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum MissedTicks {
    /// Fire none of them; count them (`missed` on the schedule, `tb_schedule_ticks_total{outcome="missed"}`).
    #[default]
    Skip,
    /// Fire one run, stamped with the latest missed nominal instant; count the rest.
    RunOnce,
    /// Fire each, the latest [`ScheduleSpec::catch_up_max`] of them; count the rest.
    All,
}

impl MissedTicks {
    /// Wire string (`skip`, `run_once`, `all`).
    pub fn as_str(self) -> &'static str {
        match self {
            MissedTicks::Skip => "skip",
            MissedTicks::RunOnce => "run_once",
            MissedTicks::All => "all",
        }
    }
}

/// What a tick does while the run started by the schedule's previous tick is still running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Overlap {
    /// Fire anyway: runs may overlap.
    #[default]
    Allow,
    /// Do not fire; count it (`outcome="overlap_skipped"`).
    Skip,
    /// Keep the latest such tick (one at most) and fire it when the previous run has ended.
    BufferOne,
}

impl Overlap {
    /// Wire string (`allow`, `skip`, `buffer_one`).
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Allow => "allow",
            Overlap::Skip => "skip",
            Overlap::BufferOne => "buffer_one",
        }
    }
}

/// The event type of every tick (`schedule.tick`: normalized event `schedule`, action `tick`).
pub const TICK_EVENT: &str = "schedule";
/// The action of every tick.
pub const TICK_ACTION: &str = "tick";

/// The normalized fields a tick carries (bindings may filter on and map inputs from these):
/// `schedule.nominal_time` and `schedule.fired_at` (RFC 3339, UTC), `schedule.catch_up` (bool: the
/// `run_once` catch-up run) and `schedule.missed` (ticks this one stands for that never fired).
pub const FIELDS: &[&str] = &[
    "schedule.nominal_time",
    "schedule.fired_at",
    "schedule.catch_up",
    "schedule.missed",
];

/// Default [`ScheduleSpec::grace_ms`]: 60 000 ms (1 min).
pub const DEFAULT_GRACE_MS: u64 = 60_000;
/// Default [`ScheduleSpec::catch_up_max`]: 10 ticks.
pub const DEFAULT_CATCH_UP_MAX: u32 = 10;
/// Largest [`ScheduleSpec::catch_up_max`]: 1 000 ticks.
pub const MAX_CATCH_UP: u32 = 1_000;
/// Largest [`ScheduleSpec::jitter_ms`]: 3 600 000 ms (1 h).
pub const MAX_JITTER_MS: u64 = 3_600_000;
/// Largest [`ScheduleSpec::grace_ms`]: 604 800 000 ms (7 days).
pub const MAX_GRACE_MS: u64 = 7 * 86_400_000;
/// Largest accepted cron expression, in bytes.
pub const MAX_CRON_LEN: usize = 256;

fn utc() -> String {
    "UTC".into()
}

fn default_grace_ms() -> u64 {
    DEFAULT_GRACE_MS
}

fn default_catch_up_max() -> u32 {
    DEFAULT_CATCH_UP_MAX
}

/// A schedule as configured (config `[subscriptions.schedule]`, API `POST /v1/schedules`, the
/// subscription's stored config). Times are Unix ms.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleSpec {
    /// Cron expression: 5 fields, or 6 with seconds first (`croner` syntax: `*`, lists, ranges,
    /// steps, names, `L`, `W`, `#`).
    pub cron: String,
    /// IANA time zone the expression is read in (default `UTC`).
    #[serde(default = "utc")]
    pub timezone: String,
    /// Each tick fires up to this many ms after its nominal instant (a stable pseudo-random offset per
    /// tick, at most [`MAX_JITTER_MS`]); 0 (default) fires on time.
    #[serde(default)]
    pub jitter_ms: u64,
    /// No tick before this instant (inclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ms: Option<i64>,
    /// No tick after this instant (inclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_ms: Option<i64>,
    /// A tick is on time while it is at most this many ms past its fire time (default
    /// [`DEFAULT_GRACE_MS`]); older ones are missed and follow [`ScheduleSpec::missed`].
    #[serde(default = "default_grace_ms")]
    pub grace_ms: u64,
    /// Missed-tick policy (default `skip`).
    #[serde(default)]
    pub missed: MissedTicks,
    /// With `missed = all`: at most this many missed ticks fire (the latest ones), 1 ..= [`MAX_CATCH_UP`].
    #[serde(default = "default_catch_up_max")]
    pub catch_up_max: u32,
    /// Overlap policy (default `allow`).
    #[serde(default)]
    pub overlap: Overlap,
}

impl ScheduleSpec {
    /// A spec with every default: `cron` read in UTC, no jitter, no window, `skip`, `allow`.
    pub fn new(cron: &str) -> ScheduleSpec {
        ScheduleSpec {
            cron: cron.into(),
            timezone: utc(),
            jitter_ms: 0,
            start_ms: None,
            end_ms: None,
            grace_ms: DEFAULT_GRACE_MS,
            missed: MissedTicks::Skip,
            catch_up_max: DEFAULT_CATCH_UP_MAX,
            overlap: Overlap::Allow,
        }
    }
}

/// A compiled schedule: its spec, parsed expression and zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    spec: ScheduleSpec,
    cron: Cron,
    tz: chrono_tz::Tz,
}

/// The parser: seconds optional (5 or 6 fields), no year field.
fn parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
}

impl Schedule {
    /// Compiles `spec`. Errors (a message naming the field): an expression that is not 5 or 6 valid
    /// fields, an unknown IANA zone, jitter above [`MAX_JITTER_MS`], `startMs` after `endMs`,
    /// `catchUpMax` outside 1 ..= [`MAX_CATCH_UP`], or an expression that never fires.
    pub fn new(spec: ScheduleSpec) -> Result<Schedule, String> {
        let text = spec.cron.trim().to_string();
        if text.len() > MAX_CRON_LEN {
            return Err(format!("cron: longer than {MAX_CRON_LEN} bytes"));
        }
        let fields = text.split_whitespace().count();
        if !(5..=6).contains(&fields) {
            return Err(format!(
                "cron {text:?}: {fields} fields; use 5 (minute hour day-of-month month day-of-week) or 6 (seconds first)"
            ));
        }
        let cron = parser().parse(&text).map_err(|e| {
            format!(
                "cron {text:?}: {e} (fields: [second 0-59] minute 0-59, hour 0-23, day-of-month 1-31, month 1-12 or JAN-DEC, day-of-week 0-7 or SUN-SAT)"
            )
        })?;
        let tz = chrono_tz::Tz::from_str(&spec.timezone).map_err(|_| {
            format!(
                "timezone {:?}: not an IANA time zone (e.g. UTC, Europe/Berlin, America/New_York)",
                spec.timezone
            )
        })?;
        if spec.jitter_ms > MAX_JITTER_MS {
            return Err(format!("jitterMs: at most {MAX_JITTER_MS}"));
        }
        if let (Some(s), Some(e)) = (spec.start_ms, spec.end_ms) {
            if s > e {
                return Err("startMs is after endMs".into());
            }
        }
        if !(1..=MAX_CATCH_UP).contains(&spec.catch_up_max) {
            return Err(format!("catchUpMax: 1 to {MAX_CATCH_UP}"));
        }
        if spec.grace_ms > MAX_GRACE_MS {
            return Err(format!("graceMs: at most {MAX_GRACE_MS} (7 days)"));
        }
        let s = Schedule { spec, cron, tz };
        // An expression such as `0 0 30 2 *` (30 February) never fires: refuse it now, not silently.
        let probe_from = s.spec.start_ms.map_or(0, |t| t - 1).max(0);
        let Some(first) = s.search(probe_from) else {
            return Err(format!("cron {text:?}: never fires"));
        };
        if s.spec.end_ms.is_some_and(|e| first > e) {
            return Err(format!(
                "cron {text:?}: no tick between start and end (the first is {})",
                utc_rfc3339(first)
            ));
        }
        // Jitter must stay below the shortest gap between ticks, or a late-jittered tick would hold
        // back the ones after it past their grace.
        if s.spec.jitter_ms > 0 {
            let ticks = s.upcoming(probe_from, 200);
            if let Some(gap) = ticks.windows(2).map(|w| w[1] - w[0]).min() {
                if s.spec.jitter_ms as i64 >= gap {
                    return Err(format!(
                        "jitterMs ({}) must be less than the shortest interval between ticks ({gap} ms)",
                        s.spec.jitter_ms
                    ));
                }
            }
        }
        Ok(s)
    }

    /// The spec it was compiled from.
    pub fn spec(&self) -> &ScheduleSpec {
        &self.spec
    }

    /// The zone the expression is read in.
    pub fn zone(&self) -> chrono_tz::Tz {
        self.tz
    }

    /// Checks that the schedule still has a tick after `now_ms` (a new schedule whose window has
    /// passed would never fire). Errors: the reason, for the caller to show.
    pub fn check_fires_after(&self, now_ms: i64) -> Result<(), String> {
        match self.next_after(now_ms) {
            Some(_) => Ok(()),
            None => Err("no tick after now (is end in the past?)".into()),
        }
    }

    /// Whether `ms` is one of the schedule's nominal instants (a tick), not just some instant.
    pub fn is_tick(&self, ms: i64) -> bool {
        ms.rem_euclid(1000) == 0 && self.at_or_before(ms) == Some(ms)
    }

    /// The first nominal instant strictly after `after_ms` (Unix ms) within the start/end window, or
    /// `None` past the end (or when the expression has no match within croner's search limit).
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let after = match self.spec.start_ms {
            Some(start) => after_ms.max(start - 1),
            None => after_ms,
        };
        let next = self.search(after)?;
        match self.spec.end_ms {
            Some(end) if next > end => None,
            _ => Some(next),
        }
    }

    /// The last nominal instant at or before `at_ms` (ignoring the start/end window), if any.
    pub fn at_or_before(&self, at_ms: i64) -> Option<i64> {
        let from: DateTime<chrono_tz::Tz> = Utc
            .timestamp_opt(at_ms.div_euclid(1000), 0)
            .single()?
            .with_timezone(&self.tz);
        let prev = self.cron.find_previous_occurrence(&from, true).ok()?;
        Some(prev.timestamp() * 1000)
    }

    /// Unbounded search: the first match strictly after `after_ms`.
    fn search(&self, after_ms: i64) -> Option<i64> {
        // Croner works in whole seconds: from the second that holds `after_ms`, exclusive, the
        // answer is strictly after `after_ms` too.
        let secs = after_ms.div_euclid(1000);
        let from: DateTime<chrono_tz::Tz> =
            Utc.timestamp_opt(secs, 0).single()?.with_timezone(&self.tz);
        let next = self.cron.find_next_occurrence(&from, false).ok()?;
        Some(next.timestamp() * 1000)
    }

    /// The next `count` nominal instants strictly after `after_ms` (fewer past the end).
    pub fn upcoming(&self, after_ms: i64, count: usize) -> Vec<i64> {
        let mut out = Vec::with_capacity(count.min(1024));
        let mut at = after_ms;
        while out.len() < count {
            match self.next_after(at) {
                Some(n) => {
                    out.push(n);
                    at = n;
                }
                None => break,
            }
        }
        out
    }

    /// When the tick of `nominal_ms` fires: its nominal instant plus a stable offset in
    /// `0 ..= jitter_ms`, derived from (`schedule_id`, nominal instant), so every replica computes the
    /// same fire time.
    pub fn fire_at(&self, schedule_id: &str, nominal_ms: i64) -> i64 {
        if self.spec.jitter_ms == 0 {
            return nominal_ms;
        }
        let mut h = Sha256::new();
        h.update(schedule_id.as_bytes());
        h.update(b"\0");
        h.update(nominal_ms.to_be_bytes());
        let d = h.finalize();
        let x = u64::from_be_bytes(d[..8].try_into().expect("8 bytes"));
        nominal_ms + (x % (self.spec.jitter_ms + 1)) as i64
    }

    /// `ms` as RFC 3339 in the schedule's zone, with its offset (`2026-03-29T03:00:00+02:00`).
    pub fn local_rfc3339(&self, ms: i64) -> String {
        match Utc.timestamp_millis_opt(ms).single() {
            Some(t) => t
                .with_timezone(&self.tz)
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            None => String::new(),
        }
    }
}

/// `ms` as RFC 3339 in UTC, whole seconds (`2026-03-29T01:00:00Z`).
pub fn utc_rfc3339(ms: i64) -> String {
    match Utc.timestamp_millis_opt(ms).single() {
        Some(t) => t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        None => String::new(),
    }
}

/// Parses an RFC 3339 instant (config `start` / `end`) into Unix ms. Errors: a message quoting it.
pub fn parse_instant(text: &str) -> Result<i64, String> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|e| {
            format!("{text:?} is not an RFC 3339 instant (e.g. 2026-12-01T09:00:00Z): {e}")
        })
}
