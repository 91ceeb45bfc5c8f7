//! One inbound message, from the pull to JetStream's answer (wire spec §9.2): read the envelope,
//! check and strip the Durable Timer triplet, find the action, decode, run the handler with its
//! timeout (sending progress), then act on [`tb_wire::outcome::decide`]: CompletionEvent and ack,
//! nak with the backoff delay, or DLQ entry + CompletionEvent + ack / term.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, AckKind};
use async_nats::HeaderMap;
use futures_util::StreamExt;
use tb_wire::headers::{from_headers, strip_private, NATS_MSG_ID};
use tb_wire::outcome::{decide, Disposition, Outcome, DLQ_RETRY_DELAY_MS};
use tb_wire::time::WireTime;
use tb_wire::{durable_timer, json, subjects, CompletionEvent, DlqEntry, Envelope};

use crate::action::{Action, Context};
use crate::service::Flows;

/// What every message task shares.
pub(crate) struct Shared {
    pub service: String,
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub actions: HashMap<String, Action>,
    pub flows: Flows,
    pub ack_wait: Duration,
}

/// Pulls from one consumer until `stop`, handling at most `permits` messages at once.
pub(crate) async fn consume(
    shared: Arc<Shared>,
    mut messages: pull::Stream,
    _batch: usize,
    permits: Arc<tokio::sync::Semaphore>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = stop.changed() => return,
        };
        tokio::select! {
            m = messages.next() => match m {
                Some(Ok(m)) => {
                    let shared = shared.clone();
                    tokio::spawn(async move {
                        handle(&shared, m).await;
                        drop(permit);
                    });
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "pull failed; pulling again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                None => return,
            },
            _ = stop.changed() => return,
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
/// connection is gone: then the server redelivers after `ack_wait`).
pub(crate) async fn handle(shared: &Shared, msg: jetstream::Message) {
    let raw = header_pairs(msg.headers.as_ref());
    let attempt = msg.info().map(|i| i.delivered).unwrap_or(1).max(1);
    let mut env = from_headers(&raw);
    env.retry_count = env.retry_count.max(attempt - 1);
    let payload = msg.payload.clone();
    let started_at = WireTime::now();
    let timer = match durable_timer::check(&raw, &payload) {
        Ok(t) => t,
        Err(e) => return reject(shared, &msg, &env, &payload, "envelope", e, started_at).await,
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
        return reject(
            shared,
            &msg,
            &env,
            &payload,
            "unknown_action",
            why,
            started_at,
        )
        .await;
    };
    let ctx = Context {
        action: action.name.clone(),
        envelope: env.clone(),
        attempt,
        headers,
        durable_timer: timer,
    };
    let work = match (action.handler)(ctx, &payload) {
        Ok(w) => w,
        Err(e) => return reject(shared, &msg, &env, &payload, "decode", e, started_at).await,
    };
    let outcome = run_attempt(work, action.timeout, &msg, shared.ack_wait).await;
    let disposition = decide(&outcome, attempt, action.retry.as_ref());
    let error = match &outcome {
        Outcome::Failed { message, .. } => message.clone(),
        _ => String::new(),
    };
    let answer = match disposition {
        Disposition::Ack => match complete(shared, &env, started_at, "").await {
            Ok(()) => AckKind::Ack,
            Err(e) => {
                tracing::warn!(error = %e, "completion event not published; redelivering");
                AckKind::Nak(Some(Duration::from_millis(DLQ_RETRY_DELAY_MS)))
            }
        },
        Disposition::Retry { delay_ms } => {
            tracing::info!(action = %action.name, attempt, delay_ms, error = %error, "attempt failed; retrying");
            AckKind::Nak(Some(Duration::from_millis(delay_ms)))
        }
        Disposition::DeadLetter | Disposition::Reject => {
            let dlq = dlq_subject(shared, action);
            match dead_letter(shared, &dlq, "action", &env, &payload, &error).await {
                Ok(()) => {
                    tracing::warn!(action = %action.name, attempt, error = %error, dlq = %dlq, "dead-lettered");
                    let _ = complete(shared, &env, started_at, &error).await;
                    AckKind::Ack
                }
                Err(e) => {
                    tracing::warn!(error = %e, "DLQ entry not written; redelivering");
                    AckKind::Nak(Some(Duration::from_millis(DLQ_RETRY_DELAY_MS)))
                }
            }
        }
    };
    if let Err(e) = msg.ack_with(answer).await {
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

/// A message that cannot be handled: DLQ entry (fallback subject `triggers.v2.dlq.<service>.<kind>`),
/// CompletionEvent `error` when it has flow context, then `+TERM`; `-NAK` later when the DLQ write
/// failed.
async fn reject(
    shared: &Shared,
    msg: &jetstream::Message,
    env: &Envelope,
    payload: &[u8],
    kind: &str,
    why: String,
    started_at: WireTime,
) {
    let subject = subjects::dlq(&shared.service, kind);
    let answer = match dead_letter(shared, &subject, kind, env, payload, &why).await {
        Ok(()) => {
            tracing::warn!(kind, error = %why, dlq = %subject, "message rejected");
            let _ = complete(shared, env, started_at, &why).await;
            AckKind::Term
        }
        Err(e) => {
            tracing::warn!(error = %e, "DLQ entry not written; redelivering");
            AckKind::Nak(Some(Duration::from_millis(DLQ_RETRY_DELAY_MS)))
        }
    };
    let _ = msg.ack_with(answer).await;
}

async fn dead_letter(
    shared: &Shared,
    subject: &str,
    kind: &str,
    env: &Envelope,
    payload: &[u8],
    why: &str,
) -> Result<(), String> {
    let entry = DlqEntry {
        kind: kind.into(),
        envelope: env.clone(),
        body: tb_wire::json::Raw::from_payload(payload),
        err_msg: why.into(),
        occurred_at: WireTime::now(),
    };
    let id = (!env.idempotency_key.is_empty()).then(|| entry.msg_id());
    let bytes = json::to_vec(&entry, false).map_err(|e| e.to_string())?;
    publish(shared, subject.to_string(), id, bytes).await
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
    publish(shared, subjects::flow_events(&env.flow_id), id, bytes).await
}

/// Publishes through JetStream when a stream captures `subject` (awaiting its PubAck; `Nats-Msg-Id`
/// de-duplicates), else as a core publish (flushed).
async fn publish(
    shared: &Shared,
    subject: String,
    msg_id: Option<String>,
    bytes: Vec<u8>,
) -> Result<(), String> {
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
        Ok(_) => Ok(()),
        Err(e) if e.kind() == jetstream::context::PublishErrorKind::StreamNotFound => {
            shared
                .client
                .publish_with_headers(subject, headers, bytes.into())
                .await
                .map_err(|e| e.to_string())?;
            shared.client.flush().await.map_err(|e| e.to_string())
        }
        Err(e) => Err(e.to_string()),
    }
}
