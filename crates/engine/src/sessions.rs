//! Signals, waits and turns as the API and CLI use them (signals-and-connectors §5): request
//! validation, server-stamped signal sources, and long-polls that wake on committed changes
//! ([`Engine::sessions`]) instead of polling the store.

use std::time::Duration;

use serde_json::Value;
use tb_core::ids::{new_id, IdKind};
use tb_core::signal::{self, SignalSource, SourceKind};
use tb_core::wait::{WaitSpec, WaitState};
use tb_core::{ErrorCode, TbError};
use tb_store::{NewPrompt, NewSignal, RaiseOutcome, TurnRecord, WaitRecord};

use crate::{clock, store_err, Engine};

/// Maps a store error on a run operation; a run that was announced (its `runId` is in a 202) but not
/// started yet is `conflict` with `Retry-After: 1` instead of `not_found`, so the caller retries and
/// nothing is lost because the target was not running yet (signals-and-connectors §5.2).
async fn run_err(engine: &Engine, run_id: &str, e: tb_store::StoreError) -> TbError {
    if matches!(
        e,
        tb_store::StoreError::NotFound {
            kind: tb_store::RecordKind::Run
        }
    ) {
        let d = tb_core::ids::delivery_id_for_run(run_id).unwrap_or_default();
        if let Ok(d) = engine.store.get_delivery(&d).await {
            if !d.state.is_terminal() && d.run_id.as_deref() == Some(run_id) {
                return TbError::new(
                    ErrorCode::Conflict,
                    "the run has not started yet; retry in a moment",
                )
                .retry_after(1);
            }
        }
    }
    store_err(e)
}

/// A signal as an API caller raises it (`POST /v1/runs/{runId}/signals`).
#[derive(Debug, Clone, Default)]
pub struct RaiseRequest {
    pub name: String,
    pub data: Option<Value>,
    /// Idempotency identity; minted (`sig_...`) when absent.
    pub signal_id: Option<String>,
    pub wake: bool,
}

/// Raises a signal on behalf of an authenticated API caller: `source = {kind: api, actorId}` and the
/// time are stamped here, never taken from the request. Data over 32 KiB (or deeper than 16 levels, or
/// over 4 096 nodes) is stored by reference (`payloadRef`).
///
/// Errors: `validation_error` (400) bad name / signalId / data over 1 MiB; `not_found` (404);
/// `target_terminal` (409); `signal_buffer_full` (429, mailbox policy `reject`).
pub async fn raise(
    engine: &Engine,
    run_id: &str,
    req: RaiseRequest,
    actor: Option<String>,
) -> Result<RaiseOutcome, TbError> {
    signal::validate_name(&req.name).map_err(|e| TbError::new(ErrorCode::ValidationError, e))?;
    let signal_id = match req.signal_id {
        Some(id) => {
            signal::validate_signal_id(&id)
                .map_err(|e| TbError::new(ErrorCode::ValidationError, e))?;
            id
        }
        None => new_id(IdKind::Signal),
    };
    let data =
        signal::place_data(req.data).map_err(|e| TbError::new(ErrorCode::ValidationError, e))?;
    let out = engine
        .store
        .raise_signal(
            run_id,
            NewSignal {
                signal_id,
                name: req.name,
                source: SignalSource {
                    kind: SourceKind::Api,
                    receipt_id: None,
                    actor_id: actor,
                },
                data,
                wake: req.wake,
                delivery_id: None,
            },
            clock::now_ms(),
        )
        .await;
    let out = match out {
        Ok(o) => Ok(o),
        Err(e) => Err(run_err(engine, run_id, e).await),
    };
    // `tb_signals_total` is counted by the store, where every raise (API, webhook, capability) goes.
    engine.session_changed();
    out
}

/// Arms a wait. Errors: `validation_error` (400); `not_found`; `target_terminal` (409).
pub async fn create_wait(
    engine: &Engine,
    run_id: &str,
    spec: WaitSpec,
) -> Result<WaitRecord, TbError> {
    spec.validate()
        .map_err(|e| TbError::new(ErrorCode::ValidationError, e))?;
    let w = match engine
        .store
        .create_wait(run_id, &new_id(IdKind::Wait), spec, clock::now_ms())
        .await
    {
        Ok(w) => w,
        Err(e) => return Err(run_err(engine, run_id, e).await),
    };
    metrics::counter!("tb_waits_total", "event" => "armed").increment(1);
    engine.session_changed();
    Ok(w)
}

/// Cancels an armed wait. Errors: `not_found`; `conflict` when it is not armed.
pub async fn cancel_wait(
    engine: &Engine,
    run_id: &str,
    wait_id: &str,
) -> Result<WaitRecord, TbError> {
    let w = engine
        .store
        .cancel_wait(run_id, wait_id, clock::now_ms())
        .await
        .map_err(store_err)?;
    engine.session_changed();
    Ok(w)
}

