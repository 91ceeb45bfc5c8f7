//! The `nats` executor: a delivery publishes its run's inputs to the service's inbound
//! subject through JetStream, with the `X-Triggers-*` envelope headers (flow run id = run id, flow
//! id = workflow id, idempotency key and `Nats-Msg-Id` = the delivery id, so a retried publish after
//! a crash is de-duplicated by JetStream within its 2 min window; a W3C traceparent). The PubAck
//! marks the delivery delivered and the run `running`; the service's CompletionEvent ends the run
//! ([`crate::completions`]). A service that is unregistered or `down` fails the attempt.

use std::time::Duration;

use async_nats::jetstream::context::PublishErrorKind;
use tb_core::run::RunStatus;
use tb_core::service::Liveness;
use tb_core::workflow::Workflow;
use tb_wire::headers::to_headers;
use tb_wire::manifest::Manifest;
use tb_wire::time::WireTime;
use tb_wire::{json, Envelope};

use crate::start::{failure, StartFailure, StartRequest};
use crate::{clock, Engine};

/// How long a PubAck is awaited before the attempt fails (`timeout`).
pub const PUBACK_TIMEOUT: Duration = Duration::from_secs(5);

/// The envelope of an attempt: ids from the run and delivery, the flow's version for the service's
/// `manifest` ([`crate::flows::version`], the one its flow was handed with), and the attempt's trace
/// context ([`crate::trace::attempt_span`]) as trace id, span id and `traceparent`.
pub fn envelope(
    workflow: &Workflow,
    action: &str,
    req: &StartRequest<'_>,
    manifest: &Manifest,
) -> Envelope {
    Envelope {
        traceparent: req.trace.to_traceparent(),
        trace_id: req.trace.trace_id_hex(),
        span_id: req.trace.span_id_hex(),
        flow_run_id: req.run_id.into(),
        flow_id: workflow.id.clone(),
        flow_version: crate::flows::version(workflow, manifest).unwrap_or_default(),
        idempotency_key: req.delivery_id.into(),
        source_node_id: action.into(),
        retry_count: i64::from(req.attempt.saturating_sub(1)),
        emitted_at: WireTime::now(),
    }
}

/// One attempt of a nats workflow run: `Ok(Running)` once JetStream acknowledged the message
/// (a duplicate acknowledgement included). Errors (all retried per the subscription's policy):
/// `nats_unavailable` (no `--nats-url`), `service_unregistered`, `service_down` (no replica's heartbeat for
/// 15 s), `unknown_action`, `no_nats_source`, `no_stream` (nothing captures the subject),
/// `timeout` (no PubAck within [`PUBACK_TIMEOUT`]), `publish`, `store`.
pub async fn start(
    engine: &Engine,
    workflow: &Workflow,
    service: &str,
    action: &str,
    req: &StartRequest<'_>,
) -> Result<RunStatus, StartFailure> {
    let Some(client) = engine.nats() else {
        return Err(failure(
            "nats_unavailable",
            "no NATS server is configured (serve --nats-url)".into(),
        ));
    };
    let svc = match engine.store.get_service(service).await {
        Ok(Some(s)) => s,
        Ok(None) => {
            return Err(failure(
                "service_unregistered",
                format!("service {service:?} has not registered"),
            ))
        }
        Err(e) => {
            return Err(failure(
                "store",
                format!("reading service {service:?}: {e}"),
            ))
        }
    };
    let now = clock::now_ms();
    if crate::orchestrator::summary_of(&svc, now).liveness == Liveness::Down {
        let ago = svc.last_heartbeat_at.map_or(0, |t| (now - t) / 1000);
        return Err(failure(
            "service_down",
            format!("service {service:?} is down: its last heartbeat was {ago} s ago"),
        ));
    }
    let manifest: Manifest = serde_json::from_value(svc.manifest).unwrap_or_default();
    if !manifest.actions.iter().flatten().any(|a| a.name == action) {
        return Err(failure(
            "unknown_action",
            format!("service {service:?} does not offer action {action:?}"),
        ));
    }
    let Some(subject) = crate::flows::inbound_subject(&manifest).map(str::to_string) else {
        return Err(failure(
            "no_nats_source",
            format!("service {service:?} has no nats source"),
        ));
    };
    let env = envelope(workflow, action, req, &manifest);
    let mut headers = async_nats::HeaderMap::new();
    for (k, v) in to_headers(&env) {
        if let Ok(v) = v.parse::<async_nats::HeaderValue>() {
            headers.insert(k, v);
        }
    }
    let payload = json::to_vec(req.inputs, false).unwrap_or_else(|_| b"null".to_vec());
    let js = async_nats::jetstream::new(client);
    let published = tokio::time::timeout(PUBACK_TIMEOUT, async {
        js.publish_with_headers(subject.clone(), headers, payload.into())
            .await?
            .await
    })
    .await;
    match published {
        Ok(Ok(ack)) => {
            if ack.duplicate {
                tracing::debug!(delivery = %req.delivery_id, "publish was a duplicate (already in the stream)");
            }
            Ok(RunStatus::Running)
        }
        Ok(Err(e)) if e.kind() == PublishErrorKind::StreamNotFound => Err(failure(
            "no_stream",
            format!(
                "no JetStream stream captures {subject} (the service creates it when it starts)"
            ),
        )),
        Ok(Err(e)) if e.kind() == PublishErrorKind::TimedOut => {
            Err(failure("timeout", format!("no PubAck for {subject}")))
        }
        Ok(Err(e)) => Err(failure("publish", format!("publishing to {subject}: {e}"))),
        Err(_) => Err(failure(
            "timeout",
            format!(
                "no PubAck for {subject} within {} ms",
                PUBACK_TIMEOUT.as_millis()
            ),
        )),
    }
}

