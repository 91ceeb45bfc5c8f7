//! DST regression vectors and the pass planner's rules. Every instant is asserted in UTC.
//! 2026 transitions: Europe/Berlin springs forward 2026-03-29 02:00 CET -> 03:00 CEST and falls back
//! 2026-10-25 03:00 CEST -> 02:00 CET; America/New_York springs forward 2026-03-08 02:00 EST -> 03:00 EDT
//! and falls back 2026-11-01 02:00 EDT -> 01:00 EST.

use super::plan::{lag_ms, plan, Cursor, PassInput};
use super::*;

fn ms(rfc3339: &str) -> i64 {
    parse_instant(rfc3339).unwrap()
}

fn next(cron: &str, tz: &str, from: &str, n: usize) -> Vec<String> {
    let s = Schedule::new(ScheduleSpec {
        timezone: tz.into(),
        ..ScheduleSpec::new(cron)
    })
    .unwrap();
    s.upcoming(ms(from), n)
        .into_iter()
        .map(utc_rfc3339)
        .collect()
}

#[test]
fn berlin_fixed_time_in_the_spring_gap_fires_at_the_first_valid_instant() {
    assert_eq!(
        next("30 2 * * *", "Europe/Berlin", "2026-03-27T12:00:00Z", 4),
        [
            "2026-03-28T01:30:00Z", // 02:30 CET
            "2026-03-29T01:00:00Z", // 02:30 does not exist: 03:00 CEST
            "2026-03-30T00:30:00Z", // 02:30 CEST
            "2026-03-31T00:30:00Z",
        ]
    );
    // A tick at the very edge of the gap (02:00 is the first missing minute).
    assert_eq!(
        next("0 2 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", 2),
        ["2026-03-29T01:00:00Z", "2026-03-30T00:00:00Z"]
    );
}

#[test]
fn berlin_fixed_time_in_the_autumn_overlap_fires_once_at_the_first_occurrence() {
    assert_eq!(
        next("30 2 * * *", "Europe/Berlin", "2026-10-23T12:00:00Z", 4),
        [
            "2026-10-24T00:30:00Z", // 02:30 CEST
            "2026-10-25T00:30:00Z", // 02:30 CEST, the first of two; 01:30Z (02:30 CET) does not fire
            "2026-10-26T01:30:00Z", // 02:30 CET
            "2026-10-27T01:30:00Z",
        ]
    );
}

#[test]
fn berlin_interval_keeps_real_time_spacing_through_both_transitions() {
    assert_eq!(
        next("*/15 * * * *", "Europe/Berlin", "2026-03-29T00:30:00Z", 4),
        [
            "2026-03-29T00:45:00Z", // 01:45 CET
            "2026-03-29T01:00:00Z", // 03:00 CEST: 15 real minutes later
            "2026-03-29T01:15:00Z",
            "2026-03-29T01:30:00Z",
        ]
    );
    assert_eq!(
        next("*/15 * * * *", "Europe/Berlin", "2026-10-25T00:30:00Z", 6),
        [
            "2026-10-25T00:45:00Z", // 02:45 CEST
            "2026-10-25T01:00:00Z", // 02:00 CET: the repeated hour fires on each real quarter
            "2026-10-25T01:15:00Z",
            "2026-10-25T01:30:00Z",
            "2026-10-25T01:45:00Z",
            "2026-10-25T02:00:00Z", // 03:00 CET
        ]
    );
}

#[test]
fn new_york_fixed_times_across_both_transitions() {
    assert_eq!(
        next("30 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", 3),
        [
            "2026-03-08T07:00:00Z", // 02:30 does not exist: 03:00 EDT
            "2026-03-09T06:30:00Z", // 02:30 EDT
            "2026-03-10T06:30:00Z",
        ]
    );
    assert_eq!(
        next("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", 3),
        [
            "2026-11-01T05:30:00Z", // 01:30 EDT, the first of two; 06:30Z (01:30 EST) does not fire
            "2026-11-02T06:30:00Z", // 01:30 EST
            "2026-11-03T06:30:00Z",
        ]
    );
    // Six fields: seconds first.
    assert_eq!(
        next("0 0 2 * * *", "America/New_York", "2026-03-07T12:00:00Z", 2),
        ["2026-03-08T07:00:00Z", "2026-03-09T06:00:00Z"]
    );
}

#[test]
fn new_york_hourly_fires_every_real_hour_through_fall_back() {
    assert_eq!(
        next("0 * * * *", "America/New_York", "2026-11-01T04:30:00Z", 4),
        [
            "2026-11-01T05:00:00Z", // 01:00 EDT
            "2026-11-01T06:00:00Z", // 01:00 EST
            "2026-11-01T07:00:00Z", // 02:00 EST
            "2026-11-01T08:00:00Z",
        ]
    );
}

