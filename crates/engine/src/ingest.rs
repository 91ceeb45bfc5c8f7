//! The webhook front end (DESIGN §3, §5.1), an edge of [`crate::accept`]: limits -> connector verifies
//! the RAW bytes -> dedup key -> [`accept`] (dedup probe -> rate limit -> admission -> route -> ONE
//! group-committed transaction of receipt + body + deliveries -> answer).
//!
//! The answer is built only after the commit returned; a duplicate found by the read-only probe never
//! touches the writer (no fsync on the duplicate path).

use bytes::Bytes;
use http::HeaderMap;
use tb_core::dedup::dedup_key;
use tb_core::ids::{new_id, IdKind};
use tb_core::receipt::ReceiptState;
use tb_core::{ErrorCode, TbError};

use tb_core::connector::ConnectorSpec;
use tb_ingress::{IngressError, Verified};

use crate::accept::{accept, Dedup, Inbound, Routing};
use crate::catalog::{SubscriptionConfig, Verification};
use crate::{clock, Engine};

pub use crate::accept::IngestAnswer;

/// Authenticates and normalizes per the subscription's verification mode (with the current secret,
/// or the previous one while a rotation's overlap lasts): `required` must verify;
/// `best-effort` falls back to the unverified read (stamping `verified: false`); `none` never checks.
/// Returns the normalized request and whether its signature was verified.
fn verify(
    sub: &SubscriptionConfig,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Verified, bool), IngressError> {
    let limits = &sub.limits.json;
    let with = |secret: &[u8]| {
        tb_ingress::verify(
            &sub.connector,
            secret,
            headers,
            body,
            clock::now_s(),
            limits,
        )
    };
    // The current secret, then (while a rotation's overlap lasts) the previous one.
    let checked = || match (with(&sub.secret), &sub.previous_secret) {
        (Err(IngressError::SignatureInvalid(e)), Some(p))
            if tb_core::rotation::previous_accepted(p.until_ms, clock::now_ms()) =>
        {
            let r = with(&p.secret);
            if r.is_ok() {
                metrics::counter!("tb_previous_secret_accepted_total", "subscription" => sub.public_label().to_string()).increment(1);
            }
            r.map_err(|_| IngressError::SignatureInvalid(e))
        }
        (r, _) => r,
    };
    let unverified = || {
        tb_ingress::standard_webhooks::read_unverified(headers, body, limits).map(|v| (v, false))
    };
    match (sub.verification, &sub.connector) {
        (Verification::None, ConnectorSpec::StandardWebhooks { .. }) => unverified(),
        (Verification::BestEffort, ConnectorSpec::StandardWebhooks { .. }) => match checked() {
            Ok(v) => Ok((v, true)),
            Err(IngressError::SignatureInvalid(_)) => unverified(),
            Err(e) => Err(e),
        },
        _ => checked().map(|v| (v, true)),
    }
}

/// Keeps a refused request as a `rejected` receipt whose deliveries are dead-lettered with reason
/// `verification_failed` (through [`accept`], [`Routing::Refused`]). Its dedup key is unique to it, so
/// a forged id can never take a real one.
///
/// The record is content-free (RFC 0232): no body is kept, so forged posts cannot fill the disk with
/// their payloads.
async fn record_refusal(engine: &Engine, sub: &SubscriptionConfig, headers: &HeaderMap) {
    let event = tb_core::normalized::NormalizedEvent {
        event: "webhook".into(),
        action: None,
        fields: Default::default(),
    };
    let inbound = Inbound {
        source: sub.source.into(),
        subscription: sub.id.clone(),
        counter: None,
        provider_event_id: Some("unverified".into()),
        event_type: event.event_type(),
        normalized: serde_json::json!({"event": "webhook", "fields": {"verified": false}}),
        body: Bytes::new(),
        content_type: media_type(headers),
        received_at: clock::now_ms(),
        dedup: None,
        rate_limit_per_min: None,
        routing: Routing::Refused {
            state: ReceiptState::Rejected,
            dead_letter: Some((event, "verification_failed")),
        },
        capability: None,
        target_run: None,
        // A forged request does not choose our traces.
        trace_parent: None,
    };
    if let Err(e) = accept(engine, inbound).await {
        tracing::error!(subscription = %sub.id, error = %e, "recording a refused request failed");
    }
}

/// The request's media type (e.g. `application/json`) when it is a plain token, for display; parameters
/// and anything unusual are dropped so no inbound text is echoed.
fn media_type(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(http::header::CONTENT_TYPE)?.to_str().ok()?;
    let essence = v.split(';').next()?.trim().to_ascii_lowercase();
    let ok = !essence.is_empty()
        && essence.len() <= 100
        && essence
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/+.-".contains(&b));
    ok.then_some(essence)
}

