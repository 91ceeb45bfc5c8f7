//! The ingest pipeline (DESIGN §3, §5.1): limits -> connector verifies the RAW bytes -> dedup probe ->
//! route -> ONE group-committed transaction (receipt + body + deliveries) -> answer.
//!
//! The answer is built only after the commit returned; a duplicate found by the read-only probe never
//! touches the writer (no fsync on the duplicate path).

use bytes::Bytes;
use http::HeaderMap;
use tb_core::dedup::dedup_key;
use tb_core::ids::{new_id, IdKind};
use tb_core::receipt::ReceiptState;
use tb_core::subscription::{admission, Admission};
use tb_core::{ErrorCode, TbError};
use tb_store::{DeliveryRef, IngestOutcome, NewReceipt};

use tb_core::connector::ConnectorSpec;
use tb_ingress::{IngressError, Verified};

use crate::catalog::{SubscriptionConfig, Verification};
use crate::{clock, router, store_err, Engine};

/// What the sender is told (OpenWOP trigger-bridge §8; issue #2 ingest contract).
#[derive(Debug, Clone, PartialEq)]
pub enum IngestAnswer {
    /// Committed with at least one delivery (202). `run_id` when exactly one run is started.
    Accepted {
        receipt_id: String,
        deliveries: Vec<DeliveryRef>,
        run_id: Option<String>,
    },
    /// Committed; no binding matched (202).
    Unmatched { receipt_id: String },
    /// Committed while the subscription is dead-lettered: its deliveries went straight to dead letters (202).
    DeadLettered {
        receipt_id: String,
        deliveries: Vec<DeliveryRef>,
    },
    /// The dedup key was seen before (200): the first receipt and its run.
    Duplicate {
        receipt_id: String,
        run_id: Option<String>,
    },
}

fn single_run(d: &[DeliveryRef]) -> Option<String> {
    match d {
        [one] => one.run_id.clone(),
        _ => None,
    }
}