#[test]
fn bad_specs_are_refused_with_the_field_named() {
    let e = |spec: ScheduleSpec| Schedule::new(spec).unwrap_err();
    assert!(e(ScheduleSpec::new("* * * *")).contains("4 fields"));
    assert!(e(ScheduleSpec::new("* * * * * * *")).contains("7 fields"));
    assert!(e(ScheduleSpec::new("61 * * * *")).starts_with("cron"));
    assert!(e(ScheduleSpec::new("0 0 30 2 *")).contains("never fires"));
    assert!(e(ScheduleSpec {
        timezone: "Mars/Olympus".into(),
        ..ScheduleSpec::new("* * * * *")
    })
    .starts_with("timezone"));
    assert!(e(ScheduleSpec {
        jitter_ms: MAX_JITTER_MS + 1,
        ..ScheduleSpec::new("* * * * *")
    })
    .starts_with("jitterMs"));
    assert!(e(ScheduleSpec {
        start_ms: Some(2),
        end_ms: Some(1),
        ..ScheduleSpec::new("* * * * *")
    })
    .contains("after"));
    assert!(e(ScheduleSpec {
        catch_up_max: 0,
        ..ScheduleSpec::new("* * * * *")
    })
    .starts_with("catchUpMax"));
    assert!(e(ScheduleSpec::new("61 * * * *")).contains("minute 0-59"));
}

#[test]
fn start_and_end_bound_the_ticks_inclusively() {
    let s = Schedule::new(ScheduleSpec {
        start_ms: Some(ms("2026-12-01T10:00:00Z")),
        end_ms: Some(ms("2026-12-01T10:02:00Z")),
        ..ScheduleSpec::new("* * * * *")
    })
    .unwrap();
    let got: Vec<_> = s
        .upcoming(ms("2026-12-01T00:00:00Z"), 10)
        .into_iter()
        .map(utc_rfc3339)
        .collect();
    assert_eq!(
        got,
        [
            "2026-12-01T10:00:00Z",
            "2026-12-01T10:01:00Z",
            "2026-12-01T10:02:00Z"
        ]
    );
}

#[test]
fn jitter_is_stable_per_tick_and_bounded() {
    let s = Schedule::new(ScheduleSpec {
        jitter_ms: 5_000,
        ..ScheduleSpec::new("* * * * *")
    })
    .unwrap();
    let n = ms("2026-12-01T10:00:00Z");
    let offsets: Vec<i64> = (0..50)
        .map(|i| s.fire_at("sched", n + i * 60_000) - (n + i * 60_000))
        .collect();
    assert!(
        offsets.iter().all(|o| (0..=5_000).contains(o)),
        "{offsets:?}"
    );
    assert!(
        offsets.iter().any(|o| *o != offsets[0]),
        "jitter varies per tick"
    );
    assert_eq!(s.fire_at("sched", n), s.fire_at("sched", n), "stable");
}

// ---- the pass planner ----

fn minutely(missed: MissedTicks, overlap: Overlap) -> Schedule {
    Schedule::new(ScheduleSpec {
        missed,
        overlap,
        ..ScheduleSpec::new("* * * * *")
    })
    .unwrap()
}

fn at(t: &str) -> PassInput {
    PassInput {
        now_ms: ms(t),
        active: true,
        previous_running: false,
    }
}

fn cursor(t: &str) -> Cursor {
    Cursor {
        last_nominal_ms: ms(t),
        ..Default::default()
    }
}

fn fired(p: &super::plan::Plan) -> Vec<String> {
    p.fire.iter().map(|f| utc_rfc3339(f.nominal_ms)).collect()
}

#[test]
fn a_tick_due_exactly_now_fires_and_the_cursor_moves_to_its_nominal_instant() {
    let s = minutely(MissedTicks::Skip, Overlap::Allow);
    let p = plan(
        &s,
        "s",
        &cursor("2026-12-01T10:00:00Z"),
        at("2026-12-01T10:01:00Z"),
    );
    assert_eq!(fired(&p), ["2026-12-01T10:01:00Z"]);
    assert_eq!(
        p.fire[0].dedup_id(),
        format!("tick:{}", ms("2026-12-01T10:01:00Z"))
    );
    let c = p.cursor.unwrap();
    assert_eq!(c.last_nominal_ms, ms("2026-12-01T10:01:00Z"));
    assert_eq!(p.next_nominal_ms, Some(ms("2026-12-01T10:02:00Z")));
    // A second pass a moment later, from the new cursor: nothing, and no cursor write.
    let again = plan(&s, "s", &c, at("2026-12-01T10:01:00.900Z"));
    assert!(again.fire.is_empty() && again.cursor.is_none(), "{again:?}");
}

