//! CompletionEvents drive nats runs: every replica pulls from one durable consumer on
//! the stream `triggers-flow-events` (capturing `triggers.v2.flow.events.>`, work-queue retention),
//! so each event is applied once and an event a replica took but did not acknowledge before it died
//! is redelivered to another after [`ACK_WAIT`]. An event is acknowledged only after the run's end is
//! committed; a repeated one finds the run ended and is acknowledged without change.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, stream, AckKind};
use futures_util::StreamExt;
use tb_core::run::RunStatus;
use tb_core::workflow::Executor;
use tb_store::StoreError;
use tb_wire::{subjects, CompletionEvent};

use crate::Engine;

/// The stream that keeps CompletionEvents until a replica applied them.
pub const STREAM: &str = "triggers-flow-events";
/// The durable consumer every replica shares.
pub const CONSUMER: &str = "trigger-bridge-completions";
/// The stream that keeps every DLQ entry (`triggers.v2.dlq.>`, 14 days), so a repeated DLQ publish
/// of one entry is de-duplicated by its `Nats-Msg-Id`.
pub const DLQ_STREAM: &str = "triggers-dlq";
/// How long an unacknowledged event waits before another replica gets it.
pub const ACK_WAIT: Duration = Duration::from_secs(10);
/// Events applied at once per replica.
const CONCURRENCY: usize = 64;
/// An event whose run never appears is given up after this many deliveries (about an hour of
/// back-off), logged and terminated.
const MAX_NOT_YET: i64 = 150;

/// CompletionEvents this process offered again because their run was not recorded yet (the
/// service answered before the attempt that published its input committed); `bench services`
/// reports it.
pub static NOT_YET: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// What an event did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The run ended with this status.
    Ended(RunStatus),
    /// The run had already ended (a repeat): nothing changed.
    Duplicate,
    /// The run is not recorded yet (the attempt that published its input has not committed):
    /// redelivered later.
    NotYet,
    /// The event does not belong to that run (another workflow or service): dropped.
    Refused(String),
}

/// Applies one event: `ok` completes the run, `error` fails it (output `{"error", "service",
/// "node_id"}`), only when the run's workflow is the event's flow, runs on the event's service and
/// its action is the event's node. The protocol has no sender authentication: whoever may publish on
/// `triggers.v2.flow.events.>` can end a running run of a flow it knows; restrict that subject with
/// NATS permissions (docs/operations.md).
/// Errors: the store's, other than not-found and conflict.
pub async fn apply(engine: &Engine, ev: &CompletionEvent) -> Result<Applied, StoreError> {
    let run = match engine.store.get_run(&ev.flow_run_id).await {
        Ok(r) => r,
        Err(StoreError::NotFound { .. }) => return Ok(Applied::NotYet),
        Err(e) => return Err(e),
    };
    let ours = match engine
        .catalog()
        .workflow(&run.workflow_id)
        .map(|w| &w.executor)
    {
        Some(Executor::Nats {
            service, action, ..
        }) => *service == ev.service && *action == ev.node_id,
        _ => false,
    };
    if !ours || run.workflow_id != ev.flow_id {
        return Ok(Applied::Refused(format!(
            "run {} is workflow {:?}, not node {:?} of flow {:?} of service {:?}",
            run.id, run.workflow_id, ev.node_id, ev.flow_id, ev.service
        )));
    }
    if run.status.is_terminal() {
        return Ok(Applied::Duplicate);
    }
    let (status, output) = match ev.status.as_str() {
        "ok" => (RunStatus::Completed, None),
        _ => (
            RunStatus::Failed,
            Some(
                serde_json::json!({"error": ev.error, "service": ev.service, "node_id": ev.node_id}),
            ),
        ),
    };
    match crate::runs::finish(engine, &run.id, status, output).await {
        Ok(_) => {
            let _ = engine.run_ends.send(run.id.clone());
            Ok(Applied::Ended(status))
        }
        Err(StoreError::Conflict(_)) => Ok(Applied::Duplicate),
        Err(e) => Err(e),
    }
}

/// [`apply`], read again up to [`LOCAL_TRIES`] times [`LOCAL_WAIT`] apart while the run is not
/// recorded yet: the attempt that published the run's input usually commits within a few ms, and a
/// re-read is cheaper than a redelivery.
async fn apply_soon(engine: &Engine, ev: &CompletionEvent) -> Result<Applied, StoreError> {
    let mut tries = 0;
    loop {
        match apply(engine, ev).await {
            Ok(Applied::NotYet) if tries < LOCAL_TRIES => {
                tries += 1;
                tokio::time::sleep(LOCAL_WAIT).await;
            }
            other => return other,
        }
    }
}

/// Re-reads of a not-yet-recorded run before the event is offered again through JetStream.
const LOCAL_TRIES: u32 = 3;
/// The wait before each re-read.
const LOCAL_WAIT: Duration = Duration::from_millis(5);

