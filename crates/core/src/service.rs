//! Services that speak `triggers.v2`: their liveness, as a pure rule over the last
//! heartbeat (wire spec §10: heartbeats every 5 s; down after 3 missed beats).

use serde::Serialize;

/// Heartbeat period of the protocol, in ms.
pub const HEARTBEAT_INTERVAL_MS: i64 = 5_000;
/// A service is `down` this long (ms) after its last heartbeat: 3 missed beats.
pub const DOWN_AFTER_MS: i64 = 3 * HEARTBEAT_INTERVAL_MS;

/// What the orchestrator knows of a service's replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Liveness {
    /// Registered, no heartbeat yet.
    Registered,
    /// A heartbeat within the last [`DOWN_AFTER_MS`].
    Up,
    /// The last heartbeat said `shutting_down`.
    Draining,
    /// No heartbeat for [`DOWN_AFTER_MS`].
    Down,
}

impl Liveness {
    /// Wire string (`registered`, `up`, `draining`, `down`).
    pub fn as_str(self) -> &'static str {
        match self {
            Liveness::Registered => "registered",
            Liveness::Up => "up",
            Liveness::Draining => "draining",
            Liveness::Down => "down",
        }
    }
}

/// The liveness at `now_ms` (Unix ms) of a service whose last heartbeat arrived at
/// `last_heartbeat_ms` with `shutting_down`.
pub fn liveness(last_heartbeat_ms: Option<i64>, shutting_down: bool, now_ms: i64) -> Liveness {
    match last_heartbeat_ms {
        None => Liveness::Registered,
        Some(t) if now_ms - t >= DOWN_AFTER_MS => Liveness::Down,
        Some(_) if shutting_down => Liveness::Draining,
        Some(_) => Liveness::Up,
    }
}

/// One replica's last heartbeat, as the rules read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Beat {
    /// When it arrived, Unix ms.
    pub at_ms: i64,
    pub shutting_down: bool,
    /// It carried the registered `manifest_hash` (false: a replica on another build).
    pub same_build: bool,
}

/// What a service's replicas say about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// `up` when any replica is up, else `draining` when one is draining, else `down` when it has
    /// replicas (all silent), `registered` when none ever sent a heartbeat.
    pub liveness: Liveness,
    /// Replicas `up` now.
    pub up: usize,
    /// A replica that is not `down` heartbeats another build.
    pub other_build: bool,
}

/// The [`Summary`] at `now_ms` of a service whose replicas last beat as `beats`.
pub fn summarize(beats: &[Beat], now_ms: i64) -> Summary {
    let mut out = Summary {
        liveness: Liveness::Registered,
        up: 0,
        other_build: false,
    };
    for b in beats {
        let l = liveness(Some(b.at_ms), b.shutting_down, now_ms);
        out.other_build |= l != Liveness::Down && !b.same_build;
        out.liveness = match (out.liveness, l) {
            (_, Liveness::Up) | (Liveness::Up, _) => Liveness::Up,
            (_, Liveness::Draining) | (Liveness::Draining, _) => Liveness::Draining,
            _ => Liveness::Down,
        };
        out.up += usize::from(l == Liveness::Up);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn down_after_three_missed_beats() {
        assert_eq!(liveness(None, false, 0), Liveness::Registered);
        assert_eq!(liveness(Some(1_000), false, 1_000 + 14_999), Liveness::Up);
        assert_eq!(liveness(Some(1_000), false, 1_000 + 15_000), Liveness::Down);
        assert_eq!(liveness(Some(1_000), true, 2_000), Liveness::Draining);
        assert_eq!(liveness(Some(1_000), true, 1_000 + 15_000), Liveness::Down);
    }

    #[test]
    fn one_live_replica_keeps_the_service_up() {
        let now = 100_000;
        let beat = |ago: i64, shutting_down: bool, same_build: bool| Beat {
            at_ms: now - ago,
            shutting_down,
            same_build,
        };
        let l = |beats: &[Beat]| summarize(beats, now).liveness;
        assert_eq!(l(&[]), Liveness::Registered);
        // One replica draining, another beating: up.
        assert_eq!(
            l(&[beat(1_000, true, true), beat(2_000, false, true)]),
            Liveness::Up
        );
        assert_eq!(
            l(&[beat(1_000, true, true), beat(20_000, false, true)]),
            Liveness::Draining
        );
        assert_eq!(
            l(&[beat(20_000, false, true), beat(16_000, true, true)]),
            Liveness::Down
        );
        // Counted: the up ones; another build only while it is not down.
        let s = summarize(
            &[
                beat(1_000, false, true),
                beat(1_000, true, false),
                beat(30_000, false, false),
            ],
            now,
        );
        assert_eq!((s.up, s.other_build), (1, true));
        let s = summarize(&[beat(1_000, false, true), beat(30_000, false, false)], now);
        assert_eq!((s.up, s.other_build), (1, false));
    }
}
