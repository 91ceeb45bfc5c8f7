//! One inbound message, from the pull to JetStream's answer (wire spec §9.2): read the envelope,
//! check and strip the Durable Timer triplet, find the action, decode, run the handler with its
//! timeout (sending progress), then act on [`tb_wire::outcome::decide`]: CompletionEvent and ack,
//! nak with the backoff delay, or DLQ entry + CompletionEvent + ack / term.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};
use async_nats::HeaderMap;
use futures_util::StreamExt;
use tb_wire::headers::{from_headers, strip_private, NATS_MSG_ID};
use tb_wire::manifest::Retry;
use tb_wire::outcome::{decide, Disposition, Outcome, DLQ_RETRY_DELAY_MS};
use tb_wire::time::WireTime;
use tb_wire::{durable_timer, json, subjects, CompletionEvent, DlqEntry, Envelope};

use crate::action::{Action, Context};
use crate::flows::Flows;

/// What every message task shares.
pub(crate) struct Shared {
    pub service: String,
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub actions: HashMap<String, Action>,
    pub flows: Flows,
    pub ack_wait: Duration,
}

/// Pulls from one consumer's message stream until `stop`. A message is taken from the stream at
/// once when one of `taken` is free (the service has the concurrency plus one per source of them),
/// then waits for a handler slot while sending progress for itself, so a message taken never runs
/// out its `ack_wait` waiting, and an idle source holds one `taken` only, never a handler slot.
/// What the client buffers ahead is bounded by the pull's batch (the concurrency).
pub(crate) async fn consume(
    shared: Arc<Shared>,
    mut messages: jetstream::consumer::pull::Stream,
    permits: Arc<tokio::sync::Semaphore>,
    taken: Arc<tokio::sync::Semaphore>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let took = tokio::select! {
            t = taken.clone().acquire_owned() => match t { Ok(t) => t, Err(_) => return },
            _ = stop.changed() => return,
        };
        let m = tokio::select! {
            m = messages.next() => m,
            _ = stop.changed() => return,
        };
        match m {
            Some(Ok(m)) => {
                let (shared, permits) = (shared.clone(), permits.clone());
                tokio::spawn(async move {
                    if let Some(p) = slot_with_progress(&permits, &m, shared.ack_wait).await {
                        handle(&shared, m).await;
                        drop(p);
                    }
                    drop(took);
                });
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "pull failed; pulling again");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = stop.changed() => return,
                }
            }
            None => return,
        }
    }
}

/// A handler slot for `msg`, sending progress for it every third of `ack_wait` while it waits.
async fn slot_with_progress(
    permits: &Arc<tokio::sync::Semaphore>,
    msg: &jetstream::Message,
    ack_wait: Duration,
) -> Option<tokio::sync::OwnedSemaphorePermit> {
    if let Ok(p) = permits.clone().try_acquire_owned() {
        return Some(p);
    }
    let mut progress = tokio::time::interval((ack_wait / 3).max(Duration::from_millis(100)));
    progress.tick().await;
    loop {
        tokio::select! {
            p = permits.clone().acquire_owned() => return p.ok(),
            _ = progress.tick() => { let _ = msg.ack_with(AckKind::Progress).await; }
        }
    }
}

fn header_pairs(h: Option<&HeaderMap>) -> Vec<(String, String)> {
    h.into_iter()
        .flat_map(|h| h.iter())
        .flat_map(|(k, vs)| {
            vs.iter()
                .map(move |v| (k.to_string(), v.as_str().to_string()))
        })
        .collect()
}

