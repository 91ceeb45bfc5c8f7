//! Buffering one ingest body under the [`IngestGate`]: slots while it is read, its share of the byte
//! budget for as long as its bytes live, one buffer without a chunk list ([`read_ingest`]).

use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body_util::BodyExt;
use tb_core::ErrorCode;
use tokio::sync::OwnedSemaphorePermit;

use super::gate::{IngestGate, Target};
use super::timing::is_timed_out;
use super::BUSY_RETRY_AFTER_S;
use crate::error::ApiError;

/// The memory of a buffered body together with its share of the byte budget: the `Bytes` returned by
/// [`read_ingest`] own one, so the share is released when the last clone of the body is dropped
/// (after the commit that stores it, even when the request went away meanwhile).
pub(super) struct Accounted<B> {
    pub(super) data: B,
    pub(super) _bytes: Option<OwnedSemaphorePermit>,
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

/// Reads and discards up to `DRAIN_CAP` bytes (at most 5 s), without buffering them.
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

/// Whether a request waiting for `100 Continue` (`Expect: 100-continue`) declares a `declared`
/// Content-Length over `limit` (bytes): the handler then answers 413 without polling the body, so
/// hyper never sends `100 Continue`, the client never sends the body, and hyper closes the connection
/// after the answer (instead of `100 Continue`, a drained body, then 413).
pub fn refuse_before_continue(
    headers: &axum::http::HeaderMap,
    declared: Option<usize>,
    limit: usize,
) -> bool {
    declared.is_some_and(|n| n > limit)
        && headers
            .get(axum::http::header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// Buffers an ingest body of at most `limit` bytes (`declared` = its Content-Length) for `target`
/// from `client` (the request's client address, `Engine::client_addr`; `None` when not known) under
/// `gate`: takes one of the target's slots (within the client's share of them) and a body slot for as
/// long as the body is being read, reserves the declared length (or each chunk as it comes) from the byte budget for as long as
/// the returned `Bytes` live, and refuses with [`ReadError::Busy`] when any is exhausted. A
/// single-frame body is returned without a copy; a longer one is copied chunk by chunk into one
/// buffer, preallocated from Content-Length (capped by `limit`) or grown by doubling (capped by
/// `limit`), so no chunk list is kept and concatenated. On `TooLarge` and `Busy` the rest of the
/// body is drained (bounded, see [`drain`], nothing kept, its slots and bytes already released) so the
/// sender reads the answer instead of a reset.
pub async fn read_ingest(
    mut body: Body,
    limit: usize,
    declared: Option<usize>,
    gate: &IngestGate,
    target: &Target,
    client: Option<std::net::IpAddr>,
) -> Result<Bytes, ReadError> {
    let r = if declared.is_some_and(|n| n > limit) {
        Err(ReadError::TooLarge)
    } else {
        buffer(&mut body, limit, declared, gate, target, client).await
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
    client: Option<std::net::IpAddr>,
) -> Result<Bytes, ReadError> {
    let busy = |reason: &'static str| {
        metrics::counter!("tb_http_refused_total", "reason" => reason).increment(1);
        ReadError::Busy
    };
    let target_slot = gate.take_target(target, client).map_err(busy)?;
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

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use http_body::Frame;

    use super::*;
    use crate::body::{BodyRules, TimedBody};

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[tokio::test]
    async fn budget_refuses_a_body_that_does_not_fit_and_releases_on_drop() {
        let gate = IngestGate::new(4, 100);
        let a = read_ingest(
            Body::from(vec![1u8; 60]),
            1000,
            Some(60),
            &gate,
            &sub("a"),
            None,
        )
        .await
        .unwrap();
        assert_eq!(gate.budget_available(), 40);
        let b = read_ingest(
            Body::from(vec![1u8; 60]),
            1000,
            Some(60),
            &gate,
            &sub("a"),
            None,
        )
        .await;
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
        let b = read_ingest(body, 1000, None, &gate, &sub("a"), None)
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
            tokio::spawn(async move { read_ingest(body, 10, None, &g, &t, None).await })
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
        let a3 = read_ingest(Body::from("3"), 10, None, &gate, &sub("a"), None).await;
        assert!(matches!(a3, Err(ReadError::Busy)), "a's share is taken");
        let b = read_ingest(Body::from("4"), 10, None, &gate, &sub("b"), None).await;
        assert_eq!(&b.unwrap()[..], b"4", "another target still reads");
        let c = read_ingest(
            Body::from("5"),
            10,
            None,
            &gate,
            &Target::Capabilities,
            None,
        )
        .await;
        assert_eq!(&c.unwrap()[..], b"5");
        drop((tx1, tx2));
        assert_eq!(&r1.await.unwrap().unwrap()[..], b"1");
        assert_eq!(&r2.await.unwrap().unwrap()[..], b"2");
        assert!(
            gate.held.lock().unwrap().by_target.is_empty(),
            "no entry outlives its slots"
        );
        assert_eq!(gate.inflight.available_permits(), 4);
    }

    /// One client address (IPv6: its /64) holds at most its share of a target's slots; another
    /// client still reads from the same target, and an unknown client is held only to the target's.
    #[tokio::test]
    async fn one_client_holds_at_most_its_share_of_a_targets_slots() {
        let gate = Arc::new(
            IngestGate::new(8, 1000)
                .with_per_target(4)
                .with_per_client(2),
        );
        let ip = |s: &str| Some(s.parse::<std::net::IpAddr>().unwrap());
        let read = |body: Body, client: Option<std::net::IpAddr>| {
            let g = gate.clone();
            tokio::spawn(async move { read_ingest(body, 10, None, &g, &sub("a"), client).await })
        };
        let attacker = ip("2001:db8:1:2::1");
        let (a1, tx1) = stalled(b"1").await;
        let (a2, tx2) = stalled(b"2").await;
        let r1 = read(a1, attacker);
        let r2 = read(a2, ip("2001:db8:1:2:ffff::9"));
        let t0 = std::time::Instant::now();
        while gate.held_by_client(&sub("a"), attacker.unwrap()) < 2 {
            assert!(
                t0.elapsed() < Duration::from_secs(2),
                "the two bodies never started"
            );
            tokio::task::yield_now().await;
        }
        let a3 = read_ingest(
            Body::from("3"),
            10,
            None,
            &gate,
            &sub("a"),
            ip("2001:db8:1:2::77"),
        )
        .await;
        assert!(
            matches!(a3, Err(ReadError::Busy)),
            "the /64's share of \"a\" is taken"
        );
        let other = read_ingest(Body::from("4"), 10, None, &gate, &sub("a"), ip("192.0.2.1")).await;
        assert_eq!(
            &other.unwrap()[..],
            b"4",
            "another client still reads from \"a\""
        );
        let b = read_ingest(Body::from("5"), 10, None, &gate, &sub("b"), attacker).await;
        assert_eq!(&b.unwrap()[..], b"5", "the share is per target");
        assert_eq!(gate.held_by(&sub("a")), 2);
        drop((tx1, tx2));
        assert_eq!(&r1.await.unwrap().unwrap()[..], b"1");
        assert_eq!(&r2.await.unwrap().unwrap()[..], b"2");
        let h = gate.held.lock().unwrap();
        assert!(
            h.by_target.is_empty() && h.by_client.is_empty(),
            "no entry outlives its slots"
        );
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
        let r = read_ingest(body, 1000, None, &gate, &sub("a"), None).await;
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
