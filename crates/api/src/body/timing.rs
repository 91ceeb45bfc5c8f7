//! The deadline of every request body: the gap rule and the minimum-rate rule ([`BodyRules`]), and
//! the body wrapper that enforces them ([`TimedBody`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use super::{DEFAULT_BODY_MIN_RATE, DEFAULT_BODY_MIN_RATE_GRACE_MS, DEFAULT_BODY_TIMEOUT_MS};

/// How fast a request body must arrive (`[server].body_timeout_ms`, `body_min_rate_bytes_per_s`,
/// `body_min_rate_grace_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyRules {
    /// Longest gap between two chunks (default [`DEFAULT_BODY_TIMEOUT_MS`]).
    pub timeout: Duration,
    /// Least average rate in bytes/s, counted from the headers, once `min_rate_grace` has passed
    /// (0 = no rate rule; default [`DEFAULT_BODY_MIN_RATE`]).
    pub min_rate_bytes_per_s: u64,
    /// Time after the headers before the rate rule applies (default
    /// [`DEFAULT_BODY_MIN_RATE_GRACE_MS`]).
    pub min_rate_grace: Duration,
}

impl Default for BodyRules {
    fn default() -> Self {
        BodyRules {
            timeout: Duration::from_millis(DEFAULT_BODY_TIMEOUT_MS),
            min_rate_bytes_per_s: DEFAULT_BODY_MIN_RATE,
            min_rate_grace: Duration::from_millis(DEFAULT_BODY_MIN_RATE_GRACE_MS),
        }
    }
}

impl BodyRules {
    /// The pure rule: having received `received` bytes, the last of them `last_chunk` after the headers,
    /// the next chunk must arrive by the returned offset from the headers: the earlier of
    /// `last_chunk + timeout` (gap rule) and `max(min_rate_grace, received / min_rate)` (rate rule:
    /// past the grace, the average rate since the headers may not fall below `min_rate`).
    pub fn deadline(&self, received: u64, last_chunk: Duration) -> Duration {
        let gap = last_chunk + self.timeout;
        if self.min_rate_bytes_per_s == 0 {
            return gap;
        }
        let rate = Duration::from_secs_f64(received as f64 / self.min_rate_bytes_per_s as f64)
            .max(self.min_rate_grace);
        gap.min(rate)
    }
}

/// The error a [`TimedBody`] ends with when its sender is too slow (see [`BodyRules`]).
#[derive(Debug, Clone, Copy)]
pub struct BodyTimedOut {
    /// Bytes received before the deadline passed.
    pub received: u64,
}

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body did not arrive in time ({} bytes received)",
            self.received
        )
    }
}

impl std::error::Error for BodyTimedOut {}

/// True when `e` (or an error it wraps) is a [`BodyTimedOut`].
pub fn is_timed_out(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(x) = cur {
        if x.is::<BodyTimedOut>() {
            return true;
        }
        cur = x.source();
    }
    false
}

/// A request body that fails with [`BodyTimedOut`] when it stops arriving (see [`BodyRules`]).
pub struct TimedBody {
    inner: Body,
    rules: BodyRules,
    start: Instant,
    received: u64,
    sleep: Pin<Box<Sleep>>,
    done: bool,
    timed_out: Option<Arc<AtomicBool>>,
}

impl TimedBody {
    /// Wraps `inner`; the clock starts now (when the headers were read).
    pub fn new(inner: Body, rules: BodyRules) -> Self {
        Self::with_flag(inner, rules, None)
    }

    /// [`TimedBody::new`] that also sets `timed_out` when the deadline passes (read by
    /// [`layer`](super::layer)).
    pub(super) fn with_flag(
        inner: Body,
        rules: BodyRules,
        timed_out: Option<Arc<AtomicBool>>,
    ) -> Self {
        let start = Instant::now();
        TimedBody {
            inner,
            rules,
            start,
            received: 0,
            sleep: Box::pin(tokio::time::sleep_until(
                start + rules.deadline(0, Duration::ZERO),
            )),
            done: false,
            timed_out,
        }
    }
}

impl HttpBody for TimedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    this.received += d.len() as u64;
                }
                let at = this.rules.deadline(this.received, this.start.elapsed());
                this.sleep.as_mut().reset(this.start + at);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(other) => Poll::Ready(other),
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.done = true;
                    if let Some(f) = &this.timed_out {
                        f.store(true, Ordering::Relaxed);
                    }
                    metrics::counter!("tb_http_refused_total", "reason" => "body_timeout")
                        .increment(1);
                    Poll::Ready(Some(Err(axum::Error::new(BodyTimedOut {
                        received: this.received,
                    }))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn gap_rule_bounds_the_wait_for_the_next_chunk() {
        let r = BodyRules {
            timeout: MS(1000),
            min_rate_bytes_per_s: 0,
            min_rate_grace: MS(1000),
        };
        assert_eq!(r.deadline(0, Duration::ZERO), MS(1000));
        assert_eq!(r.deadline(10, MS(5000)), MS(6000));
    }

    #[test]
    fn rate_rule_applies_after_its_own_grace_not_after_the_gap_timeout() {
        // 15 s gap rule, 2 s grace, 16 KiB/s: a trickle of 5 KB/s (the attacker's 2.5 KB per 0.5 s)
        // must send its next chunk by 2 s, not by 15 s.
        let r = BodyRules {
            timeout: MS(15_000),
            min_rate_bytes_per_s: 16 * 1024,
            min_rate_grace: MS(2000),
        };
        assert_eq!(r.deadline(0, Duration::ZERO), MS(2000));
        assert_eq!(r.deadline(7_500, MS(1500)), MS(2000));
        // A sender at the rate keeps going: 64 KiB by 3.5 s allows until 4 s.
        assert_eq!(r.deadline(64 * 1024, MS(3500)), MS(4000));
        // A fast sender: 10 MiB at 1 s; the gap rule (16 s) is later than the rate (640 s), so 16 s.
        assert_eq!(r.deadline(10 << 20, MS(1000)), MS(16_000));
    }

    #[test]
    fn rate_rule_applies_after_the_grace() {
        let r = BodyRules {
            timeout: MS(1000),
            min_rate_bytes_per_s: 1000,
            min_rate_grace: MS(1000),
        };
        // 500 bytes at 0.9 s: within the grace, the gap rule (1.9 s) vs rate (max(1 s, 0.5 s)) -> 1 s.
        assert_eq!(r.deadline(500, MS(900)), MS(1000));
        // 3 000 bytes at 2.5 s: the rate allows until 3 s; the gap rule until 3.5 s.
        assert_eq!(r.deadline(3000, MS(2500)), MS(3000));
        // Fast sender: 1 MB at 2 s -> the gap rule (3 s) decides.
        assert_eq!(r.deadline(1_000_000, MS(2000)), MS(3000));
    }
}
