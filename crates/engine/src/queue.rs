//! The NATS JetStream queue source: an edge module, not a pipeline. Each `queue`
//! subscription consumes its stream through one durable pull consumer with explicit ack, shared by every
//! replica (JetStream spreads the messages), and hands each message to [`accept`] as an [`Inbound`].
//!
//! **A message is acked only after its receipt is committed.** JetStream's ack is not our durability:
//! a message whose commit failed is not acked (`Nak` with a delay: redelivered), and one whose ack was
//! lost (or whose process died between commit and ack) is redelivered and answered `duplicate` by the
//! receipt's unique dedup key (`Nats-Msg-Id`, else stream + sequence: `tb_core::queue::dedup_id`). So
//! a message starts at most one run per binding however often it arrives.
//!
//! A message that cannot become an event (not JSON, too large) is recorded as a content-free
//! `rejected` receipt and then terminated (`AckKind::Term`): visible, never redelivered for ever.
//! Long handling sends in-progress acks every third of `ack_wait`.
//!
//! **Recovery.** A lost server, a deleted stream or consumer, or missed idle heartbeats end the pull;
//! the consumer backs off (100 ms doubling to 30 s), re-creates what its config allows (the consumer
//! always, the stream with `create_stream`), and resumes. Meanwhile the subscription is `failed`
//! (`state.changed`, reason `source-removed`) and `GET /ready` lists it under `warnings.queues`; it goes
//! back to `active` when the consumer is open again. One log line per change of health, never one per
//! retry.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, AckKind};
use bytes::Bytes;
use futures_util::StreamExt;
use tb_core::connector::ConnectorSpec;
use tb_core::dedup::dedup_key;
use tb_core::normalized::NormalizedEvent;
use tb_core::queue::{
    clean_header, decode, dedup_id, QueueSpec, MAX_COMMIT_TRIES, MESSAGE_ACTION, MESSAGE_EVENT,
};
use tb_core::receipt::{ReceiptSource, ReceiptState};
use tb_core::subscription::{SubscriptionInput, SubscriptionState};
use tb_core::ErrorCode;

use crate::accept::{accept, Dedup, Inbound, Routing};
use crate::catalog::SubscriptionConfig;
use crate::{clock, Engine};

/// Why each queue subscription is not consuming right now (subscription id -> reason), for `GET
/// /ready` (`warnings.queues`).
pub type Degraded = Arc<Mutex<BTreeMap<String, String>>>;

/// Longest back-off between attempts to reopen a consumer.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Idle heartbeat asked of the server on every pull; two missed ones end the pull.
pub const HEARTBEAT: Duration = Duration::from_secs(5);
/// How often the supervisor looks for queue subscriptions added to or removed from the catalog.
const SUPERVISE_EVERY: Duration = Duration::from_secs(1);

fn set_degraded(engine: &Engine, id: &str, why: Option<String>) {
    let mut m = engine
        .queues_degraded
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    match why {
        Some(w) => {
            m.insert(id.to_string(), w);
        }
        None => {
            m.remove(id);
        }
    }
    metrics::gauge!("tb_queues_degraded").set(m.len() as f64);
}

/// The queue subscriptions of the catalog with their specs.
fn queue_subscriptions(engine: &Engine) -> Vec<(Arc<SubscriptionConfig>, QueueSpec)> {
    engine
        .catalog()
        .subscriptions()
        .filter_map(|s| match &s.connector {
            ConnectorSpec::Nats(q) => Some((s.clone(), q.clone())),
            _ => None,
        })
        .collect()
}

