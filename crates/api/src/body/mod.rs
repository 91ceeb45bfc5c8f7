//! Request bodies at the HTTP edge: a read deadline on every request body, and for
//! ingest bodies a cap on bodies being buffered at once plus a global budget of buffered bytes.
//!
//! - [`BodyRules`] + [`TimedBody`]: every request body must keep arriving: a gap between two chunks
//!   longer than `timeout`, or an average rate below `min_rate_bytes_per_s` once `min_rate_grace` has
//!   passed since the headers, ends the body with [`BodyTimedOut`] (answered 408 `request_timeout`).
//! - [`IngestGate`]: ingest bodies are buffered whole before their signature is verified; at most
//!   `max_inflight` are read at once, at most `per_target` of them for one [`Target`] (a subscription,
//!   or the pool of every capability URL), of those at most `per_client` from one client address
//!   (docs/limits.md "Per-client limits"), and together they hold at most `budget_bytes`. Over any:
//!   503 `unavailable` with `Retry-After: 1`, nothing stored. A body's slots are held while it is
//!   read; its bytes keep their share of the budget until the last reference to them is dropped (the
//!   commit included).
//!
//! The rule of the project: anything reachable without a key must cost the attacker more than it
//! costs us. A trickled body holds a slot only for the grace unless it pays the minimum rate,
//! trickling to one URL cannot take the slots of the others, and one address trickling to a URL
//! cannot take the slots other senders to that URL need.
//!
//! [`layer`] installs both on a router; `serve` does it with the `[server]` config values.
//!
//! Modules: [`timing`] (the deadline of every body), [`gate`] (slots, fair share, byte budget),
//! [`read`] (buffering an ingest body under the gate).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::body::Body;

pub mod decode;
pub mod gate;
pub mod read;
pub mod timing;

pub use decode::{coding_of, decode, decode_request, Coding, DecodeError};
pub use gate::{target_admits, IngestGate, Target};
pub use read::{drain, read_ingest, refuse_before_continue, ReadError};
pub use timing::{is_timed_out, BodyRules, BodyTimedOut, TimedBody};

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

/// The header limits of `limits` over a request's `headers` (each header counted as its name's plus
/// its value's bytes). Errors: `headers_too_large` (431), counted in
/// `tb_http_refused_total{reason="headers"}`.
pub fn check_headers(
    headers: &http::HeaderMap,
    limits: &tb_core::limits::Limits,
) -> Result<(), tb_core::TbError> {
    let sizes = headers.iter().map(|(k, v)| k.as_str().len() + v.len());
    tb_core::limits::check_headers(headers.len(), sizes, limits).map_err(|e| {
        metrics::counter!("tb_http_refused_total", "reason" => "headers").increment(1);
        e.error()
    })
}

pub fn gate_of(ext: Option<axum::Extension<Arc<IngestGate>>>) -> Arc<IngestGate> {
    ext.map(|axum::Extension(g)| g)
        .unwrap_or_else(IngestGate::shared_default)
}
