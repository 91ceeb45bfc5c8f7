//! The one source-agnostic entry of inbound work: every source (the webhook front end, a
//! capability URL, an API run, the refusal records, and next a cron scheduler and a queue consumer)
//! hands the engine an [`Inbound`] and calls [`accept`].
//!
//! An edge owns what is particular to its source: reading and authenticating the request (headers,
//! signatures, tokens, body limits), the dedup key it derives, its own refusals before anything is
//! written, and how its answer is shown. [`accept`] owns what every source shares, in this order: the
//! dedup probe (read-only: a duplicate never touches the writer), the rate limit, the target run's
//! liveness, admission by the subscription's state, routing (unless the source names its deliveries),
//! the receipt state, ONE detached commit of receipt + body + deliveries, the counters, the worker's
//! wake-up, and the answer. No HTTP type is in here: a caller needs no request to call it.

use bytes::Bytes;
use serde_json::Value;
use tb_core::dedup::dedup_key;
use tb_core::delivery::DeliveryState;
use tb_core::ids::{new_id, IdKind};
use tb_core::normalized::NormalizedEvent;
use tb_core::receipt::{ReceiptSource, ReceiptState};
use tb_core::subscription::{admission, Admission, SubscriptionState};
use tb_core::{ErrorCode, TbError};
use tb_store::{DeliveryRef, IngestOutcome, NewDelivery, NewReceipt, StoreError};

use crate::{clock, router, store_err, Engine};

/// What the sender is told (OpenWOP trigger-bridge §8, the ingest contract).
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

/// One piece of inbound work, from any source.
#[derive(Debug, Clone)]
pub struct Inbound {
    /// The edge it came through (`receipts.source`).
    pub source: ReceiptSource,
    /// Whose receipt it is: a subscription id (webhook, schedule, queue), a capability endpoint id
    /// (`sgep_...`), or [`crate::API_SOURCE`] for an API run. Its dedup keys are scoped by it.
    pub subscription: String,
    /// The `connector` label of `tb_receipts_total{connector, outcome}` (`github`, `capability`, ...);
    /// `None` counts nothing (API runs are not receipts of a trigger).
    pub counter: Option<&'static str>,
    /// The provider's (or caller's) id of the event, kept for operators; not the dedup key. `None`:
    /// the receipt's own id (an API run has no provider).
    pub provider_event_id: Option<String>,
    /// The event type shown and sent to executors (`push`, `pull_request.opened`, `run.requested`).
    pub event_type: String,
    /// The normalized event as stored (allowlisted fields only).
    pub normalized: Value,
    /// The exact bytes received (empty for a content-free refusal record).
    pub body: Bytes,
    /// Media type of `body`, for display.
    pub content_type: Option<String>,
    /// When it was received, Unix ms.
    pub received_at: i64,
    /// How repeats are recognized; `None`: a key unique to this receipt, with no probe.
    pub dedup: Option<Dedup>,
    /// Requests a minute `subscription` accepts, checked after the dedup probe (so a redelivery of an
    /// accepted event is still answered `duplicate`); a refusal is kept as a content-free
    /// `rate_limited` receipt. `None` or `Some(0)`: not limited here.
    pub rate_limit_per_min: Option<u32>,
    /// Where its deliveries come from.
    pub routing: Routing,
    /// A capability endpoint whose use the commit counts; the commit is refused if the endpoint was
    /// revoked, expired or used up meanwhile (answered `not_found`, "no such endpoint").
    pub capability: Option<String>,
    /// The run the deliveries act on, when the source names one: refused `target_terminal` (409) when
    /// it has ended, after the dedup probe.
    pub target_run: Option<String>,
    /// The sender's W3C `traceparent`, when it sent a valid one (an HTTP `traceparent` header, a NATS
    /// message's `traceparent` header): the parent of the `receipt` span ([`crate::trace`]).
    pub trace_parent: Option<tb_core::trace::TraceContext>,
}