/// Handles one message to the end (an answer to JetStream is always sent, except when the
/// connection is gone: then the server redelivers after `ack_wait`). Nothing is acknowledged before
/// its DLQ entry and CompletionEvent were written; a write that fails is retried by redelivery, and
/// a redelivery past the action's last attempt only writes them again (the handler does not run
/// again).
pub(crate) async fn handle(shared: &Shared, msg: jetstream::Message) {
    let raw = header_pairs(msg.headers.as_ref());
    let info = msg.info().ok();
    let attempt = info.as_ref().map_or(1, |i| i.delivered).max(1);
    // The DLQ entry's time: the message's stream timestamp, the same on every redelivery, so every
    // publish of one entry has one Nats-Msg-Id (spec §2.3).
    let occurred_at = info.as_ref().map_or_else(WireTime::now, |i| {
        WireTime::from_unix_nanos(i.published.unix_timestamp_nanos() as i64)
    });
    let mut env = from_headers(&raw);
    env.retry_count = env.retry_count.max(attempt - 1);
    let payload = msg.payload.clone();
    let started_at = WireTime::now();
    let reject = |kind: &'static str, subject: Option<String>, why: String| Rejection {
        kind,
        subject,
        why,
        occurred_at,
        started_at,
    };
    if !env.flow_id.is_empty() && !subjects::valid_subject_suffix(&env.flow_id) {
        let why = format!("X-Triggers-Flow-Id {:?} cannot name a subject", env.flow_id);
        // No CompletionEvent can be sent for it: clear the flow so none is tried.
        env.flow_id.clear();
        return answer(
            &msg,
            rejected(shared, &env, &payload, reject("envelope", None, why)).await,
        )
        .await;
    }
    let timer = match durable_timer::check(&raw, &payload) {
        Ok(t) => t,
        Err(e) => {
            return answer(
                &msg,
                rejected(shared, &env, &payload, reject("envelope", None, e)).await,
            )
            .await
        }
    };
    let headers = strip_private(&raw);
    let names: Vec<&str> = shared.actions.keys().map(String::as_str).collect();
    let action = shared
        .flows
        .0
        .read()
        .unwrap()
        .route(&shared.service, &env.flow_id, &env.source_node_id, &names)
        .map(str::to_string);
    let Some(action) = action.and_then(|a| shared.actions.get(&a)) else {
        let why = format!(
            "no action for node {:?} of flow {:?}",
            env.source_node_id, env.flow_id
        );
        return answer(
            &msg,
            rejected(shared, &env, &payload, reject("unknown_action", None, why)).await,
        )
        .await;
    };
    let dlq = dlq_subject(shared, action);
    if attempt > Retry::attempts(action.retry.as_ref()) {
        // The last attempt ran, but its DLQ entry or CompletionEvent was not written: write them.
        let why =
            "retries exhausted (the dead letter of the last attempt is written again)".to_string();
        let r = reject("action", Some(dlq), why);
        return answer(
            &msg,
            dead_lettered(shared, &env, &payload, r, AckKind::Ack).await,
        )
        .await;
    }
    let ctx = Context {
        action: action.name.clone(),
        envelope: env.clone(),
        attempt,
        headers,
        durable_timer: timer,
    };
    let work = match (action.handler)(ctx, &payload) {
        Ok(w) => w,
        Err(e) => {
            return answer(
                &msg,
                rejected(shared, &env, &payload, reject("decode", Some(dlq), e)).await,
            )
            .await
        }
    };
    let outcome = run_attempt(work, action.timeout, &msg, shared.ack_wait).await;
    let kind = match decide(&outcome, attempt, action.retry.as_ref()) {
        Disposition::Ack => match complete_retrying(shared, &env, started_at, "").await {
            Ok(()) => AckKind::Ack,
            Err(e) => {
                tracing::warn!(error = %e, "completion event not published; redelivering");
                AckKind::Nak(Some(Duration::from_millis(DLQ_RETRY_DELAY_MS)))
            }
        },
        Disposition::Retry { delay_ms } => {
            let error = failure_text(&outcome);
            tracing::info!(action = %action.name, attempt, delay_ms, error = %error, "attempt failed; retrying");
            AckKind::Nak(Some(Duration::from_millis(delay_ms)))
        }
        Disposition::DeadLetter | Disposition::Reject => {
            let r = reject("action", Some(dlq), failure_text(&outcome));
            dead_lettered(shared, &env, &payload, r, AckKind::Ack).await
        }
    };
    answer(&msg, kind).await
}

