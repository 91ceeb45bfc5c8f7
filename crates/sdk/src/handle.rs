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
    /// Messages (by stream sequence) whose handler ran but whose DLQ entry or CompletionEvent could
    /// not be written before they were offered again: a redelivery here writes them without running
    /// the handler again. Bounded by [`MAX_PENDING_WRITES`].
    pub pending: std::sync::Mutex<HashMap<u64, Written>>,
}

/// What a handled message still has to write.
#[derive(Debug, Clone)]
pub(crate) enum Written {
    /// The handler succeeded: CompletionEvent `ok`, then `+ACK`.
    Done { started_at: WireTime },
    /// A DLQ entry and CompletionEvent `error`, then `+ACK` (exhausted) or `+TERM` (rejected).
    DeadLetter {
        kind: &'static str,
        subject: String,
        why: String,
        started_at: WireTime,
        term: bool,
    },
}

/// Most remembered pending writes; beyond it a redelivery runs the handler again (at least once).
const MAX_PENDING_WRITES: usize = 10_000;
/// How long the writes after a handler are retried (with progress, the message kept) before the
/// message is offered again.
const WRITE_RETRY_FOR: Duration = Duration::from_secs(30);

/// Pulls from one consumer's message stream until `stop`. A message is taken from the stream when
/// one of `taken` is free (the service has twice its concurrency plus one per source of them), then
/// waits for a handler slot; from the moment it is taken until it is answered it gets progress
/// (`+WPI`) every third of `ack_wait` (at once when it has to wait), so it never runs out its
/// `ack_wait` while this replica lives. An idle source holds one `taken` only, never a handler
/// slot. What the client buffers ahead is bounded by the pull's batch; on `stop` up to that many
/// are handed back at once (`-NAK`) for another replica.
pub(crate) async fn consume(
    shared: Arc<Shared>,
    mut messages: jetstream::consumer::pull::Stream,
    batch: usize,
    permits: Arc<tokio::sync::Semaphore>,
    taken: Arc<tokio::sync::Semaphore>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let took = tokio::select! {
            t = taken.clone().acquire_owned() => match t { Ok(t) => t, Err(_) => return },
            _ = stop.changed() => return hand_back(&mut messages, batch).await,
        };
        let m = tokio::select! {
            m = messages.next() => m,
            _ = stop.changed() => return hand_back(&mut messages, batch).await,
        };
        match m {
            Some(Ok(m)) => {
                let (shared, permits) = (shared.clone(), permits.clone());
                tokio::spawn(async move {
                    let waits = permits.available_permits() == 0;
                    let work = async {
                        if let Ok(p) = permits.acquire_owned().await {
                            handle(&shared, &m).await;
                            drop(p);
                        }
                    };
                    keep_alive(&m, shared.ack_wait, waits, work).await;
                    drop(took);
                });
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "pull failed; pulling again");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = stop.changed() => return hand_back(&mut messages, batch).await,
                }
            }
            None => {
                tracing::error!("the consumer's message stream ended (consumer deleted?)");
                return;
            }
        }
    }
}

/// `-NAK`s (no delay) what the pull already brought, at most `batch` messages, each awaited 50 ms.
async fn hand_back(messages: &mut jetstream::consumer::pull::Stream, batch: usize) {
    for _ in 0..batch {
        match tokio::time::timeout(Duration::from_millis(50), messages.next()).await {
            Ok(Some(Ok(m))) => {
                let _ = m.ack_with(AckKind::Nak(None)).await;
            }
            _ => return,
        }
    }
}

