//! Traces across the durable boundary (architecture §10 "Tracing").
//!
//! Two kinds of span, each its own OpenTelemetry root, never one span that lives as long as a
//! delivery's retries:
//!
//! - `receipt` ([`receipt_span`]): one per accepted request, tick or message, around the commit of
//!   its durable receipt. Its parent is the sender's W3C `traceparent` when the request carried a valid
//!   one ([`tb_core::trace::TraceContext::parse`]). Its context is written on every delivery of the
//!   receipt (`deliveries.trace_context`).
//! - `attempt` ([`attempt_span`]): one per attempt, a new trace LINKED to the stored receipt context.
//!   The link is read from the delivery row, so it holds on any replica and after a restart. The
//!   attempt's own context is what the `http` executor sends as `traceparent` and the `nats` executor
//!   as `X-Triggers-Traceparent`.
//!
//! Spans reach OpenTelemetry only when `serve` installs the layer (`--otlp-endpoint`, or the
//! standard `OTEL_EXPORTER_OTLP_ENDPOINT`). Without
//! it the bridge has no span ids of its own, and the rules fall back so the trace still passes through:
//! a receipt stores the sender's trace id with a fresh span id (nothing when the sender sent none), and
//! an attempt sends that trace id, or one derived from the receipt id, with a span id derived from the
//! delivery and attempt number (the same on every replica).

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry::Context;
use sha2::{Digest, Sha256};
use tb_core::trace::TraceContext;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Target of every span made here: the OpenTelemetry layer of `serve` takes this target only, so no
/// other span (the process-long `replica` span, a library's) becomes a parent or is exported.
pub const TARGET: &str = "trigger_bridge::trace";

/// The sender's trace context from an HTTP request's `traceparent` header: `None` when there is none,
/// more than one (W3C Trace Context §3.2.1: then the header is ignored) or one that breaks the rules.
pub fn from_headers(headers: &http::HeaderMap) -> Option<TraceContext> {
    let mut all = headers.get_all("traceparent").iter();
    let one = all.next()?;
    if all.next().is_some() {
        return None;
    }
    TraceContext::parse(one.to_str().ok()?)
}

/// The span around accepting one piece of inbound work (fields: `subscription`, `source`, `receipt`).
pub fn receipt_span(subscription: &str, source: &str, receipt: &str) -> tracing::Span {
    tracing::info_span!(target: TARGET, "receipt", subscription = %subscription, source = %source, receipt = %receipt)
}

/// Makes `span` the root of its trace, or the child of `parent` (the sender's `traceparent`), and
/// returns the `traceparent` to store with the receipt's deliveries: the span's own context when
/// OpenTelemetry is on; without it the sender's trace with a fresh span id, or `None` when the sender
/// sent none (nothing is stored then).
pub fn ingress(span: &tracing::Span, parent: Option<TraceContext>) -> Option<String> {
    let cx = match parent {
        Some(p) => Context::new().with_remote_span_context(to_otel(p)),
        None => Context::new(),
    };
    // Fails only when the layer is not installed (or the span is disabled): then the fallback applies.
    let _ = span.set_parent(cx);
    match own(span) {
        Some(c) => Some(c.to_traceparent()),
        None => parent
            .and_then(|p| p.with_span(rand::random()))
            .map(|c| c.to_traceparent()),
    }
}

/// The span of one attempt of `delivery` (fields: `delivery`, `receipt`, `attempt`) and the context its
/// executor passes on. The span is a new root linked to `stored` (the delivery's `trace_context`; an
/// unparsable value is ignored).
pub fn attempt_span(
    delivery: &str,
    receipt: &str,
    attempt: u32,
    stored: Option<&str>,
) -> (tracing::Span, TraceContext) {
    let span = tracing::info_span!(target: TARGET, "attempt", delivery = %delivery, receipt = %receipt, attempt);
    let _ = span.set_parent(Context::new());
    let stored = stored.and_then(TraceContext::parse);
    if let Some(s) = stored {
        span.add_link(to_otel(s));
    }
    let cx = own(&span).unwrap_or_else(|| fallback(stored, delivery, receipt, attempt));
    (span, cx)
}

/// Without OpenTelemetry: the stored trace (else one derived from the receipt id, so every attempt of
/// one event shares it) with a span id derived from the delivery and attempt number, sampled.
fn fallback(
    stored: Option<TraceContext>,
    delivery: &str,
    receipt: &str,
    attempt: u32,
) -> TraceContext {
    let digest = |s: String| Sha256::digest(s.as_bytes());
    let mut trace_id = stored.map_or_else(
        || {
            let mut t = [0u8; 16];
            t.copy_from_slice(&digest(format!("trace:{receipt}"))[..16]);
            t
        },
        |s| s.trace_id,
    );
    let mut span_id = [0u8; 8];
    span_id.copy_from_slice(&digest(format!("span:{delivery}:{attempt}"))[..8]);
    // An all-zero digest prefix is as good as impossible; one bit keeps the ids valid anyway.
    trace_id[15] |= u8::from(trace_id == [0; 16]);
    span_id[7] |= u8::from(span_id == [0; 8]);
    TraceContext {
        trace_id,
        span_id,
        flags: stored.map_or(1, |s| s.flags),
    }
}

/// The span's OpenTelemetry context, when the layer gave it one.
fn own(span: &tracing::Span) -> Option<TraceContext> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| TraceContext {
        trace_id: sc.trace_id().to_bytes(),
        span_id: sc.span_id().to_bytes(),
        flags: sc.trace_flags().to_u8(),
    })
}

/// A parsed `traceparent` as the remote span context OpenTelemetry links to or continues.
pub fn to_otel(c: TraceContext) -> SpanContext {
    SpanContext::new(
        TraceId::from_bytes(c.trace_id),
        SpanId::from_bytes(c.span_id),
        TraceFlags::new(c.flags),
        true,
        TraceState::default(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const SENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn without_the_layer_the_senders_trace_passes_through() {
        let parent = TraceContext::parse(SENT);
        let span = receipt_span("s", "webhook", "rcpt_1");
        let stored = ingress(&span, parent).unwrap();
        let stored_cx = TraceContext::parse(&stored).unwrap();
        assert_eq!(stored_cx.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_ne!(stored_cx.span_id_hex(), "00f067aa0ba902b7");
        assert_eq!(ingress(&span, None), None);

        let (_, a1) = attempt_span("dlv_1", "rcpt_1", 1, Some(&stored));
        let (_, a2) = attempt_span("dlv_1", "rcpt_1", 2, Some(&stored));
        assert_eq!(a1.trace_id, stored_cx.trace_id);
        assert_ne!(a1.span_id, a2.span_id);
        // The same on every replica: derived, not random.
        assert_eq!(attempt_span("dlv_1", "rcpt_1", 1, Some(&stored)).1, a1);
    }

    #[test]
    fn without_a_stored_context_every_attempt_shares_the_receipts_trace() {
        let (_, a1) = attempt_span("dlv_1", "rcpt_1", 1, None);
        let (_, a2) = attempt_span("dlv_1", "rcpt_1", 2, Some("not a traceparent"));
        let (_, other) = attempt_span("dlv_2", "rcpt_2", 1, None);
        assert_eq!(a1.trace_id, a2.trace_id);
        assert_ne!(a1.trace_id, other.trace_id);
        assert!(a1.sampled());
        assert_eq!(TraceContext::parse(&a1.to_traceparent()), Some(a1));
    }
}
