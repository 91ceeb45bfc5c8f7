//! Local delivery effects: a delivery whose action happens inside the store rather than at a
//! remote executor: starting a session (with coalescing), raising a signal, enqueueing a prompt. The
//! worker performs them inside the attempt's own transaction (`AttemptCommit::effect`).

use serde_json::Value;
use tb_core::binding::{ActionParams, OnExisting};
use tb_core::delivery::ActionResult;
use tb_core::signal::{DataPlacement, SignalSource, SourceKind};
use tb_core::workflow::{Executor, Workflow};
use tb_core::ErrorCode;
use tb_store::{Coalesce, DeliveryRecord, Effect, NewPrompt, NewRun, NewSignal, Target};

fn invalid(what: &str) -> ActionResult {
    ActionResult::Failed {
        error_class: format!("invalid_{what}"),
        retry_after_ms: None,
        permanent: true,
    }
}

/// The signal a webhook delivery raises: `signalId` = the delivery id (stable across retries and
/// redeliveries, so the mailbox suppresses repeats), source `webhook` with the receipt, and as data the
/// binding's allowlisted inputs (or, for a capability endpoint, its validated JSON body).
fn webhook_signal(d: &DeliveryRecord, name: String, wake: bool) -> NewSignal {
    let data = match &d.inputs {
        Value::Object(m) if m.is_empty() => DataPlacement::None,
        Value::Null => DataPlacement::None,
        v => tb_core::signal::place_data(Some(v.clone())).unwrap_or(DataPlacement::None),
    };
    NewSignal {
        signal_id: d.id.clone(),
        name,
        source: SignalSource {
            kind: SourceKind::Webhook,
            receipt_id: Some(d.receipt_id.clone()),
            actor_id: None,
        },
        data,
        wake,
        delivery_id: Some(d.id.clone()),
    }
}

fn webhook_prompt(d: &DeliveryRecord, p: &ActionParams) -> Option<NewPrompt> {
    Some(NewPrompt {
        text: p.prompt.clone()?,
        variables: p.variables.clone().unwrap_or(Value::Null),
        from: format!("binding {}", d.binding_id),
        delivery_id: Some(d.id.clone()),
    })
}

fn target(d: &DeliveryRecord, p: &ActionParams) -> Option<Target> {
    if let Some(r) = &p.run {
        return Some(Target::Run(r.clone()));
    }
    Some(Target::Session {
        workflow_id: d.workflow_id.clone()?,
        key: p.coalesce_key.clone()?,
    })
}

/// Plans the local effect of a delivery, if its action has one: `None` for remote actions (a `start_run`
/// of a `noop` / `http` workflow, an outbound webhook). `Some(Err)` when the stored parameters cannot
/// be performed (a permanent failure).
pub fn plan(
    d: &DeliveryRecord,
    run_id: &str,
    workflow: Option<&Workflow>,
) -> Option<Result<Effect, ActionResult>> {
    let params: ActionParams = d
        .params
        .clone()
        .and_then(|p| serde_json::from_value(p).ok())
        .unwrap_or_default();
    match d.action.as_str() {
        "start_run" => {
            let w = workflow?;
            let Executor::Session { config, mailbox } = &w.executor else {
                return None;
            };
            let coalesce = params.coalesce_key.clone().map(|key| {
                Box::new(Coalesce {
                    workflow_id: w.id.clone(),
                    key,
                    on_existing: params.on_existing.unwrap_or(OnExisting::Noop),
                    signal: params
                        .signal
                        .clone()
                        .map(|n| webhook_signal(d, n, params.wake)),
                    prompt: webhook_prompt(d, &params),
                })
            });
            Some(Ok(Effect::StartSession {
                run: NewRun {
                    id: run_id.to_string(),
                    workflow_id: w.id.clone(),
                    inputs: d.inputs.clone(),
                    status: tb_core::run::RunStatus::Running,
                    dead_letter: None,
                    session: Some((config.clone(), *mailbox)),
                },
                coalesce,
            }))
        }
        "raise_signal" => Some((|| {
            let name = params.signal.clone().ok_or_else(|| invalid("signal"))?;
            Ok(Effect::RaiseSignal {
                target: target(d, &params).ok_or_else(|| invalid("target"))?,
                signal: webhook_signal(d, name, params.wake),
            })
        })()),
        "enqueue_prompt" => Some((|| {
            Ok(Effect::EnqueuePrompt {
                target: target(d, &params).ok_or_else(|| invalid("target"))?,
                prompt: webhook_prompt(d, &params).ok_or_else(|| invalid("prompt"))?,
            })
        })()),
        _ => None,
    }
}

/// The failed attempt for an effect the store refused: `target_terminal` and `target_missing` are
/// permanent (dead-lettered at once, the receipt ends `target_terminal` / `routing_failed`);
/// `signal_buffer_full` is retried with backoff while the mailbox drains, and `target_starting` while
/// the session the key belongs to is still being started by an earlier delivery.
pub fn refusal(code: ErrorCode) -> ActionResult {
    let (class, permanent) = match code {
        ErrorCode::TargetTerminal => ("target_terminal", true),
        ErrorCode::NotFound => ("target_missing", true),
        ErrorCode::SignalBufferFull => ("signal_buffer_full", false),
        ErrorCode::Unavailable => ("target_starting", false),
        ErrorCode::ValidationError => ("invalid_action", true),
        _ => ("effect_refused", false),
    };
    ActionResult::Failed {
        error_class: class.into(),
        retry_after_ms: None,
        permanent,
    }
}