/// Publishes the DLQ entry of a nats delivery that was dead-lettered before its service took it,
/// on `triggers.v2.dlq.source.<subscription id>` (the orchestrator's own DLQ subject; the SDK never
/// publishes there): kind `delivery`, the attempt's envelope, the run inputs as body, `why` as
/// `err_msg`, `occurred_at` = the attempt's start (`started_ms`), so its `Nats-Msg-Id` is the same
/// for a repeat. Its flow version is the one of the service's registered manifest (read in the
/// background; an unregistered service's reads as the flow with no target). Best effort and in the
/// background (the worker does not wait for NATS): the dead letter itself is in the store; a failed
/// publish is logged.
pub fn source_dead_letter(
    engine: &Engine,
    workflow: &Workflow,
    action: &str,
    req: &StartRequest<'_>,
    started_ms: i64,
    why: &str,
) {
    let Some(client) = engine.nats() else { return };
    let mut entry = tb_wire::DlqEntry {
        kind: "delivery".into(),
        envelope: envelope(workflow, action, req, &Manifest::default()),
        body: tb_wire::json::Raw::parse(&req.inputs.to_string()).unwrap_or_default(),
        err_msg: why.into(),
        occurred_at: WireTime::from_unix_nanos(started_ms.saturating_mul(1_000_000)),
    };
    let subject = tb_wire::subjects::dlq_source(req.subscription_id);
    let delivery = req.delivery_id.to_string();
    let (store, workflow) = (engine.store.clone(), workflow.clone());
    tokio::spawn(async move {
        let service = match &workflow.executor {
            tb_core::workflow::Executor::Nats { service, .. } => service.as_str(),
            _ => "",
        };
        if let Ok(Some(svc)) = store.get_service(service).await {
            let manifest: Manifest = serde_json::from_value(svc.manifest).unwrap_or_default();
            if let Some(v) = crate::flows::version(&workflow, &manifest) {
                entry.envelope.flow_version = v;
            }
        }
        let mut headers = async_nats::HeaderMap::new();
        if let Ok(v) = entry.msg_id().parse::<async_nats::HeaderValue>() {
            headers.insert(tb_wire::headers::NATS_MSG_ID, v);
        }
        let bytes = json::to_vec(&entry, false).unwrap_or_default();
        let js = async_nats::jetstream::new(client.clone());
        let sent = tokio::time::timeout(PUBACK_TIMEOUT, async {
            js.publish_with_headers(subject.clone(), headers.clone(), bytes.clone().into())
                .await?
                .await
        })
        .await;
        match sent {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if e.kind() == PublishErrorKind::StreamNotFound => {
                let _ = client
                    .publish_with_headers(subject, headers, bytes.into())
                    .await;
            }
            _ => {
                tracing::warn!(delivery = %delivery, subject = %subject, "source DLQ entry not published")
            }
        }
    });
}