/// How an [`Inbound`]'s repeats are recognized (DESIGN §5.2).
#[derive(Debug, Clone, PartialEq)]
pub struct Dedup {
    /// The dedup key (`tb_core::dedup::dedup_key`), unique per `subscription` while live.
    pub key: String,
    /// How long the key answers `duplicate`, in ms from `received_at`.
    pub window_ms: i64,
    /// A repeat must carry the same body: another body is refused `conflict` (409), like an
    /// `Idempotency-Key` reused with another request.
    pub same_body: bool,
}

/// Where an [`Inbound`]'s deliveries come from.
#[derive(Debug, Clone)]
pub enum Routing {
    /// Routed through the subscription's bindings (`router::route`), after admission by the
    /// subscription's state: paused refuses `subscription_not_active` (409), dead-lettered accepts
    /// with every delivery dead-lettered.
    Route(NormalizedEvent),
    /// The source names its deliveries itself (an API run's `start_run`, a capability's signal): no
    /// admission, no routing.
    Fixed(Vec<NewDelivery>),
    /// A content-free record of a refused request, committed as is: no probe, no rate limit, no
    /// counters, no wake-up (the edge counted and answers its own error).
    Refused {
        /// `rejected` or `rate_limited`.
        state: ReceiptState,
        /// Route this event with every delivery dead-lettered for this reason (RFC 0230: a refused
        /// post to a registered subscription, `verification_failed`); `None`: no deliveries.
        dead_letter: Option<(NormalizedEvent, &'static str)>,
    },
}

/// What [`accept`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Accepted {
    /// Committed, or found a duplicate: what the sender is told.
    Answer(IngestAnswer),
    /// A [`Routing::Refused`] record was committed.
    Recorded { receipt_id: String },
}

impl Accepted {
    /// The sender's answer. Errors: `internal` for a refusal record (it has none).
    pub fn answer(self) -> Result<IngestAnswer, TbError> {
        match self {
            Accepted::Answer(a) => Ok(a),
            Accepted::Recorded { .. } => Err(TbError::new(
                ErrorCode::Internal,
                "a refusal record has no answer",
            )),
        }
    }
}

fn count(connector: Option<&'static str>, outcome: &'static str) {
    if let Some(connector) = connector {
        metrics::counter!("tb_receipts_total", "connector" => connector, "outcome" => outcome)
            .increment(1);
    }
}

fn single_run(d: &[DeliveryRef]) -> Option<String> {
    match d {
        [one] => one.run_id.clone(),
        _ => None,
    }
}

/// The receipt state of freshly routed deliveries: `unmatched` (none), `dead_lettered` (the
/// subscription is), `routing_failed` (every one failed to render), else `routed`.
fn routed_state(deliveries: &[NewDelivery], dead: bool) -> ReceiptState {
    if deliveries.is_empty() {
        ReceiptState::Unmatched
    } else if dead {
        ReceiptState::DeadLettered
    } else if deliveries
        .iter()
        .all(|d| d.state == DeliveryState::DeadLettered)
    {
        ReceiptState::RoutingFailed
    } else {
        ReceiptState::Routed
    }
}

/// The content-free normalized form of a refused event: its event and action, no field values.
fn content_free(event: &NormalizedEvent) -> Value {
    serde_json::json!({"event": event.event, "action": event.action, "fields": {}})
}

/// Whether a binding of `subscription` that takes `event` has a rate limit.
fn limited_bindings(engine: &Engine, subscription: &str, event: &NormalizedEvent) -> bool {
    engine
        .catalog()
        .bindings_of(subscription)
        .any(|b| b.rate_limit_per_min > 0 && b.matches(event))
}