/// Drives `work` while sending progress for `msg` every third of `ack_wait` (first at once when
/// `now`).
async fn keep_alive(
    msg: &jetstream::Message,
    ack_wait: Duration,
    now: bool,
    work: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(work);
    let mut progress = tokio::time::interval((ack_wait / 3).max(Duration::from_millis(100)));
    progress.tick().await;
    if now {
        let _ = msg.ack_with(AckKind::Progress).await;
    }
    loop {
        tokio::select! {
            _ = &mut work => return,
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
/// its DLQ entry and CompletionEvent were written: writes that fail are retried (the message kept,
/// with progress) for [`WRITE_RETRY_FOR`], then the message is offered again and its redelivery
/// here writes them without running the handler again.
pub(crate) async fn handle(shared: &Shared, msg: &jetstream::Message) {
    let raw = header_pairs(msg.headers.as_ref());
    let info = msg.info().ok();
    let attempt = info.as_ref().map_or(1, |i| i.delivered).max(1);
    let seq = info.as_ref().map(|i| i.stream_sequence);
    // The DLQ entry's time: the message's stream timestamp, the same on every redelivery, so every
    // publish of one entry has one Nats-Msg-Id (spec §2.3).
    let occurred_at = info.as_ref().map_or_else(WireTime::now, |i| {
        WireTime::from_unix_nanos(i.published.unix_timestamp_nanos() as i64)
    });
    let mut env = from_headers(&raw);
    env.retry_count = env.retry_count.max(attempt - 1);
    let payload = msg.payload.clone();
    let ctx = Job {
        shared,
        msg,
        env: &env,
        payload: &payload,
        occurred_at,
        seq,
    };
    let remembered = seq.and_then(|q| shared.pending.lock().unwrap().remove(&q));
    if let Some(w) = remembered {
        return ctx.write(w).await;
    }
    let started_at = WireTime::now();
    let reject = |kind: &'static str, subject: Option<String>, why: String| Written::DeadLetter {
        subject: subject.unwrap_or_else(|| subjects::dlq(&shared.service, kind)),
        kind,
        why,
        started_at,
        term: true,
    };
    if !env.flow_id.is_empty() && !subjects::valid_subject_suffix(&env.flow_id) {
        let why = format!("X-Triggers-Flow-Id {:?} cannot name a subject", env.flow_id);
        return ctx.write(reject("envelope", None, why)).await;
    }
    let timer = match durable_timer::check(&raw, &payload) {
        Ok(t) => t,
        Err(e) => return ctx.write(reject("envelope", None, e)).await,
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
        return ctx.write(reject("unknown_action", None, why)).await;
    };
    let dlq = dlq_subject(shared, action);
    let handler_ctx = Context {
        action: action.name.clone(),
        envelope: env.clone(),
        attempt,
        headers,
        durable_timer: timer,
    };
    let work = match (action.handler)(handler_ctx, &payload) {
        Ok(w) => w,
        Err(e) => return ctx.write(reject("decode", Some(dlq), e)).await,
    };
    let outcome = run_attempt(work, action.timeout).await;
    match decide(&outcome, attempt, action.retry.as_ref()) {
        Disposition::Ack => ctx.write(Written::Done { started_at }).await,
        Disposition::Retry { delay_ms } => {
            let error = failure_text(&outcome);
            tracing::info!(action = %action.name, attempt, delay_ms, error = %error, "attempt failed; retrying");
            answer(msg, AckKind::Nak(Some(Duration::from_millis(delay_ms)))).await
        }
        Disposition::DeadLetter => {
            let w = Written::DeadLetter {
                kind: "action",
                subject: dlq,
                why: failure_text(&outcome),
                started_at,
                term: false,
            };
            ctx.write(w).await
        }
    }
}

/// One message being answered.
struct Job<'a> {
    shared: &'a Shared,
    msg: &'a jetstream::Message,
    env: &'a Envelope,
    payload: &'a [u8],
    occurred_at: WireTime,
    seq: Option<u64>,
}

impl Job<'_> {
    /// Writes what `w` says (retried for [`WRITE_RETRY_FOR`]), then answers: `+ACK` / `+TERM` once
    /// written; else remembers `w` for the redelivery and `-NAK`s with [`DLQ_RETRY_DELAY_MS`].
    async fn write(&self, w: Written) {
        let deadline = tokio::time::Instant::now() + WRITE_RETRY_FOR;
        let mut delay = Duration::from_millis(200);
        let last_error = loop {
            match self.write_once(&w).await {
                Ok(()) => {
                    let kind = match &w {
                        Written::DeadLetter { term: true, .. } => AckKind::Term,
                        _ => AckKind::Ack,
                    };
                    return answer(self.msg, kind).await;
                }
                Err(e) if tokio::time::Instant::now() + delay < deadline => {
                    tracing::debug!(error = %e, "write after the handler failed; trying again");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                Err(e) => break e,
            }
        };
        tracing::warn!(error = %last_error, "DLQ entry or completion event not written; offered again");
        if let Some(q) = self.seq {
            let mut pending = self.shared.pending.lock().unwrap();
            if pending.len() < MAX_PENDING_WRITES {
                pending.insert(q, w);
            }
        }
        answer(
            self.msg,
            AckKind::Nak(Some(Duration::from_millis(DLQ_RETRY_DELAY_MS))),
        )
        .await
    }

    async fn write_once(&self, w: &Written) -> Result<(), String> {
        match w {
            Written::Done { started_at } => complete(self.shared, self.env, *started_at, "").await,
            Written::DeadLetter {
                kind,
                subject,
                why,
                started_at,
                ..
            } => {
                let entry = DlqEntry {
                    kind: (*kind).into(),
                    envelope: self.env.clone(),
                    body: tb_wire::json::Raw::from_payload(self.payload),
                    err_msg: why.clone(),
                    occurred_at: self.occurred_at,
                };
                dead_letter(self.shared, subject, &entry).await?;
                tracing::warn!(kind, error = %why, dlq = %subject, "dead-lettered");
                complete(self.shared, self.env, *started_at, why).await
            }
        }
    }
}

fn failure_text(outcome: &Outcome) -> String {
    match outcome {
        Outcome::Failed { message, .. } => message.clone(),
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

/// Runs one attempt: the handler in its own task (a panic is a retryable failure), cut at
/// `timeout` (progress is sent by the caller meanwhile).
async fn run_attempt(
    work: crate::action::BoxFuture<Result<serde_json::Value, crate::action::HandlerError>>,
    timeout: Duration,
) -> Outcome {
    let task = tokio::spawn(work);
    let abort = task.abort_handle();
    match tokio::time::timeout(timeout, task).await {
        Ok(Ok(Ok(_))) => Outcome::Done,
        Ok(Ok(Err(e))) => Outcome::Failed {
            message: e.message,
            permanent: e.permanent,
        },
        Ok(Err(_)) => Outcome::Failed {
            message: "the handler panicked".into(),
            permanent: false,
        },
        Err(_) => {
            abort.abort();
            Outcome::Failed {
                message: format!("timeout: no result within {} ms", timeout.as_millis()),
                permanent: false,
            }
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

/// Publishes the CompletionEvent of this execution on `triggers.v2.flow.events.<flow_id>` when the
/// message has flow context; `error` empty = `ok`. `Nats-Msg-Id` = `<idempotency_key>:completion`
/// (one completion per execution, so a repeat collapses).
async fn complete(
    shared: &Shared,
    env: &Envelope,
    started_at: WireTime,
    error: &str,
) -> Result<(), String> {
    if env.flow_run_id.is_empty() || !subjects::valid_subject_suffix(&env.flow_id) {
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
