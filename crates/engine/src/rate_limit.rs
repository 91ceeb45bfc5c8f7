//! Request rate limits (signals-and-connectors §0.5: 429 with `Retry-After`; DESIGN §10): one
//! token bucket per key (a subscription or a capability endpoint) allowing `per_min` requests a minute
//! with bursts of the same size. In memory, per process: a restart starts every bucket full.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

/// The buckets, created on first use.
#[derive(Default)]
pub struct RateLimits {
    buckets: Mutex<HashMap<String, (u32, Arc<DefaultDirectRateLimiter>)>>,
}

impl RateLimits {
    /// Takes one request from `key`'s bucket of `per_min` a minute. `Err(seconds)` when the bucket is
    /// empty: the whole seconds until a request would be allowed (at least 1). A changed `per_min`
    /// replaces the bucket.
    pub fn check(&self, key: &str, per_min: u32) -> Result<(), u64> {
        let Some(n) = NonZeroU32::new(per_min) else {
            return Ok(());
        };
        let limiter = {
            let mut m = self.buckets.lock().expect("rate limit lock");
            match m.get(key) {
                Some((q, l)) if *q == per_min => l.clone(),
                _ => {
                    let l = Arc::new(RateLimiter::direct(Quota::per_minute(n)));
                    m.insert(key.to_string(), (per_min, l.clone()));
                    l
                }
            }
        };
        limiter.check().map_err(|not_until| {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refuses_past_its_quota_and_says_when_to_retry() {
        let r = RateLimits::default();
        for _ in 0..3 {
            assert!(r.check("sub", 3).is_ok());
        }
        let wait = r.check("sub", 3).unwrap_err();
        assert!((1..=20).contains(&wait), "{wait}");
        assert!(r.check("other", 3).is_ok(), "buckets are per key");
        assert!(r.check("sub", 0).is_ok(), "0 = unlimited");
        assert!(r.check("sub", 4).is_ok(), "a new quota starts a new bucket");
    }
}
