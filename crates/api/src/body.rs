//! Request bodies at the HTTP edge (issue #9 defect 1): a read deadline on every request body, and for
//! ingest bodies a cap on bodies being buffered at once plus a global budget of buffered bytes.
//!
//! - [`BodyRules`] + [`TimedBody`]: every request body must keep arriving: a gap between two chunks
//!   longer than `timeout`, or an average rate below `min_rate_bytes_per_s` once `min_rate_grace` has
//!   passed since the headers, ends the body with [`BodyTimedOut`] (answered 408 `request_timeout`).
//! - [`IngestGate`]: ingest bodies are buffered whole before their signature is verified; at most
//!   `max_inflight` are read at once, at most `per_target` of them for one [`Target`] (a subscription,
//!   or the pool of every capability URL), and together they hold at most `budget_bytes`. Over any:
//!   503 `unavailable` with `Retry-After: 1`, nothing stored. A body's slots are held while it is
//!   read; its bytes keep their share of the budget until the last reference to them is dropped (the
//!   commit included).
//!
//! The rule of the project: anything reachable without a key must cost the attacker more than it
//! costs us. A trickled body holds a slot only for the grace unless it pays the minimum rate, and
//! trickling to one URL cannot take the slots of the others.
//!
//! [`layer`] installs both on a router; `serve` does it with the `[server]` config values.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use http_body_util::BodyExt;
use tb_core::ErrorCode;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

use crate::error::ApiError;

/// Default of `[server].body_timeout_ms`: 15 000 ms.
pub const DEFAULT_BODY_TIMEOUT_MS: u64 = 15_000;
/// Default of `[server].body_min_rate_bytes_per_s`: 16 384 bytes/s (16 KiB/s = 128 kbit/s).
///
/// Why: webhook bodies (KBs up to 25 MiB) come from providers' data centres at MB/s, and a provider
/// gives up on a delivery after ~10 to 30 s anyway (a 25 MiB body at 16 KiB/s would take 26 min), so
/// no real sender is near this floor; a 1 KiB body arrives in its first chunk. A trickling client
/// must pay 16 KiB/s per body slot it keeps past the grace ([`DEFAULT_BODY_MIN_RATE_GRACE_MS`]).
pub const DEFAULT_BODY_MIN_RATE: u64 = 16 * 1024;
/// Default of `[server].body_min_rate_grace_ms`: 2 000 ms after the headers before the minimum rate
/// applies (room for a few round trips of TCP slow start on a distant link).
pub const DEFAULT_BODY_MIN_RATE_GRACE_MS: u64 = 2_000;
/// Default of `[server].max_inflight_bodies`: 64 ingest bodies buffered at once.
pub const DEFAULT_MAX_INFLIGHT_BODIES: usize = 64;
/// Default of `[server].max_inflight_bodies_per_target`: 16 of the body slots for one [`Target`]
/// (or `max_inflight_bodies` when that is smaller).
pub const DEFAULT_MAX_INFLIGHT_BODIES_PER_TARGET: usize = 16;
/// Default of `[server].body_budget_bytes`: 256 MiB of ingest bodies buffered at once.
pub const DEFAULT_BODY_BUDGET_BYTES: usize = 256 << 20;
/// `Retry-After` (s) of a 503 answered because the edge is full.
pub const BUSY_RETRY_AFTER_S: u64 = 1;

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

    /// [`TimedBody::new`] that also sets `timed_out` when the deadline passes (read by [`layer`]).
    fn with_flag(inner: Body, rules: BodyRules, timed_out: Option<Arc<AtomicBool>>) -> Self {
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

/// Whose share of the body slots an ingest body takes ([`IngestGate`]): each subscription has its own
/// share; every capability URL (`/v1/hooks/{token}`) shares one.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Target {
    /// `POST /v1/trigger-subscriptions/{id}/ingest`, by subscription id.
    Subscription(String),
    /// `POST /v1/hooks/{token}` with a live token, all endpoints together.
    Capabilities,
}

/// The pure fair-share rule: a body for a target that already holds `held` slots may take another
/// when `held < per_target`.
pub fn target_admits(held: usize, per_target: usize) -> bool {
    held < per_target
}

type Held = Arc<Mutex<HashMap<Target, usize>>>;

/// The shared limits of ingest bodies buffered before verification.
#[derive(Debug)]
pub struct IngestGate {
    inflight: Arc<Semaphore>,
    budget: Arc<Semaphore>,
    per_target: usize,
    /// Slots held per target; an entry is removed when its count falls to 0 (bounded by the slots).
    held: Held,
}

