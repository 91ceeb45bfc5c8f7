//! The delivery worker (DESIGN §3, §5.7): leases due deliveries, performs each delivery's action, and
//! records the attempt, the next due time and everything that follows in ONE store transaction.
//!
//! Deliveries committed by this process arrive already leased ([`crate::handoff`]); other new work is
//! picked up at once through [`Engine::work_ready`]; otherwise the worker sleeps until the
//! earliest due time (at most `idle_poll`). A crash mid-attempt leaves the lease to lapse; another
//! worker (or this one after restart) then performs the delivery again under the same idempotency key.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tb_core::attempt::{AttemptFailure, AttemptReport, RunStart};
use tb_core::delivery::{
    decide, ActionResult, AttemptDecision, AttemptOutcome, DeliveryKind, RETRIES_EXHAUSTED,
};
use tb_core::ids::{new_id, IdKind};
use tb_core::lease::Completion;
use tb_core::run::RunStatus;
use tb_store::{AttemptCommit, Lease, StoreError};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use crate::executor::{self, StartRequest};
use crate::handoff::Handed;
use crate::{clock, Engine};

/// Worker settings.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// This worker's id (`worker-att_<32 hex>` by default), stored as a lease's owner for display; the
    /// lease itself is fenced by the token of each grant, never by this id.
    pub owner: String,
    /// Lease length in ms; a crashed attempt is retried after this.
    pub lease_ms: u64,
    /// Deliveries leased per round.
    pub batch: u32,
    /// Attempts in flight at once.
    pub concurrency: usize,
    /// Longest sleep without a notification, as a safety net.
    pub idle_poll: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            owner: format!("worker-{}", new_id(IdKind::Attempt)),
            lease_ms: 60_000,
            batch: 256,
            concurrency: 256,
            idle_poll: Duration::from_secs(1),
        }
    }
}