/// The subscription's limit (`per_min`, 0 = none) and that of every binding taking `event`, checked
/// and counted together ([`crate::rate_limit::RateLimits::admit`]).
fn limit(
    engine: &Engine,
    subscription: &str,
    per_min: u32,
    event: &NormalizedEvent,
) -> Result<(), tb_core::rate::Refusal> {
    let catalog = engine.catalog();
    let mut levels = vec![crate::rate_limit::Level {
        scope: tb_core::rate::Scope::Subscription,
        key: subscription,
        limit: per_min,
    }];
    levels.extend(
        catalog
            .bindings_of(subscription)
            .filter(|b| b.rate_limit_per_min > 0 && b.matches(event))
            .map(|b| crate::rate_limit::Level {
                scope: tb_core::rate::Scope::Binding,
                key: &b.id,
                limit: b.rate_limit_per_min,
            }),
    );
    engine.rate_limits.admit(clock::now_ms(), &levels)
}

/// Accepts one piece of inbound work: probe, limit, admit, route, commit, count, wake, answer (the
/// order of the module docs). A refusal writes nothing, except the content-free `rate_limited` record
/// (the first [`tb_core::rate::RECORDS_PER_MINUTE`] a minute per subscription; the rest are counted).
///
/// Errors (stable codes): `conflict` (409) a repeat with another body under [`Dedup::same_body`];
/// `rate_limited` (429, `Retry-After`) over [`Inbound::rate_limit_per_min`] or a matched binding's
/// `rate_limit_per_min`; `target_terminal` (409)
/// the target run ended; `subscription_not_active` (409) a paused subscription; `not_found` (404) the
/// capability was revoked, expired or used up at commit; `unavailable` (503) the store cannot commit
/// (`Retry-After: 1` when busy); `internal` if the commit task panicked.
pub async fn accept(engine: &Engine, inbound: Inbound) -> Result<Accepted, TbError> {
    use tracing::Instrument;
    let id = new_id(IdKind::Receipt);
    let span = crate::trace::receipt_span(&inbound.subscription, inbound.source.as_str(), &id);
    let trace_context = crate::trace::ingress(&span, inbound.trace_parent);
    accept_traced(engine, inbound, id, trace_context)
        .instrument(span)
        .await
}