fn failure_text(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Failed { message, .. } | Outcome::Rejected { message, .. } => message.clone(),
        Outcome::Done => String::new(),
    }
}

async fn answer(msg: &jetstream::Message, kind: AckKind) {
    if let Err(e) = msg.ack_with(kind).await {
        tracing::warn!(error = %e, "answer to JetStream not sent; it redelivers after ack_wait");
    }
}

fn dlq_subject(shared: &Shared, action: &Action) -> String {
    action
        .dlq
        .clone()
        .unwrap_or_else(|| subjects::dlq(&shared.service, &action.name))
}

/// A DLQ entry to write: its kind, subject (`None`: the fallback `triggers.v2.dlq.<service>.<kind>`),
/// error text and time.
struct Rejection {
    kind: &'static str,
    subject: Option<String>,
    why: String,
    occurred_at: WireTime,
    started_at: WireTime,
}

/// A message that cannot be handled: DLQ entry, CompletionEvent `error` (with flow context), `+TERM`.
async fn rejected(shared: &Shared, env: &Envelope, payload: &[u8], r: Rejection) -> AckKind {
    dead_lettered(shared, env, payload, r, AckKind::Term).await
}

/// Writes the DLQ entry, then the CompletionEvent `error`; `done` when both were written, else
/// `-NAK` with [`DLQ_RETRY_DELAY_MS`] (the redelivery writes them again; the entry's `Nats-Msg-Id`
/// is stable, so a repeat collapses).
async fn dead_lettered(
    shared: &Shared,
    env: &Envelope,
    payload: &[u8],
    r: Rejection,
    done: AckKind,
) -> AckKind {
    let subject = r
        .subject
        .clone()
        .unwrap_or_else(|| subjects::dlq(&shared.service, r.kind));
    let entry = DlqEntry {
        kind: r.kind.into(),
        envelope: env.clone(),
        body: tb_wire::json::Raw::from_payload(payload),
        err_msg: r.why.clone(),
        occurred_at: r.occurred_at,
    };
    let written = async {
        dead_letter(shared, &subject, &entry).await?;
        complete(shared, env, r.started_at, &r.why).await
    };
    match written.await {
        Ok(()) => {
            tracing::warn!(kind = r.kind, error = %r.why, dlq = %subject, "dead-lettered");
            done
        }
        Err(e) => {
            tracing::warn!(error = %e, "DLQ entry or completion event not written; redelivering");
            AckKind::Nak(Some(Duration::from_millis(DLQ_RETRY_DELAY_MS)))
        }
    }
}

/// Runs one attempt: the handler in its own task (a panic is a retryable failure), cut at
/// `timeout`, with `+WPI` every third of `ack_wait` so JetStream does not redeliver meanwhile.
async fn run_attempt(
    work: crate::action::BoxFuture<Result<serde_json::Value, crate::action::HandlerError>>,
    timeout: Duration,
    msg: &jetstream::Message,
    ack_wait: Duration,
) -> Outcome {
    let task = tokio::spawn(work);
    let abort = task.abort_handle();
    let limited = tokio::time::timeout(timeout, task);
    tokio::pin!(limited);
    let mut progress = tokio::time::interval((ack_wait / 3).max(Duration::from_millis(100)));
    progress.tick().await;
    loop {
        tokio::select! {
            r = &mut limited => return match r {
                Ok(Ok(Ok(_))) => Outcome::Done,
                Ok(Ok(Err(e))) => Outcome::Failed { message: e.message, permanent: e.permanent },
                Ok(Err(_)) => Outcome::Failed { message: "the handler panicked".into(), permanent: false },
                Err(_) => {
                    abort.abort();
                    Outcome::Failed { message: format!("timeout: no result within {} ms", timeout.as_millis()), permanent: false }
                }
            },
            _ = progress.tick() => { let _ = msg.ack_with(AckKind::Progress).await; }
        }
    }
}