#[test]
fn a_stopped_server_catches_up_per_the_missed_policy() {
    // Down from 10:00:30 to 10:07:30: ticks 10:01 .. 10:07 came due; grace 60 s makes 10:07 on time.
    let (c, now) = (cursor("2026-12-01T10:00:00Z"), at("2026-12-01T10:07:30Z"));
    let skip = plan(&minutely(MissedTicks::Skip, Overlap::Allow), "s", &c, now);
    assert_eq!(fired(&skip), ["2026-12-01T10:07:00Z"]);
    assert_eq!(skip.missed, 6);
    assert_eq!(skip.cursor.as_ref().unwrap().missed_total, 6);

    let once = plan(
        &minutely(MissedTicks::RunOnce, Overlap::Allow),
        "s",
        &c,
        now,
    );
    assert_eq!(
        fired(&once),
        ["2026-12-01T10:06:00Z", "2026-12-01T10:07:00Z"]
    );
    assert_eq!(once.fire[0].catch_up_from, Some(c.last_nominal_ms));
    assert_eq!(once.fire[0].missed, 5);
    assert_eq!(
        once.fire[0].dedup_id(),
        format!("catch-up:{}", c.last_nominal_ms)
    );
    assert_eq!(once.missed, 5);

    let all = plan(
        &Schedule::new(ScheduleSpec {
            missed: MissedTicks::All,
            catch_up_max: 3,
            ..ScheduleSpec::new("* * * * *")
        })
        .unwrap(),
        "s",
        &c,
        now,
    );
    assert_eq!(
        fired(&all),
        [
            "2026-12-01T10:04:00Z",
            "2026-12-01T10:05:00Z",
            "2026-12-01T10:06:00Z",
            "2026-12-01T10:07:00Z"
        ]
    );
    assert_eq!(all.missed, 3);
    // An hourly schedule down from 10:00:30 to 13:30: 11:00, 12:00 and 13:00 are all past the
    // grace: skip fires nothing, run_once exactly one run stamped 13:00.
    let hourly = |missed| {
        Schedule::new(ScheduleSpec {
            missed,
            ..ScheduleSpec::new("0 * * * *")
        })
        .unwrap()
    };
    let back = at("2026-12-01T13:30:00Z");
    let late = plan(&hourly(MissedTicks::Skip), "s", &c, back);
    assert!(late.fire.is_empty(), "{late:?}");
    assert_eq!(late.missed, 3);
    assert_eq!(
        late.cursor.unwrap().last_nominal_ms,
        ms("2026-12-01T13:00:00Z")
    );
    let one = plan(&hourly(MissedTicks::RunOnce), "s", &c, back);
    assert_eq!(fired(&one), ["2026-12-01T13:00:00Z"]);
    assert_eq!((one.fire[0].missed, one.missed), (2, 2));
}

#[test]
fn a_paused_schedule_skips_and_resume_starts_from_the_next_tick() {
    let s = minutely(MissedTicks::RunOnce, Overlap::Allow);
    let paused = plan(
        &s,
        "s",
        &cursor("2026-12-01T10:00:00Z"),
        PassInput {
            active: false,
            ..at("2026-12-01T10:05:10Z")
        },
    );
    assert!(paused.fire.is_empty());
    assert_eq!(paused.paused, 5);
    let c = paused.cursor.unwrap();
    assert_eq!(c.last_nominal_ms, ms("2026-12-01T10:05:00Z"));
    // Resumed at 10:05:20: no catch-up; 10:06 fires on its time.
    let resumed = plan(&s, "s", &c, at("2026-12-01T10:05:20Z"));
    assert!(resumed.fire.is_empty() && resumed.cursor.is_none());
    let next = plan(&s, "s", &c, at("2026-12-01T10:06:00Z"));
    assert_eq!(fired(&next), ["2026-12-01T10:06:00Z"]);
}