/// [`accept`] inside its `receipt` span: `id` is the receipt's id, `trace_context` the `traceparent`
/// its deliveries keep.
async fn accept_traced(
    engine: &Engine,
    inbound: Inbound,
    id: String,
    trace_context: Option<String>,
) -> Result<Accepted, TbError> {
    let Inbound {
        source,
        subscription,
        counter,
        provider_event_id,
        event_type,
        normalized,
        body,
        content_type,
        received_at,
        dedup,
        rate_limit_per_min,
        routing,
        capability,
        target_run,
        trace_parent: _,
    } = inbound;
    let receipt = |state, deliveries, key: Option<&Dedup>, normalized, body| NewReceipt {
        source,
        subscription_id: subscription.clone(),
        dedup_key: key.map_or_else(|| dedup_key(&subscription, &id), |d| d.key.clone()),
        dedup_until: received_at.saturating_add(key.map_or(0, |d| d.window_ms)),
        id: id.clone(),
        provider_event_id: provider_event_id.clone().unwrap_or_else(|| id.clone()),
        event_type: event_type.clone(),
        normalized,
        state,
        content_type: content_type.clone(),
        body,
        received_at,
        deliveries,
        capability: capability.clone(),
        // Filled by `commit_detached` from the local worker's free slots (hand-off).
        lease: None,
        trace_context: trace_context.clone(),
    };
    let (dead, deliveries) = match routing {
        Routing::Refused { state, dead_letter } => {
            let deliveries = match &dead_letter {
                Some((event, reason)) => {
                    let mut d = router::route(&engine.catalog(), &subscription, event, true);
                    for d in &mut d {
                        d.dead_letter_reason = Some((*reason).into());
                    }
                    d
                }
                None => Vec::new(),
            };
            let r = receipt(state, deliveries, None, normalized, Bytes::new());
            let out = commit_detached(engine, r, |_, _| {})
                .await?
                .map_err(store_err)?;
            let (IngestOutcome::Accepted { receipt_id, .. }
            | IngestOutcome::Duplicate { receipt_id, .. }) = out;
            return Ok(Accepted::Recorded { receipt_id });
        }
        routing => {
            // A repeat is answered as a duplicate before the checks below (rate limit, endpoint run,
            // subscription state) could refuse it; where none of them applies, a store whose commit
            // finds the taken key as cheaply is not asked first.
            let checks = rate_limit_per_min.is_some_and(|n| n > 0)
                || (rate_limit_per_min.is_some()
                    && matches!(&routing, Routing::Route(e) if limited_bindings(engine, &subscription, e)))
                || target_run.is_some()
                || (matches!(routing, Routing::Route(_))
                    && engine
                        .subscription_state(&subscription)
                        .unwrap_or(SubscriptionState::Active)
                        != SubscriptionState::Active);
            let probe = checks || engine.store.probe_before_commit();
            if let (Some(d), true) = (&dedup, probe) {
                if let Some(first) = engine
                    .store
                    .find_duplicate(&subscription, &d.key, received_at)
                    .await
                    .map_err(store_err)?
                {
                    return duplicate(engine, counter, d, first, &body).await;
                }
            }
            // Webhook requests only (`Some`): a queue message or a schedule tick is not the sender's
            // to retry.
            if let (Some(per_min), Routing::Route(event)) = (rate_limit_per_min, &routing) {
                if let Err(refusal) = limit(engine, &subscription, per_min, event) {
                    count(counter, "rate_limited");
                    // The first few a minute are kept, content-free (no body, no field values, no
                    // deliveries) with a key of their own: a later redelivery is not a duplicate, and
                    // the provider's id says what to redeliver. The rest are only counted.
                    if engine.count_refusal(Some(&subscription), "rate_limited") {
                        let r = NewReceipt {
                            content_type: None,
                            ..receipt(
                                ReceiptState::RateLimited,
                                Vec::new(),
                                None,
                                content_free(event),
                                Bytes::new(),
                            )
                        };
                        if let Err(e) = engine.store.commit_receipt(r).await {
                            tracing::error!(subscription = %subscription, error = %e, "recording a rate-limited request failed");
                        }
                    }
                    return Err(refusal.error());
                }
            }
            if let Some(run_id) = &target_run {
                let run = engine.store.get_run(run_id).await.map_err(store_err)?;
                if run.status.is_terminal() {
                    count(counter, "target_terminal");
                    return Err(TbError::new(
                        ErrorCode::TargetTerminal,
                        format!("the endpoint's run has ended ({})", run.status.as_str()),
                    ));
                }
            }
            match routing {
                Routing::Route(event) => {
                    let state = engine
                        .subscription_state(&subscription)
                        .unwrap_or(SubscriptionState::Active);
                    let admit = admission(state);
                    if admit == Admission::Refuse {
                        count(counter, "not_active");
                        return Err(TbError::new(
                            ErrorCode::SubscriptionNotActive,
                            format!(
                                "subscription {subscription:?} is {}; resume it to accept deliveries",
                                state.as_str()
                            ),
                        ));
                    }
                    let dead = admit == Admission::AcceptAsDeadLetter;
                    (
                        dead,
                        router::route(&engine.catalog(), &subscription, &event, dead),
                    )
                }
                Routing::Fixed(d) => (false, d),
                Routing::Refused { .. } => unreachable!("handled above"),
            }
        }
    };
    let receipt_state = routed_state(&deliveries, dead);
    let r = receipt(
        receipt_state,
        deliveries,
        dedup.as_ref(),
        normalized,
        body.clone(),
    );
    let same_body = dedup.as_ref().is_some_and(|d| d.same_body);
    // Everything that must follow the commit (counters, the worker's wake-up) runs in a spawned task
    // with the commit itself: a caller that goes away cannot skip it.
    let committed = commit_detached(engine, r, move |out, ready| match out {
        Ok(IngestOutcome::Accepted { deliveries, .. }) => match receipt_state {
            ReceiptState::Unmatched => count(counter, "unmatched"),
            ReceiptState::DeadLettered | ReceiptState::RoutingFailed => {
                count(counter, "dead_lettered");
                metrics::counter!("tb_deliveries_total", "outcome" => "dead-lettered")
                    .increment(deliveries.len() as u64);
            }
            _ => {
                count(counter, "accepted");
                ready.notify_one();
            }
        },
        // A same-body repeat is counted once its body was compared.
        Ok(IngestOutcome::Duplicate { .. }) if !same_body => count(counter, "duplicate"),
        _ => {}
    })
    .await?;
    match committed {
        Ok(IngestOutcome::Accepted {
            receipt_id,
            deliveries,
            ..
        }) => Ok(Accepted::Answer(match receipt_state {
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
        })),
        Ok(first @ IngestOutcome::Duplicate { .. }) => match &dedup {
            Some(d) if d.same_body => duplicate(engine, counter, d, first, &body).await,
            _ => Ok(Accepted::Answer(answer_duplicate(engine, first))),
        },
        Err(StoreError::Rejected {
            code: ErrorCode::NotFound,
            ..
        }) if capability.is_some() => {
            count(counter, "not_found");
            Err(TbError::new(ErrorCode::NotFound, "no such endpoint"))
        }
        Err(e) => Err(store_err(e)),
    }
}