/// The `ingress_counts` outcome of a connector's refusal.
fn refusal_outcome(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::SignatureInvalid => "signature_invalid",
        ErrorCode::PayloadTooLarge => "too_large",
        ErrorCode::UnsupportedMediaType => "unsupported_media_type",
        ErrorCode::UnprocessableEvent => "unprocessable",
        _ => "rejected",
    }
}

fn count(connector: &'static str, outcome: &'static str) {
    metrics::counter!("tb_receipts_total", "connector" => connector, "outcome" => outcome)
        .increment(1);
}

/// Runs one request through the pipeline, in this order: subscription lookup, size limit, signature over
/// the raw bytes, dedup probe, rate limit, subscription state, routing, commit. So an unauthenticated caller learns
/// nothing about the subscription's state, and a redelivery of an accepted id is answered `duplicate`
/// even while the subscription is paused.
///
/// Errors (stable codes): `not_found` (404) unknown subscription; `subscription_not_active` (409) paused;
/// `payload_too_large` (413); `unsupported_media_type` (415); `signature_invalid` (401) bad or missing
/// signature or stale timestamp; `rate_limited` (429, with `Retry-After`) over the subscription's
/// `rate_limit_per_min`; `validation_error` (400) malformed after authentication; `unavailable`
/// (503) the store cannot commit. A refused request writes nothing and changes no state.
pub async fn ingest(
    engine: &Engine,
    subscription_id: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<IngestAnswer, TbError> {
    let Some(sub) = engine.catalog().subscription(subscription_id).cloned() else {
        return Err(engine.missing_subscription(subscription_id));
    };
    if sub.source != tb_core::subscription::Source::Webhook {
        // A schedule (or queue) has no ingest URL: the same answer as an unknown id.
        return Err(engine.missing_subscription(subscription_id));
    }
    let connector = sub.connector.name();
    if body.len() > sub.max_body_bytes {
        count(connector, "too_large");
        engine.count_refusal(Some(&sub.id), "too_large");
        return Err(TbError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "body is {} bytes; this subscription accepts at most {}",
                body.len(),
                sub.max_body_bytes
            ),
        ));
    }
    let (mut verified, authentic) = match verify(&sub, headers, &body) {
        Ok(v) => v,
        Err(e) => {
            count(connector, "rejected");
            let keep = engine.count_refusal(Some(&sub.id), refusal_outcome(e.code()));
            if keep {
                tracing::info!(subscription = %sub.id, error = %e, "request refused");
            }
            if keep && sub.registration.is_some() && e.code() == ErrorCode::SignatureInvalid {
                // RFC 0230: a refused post to a registered subscription is kept as a dead-lettered
                // delivery (reason verification_failed), without any state change: the first
                // few a minute; the rest of a flood are only counted (`ingress_counts`).
                record_refusal(engine, &sub, headers).await;
            }
            return Err(TbError::new(e.code(), e.to_string()));
        }
    };
    let key = if sub.dedup_enabled && !authentic {
        // An unverified request (best-effort / none) never takes the key of a verified one, so a forged
        // post cannot shadow the real event.
        dedup_key(
            &sub.id,
            &format!("unverified:{}", verified.provider_event_id),
        )
    } else if sub.dedup_enabled {
        dedup_key(&sub.id, &verified.provider_event_id)
    } else {
        // No dedup: every request is its own key.
        dedup_key(&sub.id, &new_id(IdKind::Receipt))
    };
    if sub.verification != Verification::Required {
        // Stamp the outcome so bindings and operators can tell (RFC 0099 §F.2 `verified`).
        verified
            .event
            .fields
            .insert("verified".into(), serde_json::Value::Bool(authentic));
    }
    let inbound = Inbound {
        source: sub.source.into(),
        subscription: sub.id.clone(),
        counter: Some(connector),
        provider_event_id: Some(verified.provider_event_id),
        event_type: verified.event.event_type(),
        normalized: serde_json::to_value(&verified.event).unwrap_or_default(),
        body,
        content_type: media_type(headers),
        received_at: clock::now_ms(),
        dedup: Some(Dedup {
            key,
            window_ms: sub.dedup_window_s.saturating_mul(1000) as i64,
            same_body: false,
        }),
        rate_limit_per_min: Some(sub.rate_limit_per_min),
        routing: Routing::Route(verified.event),
        capability: None,
        target_run: None,
        trace_parent: crate::trace::from_headers(headers),
    };
    accept(engine, inbound).await?.answer()
}
