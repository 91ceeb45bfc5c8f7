//! The time codec (wire spec §2.1, §5.5): RFC 3339 with nanoseconds, always UTC (`Z`).
//!
//! Go's `time.RFC3339Nano` output trims trailing zeros of the fraction (and the dot when it is zero):
//! `…45.12Z`, `…45Z`. The seed's text asks for 9 padded digits (`…45.120000000Z`), which only the
//! Python SDK writes. The default here is Go's (the seed's declared authority); [`set_padded`] switches
//! the whole process to the padded form. Decoding takes 0 to 9 fraction digits and `Z` or `±hh:mm`.
//! Times are not in the manifest hash, so the choice never changes `manifest_hash`.

use std::sync::atomic::{AtomicBool, Ordering};

use chrono::{DateTime, SecondsFormat, TimeZone, Utc};
use serde::{Deserialize, Serialize};

static PADDED: AtomicBool = AtomicBool::new(false);

/// Switches every encoded time of this process to the padded 9-digit form (`true`) or back to
/// Go's trimmed form (`false`, the default).
pub fn set_padded(padded: bool) {
    PADDED.store(padded, Ordering::Relaxed);
}

/// A wire time: a UTC instant with nanoseconds. `Default` is Go's zero time
/// (`0001-01-01T00:00:00Z`), what a missing time decodes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WireTime(pub DateTime<Utc>);

impl Default for WireTime {
    fn default() -> WireTime {
        WireTime(
            Utc.with_ymd_and_hms(1, 1, 1, 0, 0, 0)
                .single()
                .expect("year 1 exists"),
        )
    }
}

impl WireTime {
    /// Now.
    pub fn now() -> WireTime {
        WireTime(Utc::now())
    }

    /// From Unix nanoseconds.
    pub fn from_unix_nanos(ns: i64) -> WireTime {
        WireTime(Utc.timestamp_nanos(ns))
    }

    /// Unix nanoseconds (saturating outside chrono's range of them).
    pub fn unix_nanos(&self) -> i64 {
        self.0.timestamp_nanos_opt().unwrap_or(i64::MAX)
    }

    /// The text: Go-trimmed, or padded to 9 digits when [`set_padded`] is on.
    pub fn format(&self) -> String {
        format_rfc3339nano(self, PADDED.load(Ordering::Relaxed))
    }
}

/// `t` as RFC 3339 in UTC: `padded` = always 9 fraction digits; else Go's trimmed form (trailing
/// zeros removed, no dot for a whole second).
pub fn format_rfc3339nano(t: &WireTime, padded: bool) -> String {
    if padded {
        return t.0.to_rfc3339_opts(SecondsFormat::Nanos, true);
    }
    let base = t.0.format("%Y-%m-%dT%H:%M:%S").to_string();
    let ns = t.0.timestamp_subsec_nanos();
    if ns == 0 {
        return format!("{base}Z");
    }
    let frac = format!("{ns:09}");
    format!("{base}.{}Z", frac.trim_end_matches('0'))
}

/// Parses RFC 3339 with 0 to 9 fraction digits and `Z` or `±hh:mm`, to UTC. Errors: a message
/// quoting the text.
pub fn parse_rfc3339nano(text: &str) -> Result<WireTime, String> {
    let frac_ok = match text.find('.') {
        Some(dot) => {
            let digits = text[dot + 1..]
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .count();
            (1..=9).contains(&digits)
        }
        None => true,
    };
    if !frac_ok {
        return Err(format!("{text:?}: 1 to 9 fraction digits"));
    }
    DateTime::parse_from_rfc3339(text)
        .map(|t| WireTime(t.with_timezone(&Utc)))
        .map_err(|e| format!("{text:?} is not an RFC 3339 time: {e}"))
}

impl Serialize for WireTime {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.format())
    }
}

impl<'de> Deserialize<'de> for WireTime {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<WireTime, D::Error> {
        let text = String::deserialize(d)?;
        parse_rfc3339nano(&text).map_err(serde::de::Error::custom)
    }
}