#[test]
fn overlap_skip_and_buffer_one_while_the_previous_run_runs() {
    let c = cursor("2026-12-01T10:00:00Z");
    let running = PassInput {
        previous_running: true,
        ..at("2026-12-01T10:01:00Z")
    };
    let skip = plan(
        &minutely(MissedTicks::Skip, Overlap::Skip),
        "s",
        &c,
        running,
    );
    assert!(skip.fire.is_empty());
    assert_eq!(skip.overlap_skipped, 1);

    let b = minutely(MissedTicks::Skip, Overlap::BufferOne);
    let held = plan(&b, "s", &c, running);
    assert!(held.fire.is_empty());
    let hc = held.cursor.unwrap();
    assert_eq!(hc.buffered_ms, Some(ms("2026-12-01T10:01:00Z")));
    // Still running at the next tick: the newer tick replaces the buffered one.
    let replaced = plan(
        &b,
        "s",
        &hc,
        PassInput {
            previous_running: true,
            ..at("2026-12-01T10:02:00Z")
        },
    );
    let rc = replaced.cursor.unwrap();
    assert_eq!(rc.buffered_ms, Some(ms("2026-12-01T10:02:00Z")));
    assert_eq!(replaced.overlap_skipped, 1);
    // The run ended between ticks: the buffered tick fires with its own nominal instant.
    let released = plan(&b, "s", &rc, at("2026-12-01T10:02:30Z"));
    assert_eq!(fired(&released), ["2026-12-01T10:02:00Z"]);
    assert_eq!(released.cursor.unwrap().buffered_ms, None);
    // allow fires regardless.
    let allow = plan(
        &minutely(MissedTicks::Skip, Overlap::Allow),
        "s",
        &c,
        running,
    );
    assert_eq!(fired(&allow), ["2026-12-01T10:01:00Z"]);
}

#[test]
fn lag_counts_from_the_fire_time_of_the_next_unhandled_tick() {
    let s = minutely(MissedTicks::Skip, Overlap::Allow);
    let c = cursor("2026-12-01T10:00:00Z");
    assert_eq!(lag_ms(&s, "s", &c, ms("2026-12-01T10:00:30Z")), 0);
    assert_eq!(lag_ms(&s, "s", &c, ms("2026-12-01T10:01:45Z")), 45_000);
}

#[test]
fn a_long_outage_of_a_seconds_schedule_jumps_and_catches_up_once() {
    let once = Schedule::new(ScheduleSpec {
        missed: MissedTicks::RunOnce,
        ..ScheduleSpec::new("* * * * * *")
    })
    .unwrap();
    let c = cursor("2026-12-01T00:00:00Z");
    let now = at("2026-12-02T00:00:00Z");
    let p = plan(&once, "s", &c, now);
    // One catch-up stamped with the last missed second (60 s grace), then the on-time seconds.
    let catch_up: Vec<_> = p
        .fire
        .iter()
        .filter(|f| f.catch_up_from.is_some())
        .collect();
    assert_eq!(catch_up.len(), 1, "{:?}", p.fire.len());
    assert_eq!(utc_rfc3339(catch_up[0].nominal_ms), "2026-12-01T23:58:59Z");
    assert_eq!(
        p.fire.len(),
        1 + 61,
        "the catch-up and the seconds within the grace"
    );
    assert_eq!(
        p.cursor.unwrap().last_nominal_ms,
        ms("2026-12-02T00:00:00Z")
    );
    // all: the latest catch_up_max missed ticks, not the oldest.
    let all = Schedule::new(ScheduleSpec {
        missed: MissedTicks::All,
        catch_up_max: 3,
        ..ScheduleSpec::new("* * * * * *")
    })
    .unwrap();
    let p = plan(&all, "s", &c, now);
    let missed: Vec<String> = p
        .fire
        .iter()
        .take(3)
        .map(|f| utc_rfc3339(f.nominal_ms))
        .collect();
    assert_eq!(
        missed,
        [
            "2026-12-01T23:58:57Z",
            "2026-12-01T23:58:58Z",
            "2026-12-01T23:58:59Z"
        ]
    );
}

#[test]
fn jitter_must_stay_below_the_shortest_interval_and_windows_must_hold_a_tick() {
    let e = Schedule::new(ScheduleSpec {
        jitter_ms: 300_000,
        ..ScheduleSpec::new("*/5 * * * *")
    })
    .unwrap_err();
    assert!(e.contains("shortest interval"), "{e}");
    assert!(Schedule::new(ScheduleSpec {
        jitter_ms: 299_000,
        ..ScheduleSpec::new("*/5 * * * *")
    })
    .is_ok());
    let e = Schedule::new(ScheduleSpec {
        start_ms: Some(ms("2026-12-01T10:00:01Z")),
        end_ms: Some(ms("2026-12-01T10:00:59Z")),
        ..ScheduleSpec::new("* * * * *")
    })
    .unwrap_err();
    assert!(e.contains("no tick between start and end"), "{e}");
    let e = Schedule::new(ScheduleSpec {
        grace_ms: u64::MAX,
        ..ScheduleSpec::new("* * * * *")
    })
    .unwrap_err();
    assert!(e.starts_with("graceMs"), "{e}");
}