/// Creates (or opens) the completion and DLQ streams.
pub async fn ensure_streams(js: &jetstream::Context) -> Result<stream::Stream, String> {
    js.get_or_create_stream(stream::Config {
        name: DLQ_STREAM.into(),
        subjects: vec!["triggers.v2.dlq.>".into()],
        max_age: Duration::from_secs(14 * 86_400),
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .map_err(|e| format!("stream {DLQ_STREAM}: {e}"))?;
    js.get_or_create_stream(stream::Config {
        name: STREAM.into(),
        subjects: vec![subjects::FLOW_EVENTS_ALL.into()],
        retention: stream::RetentionPolicy::WorkQueue,
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await
    .map_err(|e| format!("stream {STREAM}: {e}"))
}

/// The delay before a not-yet-applicable event is offered again: 10 ms doubling per delivery, at
/// most 30 s (the attempt that published the run's input usually commits within a few ms).
fn not_yet_delay(delivered: i64) -> Duration {
    let ms = 10u64.saturating_mul(1 << (delivered.clamp(1, 20) - 1) as u64);
    Duration::from_millis(ms.min(30_000))
}

async fn handle(engine: &Engine, msg: jetstream::Message) {
    let delivered = msg.info().map(|i| i.delivered).unwrap_or(1);
    let answer = match serde_json::from_slice::<CompletionEvent>(&msg.payload) {
        Err(e) => {
            tracing::warn!(subject = %msg.subject, error = %e, "a message that is not a CompletionEvent; dropped");
            AckKind::Term
        }
        Ok(ev) => match apply_soon(engine, &ev).await {
            Ok(Applied::Ended(s)) => {
                metrics::counter!("tb_completion_events_total", "outcome" => s.as_str())
                    .increment(1);
                tracing::debug!(run = %ev.flow_run_id, status = s.as_str(), "run ended by its CompletionEvent");
                AckKind::Ack
            }
            Ok(Applied::Duplicate) => {
                metrics::counter!("tb_completion_events_total", "outcome" => "duplicate")
                    .increment(1);
                AckKind::Ack
            }
            Ok(Applied::NotYet) if delivered >= MAX_NOT_YET => {
                tracing::warn!(run = %ev.flow_run_id, service = %ev.service, "CompletionEvent of a run that never appeared; dropped");
                AckKind::Term
            }
            Ok(Applied::NotYet) => {
                metrics::counter!("tb_completion_events_total", "outcome" => "not_yet")
                    .increment(1);
                NOT_YET.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                AckKind::Nak(Some(not_yet_delay(delivered)))
            }
            Ok(Applied::Refused(why)) => {
                metrics::counter!("tb_completion_events_total", "outcome" => "refused")
                    .increment(1);
                tracing::warn!(run = %ev.flow_run_id, service = %ev.service, why = %why, "CompletionEvent refused");
                AckKind::Term
            }
            Err(e) => {
                tracing::warn!(run = %ev.flow_run_id, error = %e, "CompletionEvent not applied; offered again");
                AckKind::Nak(Some(Duration::from_secs(1)))
            }
        },
    };
    if let Err(e) = msg.ack_with(answer).await {
        tracing::warn!(error = %e, "answer to JetStream not sent; redelivered after ack_wait");
    }
}

/// Pulls CompletionEvents until `stop` (re-opening the consumer with back-off when it fails).
pub async fn run(
    engine: Arc<Engine>,
    client: async_nats::Client,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let js = jetstream::new(client);
    let mut backoff = Duration::from_millis(200);
    loop {
        let opened = async {
            let st = ensure_streams(&js).await?;
            let consumer = st
                .get_or_create_consumer(
                    CONSUMER,
                    pull::Config {
                        durable_name: Some(CONSUMER.into()),
                        ack_policy: jetstream::consumer::AckPolicy::Explicit,
                        ack_wait: ACK_WAIT,
                        // Finite: a message the client cannot read (a header value that is not
                        // UTF-8 drops the connection) stops being redelivered.
                        max_deliver: MAX_NOT_YET + 10,
                        max_ack_pending: 10_000,
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| format!("consumer {CONSUMER}: {e}"))?;
            consumer
                .stream()
                .max_messages_per_batch(CONCURRENCY)
                .messages()
                .await
                .map_err(|e| format!("consumer {CONSUMER}: {e}"))
        };
        let mut messages = match opened.await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "CompletionEvents not consumed yet; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        backoff = Duration::from_millis(200);
        let mut inflight = futures_util::stream::FuturesUnordered::new();
        loop {
            tokio::select! {
                Some(()) = inflight.next(), if !inflight.is_empty() => {}
                m = messages.next(), if inflight.len() < CONCURRENCY => match m {
                    Some(Ok(m)) => inflight.push(handle(&engine, m)),
                    Some(Err(e)) => {
                        // The stream or consumer may be gone (deleted, server restarted): open
                        // them again (re-creating what is missing) rather than pull in vain.
                        tracing::warn!(error = %e, "CompletionEvent pull failed; opening the consumer again");
                        while inflight.next().await.is_some() {}
                        break;
                    }
                    None => break,
                },
                _ = stop.changed() => {
                    // Finish what was taken (each is one store write), then stop.
                    while inflight.next().await.is_some() {}
                    return;
                }
            }
        }
    }
}