impl IngestGate {
    /// At most `max_inflight` bodies read at once, holding at most `budget_bytes` bytes together; one
    /// target may hold [`DEFAULT_MAX_INFLIGHT_BODIES_PER_TARGET`] of the slots (at most `max_inflight`).
    pub fn new(max_inflight: usize, budget_bytes: usize) -> Self {
        IngestGate {
            inflight: Arc::new(Semaphore::new(max_inflight)),
            budget: Arc::new(Semaphore::new(budget_bytes.min(Semaphore::MAX_PERMITS))),
            per_target: DEFAULT_MAX_INFLIGHT_BODIES_PER_TARGET.min(max_inflight),
            held: Held::default(),
        }
    }

    /// This gate with at most `per_target` slots for one target (`[server].max_inflight_bodies_per_target`;
    /// `check-config` keeps it in 1..=max_inflight_bodies).
    pub fn with_per_target(mut self, per_target: usize) -> Self {
        self.per_target = per_target;
        self
    }

    /// The gate of routers built without [`layer`] (tests; `serve` always installs the configured
    /// one): [`DEFAULT_MAX_INFLIGHT_BODIES`] and [`DEFAULT_BODY_BUDGET_BYTES`], shared by all of them,
    /// and, like their bodies without timeouts, no fair share (one target may take every slot: such
    /// routers run in-process clients whose bodies all wait for the client task at once).
    pub fn shared_default() -> Arc<IngestGate> {
        static G: OnceLock<Arc<IngestGate>> = OnceLock::new();
        G.get_or_init(|| {
            Arc::new(
                IngestGate::new(DEFAULT_MAX_INFLIGHT_BODIES, DEFAULT_BODY_BUDGET_BYTES)
                    .with_per_target(DEFAULT_MAX_INFLIGHT_BODIES),
            )
        })
        .clone()
    }

    /// Bytes of the budget not held by a body now.
    pub fn budget_available(&self) -> usize {
        self.budget.available_permits()
    }

    /// Body slots held by `target` now.
    pub fn held_by(&self, target: &Target) -> usize {
        self.held
            .lock()
            .map(|h| h.get(target).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Takes one of `target`'s slots, or `None` when it holds its share already.
    fn take_target(&self, target: &Target) -> Option<TargetSlot> {
        let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let n = h.entry(target.clone()).or_insert(0);
        if !target_admits(*n, self.per_target) {
            if *n == 0 {
                h.remove(target);
            }
            return None;
        }
        *n += 1;
        Some(TargetSlot {
            held: self.held.clone(),
            target: target.clone(),
        })
    }
}

/// One body slot of a target, given back on drop.
struct TargetSlot {
    held: Held,
    target: Target,
}

impl Drop for TargetSlot {
    fn drop(&mut self) {
        let mut h = self.held.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = h.get_mut(&self.target) {
            *n -= 1;
            if *n == 0 {
                h.remove(&self.target);
            }
        }
    }
}

/// The memory of a buffered body together with its share of the byte budget: the `Bytes` returned by
/// [`read_ingest`] own one, so the share is released when the last clone of the body is dropped
/// (after the commit that stores it, even when the request went away meanwhile).
struct Accounted<B> {
    data: B,
    _bytes: Option<OwnedSemaphorePermit>,
}

impl<B: AsRef<[u8]>> AsRef<[u8]> for Accounted<B> {
    fn as_ref(&self) -> &[u8] {
        self.data.as_ref()
    }
}

/// Why an ingest body was not buffered.
#[derive(Debug)]
pub enum ReadError {
    /// Over the subscription's limit (413 `payload_too_large`); the body was drained (bounded).
    TooLarge,
    /// The sender was too slow (408 `request_timeout`).
    TimedOut,
    /// Too many bodies or bytes buffered at once (503 `unavailable`, `Retry-After: 1`).
    Busy,
    /// The connection failed mid-body (400 `validation_error`).
    Broken,
}

impl ReadError {
    /// The answer of this refusal. `Busy` is answered without the error log line of other 5xx
    /// answers (a flood would fill the log; `tb_http_refused_total` counts them).
    pub fn into_response(self, limit: usize) -> axum::response::Response {
        use axum::response::IntoResponse;
        match self {
            ReadError::Busy => {
                let e = self.into_api(limit).0;
                let mut r = (
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    axum::Json(serde_json::json!({"error": e.code.as_str(), "message": e.message})),
                )
                    .into_response();
                r.headers_mut()
                    .insert(axum::http::header::RETRY_AFTER, BUSY_RETRY_AFTER_S.into());
                r
            }
            other => other.into_api(limit).into_response(),
        }
    }

    /// The flat-envelope answer of this refusal.
    pub fn into_api(self, limit: usize) -> ApiError {
        match self {
            ReadError::TooLarge => ApiError::new(
                ErrorCode::PayloadTooLarge,
                format!("body exceeds this endpoint's limit of {limit} bytes"),
            ),
            ReadError::TimedOut => ApiError::new(
                ErrorCode::RequestTimeout,
                "the request body did not arrive in time; send it faster or retry",
            ),
            ReadError::Busy => ApiError(
                tb_core::TbError::new(
                    ErrorCode::Unavailable,
                    "the server is buffering too many request bodies; retry shortly",
                )
                .retry_after(BUSY_RETRY_AFTER_S),
            ),
            ReadError::Broken => ApiError::new(
                ErrorCode::ValidationError,
                "the request body ended with an error",
            ),
        }
    }
}

/// Most bytes read and discarded after a body went over its limit, so an ordinary sender still reads our
/// 413 instead of a reset connection; beyond this (or after 5 s) the connection is closed.
const DRAIN_CAP: usize = 8 * 1024 * 1024;

/// Reads and discards up to [`DRAIN_CAP`] bytes (at most 5 s), without buffering them.
pub async fn drain(mut body: Body) {
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let mut seen = 0usize;
        while let Some(Ok(frame)) = body.frame().await {
            seen += frame.data_ref().map_or(0, |d| d.len());
            if seen > DRAIN_CAP {
                break;
            }
        }
    })
    .await;
}