/// Reads a wait, waiting up to `timeout` for it to leave `armed` (long-poll). Errors: `not_found`.
pub async fn poll_wait(
    engine: &Engine,
    run_id: &str,
    wait_id: &str,
    timeout: Duration,
) -> Result<WaitRecord, TbError> {
    let mut rx = engine.sessions.subscribe();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        rx.borrow_and_update();
        let w = engine
            .store
            .get_wait(run_id, wait_id)
            .await
            .map_err(store_err)?;
        if w.state != WaitState::Armed || engine.is_closing() {
            return Ok(w);
        }
        if tokio::time::timeout_at(deadline, rx.changed())
            .await
            .is_err()
        {
            return Ok(w);
        }
    }
}

/// Enqueues user input (a prompt turn). It interrupts an armed `signal` wait for one turn, or wins an
/// `any` wait that races user input. Errors: `validation_error` empty or over 32 KiB; `not_found`;
/// `target_terminal`.
pub async fn prompt(
    engine: &Engine,
    run_id: &str,
    text: String,
    actor: Option<String>,
) -> Result<TurnRecord, TbError> {
    if text.trim().is_empty() || text.len() > signal::MAX_INLINE_DATA_BYTES {
        return Err(TbError::new(
            ErrorCode::ValidationError,
            "text is required and at most 32 KiB",
        ));
    }
    let from = match actor {
        Some(a) => format!("user {a}"),
        None => "user".into(),
    };
    let t = engine
        .store
        .enqueue_prompt(
            run_id,
            NewPrompt {
                text,
                variables: Value::Null,
                from,
                delivery_id: None,
            },
            clock::now_ms(),
        )
        .await;
    let t = match t {
        Ok(t) => t,
        Err(e) => return Err(run_err(engine, run_id, e).await),
    };
    engine.session_changed();
    Ok(t)
}

/// Claims the run's next turn, waiting up to `timeout` for one (long-poll); `lease` is how long the
/// driver has to acknowledge it before it is redelivered. `None` when nothing arrived in time.
/// Errors: `not_found`; `target_terminal` (409) once the run has ended (the store refuses the claim).
pub async fn claim(
    engine: &Engine,
    run_id: &str,
    lease: Duration,
    timeout: Duration,
) -> Result<Option<TurnRecord>, TbError> {
    let mut rx = engine.sessions.subscribe();
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        rx.borrow_and_update();
        let now = clock::now_ms();
        if let Some(t) = engine
            .store
            .claim_turn(run_id, lease.as_millis() as u64, now)
            .await
            .map_err(store_err)?
        {
            return Ok(Some(t));
        }
        if engine.is_closing() {
            return Ok(None);
        }
        // A leased turn may lapse without any commit: re-check at least once a second.
        let tick = tokio::time::Instant::now() + Duration::from_secs(1);
        match tokio::time::timeout_at(deadline.min(tick), rx.changed()).await {
            Err(_) if tokio::time::Instant::now() >= deadline => return Ok(None),
            _ => {}
        }
    }
}

/// Acknowledges a claimed turn; `claim` is the `claims` count returned with it. Errors: `not_found`;
/// `conflict` when it is not claimed or was claimed again since; `target_terminal` once the run ended.
pub async fn ack(
    engine: &Engine,
    run_id: &str,
    turn_id: &str,
    claim: u32,
) -> Result<TurnRecord, TbError> {
    let t = engine
        .store
        .ack_turn(run_id, turn_id, claim, clock::now_ms())
        .await
        .map_err(store_err)?;
    engine.session_changed();
    Ok(t)
}

/// The durable timer loop: resolves waits whose deadline has passed, sleeping until the earliest
/// deadline or until a session change (a new wait) is committed. Runs until `shutdown` turns true.
pub async fn timers(
    engine: std::sync::Arc<Engine>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut rx = engine.sessions.subscribe();
    loop {
        if *shutdown.borrow() {
            return;
        }
        rx.borrow_and_update();
        let now = clock::now_ms();
        match engine.store.fire_timers(now, 256).await {
            Ok(n) if n > 0 => {
                metrics::counter!("tb_waits_total", "event" => "timer_fired").increment(n as u64);
                engine.session_changed();
                continue;
            }
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "firing due timers failed"),
        }
        let sleep = match engine.store.next_timer_at().await {
            Ok(Some(t)) => Duration::from_millis((t - now).clamp(1, 60_000) as u64),
            _ => Duration::from_secs(60),
        };
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = rx.changed() => {}
            _ = shutdown.changed() => {}
        }
    }
}