/// Authenticates and normalizes per the subscription's verification mode: `required` must verify;
/// `best-effort` falls back to the unverified read (stamping `verified: false`); `none` never checks.
/// Returns the normalized request and whether its signature was verified.
fn verify(
    sub: &SubscriptionConfig,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(Verified, bool), IngressError> {
    let checked = || tb_ingress::verify(&sub.connector, &sub.secret, headers, body, clock::now_s());
    let unverified =
        || tb_ingress::standard_webhooks::read_unverified(headers, body).map(|v| (v, false));
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
/// `verification_failed`. Its dedup key is unique to it, so a forged id can never take a real one.
///
/// The record is content-free (RFC 0232): no body is kept, so forged posts cannot fill the disk with
/// their payloads.
async fn record_refusal(engine: &Engine, sub: &SubscriptionConfig, headers: &HeaderMap) {
    let event = tb_core::normalized::NormalizedEvent {
        event: "webhook".into(),
        action: None,
        fields: Default::default(),
    };
    let mut deliveries = router::route(&engine.catalog(), &sub.id, &event, true);
    for d in &mut deliveries {
        d.dead_letter_reason = Some("verification_failed".into());
    }
    let mut r = content_free_receipt(sub, ReceiptState::Rejected, "unverified".into(), &event);
    r.normalized = serde_json::json!({"event": "webhook", "fields": {"verified": false}});
    r.content_type = media_type(headers);
    r.deliveries = deliveries;
    if let Err(e) = engine.store.commit_receipt(r).await {
        tracing::error!(subscription = %sub.id, error = %e, "recording a refused request failed");
    }
}

/// Keeps an authenticated request refused by the rate limit as a content-free `rate_limited` receipt:
/// its provider event id (so an operator can ask the provider to redeliver it), event type and time; no
/// body, no fields, no deliveries, and a dedup key of its own (a later redelivery is not a duplicate).
async fn record_rate_limited(engine: &Engine, sub: &SubscriptionConfig, v: &Verified) {
    let r = content_free_receipt(
        sub,
        ReceiptState::RateLimited,
        v.provider_event_id.clone(),
        &v.event,
    );
    if let Err(e) = engine.store.commit_receipt(r).await {
        tracing::error!(subscription = %sub.id, error = %e, "recording a rate-limited request failed");
    }
}

/// A receipt that records a refusal without content: no body, no normalized field values, no
/// deliveries, and a dedup key unique to it (it never holds or takes a real event's key).
fn content_free_receipt(
    sub: &SubscriptionConfig,
    state: ReceiptState,
    provider_event_id: String,
    event: &tb_core::normalized::NormalizedEvent,
) -> NewReceipt {
    let id = new_id(IdKind::Receipt);
    let now = clock::now_ms();
    NewReceipt {
        dedup_key: dedup_key(&sub.id, &id),
        id,
        subscription_id: sub.id.clone(),
        provider_event_id,
        event_type: event.event_type(),
        normalized: serde_json::json!({"event": event.event, "action": event.action, "fields": {}}),
        state,
        content_type: None,
        body: Bytes::new(),
        received_at: now,
        dedup_until: now,
        deliveries: Vec::new(),
        capability: None,
        lease: None,
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

/// Commits `receipt` and runs `after` on the outcome inside a spawned task, so neither the commit's
/// follow-up (counters, the worker's wake-up) nor the commit itself can be skipped by a caller that
/// goes away (a dropped request future; issue #9 defect 15). The caller only awaits the outcome.
/// Errors: the store's, or `internal` if the task panicked.
///
/// Hand-off (`crate::handoff`): worker slots are reserved for the receipt's pending deliveries first,
/// the commit leases that many, and the leases go to the local worker; the worker is woken through
/// `work_ready` only when a pending delivery was left unleased (else `after` gets a notifier nobody
/// waits on, and the worker is not sent to look for work it already has).
pub(crate) async fn commit_detached(
    engine: &Engine,
    mut receipt: NewReceipt,
    after: impl FnOnce(&tb_store::StoreResult<IngestOutcome>, &tokio::sync::Notify) + Send + 'static,
) -> Result<tb_store::StoreResult<IngestOutcome>, TbError> {
    let store = engine.store.clone();
    let ready = engine.work_ready.clone();
    let pending = receipt
        .deliveries
        .iter()
        .filter(|d| d.state == tb_core::delivery::DeliveryState::Pending)
        .count();
    let reservation = engine.handoff.reserve(pending);
    receipt.lease = reservation
        .as_ref()
        .map(crate::handoff::Reservation::request);
    tokio::spawn(async move {
        let mut out = store.commit_receipt(receipt).await;
        let handed = match (&mut out, reservation) {
            (Ok(IngestOutcome::Accepted { leased, .. }), Some(r)) => {
                r.deliver(std::mem::take(leased))
            }
            _ => 0,
        };
        if handed > 0 && handed == pending {
            after(&out, &tokio::sync::Notify::new());
        } else {
            after(&out, &ready);
        }
        out
    })
    .await
    .map_err(|e| TbError::new(ErrorCode::Internal, format!("commit task failed: {e}")))
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
    let connector = sub.connector.name();
    let state = engine
        .subscription_state(&sub.id)
        .unwrap_or(tb_core::subscription::SubscriptionState::Active);
    if body.len() > sub.max_body_bytes {
        count(connector, "too_large");
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
            tracing::info!(subscription = %sub.id, error = %e, "request refused");
            if sub.registration.is_some() && e.code() == ErrorCode::SignatureInvalid {
                // RFC 0230: a refused post to a registered subscription is kept as a dead-lettered
                // delivery (reason verification_failed), without any state change.
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
    let answer_dup = |o: IngestOutcome| match o {
        IngestOutcome::Duplicate {
            receipt_id,
            deliveries,
        }
        | IngestOutcome::Accepted {
            receipt_id,
            deliveries,
            ..
        } => {
            engine.note_duplicate(&receipt_id);
            IngestAnswer::Duplicate {
                run_id: single_run(&deliveries),
                receipt_id,
            }
        }
    };
    let now = clock::now_ms();
    if let Some(first) = engine
        .store
        .find_duplicate(&sub.id, &key, now)
        .await
        .map_err(store_err)?
    {
        count(connector, "duplicate");
        return Ok(answer_dup(first));
    }
    // Rate-limited after authentication and the duplicate probe: a redelivery of an accepted event is
    // answered `duplicate` even while the bucket is empty (it costs nothing and starts nothing), so a
    // `rate_limited` receipt always names an event that was not accepted.
    if let Err(wait_s) = engine.rate_limits.check(&sub.id, sub.rate_limit_per_min) {
        count(connector, "rate_limited");
        record_rate_limited(engine, &sub, &verified).await;
        return Err(TbError::new(
            ErrorCode::RateLimited,
            format!(
                "subscription {:?} accepts {} request{} a minute; retry after {wait_s} s",
                sub.id,
                sub.rate_limit_per_min,
                if sub.rate_limit_per_min == 1 { "" } else { "s" }
            ),
        )
        .retry_after(wait_s));
    }
    let admit = admission(state);
    if admit == Admission::Refuse {
        count(connector, "not_active");
        return Err(TbError::new(
            ErrorCode::SubscriptionNotActive,
            format!(
                "subscription {:?} is {}; resume it to accept deliveries",
                sub.id,
                state.as_str()
            ),
        ));
    }
    let dead = admit == Admission::AcceptAsDeadLetter;
    let deliveries = router::route(&engine.catalog(), &sub.id, &verified.event, dead);
    let receipt_state = if deliveries.is_empty() {
        ReceiptState::Unmatched
    } else if dead {
        ReceiptState::DeadLettered
    } else if deliveries
        .iter()
        .all(|d| d.state == tb_core::delivery::DeliveryState::DeadLettered)
    {
        // Every matching binding failed to render (a template field is absent).
        ReceiptState::RoutingFailed
    } else {
        ReceiptState::Routed
    };
    let content_type = media_type(headers);
    let receipt = NewReceipt {
        id: new_id(IdKind::Receipt),
        subscription_id: sub.id.clone(),
        dedup_key: key,
        provider_event_id: verified.provider_event_id,
        event_type: verified.event.event_type(),
        normalized: serde_json::to_value(&verified.event).unwrap_or_default(),
        state: receipt_state,
        content_type,
        body,
        received_at: now,
        dedup_until: now.saturating_add(sub.dedup_window_s.saturating_mul(1000) as i64),
        deliveries,
        capability: None,
        lease: None,
    };
    // Everything that must follow the commit (counters, the worker's wake-up) runs in a spawned task
    // with the commit itself: a caller that goes away cannot skip it (issue #9 defect 15).
    let committed = commit_detached(engine, receipt, move |out, ready| match out {
        Ok(IngestOutcome::Accepted { deliveries, .. }) => match receipt_state {
            ReceiptState::Unmatched => count(connector, "unmatched"),
            ReceiptState::DeadLettered | ReceiptState::RoutingFailed => {
                count(connector, "dead_lettered");
                metrics::counter!("tb_deliveries_total", "outcome" => "dead-lettered")
                    .increment(deliveries.len() as u64);
            }
            _ => {
                count(connector, "accepted");
                ready.notify_one();
            }
        },
        Ok(IngestOutcome::Duplicate { .. }) => count(connector, "duplicate"),
        Err(_) => {}
    })
    .await?
    .map_err(store_err)?;
    match committed {
        IngestOutcome::Accepted {
            receipt_id,
            deliveries,
            ..
        } => Ok(match receipt_state {
            ReceiptState::Unmatched => IngestAnswer::Unmatched { receipt_id },
            ReceiptState::DeadLettered | ReceiptState::RoutingFailed => {
                IngestAnswer::DeadLettered {
                    receipt_id,
                    deliveries,
                }
            }
            _ => IngestAnswer::Accepted {
                run_id: single_run(&deliveries),
                receipt_id,
                deliveries,
            },
        }),
        dup @ IngestOutcome::Duplicate { .. } => Ok(answer_dup(dup)),
    }
}