/// Buffers an ingest body of at most `limit` bytes (`declared` = its Content-Length) for `target`
/// under `gate`: takes one of the target's slots and a body slot for as long as the body is being
/// read, reserves the declared length (or each chunk as it comes) from the byte budget for as long as
/// the returned `Bytes` live, and refuses with [`ReadError::Busy`] when any is exhausted. A single-frame body is returned without a copy; a longer one is copied chunk by chunk
/// into one buffer, preallocated from Content-Length (capped by `limit`) or grown by doubling (capped
/// by `limit`), so no chunk list is kept and concatenated. On `TooLarge` and `Busy` the rest of the
/// body is drained (bounded, see [`drain`], nothing kept, its slots and bytes already released) so the
/// sender reads the answer instead of a reset.
pub async fn read_ingest(
    mut body: Body,
    limit: usize,
    declared: Option<usize>,
    gate: &IngestGate,
    target: &Target,
) -> Result<Bytes, ReadError> {
    let r = if declared.is_some_and(|n| n > limit) {
        Err(ReadError::TooLarge)
    } else {
        buffer(&mut body, limit, declared, gate, target).await
    };
    if let Err(ReadError::TooLarge | ReadError::Busy) = r {
        drain(body).await;
    }
    r
}

async fn buffer(
    body: &mut Body,
    limit: usize,
    declared: Option<usize>,
    gate: &IngestGate,
    target: &Target,
) -> Result<Bytes, ReadError> {
    let busy = |reason: &'static str| {
        metrics::counter!("tb_http_refused_total", "reason" => reason).increment(1);
        ReadError::Busy
    };
    let target_slot = gate
        .take_target(target)
        .ok_or_else(|| busy("target_bodies"))?;
    let slot = gate
        .inflight
        .clone()
        .try_acquire_owned()
        .map_err(|_| busy("inflight_bodies"))?;
    let reserve = |n: usize| -> Result<Option<OwnedSemaphorePermit>, ReadError> {
        if n == 0 {
            return Ok(None);
        }
        let n = u32::try_from(n).map_err(|_| ReadError::TooLarge)?;
        gate.budget
            .clone()
            .try_acquire_many_owned(n)
            .map(Some)
            .map_err(|_| busy("body_budget"))
    };
    let mut held = reserve(declared.unwrap_or(0))?;
    let mut reserved = declared.unwrap_or(0);
    // The first frame is kept as is; from the second on, frames are copied into `buf` and dropped.
    let mut first: Option<Bytes> = None;
    let mut buf: Vec<u8> = Vec::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            if is_timed_out(&e) {
                ReadError::TimedOut
            } else {
                ReadError::Broken
            }
        })?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        if data.is_empty() {
            continue;
        }
        total += data.len();
        if total > limit {
            return Err(ReadError::TooLarge);
        }
        if total > reserved {
            let more = reserve(total - reserved)?;
            match (&mut held, more) {
                (Some(h), Some(m)) => h.merge(m),
                (h @ None, m) => *h = m,
                _ => {}
            }
            reserved = total;
        }
        if first.is_none() && buf.is_empty() {
            first = Some(data);
            continue;
        }
        if let Some(f) = first.take() {
            buf = Vec::with_capacity(initial_capacity(declared, limit, total));
            buf.extend_from_slice(&f);
        }
        grow(&mut buf, data.len(), limit);
        buf.extend_from_slice(&data);
    }
    let bytes = match first {
        Some(one) => Bytes::from_owner(Accounted {
            data: one,
            _bytes: held,
        }),
        None if buf.is_empty() => Bytes::new(),
        None => Bytes::from_owner(Accounted {
            data: buf,
            _bytes: held,
        }),
    };
    // The body is in: its slots go back now (they bound bodies being read, the budget bounds memory).
    drop((slot, target_slot));
    Ok(bytes)
}