async fn dead_letter(shared: &Shared, subject: &str, entry: &DlqEntry) -> Result<(), String> {
    let id = (!entry.envelope.idempotency_key.is_empty()).then(|| entry.msg_id());
    let bytes = json::to_vec(entry, false).map_err(|e| e.to_string())?;
    publish(shared, subject.to_string(), id, bytes)
        .await
        .map(|_| ())
}

/// [`complete`], tried 3 times (200 ms, then 400 ms apart) before giving up: a failed publish after
/// a handler that succeeded would otherwise run the handler again.
async fn complete_retrying(
    shared: &Shared,
    env: &Envelope,
    started_at: WireTime,
    error: &str,
) -> Result<(), String> {
    let mut delay = Duration::from_millis(200);
    for _ in 0..2 {
        match complete(shared, env, started_at, error).await {
            Ok(()) => return Ok(()),
            Err(e) => tracing::debug!(error = %e, "completion event not published; trying again"),
        }
        tokio::time::sleep(delay).await;
        delay *= 2;
    }
    complete(shared, env, started_at, error).await
}

/// Publishes the CompletionEvent of this execution on `triggers.v2.flow.events.<flow_id>` when the
/// message has flow context; `error` empty = `ok`. `Nats-Msg-Id` = `<idempotency_key>:completion`
/// (one completion per execution, so a repeat collapses).
async fn complete(
    shared: &Shared,
    env: &Envelope,
    started_at: WireTime,
    error: &str,
) -> Result<(), String> {
    if env.flow_id.is_empty() || env.flow_run_id.is_empty() {
        return Ok(());
    }
    let ev = CompletionEvent {
        flow_run_id: env.flow_run_id.clone(),
        flow_id: env.flow_id.clone(),
        flow_version: env.flow_version.clone(),
        node_id: env.source_node_id.clone(),
        node_type: "service".into(),
        service: shared.service.clone(),
        started_at,
        finished_at: WireTime::now(),
        status: if error.is_empty() { "ok" } else { "error" }.into(),
        error: error.into(),
        trace_id: env.trace_id.clone(),
    };
    let id =
        (!env.idempotency_key.is_empty()).then(|| format!("{}:completion", env.idempotency_key));
    let bytes = json::to_vec(&ev, false).map_err(|e| e.to_string())?;
    let durable = publish(shared, subjects::flow_events(&env.flow_id), id, bytes).await?;
    if !durable && !CORE_COMPLETIONS_WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::warn!("no JetStream stream captures triggers.v2.flow.events.>: CompletionEvents go out as core publishes, lost when no orchestrator is subscribed at that moment (trigger-bridge creates the stream triggers-flow-events)");
    }
    Ok(())
}

/// Set once the core-publish fallback of CompletionEvents was logged.
static CORE_COMPLETIONS_WARNED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Publishes through JetStream when a stream captures `subject` (awaiting its PubAck; `Nats-Msg-Id`
/// de-duplicates), else as a core publish (flushed), as the protocol has it. `Ok(true)`: stored by a
/// stream; `Ok(false)`: sent as a core publish.
async fn publish(
    shared: &Shared,
    subject: String,
    msg_id: Option<String>,
    bytes: Vec<u8>,
) -> Result<bool, String> {
    let mut headers = HeaderMap::new();
    if let Some(id) = msg_id {
        let v: async_nats::HeaderValue = id.parse().map_err(|e| format!("message id: {e}"))?;
        headers.insert(NATS_MSG_ID, v);
    }
    let acked = async {
        shared
            .js
            .publish_with_headers(subject.clone(), headers.clone(), bytes.clone().into())
            .await?
            .await
    }
    .await;
    match acked {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == jetstream::context::PublishErrorKind::StreamNotFound => {
            shared
                .client
                .publish_with_headers(subject, headers, bytes.into())
                .await
                .map_err(|e| e.to_string())?;
            shared.client.flush().await.map_err(|e| e.to_string())?;
            Ok(false)
        }
        Err(e) => Err(e.to_string()),
    }
}
