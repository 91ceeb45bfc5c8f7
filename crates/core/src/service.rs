//! Services that speak `triggers.v2` (issue #12): their liveness, as a pure rule over the last
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

/// A service's liveness from its replicas' last heartbeats `(arrival ms, shutting_down)`: `up` when
/// any replica is up, else `draining` when one is draining, else `down` when it has replicas (all
/// silent), `registered` when none ever sent a heartbeat.
pub fn service_liveness(replicas: impl IntoIterator<Item = (i64, bool)>, now_ms: i64) -> Liveness {
    let mut seen = Liveness::Registered;
    for (last, shutting_down) in replicas {
        match liveness(Some(last), shutting_down, now_ms) {
            Liveness::Up => return Liveness::Up,
            Liveness::Draining => seen = Liveness::Draining,
            Liveness::Down if seen == Liveness::Registered => seen = Liveness::Down,
            _ => {}
        }
    }
    seen
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
        assert_eq!(service_liveness([], now), Liveness::Registered);
        // One replica draining, another beating: up.
        assert_eq!(
            service_liveness([(now - 1_000, true), (now - 2_000, false)], now),
            Liveness::Up
        );
        assert_eq!(
            service_liveness([(now - 1_000, true), (now - 20_000, false)], now),
            Liveness::Draining
        );
        assert_eq!(
            service_liveness([(now - 20_000, false), (now - 16_000, true)], now),
            Liveness::Down
        );
    }
}