/// Capacity of the buffer once a body has a second frame (`seen` bytes so far): its declared length
/// capped by `limit`, else twice what came so far (capped by `limit`).
fn initial_capacity(declared: Option<usize>, limit: usize, seen: usize) -> usize {
    match declared {
        Some(n) => n.min(limit).max(seen),
        None => seen.saturating_mul(2).min(limit).max(seen),
    }
}

/// Makes room for `more` bytes: doubling, but never past `limit` (a body can be no longer), so a body
/// without Content-Length holds at most twice its length of capacity and never more than `limit`.
fn grow(buf: &mut Vec<u8>, more: usize, limit: usize) {
    let need = buf.len() + more;
    if need <= buf.capacity() {
        return;
    }
    let to = buf.len().saturating_mul(2).min(limit).max(need);
    buf.reserve_exact(to - buf.len());
}

/// Installs the edge limits on `router`: every request body becomes a [`TimedBody`] under `rules`, and
/// ingest handlers buffer under `gate`. Whatever layer or extractor read the body (idempotency, JSON),
/// a request whose body timed out and that was answered with an error is answered 408
/// `request_timeout` instead.
pub fn layer(router: axum::Router, rules: BodyRules, gate: Arc<IngestGate>) -> axum::Router {
    router
        .layer(axum::Extension(gate))
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| async move {
                let flag = Arc::new(AtomicBool::new(false));
                let f = flag.clone();
                let req = req.map(|b| Body::new(TimedBody::with_flag(b, rules, Some(f))));
                let resp = next.run(req).await;
                // Only the generic answers to a failed read (400 / 422 / 500); a deliberate 413 or 503
                // given before a drain timed out stays.
                let generic = matches!(resp.status().as_u16(), 400 | 422 | 500);
                if generic && flag.load(Ordering::Relaxed) {
                    return axum::response::IntoResponse::into_response(
                        ReadError::TimedOut.into_api(0),
                    );
                }
                resp
            },
        ))
}

