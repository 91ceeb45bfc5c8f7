//! Retry policy and backoff (DESIGN §4 Delivery; schedule and Retry-After rules from
//! signals-and-connectors §7, Svix's published retry behaviour).

use serde::{Deserialize, Serialize};

/// Backoff shape between attempts (OpenWOP `retryPolicy.backoff`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backoff {
    /// Retry at once.
    None,
    /// Wait `initial_ms` before every retry.
    Fixed,
    /// Wait `initial_ms * 2^(n-2)` before attempt n, capped at `max_ms`; or follow `schedule_ms` when set.
    Exponential,
}

/// The Svix / Standard Webhooks schedule: delays before attempts 2..=8 (5 s, 5 min, 30 min, 2 h, 5 h,
/// 10 h, 10 h), in ms.
pub const DEFAULT_SCHEDULE_MS: [u64; 7] = [
    5_000, 300_000, 1_800_000, 7_200_000, 18_000_000, 36_000_000, 36_000_000,
];

/// A delivery's retry policy.
///
/// * `max_attempts` >= 1: attempts in all, the first included.
/// * `initial_ms`, `max_ms`: first delay and delay cap, in ms.
/// * `jitter`: fraction in [0, 1]; each delay is scaled by a random factor in `[1 - jitter, 1 + jitter]`.
/// * `schedule_ms`: explicit delays before attempts 2, 3, ... (the last value repeats); overrides the
///   computed exponential delays. The default policy uses [`DEFAULT_SCHEDULE_MS`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub backoff: Backoff,
    pub initial_ms: u64,
    pub max_ms: u64,
    pub jitter: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_ms: Option<Vec<u64>>,
}

impl Default for RetryPolicy {
    /// 8 attempts at 0, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h with 20 % jitter.
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 8,
            backoff: Backoff::Exponential,
            initial_ms: 5_000,
            max_ms: 36_000_000,
            jitter: 0.2,
            schedule_ms: Some(DEFAULT_SCHEDULE_MS.to_vec()),
        }
    }
}

impl RetryPolicy {
    /// Checks the policy; the error says which field to fix.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_attempts == 0 {
            return Err("max_attempts must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(format!(
                "jitter must be within 0.0..=1.0, got {}",
                self.jitter
            ));
        }
        if self.max_ms < self.initial_ms {
            return Err(format!(
                "max_ms ({}) must be >= initial_ms ({})",
                self.max_ms, self.initial_ms
            ));
        }
        Ok(())
    }

    /// The policy for a delivery replayed `replays` times by an operator: each replay grants one attempt
    /// beyond `max_attempts` (attempt numbers never reset, so without it a replayed delivery would
    /// dead-letter at once). Source: `replay_delivery` (`crate::replay::reopen` counts the replays).
    pub fn with_replays(&self, replays: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts: self.max_attempts.saturating_add(replays),
            ..self.clone()
        }
    }

    /// The nominal (un-jittered) delay in ms before attempt `next_attempt` (2-based: the delay before
    /// attempt 2 is the first retry delay).
    pub fn base_delay_ms(&self, next_attempt: u32) -> u64 {
        let n = next_attempt.saturating_sub(2) as usize;
        if let Some(s) = self.schedule_ms.as_ref().filter(|s| !s.is_empty()) {
            return s[n.min(s.len() - 1)];
        }
        match self.backoff {
            Backoff::None => 0,
            Backoff::Fixed => self.initial_ms,
            Backoff::Exponential => {
                let shift = n.min(40) as u32;
                self.initial_ms
                    .saturating_mul(1u64 << shift)
                    .min(self.max_ms)
            }
        }
    }

    /// The delay in ms before attempt `next_attempt`, with jitter drawn from `unit` (a value in [0, 1)),
    /// and an optional `Retry-After` from the target clamped to `[base, 2 * base]` (Svix rule).
    pub fn delay_ms(&self, next_attempt: u32, unit: f64, retry_after_ms: Option<u64>) -> u64 {
        let base = self.base_delay_ms(next_attempt);
        if let Some(ra) = retry_after_ms {
            return ra.clamp(base, base.saturating_mul(2));
        }
        let factor = 1.0 + self.jitter * (2.0 * unit - 1.0);
        ((base as f64) * factor).round().max(0.0) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_follows_the_svix_schedule() {
        let p = RetryPolicy::default();
        let got: Vec<u64> = (2..=8).map(|n| p.base_delay_ms(n)).collect();
        assert_eq!(got, DEFAULT_SCHEDULE_MS.to_vec());
        assert_eq!(p.max_attempts, 8);
        // 20 % jitter bounds.
        assert_eq!(p.delay_ms(2, 0.0, None), 4_000);
        assert_eq!(p.delay_ms(2, 1.0, None), 6_000);
        assert_eq!(p.delay_ms(2, 0.5, None), 5_000);
    }

    #[test]
    fn exponential_fixed_none() {
        let mut p = RetryPolicy {
            max_attempts: 5,
            backoff: Backoff::Exponential,
            initial_ms: 100,
            max_ms: 350,
            jitter: 0.0,
            schedule_ms: None,
        };
        assert_eq!(
            (2..=5).map(|n| p.base_delay_ms(n)).collect::<Vec<_>>(),
            vec![100, 200, 350, 350]
        );
        p.backoff = Backoff::Fixed;
        assert_eq!(p.base_delay_ms(4), 100);
        p.backoff = Backoff::None;
        assert_eq!(p.base_delay_ms(4), 0);
    }

    #[test]
    fn retry_after_is_clamped() {
        let p = RetryPolicy::default();
        assert_eq!(
            p.delay_ms(2, 0.5, Some(120_000)),
            10_000,
            "clamped to 2 x 5 s"
        );
        assert_eq!(p.delay_ms(2, 0.5, Some(1)), 5_000, "never below the base");
        assert_eq!(p.delay_ms(3, 0.5, Some(400_000)), 400_000);
    }

    #[test]
    fn each_replay_grants_one_more_attempt() {
        let p = RetryPolicy::default().with_replays(2);
        assert_eq!(p.max_attempts, 10);
        assert_eq!(p.schedule_ms, RetryPolicy::default().schedule_ms);
        let top = RetryPolicy {
            max_attempts: u32::MAX,
            ..Default::default()
        };
        assert_eq!(top.with_replays(1).max_attempts, u32::MAX);
    }

    #[test]
    fn validation_messages() {
        let mut p = RetryPolicy {
            max_attempts: 0,
            ..Default::default()
        };
        assert!(p.validate().unwrap_err().contains("max_attempts"));
        p.max_attempts = 1;
        p.jitter = 1.5;
        assert!(p.validate().unwrap_err().contains("jitter"));
    }
}