/// The queue task: one consumer per queue subscription in the catalog (started and stopped as the
/// catalog changes), until `stop` turns true. Without a client (`serve` without `--nats-url`) every
/// queue subscription is listed as degraded with the fix, logged once, and the rest of the server
/// runs as usual.
pub async fn run(
    engine: Arc<Engine>,
    client: Option<async_nats::Client>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let js = client.map(jetstream::new);
    let mut running: HashMap<String, (QueueSpec, tokio::task::JoinHandle<()>)> = HashMap::new();
    loop {
        let subs = queue_subscriptions(&engine);
        let live: std::collections::HashSet<String> =
            subs.iter().map(|(s, _)| s.id.clone()).collect();
        running.retain(|id, (_, task)| {
            let keep = live.contains(id) && !task.is_finished();
            if !keep {
                task.abort();
                set_degraded(&engine, id, None);
            }
            keep
        });
        for (sub, spec) in subs {
            let Some(js) = &js else {
                let mut m = engine
                    .queues_degraded
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
                if !m.contains_key(&sub.id) {
                    tracing::error!(subscription = %sub.id, "queue subscription not consumed: no NATS connection (start serve with --nats-url nats://HOST:4222, or TRIGGER_BRIDGE_NATS_URL)");
                    m.insert(
                        sub.id.clone(),
                        "no NATS connection: serve was started without --nats-url".into(),
                    );
                }
                continue;
            };
            if running.get(&sub.id).is_some_and(|(s, _)| *s == spec) {
                continue;
            }
            if let Some((_, old)) = running.remove(&sub.id) {
                old.abort();
            }
            let task = tokio::spawn(consume(
                engine.clone(),
                js.clone(),
                sub.clone(),
                spec.clone(),
                stop.clone(),
            ));
            running.insert(sub.id.clone(), (spec, task));
        }
        tokio::select! {
            _ = tokio::time::sleep(SUPERVISE_EVERY) => {}
            r = stop.changed() => if r.is_err() || *stop.borrow() { break; },
        }
    }
    for (_, (_, task)) in running {
        let _ = task.await;
    }
}

/// An open consumer: the consumer and its stream's creation time (Unix ms, part of the fallback
/// dedup id).
struct Opened {
    consumer: jetstream::consumer::Consumer<pull::Config>,
    stream_created_ms: i64,
}