/// The `duplicate` answer (200) naming the first receipt and its run; the repeat is added to the
/// receipt's counters later ([`Engine::note_duplicate`]).
fn answer_duplicate(engine: &Engine, first: IngestOutcome) -> IngestAnswer {
    let (IngestOutcome::Duplicate {
        receipt_id,
        deliveries,
    }
    | IngestOutcome::Accepted {
        receipt_id,
        deliveries,
        ..
    }) = first;
    engine.note_duplicate(&receipt_id);
    IngestAnswer::Duplicate {
        run_id: single_run(&deliveries),
        receipt_id,
    }
}

/// A repeat of a live dedup key: under [`Dedup::same_body`] the stored body must equal `body`
/// (another body: `conflict`, 409); then counted and answered `duplicate`.
async fn duplicate(
    engine: &Engine,
    counter: Option<&'static str>,
    d: &Dedup,
    first: IngestOutcome,
    body: &[u8],
) -> Result<Accepted, TbError> {
    if d.same_body {
        let (IngestOutcome::Duplicate { receipt_id, .. }
        | IngestOutcome::Accepted { receipt_id, .. }) = &first;
        let stored = engine.store.get_body(receipt_id).await.map_err(store_err)?;
        if stored.as_ref() != body {
            return Err(TbError::new(
                ErrorCode::Conflict,
                "this Idempotency-Key was used with a different body",
            ));
        }
    }
    count(counter, "duplicate");
    Ok(Accepted::Answer(answer_duplicate(engine, first)))
}

/// Commits `receipt` and runs `after` on the outcome inside a spawned task, so neither the commit's
/// follow-up (counters, the worker's wake-up) nor the commit itself can be skipped by a caller that
/// goes away (a dropped request future). The caller only awaits the outcome.
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
    let changes = engine.changes.clone();
    let pending = receipt
        .deliveries
        .iter()
        .filter(|d| d.state == tb_core::delivery::DeliveryState::Pending)
        .count();
    let reservation = engine.handoff.reserve(pending);
    receipt.lease = reservation
        .as_ref()
        .map(crate::handoff::Reservation::request);
    // The handed leases carry the receipt's event type to the worker.
    let reservation = reservation.map(|r| (r, receipt.event_type.clone()));
    tokio::spawn(async move {
        let mut out = store.commit_receipt(receipt).await;
        let handed = match (&mut out, reservation) {
            (Ok(IngestOutcome::Accepted { leased, .. }), Some((r, event_type))) => {
                r.deliver(std::mem::take(leased), &event_type)
            }
            _ => 0,
        };
        if handed > 0 && handed == pending {
            after(&out, &tokio::sync::Notify::new());
        } else {
            after(&out, &ready);
        }
        if out.is_ok() {
            changes.send_modify(|n| *n = n.wrapping_add(1));
        }
        out
    })
    .await
    .map_err(|e| TbError::new(ErrorCode::Internal, format!("commit task failed: {e}")))
}