/// The configured gate of a request, or the shared default.
pub fn gate_of(ext: Option<axum::Extension<Arc<IngestGate>>>) -> Arc<IngestGate> {
    ext.map(|axum::Extension(g)| g)
        .unwrap_or_else(IngestGate::shared_default)
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

    #[tokio::test]
    async fn budget_refuses_a_body_that_does_not_fit_and_releases_on_drop() {
        let gate = IngestGate::new(4, 100);
        let a = read_ingest(Body::from(vec![1u8; 60]), 1000, Some(60), &gate, &sub("a"))
            .await
            .unwrap();
        assert_eq!(gate.budget_available(), 40);
        let b = read_ingest(Body::from(vec![1u8; 60]), 1000, Some(60), &gate, &sub("a")).await;
        assert!(matches!(b, Err(ReadError::Busy)));
        drop(a);
        assert_eq!(gate.budget_available(), 100);
    }

    fn sub(id: &str) -> Target {
        Target::Subscription(id.into())
    }

    #[tokio::test]
    async fn the_budget_is_held_until_the_last_clone_of_the_body_is_dropped() {
        let gate = IngestGate::new(4, 1000);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, axum::Error>>(4);
        for part in [&b"{\"a\":"[..], b"1", b"}"] {
            tx.send(Ok(Frame::data(Bytes::copy_from_slice(part))))
                .await
                .unwrap();
        }
        drop(tx);
        let body = Body::new(http_body_util::StreamBody::new(ReceiverStream(rx)));
        let b = read_ingest(body, 1000, None, &gate, &sub("a"))
            .await
            .unwrap();
        assert_eq!(&b[..], b"{\"a\":1}");
        assert_eq!(
            gate.held_by(&sub("a")),
            0,
            "the slots go once the body is in"
        );
        assert_eq!(gate.inflight.available_permits(), 4);
        let kept = b.clone();
        drop(b);
        assert_eq!(
            gate.budget_available(),
            1000 - 7,
            "the bytes keep their share"
        );
        drop(kept);
        assert_eq!(gate.budget_available(), 1000);
    }

    /// A body that sends `first` and then waits for more (until its sender is dropped).
    async fn stalled(
        first: &'static [u8],
    ) -> (
        Body,
        tokio::sync::mpsc::Sender<Result<Frame<Bytes>, axum::Error>>,
    ) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, axum::Error>>(1);
        tx.send(Ok(Frame::data(Bytes::from_static(first))))
            .await
            .unwrap();
        (
            Body::new(http_body_util::StreamBody::new(ReceiverStream(rx))),
            tx,
        )
    }

    #[tokio::test]
    async fn one_target_holds_at_most_its_share_of_the_slots() {
        let gate = Arc::new(IngestGate::new(4, 1000).with_per_target(2));
        let read = |body: Body, t: Target| {
            let g = gate.clone();
            tokio::spawn(async move { read_ingest(body, 10, None, &g, &t).await })
        };
        let (a1, tx1) = stalled(b"1").await;
        let (a2, tx2) = stalled(b"2").await;
        let r1 = read(a1, sub("a"));
        let r2 = read(a2, sub("a"));
        let t0 = std::time::Instant::now();
        while gate.held_by(&sub("a")) < 2 {
            assert!(
                t0.elapsed() < Duration::from_secs(2),
                "the two bodies never started"
            );
            tokio::task::yield_now().await;
        }
        let a3 = read_ingest(Body::from("3"), 10, None, &gate, &sub("a")).await;
        assert!(matches!(a3, Err(ReadError::Busy)), "a's share is taken");
        let b = read_ingest(Body::from("4"), 10, None, &gate, &sub("b")).await;
        assert_eq!(&b.unwrap()[..], b"4", "another target still reads");
        let c = read_ingest(Body::from("5"), 10, None, &gate, &Target::Capabilities).await;
        assert_eq!(&c.unwrap()[..], b"5");
        drop((tx1, tx2));
        assert_eq!(&r1.await.unwrap().unwrap()[..], b"1");
        assert_eq!(&r2.await.unwrap().unwrap()[..], b"2");
        assert!(
            gate.held.lock().unwrap().is_empty(),
            "no entry outlives its slots"
        );
        assert_eq!(gate.inflight.available_permits(), 4);
    }

    #[test]
    fn a_body_without_length_grows_by_doubling_up_to_the_limit() {
        let mut v = Vec::with_capacity(initial_capacity(None, 100, 10));
        assert_eq!(v.capacity(), 20);
        v.extend_from_slice(&[0; 10]);
        grow(&mut v, 50, 100);
        assert!(
            v.capacity() >= 60 && v.capacity() <= 100,
            "{}",
            v.capacity()
        );
        assert_eq!(initial_capacity(Some(80), 100, 10), 80);
        assert_eq!(initial_capacity(Some(500), 100, 10), 100);
    }

    #[tokio::test]
    async fn a_stalled_body_times_out() {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, axum::Error>>(1);
        let stream = http_body_util::StreamBody::new(ReceiverStream(rx));
        tx.send(Ok(Frame::data(Bytes::from_static(b"abc"))))
            .await
            .unwrap();
        let rules = BodyRules {
            timeout: MS(200),
            min_rate_bytes_per_s: 0,
            min_rate_grace: MS(200),
        };
        let body = Body::new(TimedBody::new(Body::new(stream), rules));
        let gate = IngestGate::new(1, 1000);
        let r = read_ingest(body, 1000, None, &gate, &sub("a")).await;
        assert!(matches!(r, Err(ReadError::TimedOut)));
        assert_eq!(gate.budget_available(), 1000);
        drop(tx);
    }

    struct ReceiverStream<T>(tokio::sync::mpsc::Receiver<T>);
    impl<T> futures_util::Stream for ReceiverStream<T> {
        type Item = T;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
            self.0.poll_recv(cx)
        }
    }
}