/// Runs the worker until `shutdown` becomes true, then waits for attempts in flight to be recorded.
///
/// It attaches itself to [`Engine::handoff`] first: deliveries committed by this process while it has
/// free slots arrive already leased, with their slot, on a bounded channel (capacity `concurrency`)
/// and are attempted at once, without a lease transaction; everything else is found by `lease_due`.
pub async fn run(engine: Arc<Engine>, cfg: WorkerConfig, mut shutdown: watch::Receiver<bool>) {
    let permits = Arc::new(Semaphore::new(cfg.concurrency));
    let (tx, mut handed) = mpsc::channel::<Handed>(cfg.concurrency.max(1));
    engine
        .handoff
        .attach(&cfg.owner, cfg.lease_ms, permits.clone(), tx);
    loop {
        if *shutdown.borrow() {
            break;
        }
        while let Ok(h) = handed.try_recv() {
            spawn_handed(&engine, h);
        }
        if permits.available_permits() == 0 {
            // Every slot is busy: wait for an attempt to finish rather than asking the store.
            tokio::select! {
                p = permits.clone().acquire_owned() => drop(p),
                Some(h) = handed.recv() => spawn_handed(&engine, h),
                _ = shutdown.changed() => {}
            }
            continue;
        }
        let now = clock::now_ms();
        let want = (permits.available_permits() as u32).min(cfg.batch);
        let leases = {
            match engine
                .store
                .lease_due(&cfg.owner, now, cfg.lease_ms, want)
                .await
            {
                Ok(l) => l,
                Err(e) => {
                    tracing::error!(error = %e, "leasing due deliveries failed");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            }
        };
        if leases.is_empty() {
            let sleep = match engine.store.next_due_at().await {
                Ok(Some(due)) => Duration::from_millis(
                    (due - now).clamp(1, cfg.idle_poll.as_millis() as i64) as u64,
                ),
                _ => cfg.idle_poll,
            };
            // Handed leases are taken while waiting; they are no reason to ask the store for work.
            let until = tokio::time::Instant::now() + sleep;
            loop {
                tokio::select! {
                    _ = engine.work_ready.notified() => break,
                    Some(h) = handed.recv() => spawn_handed(&engine, h),
                    _ = tokio::time::sleep_until(until) => break,
                    _ = shutdown.changed() => break,
                }
            }
            continue;
        }
        for lease in leases {
            // Handed leases hold slots too: take them while waiting, or both could wait on each other.
            let permit = loop {
                tokio::select! {
                    p = permits.clone().acquire_owned() => break p.expect("semaphore open"),
                    Some(h) = handed.recv() => spawn_handed(&engine, h),
                }
            };
            spawn_attempt(&engine, lease, permit, None);
        }
    }
    // No more leases at commit; those already granted are attempted (the channel ends once every
    // commit that reserved slots has sent its leases), then the attempts in flight are awaited.
    engine.handoff.detach();
    while let Some(h) = handed.recv().await {
        spawn_handed(&engine, h);
    }
    let _ = permits.acquire_many(cfg.concurrency as u32).await;
}

/// Attempts a lease handed over at commit ([`spawn_attempt`] with the event type it came with).
fn spawn_handed(engine: &Arc<Engine>, h: Handed) {
    spawn_attempt(engine, h.lease, h.permit, Some(h.event_type));
}

/// Attempts `lease` in its own task, holding `permit` (one worker slot) until the attempt is recorded;
/// `event_type` is the receipt's when known (else the `http` executor reads it).
fn spawn_attempt(
    engine: &Arc<Engine>,
    lease: Lease,
    permit: OwnedSemaphorePermit,
    event_type: Option<String>,
) {
    let engine = engine.clone();
    tokio::spawn(async move {
        use std::sync::atomic::Ordering::Relaxed;
        engine.attempts_in_flight.fetch_add(1, Relaxed);
        attempt_with(&engine, lease, event_type).await;
        engine.attempts_in_flight.fetch_sub(1, Relaxed);
        drop(permit);
    });
}

/// Performs one leased delivery and records the attempt.
pub async fn attempt(engine: &Engine, lease: Lease) {
    attempt_with(engine, lease, None).await
}

/// [`attempt`], with the receipt's event type when the caller knows it (a lease handed over at
/// commit): the `http` executor sends it, and reads the receipt for it only when it is not given.
async fn attempt_with(engine: &Engine, lease: Lease, known_event_type: Option<String>) {
    use tracing::Instrument;
    let d = &lease.delivery;
    let (span, trace) = crate::trace::attempt_span(
        &d.id,
        &d.receipt_id,
        d.attempts + 1,
        d.trace_context.as_deref(),
    );
    attempt_traced(engine, lease, known_event_type, trace)
        .instrument(span)
        .await
}

/// [`attempt_with`] inside the attempt's span; `trace` is the context its executor passes on.
async fn attempt_traced(
    engine: &Engine,
    lease: Lease,
    known_event_type: Option<String>,
    trace: tb_core::trace::TraceContext,
) {
    let d = &lease.delivery;
    let started = clock::now_ms();
    let t0 = Instant::now();
    let number = d.attempts + 1;
    if let Some(lost) = lease.lost {
        // Recorded by the lease's own commit (`lease_due`): counted and logged once, here.
        metrics::counter!("tb_deliveries_total", "outcome" => AttemptOutcome::Lost.as_str())
            .increment(1);
        tracing::warn!(
            delivery = %d.id,
            receipt = %d.receipt_id,
            subscription = %d.subscription_id,
            attempt = lost,
            next_attempt = number,
            "an earlier lease lapsed with no outcome recorded: that attempt is recorded lost and the delivery is attempted again"
        );
    }
    let event_id = new_id(IdKind::Event);
    let catalog = engine.catalog();
    // The delivery's kind says whose retry policy it follows (never the shape of its ids).
    let sub = match d.kind {
        DeliveryKind::OutboundWebhook => {
            // Its own retry policy; the webhook's subscription row counts it.
            let mut c = crate::catalog::api_runs_config();
            c.id = d.subscription_id.clone();
            c.retry = crate::webhooks::policy(
                engine
                    .webhooks_durable
                    .load(std::sync::atomic::Ordering::Relaxed),
            );
            Some(std::sync::Arc::new(c))
        }
        DeliveryKind::CapabilitySignal => {
            // A minted capability endpoint's signal: the default retry policy, no subscription row.
            let mut c = crate::catalog::api_runs_config();
            c.id = d.subscription_id.clone();
            Some(std::sync::Arc::new(c))
        }
        DeliveryKind::ApiRun => {
            // A run started through `POST /v1/runs`: the API run policy, no subscription.
            let mut c = crate::catalog::api_runs_config();
            c.retry = engine.api_run_retry.read().expect("policy lock").clone();
            Some(std::sync::Arc::new(c))
        }
        DeliveryKind::Binding => catalog.subscription(&d.subscription_id).cloned(),
    };
    let Some(sub) = sub else {
        tracing::warn!(delivery = %d.id, "subscription no longer configured; releasing lease");
        let _ = engine
            .store
            .release_lease(&d.id, &lease.token, clock::now_ms())
            .await;
        return;
    };
    // A dead-lettered-at-ingest delivery has no run id yet; a replay derives it from the delivery.
    let run_id = d
        .run_id
        .clone()
        .unwrap_or_else(|| tb_core::ids::run_id_for_delivery(&d.id));
    let workflow = d
        .workflow_id
        .as_deref()
        .and_then(|w| catalog.workflow(w).cloned());
    let effect = crate::effects::plan(d, &run_id, workflow.as_ref());
    // The binding is re-checked on every delivery: a revoked (or removed) binding acts no more.
    let bound =
        d.kind == DeliveryKind::Binding && catalog.subscription(&d.subscription_id).is_some();
    let mut message: Option<String> = None;
    let work = async {
        let result: Result<RunStatus, ActionResult> =
            if bound && !catalog.binding_live(&d.binding_id) {
                Err(ActionResult::Failed {
                    error_class: "binding_revoked".into(),
                    retry_after_ms: None,
                    permanent: true,
                })
            } else if d.kind == DeliveryKind::OutboundWebhook {
                crate::webhooks::deliver(engine, d)
                    .await
                    .map(|_| RunStatus::Completed)
            } else if let Some(e) = &effect {
                e.as_ref().map(|_| RunStatus::Running).map_err(Clone::clone)
            } else {
                match workflow {
                    None => Err(ActionResult::Failed {
                        error_class: "workflow_missing".into(),
                        retry_after_ms: None,
                        permanent: true,
                    }),
                    Some(w) => {
                        // Only the http executor sends the event type; noop runs skip the read.
                        let event_type = match (&w.executor, known_event_type) {
                            (tb_core::workflow::Executor::Http { .. }, Some(t)) => t,
                            (tb_core::workflow::Executor::Http { .. }, None) => engine
                                .store
                                .get_receipt(&d.receipt_id)
                                .await
                                .map(|r| r.event_type)
                                .unwrap_or_default(),
                            _ => String::new(),
                        };
                        let req = StartRequest {
                            run_id: &run_id,
                            delivery_id: &d.id,
                            causation_id: &event_id,
                            inputs: &d.inputs,
                            subscription_id: &d.subscription_id,
                            event_type: &event_type,
                            receipt_id: &d.receipt_id,
                            attempt: number,
                            trace,
                        };
                        executor::start_run(engine, &w, &req).await.map_err(|f| {
                            // A worker's text is outside text: credentials of a listed shape are
                            // masked before the message is logged or stored (docs/limits.md).
                            message = Some(
                                tb_core::credentials::mask(&f.message, tb_core::credentials::MASK)
                                    .into_owned(),
                            );
                            f.result
                        })
                    }
                }
            };
        result
    };
    // The lease is renewed while the action is in flight, so work longer than the lease is never
    // leased (and performed) a second time.
    let result = with_heartbeat(engine, &lease, work).await;
    let effect = effect.and_then(Result::ok).filter(|_| result.is_ok());
    let build = |result: &Result<RunStatus, ActionResult>, effect: Option<tb_store::Effect>| {
        let action = match result {
            Ok(_) => ActionResult::Done,
            Err(f) => f.clone(),
        };
        // Each operator replay grants one attempt beyond the policy (attempt numbers never reset).
        let policy = sub.retry.with_replays(d.replays);
        let decision = decide(&policy, number, &action, rand::random::<f64>());
        let failure = match &action {
            ActionResult::Failed {
                error_class,
                permanent,
                ..
            } => Some(AttemptFailure {
                error_class: error_class.clone(),
                message: message.clone(),
                permanent: *permanent,
            }),
            ActionResult::Done => None,
        };
        let run = match (result, d.workflow_id.as_ref()) {
            (Ok(_), _) if effect.is_some() => None,
            (Ok(status), Some(w)) => Some(RunStart {
                id: run_id.clone(),
                workflow_id: w.clone(),
                inputs: d.inputs.clone(),
                status: *status,
                dead_letter: None,
                session: false,
            }),
            // A run requested through the API exists from its 201; when its start is exhausted it is
            // kept as a dead-lettered, failed run (RFC 0053), fork-eligible. Trigger deliveries start no
            // run instead (their dead letters are RFC 0232 records).
            (Err(_), Some(w))
                if d.kind == DeliveryKind::ApiRun && decision == AttemptDecision::DeadLetter =>
            {
                Some(RunStart {
                    id: run_id.clone(),
                    workflow_id: w.clone(),
                    inputs: d.inputs.clone(),
                    status: RunStatus::Failed,
                    dead_letter: Some((RETRIES_EXHAUSTED.to_string(), number)),
                    session: false,
                })
            }
            _ => None,
        };
        AttemptCommit {
            delivery_id: d.id.clone(),
            report: AttemptReport {
                lease: Completion {
                    token: lease.token.clone(),
                    attempt: number,
                },
                event_id: event_id.clone(),
                decision,
                failure,
                started_at: started,
                duration_ms: t0.elapsed().as_millis() as u64,
                run,
                effect: None,
                failure_policy: sub.failure,
            },
            effect,
            now: clock::now_ms(),
        }
    };
    // What the log and the notifications need, read before the commit moves.
    let summary = |c: &AttemptCommit| {
        let r = &c.report;
        (
            r.decision.outcome().0,
            r.failure.as_ref().map(|f| f.error_class.clone()),
            matches!(r.decision, AttemptDecision::Retry { .. }),
            c.effect.is_some(),
        )
    };
    let commit = build(&result, effect);
    let (mut outcome, mut error_class, mut retrying, had_effect) = summary(&commit);
    let mut changed_session = had_effect;
    let mut committed = engine.store.commit_attempt(commit).await;
    if let (true, Err(StoreError::Rejected { code, .. })) = (had_effect, &committed) {
        // The local effect was refused inside the transaction (nothing written): record the failure.
        let mut failed = build(&Err(crate::effects::refusal(*code)), None);
        if let (tb_core::ErrorCode::Unavailable, AttemptDecision::Retry { delay_ms }) =
            (*code, failed.report.decision)
        {
            // A keyed target still starting: retried once its settle window has passed, so a start
            // accepted together with it is seen (docs/sessions.md "Coalescing").
            failed.report.decision = AttemptDecision::Retry {
                delay_ms: tb_core::binding::starting_retry_delay(
                    delay_ms,
                    d.created_at,
                    failed.now,
                ),
            };
        }
        (outcome, error_class, retrying, changed_session) = summary(&failed);
        committed = engine.store.commit_attempt(failed).await;
    }
    if committed.is_ok() {
        engine.changes.send_modify(|n| *n = n.wrapping_add(1));
        // The attempt's run events may have written outbox deliveries (an outbound webhook's own
        // attempt writes none).
        if d.kind != DeliveryKind::OutboundWebhook {
            engine.run_events_committed();
        }
    }
    // A refused local effect replaced the result: its message no longer applies.
    let message_logged = if changed_session == had_effect {
        message.clone()
    } else {
        None
    };
    let elapsed = t0.elapsed();
    metrics::histogram!("tb_attempt_duration_seconds").record(elapsed.as_secs_f64());
    match committed {
        Ok(done) => {
            metrics::counter!("tb_deliveries_total", "outcome" => outcome.as_str()).increment(1);
            // Failures are visible at the default level: ids, attempt, class and the sanitized
            // message (never a body, header or secret).
            let msg = message_logged.as_deref().unwrap_or("");
            match (outcome, &error_class) {
                // A commit never records `lost` (only a lease taken over does: `lease_due`).
                (AttemptOutcome::Delivered | AttemptOutcome::Lost, _) | (_, None) => {
                    tracing::debug!(delivery = %d.id, attempt = number, outcome = outcome.as_str(), "attempt recorded")
                }
                (AttemptOutcome::DeadLettered, Some(class)) => {
                    tracing::warn!(
                        delivery = %d.id,
                        receipt = %d.receipt_id,
                        subscription = %d.subscription_id,
                        attempt = number,
                        error_class = %class,
                        message = msg,
                        "delivery dead-lettered"
                    );
                    // A nats run that never reached its service: the source DLQ gets an entry.
                    if let Some(w) = d.workflow_id.as_deref().and_then(|w| catalog.workflow(w)) {
                        if let tb_core::workflow::Executor::Nats { action, .. } = &w.executor {
                            let req = StartRequest {
                                run_id: &run_id,
                                delivery_id: &d.id,
                                causation_id: &event_id,
                                inputs: &d.inputs,
                                subscription_id: &d.subscription_id,
                                event_type: "",
                                receipt_id: &d.receipt_id,
                                attempt: number,
                                trace,
                            };
                            let why = format!("{class}: {msg}");
                            crate::nats_executor::source_dead_letter(
                                engine, w, action, &req, started, &why,
                            );
                        }
                    }
                }
                (AttemptOutcome::Retrying, Some(class)) => tracing::warn!(
                    delivery = %d.id,
                    receipt = %d.receipt_id,
                    subscription = %d.subscription_id,
                    attempt = number,
                    error_class = %class,
                    message = msg,
                    "delivery attempt failed; retrying"
                ),
            }
            if let Some(t) = done.subscription_transition {
                engine.note_transition(&d.subscription_id, &t);
            }
            if retrying {
                engine.work_ready.notify_one();
            }
            if changed_session {
                engine.session_changed();
            }
        }
        Err(StoreError::LeaseLost(_)) => {
            tracing::warn!(delivery = %d.id, attempt = number, "lease lapsed before the attempt was recorded; result discarded");
        }
        Err(e) => {
            tracing::error!(delivery = %d.id, error = %e, "recording the attempt failed; the lease will lapse")
        }
    }
}

/// Drives `work` while renewing `lease` every `lease_ms / 3` (extending it by `lease_ms`, fenced by the
/// grant's token: see [`tb_store::Store::renew_lease`]). When the lease cannot be renewed (it lapsed and moved
/// on) renewing stops; the attempt's commit is then refused as `LeaseLost`.
async fn with_heartbeat<F: std::future::Future>(
    engine: &Engine,
    lease: &Lease,
    work: F,
) -> F::Output {
    let every = Duration::from_millis((lease.lease_ms / 3).max(1));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(work);
    loop {
        tokio::select! {
            out = &mut work => return out,
            _ = tick.tick() => {
                let d = &lease.delivery.id;
                match engine.store.renew_lease(d, &lease.token, clock::now_ms(), lease.lease_ms).await {
                    Ok(_) => {}
                    Err(StoreError::LeaseLost(_)) => {
                        tracing::warn!(delivery = %d, "lease lapsed during the attempt; no longer renewed");
                        return work.await;
                    }
                    Err(e) => tracing::warn!(delivery = %d, error = %e, "renewing the lease failed"),
                }
            }
        }
    }
}
