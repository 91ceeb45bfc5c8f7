//! Run executors (DESIGN §2 executor), dispatched here: `noop` completes at once; `nats` publishes to a
//! triggers.v2 service (crate::nats_executor); `http` makes a Standard Webhooks-signed
//! POST to the workflow's worker URL with the delivery id as the idempotency key.

use serde_json::json;
use tb_core::delivery::ActionResult;
use tb_core::run::RunStatus;
use tb_core::workflow::{Executor, Workflow};

use crate::clock;

pub(crate) use crate::start::failure;
pub use crate::start::{StartFailure, StartRequest};

/// Largest `Retry-After` honoured before clamping by the retry policy: 1 day, in seconds.
const MAX_RETRY_AFTER_S: u64 = 86_400;

/// Starts a run of `workflow`. `Ok` gives the run's status after the start (`completed` or `running`);
/// `Err` is a failed attempt with a content-free `error_class` (`http_<status>`, permanent for one of the
/// workflow's `non_retryable_statuses` ([`tb_core::delivery::http_answer_failure`]), `timeout`, `connect`,
/// `request`, `destination_forbidden` (the SSRF guard, [`crate::ssrf`])), the worker's `Retry-After` (seconds or HTTP date are both read; only seconds are
/// honoured) and a [`StartFailure::message`]. Of a failed answer's body at most the first 256 bytes are
/// read (bounded memory).
///
/// The `http` executor POSTs `{runId, workflowId, inputs, causationId, trigger: {subscriptionId,
/// eventType, receiptId}, resultToken}` (the run's [`tb_core::run::result_token`]) with
/// `webhook-id` = the delivery id (stable across attempts, also sent as `Idempotency-Key`),
/// `webhook-timestamp` = now (per attempt) and `webhook-signature` (Standard Webhooks §3.5 sender
/// rules). 200/201/204 complete the run; 202 leaves it running until
/// `POST /v1/runs/{runId}/result` (with `Authorization: Bearer <resultToken>`); anything else, a
/// redirect included, is a failure. The `nats` executor is [`crate::nats_executor::start`].
pub async fn start_run(
    engine: &crate::Engine,
    workflow: &Workflow,
    req: &StartRequest<'_>,
) -> Result<RunStatus, StartFailure> {
    match &workflow.executor {
        Executor::Noop => Ok(RunStatus::Completed),
        // Sessions start inside the store (crate::effects); reaching here is a routing bug.
        Executor::Session { .. } => Err(StartFailure {
            result: ActionResult::Failed {
                error_class: "session_not_local".into(),
                retry_after_ms: None,
                permanent: true,
            },
            message: "session workflows start inside the store, not through an executor".into(),
        }),
        Executor::Nats {
            service, action, ..
        } => crate::nats_executor::start(engine, workflow, service, action, req).await,
        Executor::Http {
            url,
            secret,
            timeout_ms,
            allow_private,
            non_retryable_statuses,
        } => {
            if let Some(f) = crate::ssrf::forbidden_literal(url, *allow_private) {
                return Err(forbidden(&workflow.id, &f));
            }
            let body = json!({
                "runId": req.run_id,
                "workflowId": workflow.id,
                "inputs": req.inputs,
                "causationId": req.causation_id,
                "trigger": {"subscriptionId": req.subscription_id, "eventType": req.event_type, "receiptId": req.receipt_id},
                // The worker's proof that it is this run's executor when it reports the result.
                "resultToken": tb_core::run::result_token(secret, req.run_id),
            })
            .to_string();
            let ts = clock::now_s();
            let sig =
                tb_ingress::standard_webhooks::sign(secret, req.delivery_id, ts, body.as_bytes());
            let client = if *allow_private {
                &engine.http_private
            } else {
                &engine.http
            };
            let resp = client
                .post(url)
                .timeout(std::time::Duration::from_millis(*timeout_ms))
                .header("content-type", "application/json")
                .header("webhook-id", req.delivery_id)
                .header("webhook-timestamp", ts.to_string())
                .header("webhook-signature", sig)
                .header("idempotency-key", req.delivery_id)
                .header("traceparent", req.trace.to_traceparent())
                .body(body)
                .send()
                .await;
            let resp = match resp {
                Ok(r) => r,
                Err(e) => {
                    if let Some(f) = crate::ssrf::forbidden_in(&e) {
                        return Err(forbidden(&workflow.id, f));
                    }
                    return Err(if e.is_timeout() {
                        failure(
                            "timeout",
                            format!("the worker did not answer within {timeout_ms} ms"),
                        )
                    } else if e.is_connect() {
                        failure("connect", "could not connect to the worker".into())
                    } else {
                        failure(
                            "request",
                            "the request to the worker failed before an answer".into(),
                        )
                    });
                }
            };
            let status = resp.status().as_u16();
            match status {
                200 | 201 | 204 => Ok(RunStatus::Completed),
                202 => Ok(RunStatus::Running),
                _ => {
                    let retry_after_ms = resp
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .map(|s| s.min(MAX_RETRY_AFTER_S) * 1000);
                    let head = body_head(resp).await;
                    let result = tb_core::delivery::http_answer_failure(
                        status,
                        retry_after_ms,
                        non_retryable_statuses,
                    );
                    let mut message = tb_core::delivery::http_failure_message(status, &head);
                    if matches!(
                        result,
                        ActionResult::Failed {
                            permanent: true,
                            ..
                        }
                    ) {
                        message.push_str(" (a non-retryable status of this workflow: not retried)");
                    }
                    Err(StartFailure { result, message })
                }
            }
        }
    }
}

/// The failed attempt of a call the SSRF guard refused: `destination_forbidden`, retried on the
/// subscription's schedule (a DNS answer can change; a fixed URL needs a configuration change).
fn forbidden(workflow: &str, f: &crate::ssrf::ForbiddenAddress) -> StartFailure {
    failure(
        "destination_forbidden",
        format!(
            "destination {} is a private, loopback, link-local or metadata address; set allow_private = true on workflow {workflow:?} if the worker is yours",
            f.ip
        ),
    )
}

/// The first [`tb_core::delivery::MESSAGE_BODY_BYTES`] bytes of a response body (fewer when it is
/// shorter or reading fails); the rest is never read.
async fn body_head(mut resp: reqwest::Response) -> Vec<u8> {
    let cap = tb_core::delivery::MESSAGE_BODY_BYTES;
    let mut head = Vec::with_capacity(cap);
    while head.len() < cap {
        match resp.chunk().await {
            Ok(Some(c)) => head.extend_from_slice(&c[..c.len().min(cap - head.len())]),
            _ => break,
        }
    }
    head
}