/// Opens (creating where allowed) the stream and the durable consumer of `spec`. A stream this
/// creates has work-queue retention (a message is removed once acked), so a consumer re-created
/// later does not replay what was consumed. A consumer this creates after `resume_from` is set
/// starts there (a deleted consumer on a stream that keeps acked messages does not replay them).
async fn open(
    js: &jetstream::Context,
    id: &str,
    spec: &QueueSpec,
    resume_from: Option<(i64, u64)>,
) -> Result<Opened, String> {
    let mut stream = if spec.create_stream {
        js.get_or_create_stream(jetstream::stream::Config {
            name: spec.stream.clone(),
            subjects: spec.subjects.clone(),
            retention: jetstream::stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("stream {}: {e}", spec.stream))?
    } else {
        js.get_stream(&spec.stream).await.map_err(|e| {
            format!(
                "stream {}: {e} (create it, or set create_stream = true)",
                spec.stream
            )
        })?
    };
    let (stream_created_ms, keeps_acked) = stream
        .info()
        .await
        .map(|i| {
            (
                (i.created.unix_timestamp_nanos() / 1_000_000) as i64,
                i.config.retention != jetstream::stream::RetentionPolicy::WorkQueue,
            )
        })
        .unwrap_or((0, true));
    let name = spec.consumer_name(id);
    let mut config = pull::Config {
        durable_name: Some(name.clone()),
        ack_policy: jetstream::consumer::AckPolicy::Explicit,
        ack_wait: Duration::from_millis(spec.ack_wait_ms),
        max_ack_pending: spec.max_ack_pending,
        filter_subjects: spec.subjects.clone(),
        ..Default::default()
    };
    // `resume_from` holds for the stream it was counted on only (a re-created stream starts at 1).
    if let Some((created, start_sequence)) = resume_from {
        if keeps_acked && created == stream_created_ms {
            config.deliver_policy =
                jetstream::consumer::DeliverPolicy::ByStartSequence { start_sequence };
        }
    }
    let mut consumer = stream
        .get_or_create_consumer(&name, config)
        .await
        .map_err(|e| format!("consumer {name}: {e}"))?;
    // An existing durable consumer keeps its own settings: say so when they differ from ours.
    if let Ok(info) = consumer.info().await {
        let c = &info.config;
        if c.ack_wait != Duration::from_millis(spec.ack_wait_ms)
            || c.max_ack_pending != spec.max_ack_pending
        {
            tracing::warn!(subscription = %id, consumer = %name, "the existing durable consumer has another ack_wait or max_ack_pending than the config; it keeps its own (delete it to apply the config)");
        }
    }
    Ok(Opened {
        consumer,
        stream_created_ms,
    })
}

/// One subscription's consumer loop.
async fn consume(
    engine: Arc<Engine>,
    js: jetstream::Context,
    sub: Arc<SubscriptionConfig>,
    spec: QueueSpec,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let id = sub.id.clone();
    let mut backoff = Duration::from_millis(100);
    // Whether this loop turned the subscription `failed` (so only it turns it back).
    let mut lost = false;
    let mut trouble: Option<String> = None;
    // Stream sequences handled by this loop: a consumer it has to re-create starts after what was
    // committed (and at the first message whose commit failed).
    let (mut max_committed, mut min_failed, mut resume_from) =
        (0u64, None::<u64>, None::<(i64, u64)>);
    let mut counted_on: i64 = 0;
    loop {
        if *stop.borrow() {
            return;
        }
        if engine.subscription_state(&id) == Some(SubscriptionState::Paused) {
            // Paused: pull nothing; the messages wait in the stream.
            tokio::select! {
                _ = tokio::time::sleep(SUPERVISE_EVERY) => continue,
                _ = stop.changed() => return,
            }
        }
        let pulled = match open(&js, &id, &spec, resume_from).await {
            Ok(o) => o
                .consumer
                .stream()
                .max_messages_per_batch(spec.batch)
                .heartbeat(HEARTBEAT)
                .expires(HEARTBEAT * 6)
                .messages()
                .await
                .map(|m| (m, o.stream_created_ms))
                .map_err(|e| format!("pull: {e}")),
            Err(e) => Err(e),
        };
        let (mut messages, created_ms) = match pulled {
            Ok(m) => m,
            Err(why) => {
                degrade(&engine, &id, &why, &mut lost, &mut trouble).await;
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => return,
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        if created_ms != counted_on {
            // Another stream (created anew): its sequences start over.
            (max_committed, min_failed, resume_from, counted_on) = (0, None, None, created_ms);
        }
        // Healthy once a message arrived or the pull ran a heartbeat interval without error; only
        // then is the back-off reset and the subscription restored (an open that fails at once must
        // not flap the state).
        let mut healthy = false;
        let settle = tokio::time::sleep(HEARTBEAT);
        tokio::pin!(settle);
        // Messages of a pull are handled concurrently (at most `batch` at once), so their commits
        // share the store's group commit or batches; each is acked after its own commit.
        let cap = spec.batch.max(1);
        let mut inflight = futures_util::stream::FuturesUnordered::new();
        let mut failed = false;
        loop {
            tokio::select! {
                Some(done) = inflight.next(), if !inflight.is_empty() => {
                    let Handled { seq, committed } = done;
                    if committed {
                        max_committed = max_committed.max(seq);
                    } else {
                        min_failed = Some(min_failed.map_or(seq, |m: u64| m.min(seq)));
                    }
                }
                _ = &mut settle, if !healthy => {
                    healthy = true;
                    recovered(&engine, &id, &spec, &mut lost, &mut trouble, &mut backoff).await;
                }
                next = messages.next(), if inflight.len() < cap => match next {
                    Some(Ok(msg)) => {
                        if !healthy {
                            healthy = true;
                            recovered(&engine, &id, &spec, &mut lost, &mut trouble, &mut backoff).await;
                        }
                        inflight.push(handle(&engine, &sub, &spec, created_ms, msg));
                    }
                    Some(Err(e)) => {
                        degrade(&engine, &id, &format!("consuming: {e}"), &mut lost, &mut trouble).await;
                        failed = true;
                        break;
                    }
                    None => break,
                },
                _ = stop.changed() => return,
            }
            if inflight.is_empty()
                && engine.subscription_state(&id) == Some(SubscriptionState::Paused)
            {
                break;
            }
        }
        while let Some(Handled { seq, committed }) = inflight.next().await {
            if committed {
                max_committed = max_committed.max(seq);
            } else {
                min_failed = Some(min_failed.map_or(seq, |m: u64| m.min(seq)));
            }
        }
        if max_committed > 0 {
            let from = min_failed
                .unwrap_or(max_committed + 1)
                .min(max_committed + 1);
            resume_from = Some((counted_on, from));
        }
        if failed {
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.changed() => return,
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

/// The consumer is open and healthy again: one log line, the back-off reset, `GET /ready` cleared,
/// and the subscription back to `active` if this loop had turned it `failed`.
async fn recovered(
    engine: &Engine,
    id: &str,
    spec: &QueueSpec,
    lost: &mut bool,
    trouble: &mut Option<String>,
    backoff: &mut Duration,
) {
    *backoff = Duration::from_millis(100);
    if trouble.take().is_some() {
        tracing::info!(subscription = %id, stream = %spec.stream, "queue consumer open again");
    }
    set_degraded(engine, id, None);
    if *lost {
        *lost = false;
        let _ = engine.operate(id, SubscriptionInput::SourceRestored).await;
    }
}

/// Records trouble: logged once per change of reason, listed for `GET /ready`, and the subscription
/// turned `failed` once.
async fn degrade(
    engine: &Engine,
    id: &str,
    why: &str,
    lost: &mut bool,
    trouble: &mut Option<String>,
) {
    if trouble.as_deref() != Some(why) {
        tracing::warn!(subscription = %id, reason = %why, "queue consumer not consuming; retrying with back-off");
        *trouble = Some(why.to_string());
    }
    set_degraded(engine, id, Some(why.to_string()));
    if !*lost {
        if let Ok(Some(_)) = engine.operate(id, SubscriptionInput::SourceLost).await {
            *lost = true;
        }
    }
}

/// The value of header `name`, read case-insensitively.
fn header<'a>(msg: &'a async_nats::Message, name: &str) -> Option<&'a str> {
    let headers = msg.headers.as_ref()?;
    headers
        .iter()
        .find(|(k, _)| AsRef::<str>::as_ref(*k).eq_ignore_ascii_case(name))
        .and_then(|(_, v)| v.first())
        .map(|v| v.as_str())
}

/// What became of one message: its stream sequence and whether its receipt is committed.
struct Handled {
    seq: u64,
    committed: bool,
}

/// Handles one message: commit its receipt (or its rejection), then ack (or terminate, or ask for a
/// later redelivery when the commit failed). A commit that failed [`MAX_COMMIT_TRIES`] deliveries in
/// a row for a reason other than an unavailable store is given up: kept as a `rejected` receipt,
/// terminated.
async fn handle(
    engine: &Engine,
    sub: &SubscriptionConfig,
    spec: &QueueSpec,
    stream_created_ms: i64,
    msg: jetstream::Message,
) -> Handled {
    let (stream, seq, delivered) = match msg.info() {
        Ok(i) => (i.stream.to_string(), i.stream_sequence, i.delivered),
        Err(_) => (spec.stream.clone(), 0, 1),
    };
    let provider_id = dedup_id(header(&msg, "Nats-Msg-Id"), &stream, stream_created_ms, seq);
    let subject = clean_header(msg.subject.as_str(), 256);
    let now = clock::now_ms();
    let mut event = NormalizedEvent {
        event: MESSAGE_EVENT.into(),
        action: Some(MESSAGE_ACTION.into()),
        fields: Default::default(),
    };
    event.fields.insert("queue.subject".into(), subject.into());
    event
        .fields
        .insert("queue.stream".into(), stream.clone().into());
    event.fields.insert("queue.sequence".into(), seq.into());
    let decoded = decode(&msg.payload, sub.max_body_bytes);
    if let Ok(Some(t)) = &decoded {
        event
            .fields
            .insert("type".into(), clean_header(t, 128).into());
    }
    let content_type: Option<String> = header(&msg, "Content-Type").map(|c| clean_header(c, 100));
    let dedup = Dedup {
        key: dedup_key(&sub.id, &provider_id),
        window_ms: sub.dedup_window_s.min(i64::MAX as u64 / 1000) as i64 * 1000,
        same_body: false,
    };
    let base = |routing, body: Bytes| Inbound {
        source: ReceiptSource::Queue,
        subscription: sub.id.clone(),
        counter: Some("nats"),
        provider_event_id: Some(provider_id.clone()),
        event_type: event.event_type(),
        normalized: serde_json::to_value(&event).unwrap_or_default(),
        body,
        content_type: content_type.clone(),
        received_at: now,
        dedup: Some(dedup.clone()),
        rate_limit_per_min: None,
        routing,
        capability: None,
        target_run: None,
        trace_parent: header(&msg, "traceparent").and_then(tb_core::trace::TraceContext::parse),
    };
    // Records the message as a content-free `rejected` receipt (its dedup key makes a redelivered
    // copy one receipt), then terminates it; not recorded: redelivered later, so nothing is dropped
    // unseen.
    let msg = &msg;
    let stream = &stream;
    let reject = |why: String| {
        let inbound = base(
            Routing::Refused {
                state: ReceiptState::Rejected,
                dead_letter: None,
            },
            Bytes::new(),
        );
        async move {
            match accept(engine, inbound).await {
                Ok(_) => {
                    // Counted once recorded: a redelivery of an unrecorded one is not counted twice.
                    metrics::counter!("tb_receipts_total", "connector" => "nats", "outcome" => "rejected")
                        .increment(1);
                    tracing::info!(subscription = %sub.id, stream = %stream, sequence = seq, reason = %why, "queue message rejected and terminated");
                    let _ = msg.ack_with(AckKind::Term).await;
                    true
                }
                Err(_) => {
                    let _ = msg
                        .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                        .await;
                    false
                }
            }
        }
    };
    if let Err(why) = decoded {
        let committed = reject(format!("{why:?}")).await;
        return Handled { seq, committed };
    }
    let inbound = base(Routing::Route(event.clone()), msg.payload.clone());
    // In-progress acks while the commit runs, so JetStream does not redeliver meanwhile.
    let every = Duration::from_millis(spec.ack_wait_ms / 3);
    let commit = accept(engine, inbound);
    tokio::pin!(commit);
    let result = loop {
        tokio::select! {
            r = &mut commit => break r,
            _ = tokio::time::sleep(every) => {
                let _ = msg.ack_with(AckKind::Progress).await;
            }
        }
    };
    match result {
        Ok(_) => {
            // A lost ack is redelivered and answered duplicate: the receipt is the record.
            let _ = msg.ack().await;
            Handled {
                seq,
                committed: true,
            }
        }
        Err(e) if e.code == ErrorCode::SubscriptionNotActive => {
            let _ = msg
                .ack_with(AckKind::Nak(Some(Duration::from_secs(5))))
                .await;
            Handled {
                seq,
                committed: false,
            }
        }
        Err(e) if delivered >= MAX_COMMIT_TRIES && e.code != ErrorCode::Unavailable => {
            let committed = reject(format!(
                "not committed after {delivered} deliveries: {}",
                e.message
            ))
            .await;
            Handled { seq, committed }
        }
        Err(e) => {
            tracing::warn!(subscription = %sub.id, error = %e, "queue message not committed; redelivered later");
            let _ = msg
                .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                .await;
            Handled {
                seq,
                committed: false,
            }
        }
    }
}
