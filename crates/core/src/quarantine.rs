//! Abuse quarantine: when a subscription is quarantined automatically (signals-and-connectors §0.3
//! "revocation and abuse quarantine take effect immediately").
//!
//! A quarantined subscription refuses every request with 403 `subscription_quarantined` before its body
//! is read, until an operator releases it. The automatic rule looks at the subscription's refused
//! requests per UTC minute, summed over every replica (`ingress_counts`; [`COUNTED_OUTCOMES`]):
//! signature failures, its own rate limit, size and header limits, bad content types and bodies. It is off unless configured, because anyone who knows an
//! ingest URL can make its refusals climb: turning it on trades a flood's cost for the chance that a
//! flood stops real deliveries too (senders that retry get them through after the release).

use serde::{Deserialize, Serialize};

/// The outcomes (`ingress_counts.outcome`) that count towards [`QuarantinePolicy::refusals_per_min`]:
/// every refusal a sender earns at this subscription. Not counted: `overloaded` (the server's own
/// 503), `quarantined` (already), `not_found`, and the server-wide and per-address rate limits
/// (`rate_limited_global`, `rate_limited_source`), which say nothing about this subscription.
pub const COUNTED_OUTCOMES: [&str; 9] = [
    "signature_invalid",
    "rate_limited",
    "too_large",
    "headers_too_large",
    "unsupported_media_type",
    "unprocessable",
    "rejected",
    "body_timeout",
    "body_broken",
];

/// A subscription's automatic quarantine rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuarantinePolicy {
    /// Refused requests a minute ([`COUNTED_OUTCOMES`]) that count as abuse; 0 = never automatically.
    pub refusals_per_min: u32,
    /// How many complete minutes in a row must reach it (at least 1).
    pub minutes: u32,
}

impl Default for QuarantinePolicy {
    /// Off; 5 minutes once a threshold is set.
    fn default() -> Self {
        QuarantinePolicy {
            refusals_per_min: 0,
            minutes: 5,
        }
    }
}

impl QuarantinePolicy {
    /// Whether the rule is on.
    pub fn enabled(&self) -> bool {
        self.refusals_per_min > 0
    }

    /// Whether `counts` (`(minute, refused requests)` of one subscription, any order, minutes without a
    /// row had none) show abuse: each of the [`minutes`](Self::minutes) complete minutes before
    /// `now_minute` reached [`refusals_per_min`](Self::refusals_per_min). The running minute is not
    /// looked at, so the decision does not depend on when in the minute it is taken.
    pub fn sustained(&self, counts: &[(i64, u64)], now_minute: i64) -> bool {
        if !self.enabled() {
            return false;
        }
        let minutes = i64::from(self.minutes.max(1));
        (now_minute - minutes..now_minute).all(|m| {
            let n: u64 = counts
                .iter()
                .filter(|(at, _)| *at == m)
                .map(|(_, n)| n)
                .sum();
            n >= u64::from(self.refusals_per_min)
        })
    }

    /// The recorded reason of an automatic quarantine.
    pub fn reason(&self) -> String {
        format!(
            "automatic: at least {} refused requests a minute for {} minute{} in a row",
            self.refusals_per_min,
            self.minutes.max(1),
            if self.minutes.max(1) == 1 { "" } else { "s" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_sustained_flood_of_complete_minutes_quarantines() {
        let p = QuarantinePolicy {
            refusals_per_min: 100,
            minutes: 3,
        };
        let now = 1000;
        let flood = [(997, 100), (998, 150), (999, 100)];
        assert!(p.sustained(&flood, now));
        assert!(
            !p.sustained(&[(997, 100), (998, 99), (999, 500)], now),
            "one quiet minute breaks the run"
        );
        assert!(
            !p.sustained(&[(998, 500), (999, 500), (1000, 500)], now),
            "the running minute is not counted"
        );
        assert!(
            p.sustained(&[(997, 60), (997, 40), (998, 100), (999, 100)], now),
            "rows of one minute (several outcomes) add up"
        );
        assert!(
            !QuarantinePolicy::default().sustained(&flood, now),
            "off by default"
        );
        assert!(p
            .reason()
            .contains("100 refused requests a minute for 3 minutes"));
    }
}
