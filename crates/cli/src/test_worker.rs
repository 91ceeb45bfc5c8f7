//! `trigger-bridge test-worker`: a flaky HTTP worker for trying dead letters and replay without writing
//! code. It takes exactly what the `http` executor sends (`tb_engine::executor::start_run`): a POST of
//! `{runId, workflowId, inputs, causationId, trigger: {subscriptionId, eventType, receiptId},
//! resultToken}` with `webhook-id` (the delivery id), `webhook-timestamp`, `webhook-signature` and
//! `Idempotency-Key`, on any path. It answers `200 {"ok": true}` (the run completes) or, with probability `failRate`,
//! `500 {"error": "test_worker_failure"}` (a failed attempt, error class `http_500`).
//!
//! With `--secret` (the workflow's `whsec_` value) the Standard Webhooks signature is checked and a bad
//! one is answered 401 (error class `http_401`). Each request is logged as one line on stdout.
//! `GET /control` -> `{failRate, requests, failed}`; `POST /control {"failRate": 0..1}` switches the
//! rate without a restart (e.g. to healthy: `{"failRate": 0}`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use bytes::Bytes;
use serde_json::{json, Value};

/// Flags of `test-worker`.
#[derive(clap::Args, Debug)]
pub struct TestWorkerArgs {
    /// Address to listen on (the workflow's `url` must point here, e.g. http://127.0.0.1:9090/run)
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub listen: SocketAddr,
    /// Share of requests answered 500, from 0 (always healthy) to 1 (always failing)
    #[arg(long, default_value_t = 0.0, value_parser = parse_rate, conflicts_with = "fail")]
    pub fail_rate: f64,
    /// Answer every request with 500 (the same as --fail-rate 1)
    #[arg(long)]
    pub fail: bool,
    /// The workflow's whsec_ signing secret: when given, requests with a bad signature get 401
    #[arg(long, env = "TEST_WORKER_SECRET", hide_env_values = true)]
    pub secret: Option<String>,
}

/// A fail rate: a number from 0 to 1.
fn parse_rate(s: &str) -> Result<f64, String> {
    let r: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a number; use 0 to 1, e.g. 0.5"))?;
    if (0.0..=1.0).contains(&r) {
        Ok(r)
    } else {
        Err(format!(
            "{r} is out of range; use 0 (never fail) to 1 (always fail)"
        ))
    }
}

#[derive(Default)]
struct Counters {
    fail_rate: f64,
    requests: u64,
    failed: u64,
}

#[derive(Clone)]
struct Worker {
    state: Arc<Mutex<Counters>>,
    key: Option<Arc<Vec<u8>>>,
}

/// Runs the worker until Ctrl-C. Errors: a bad `--secret`, the address is taken.
pub async fn run(a: TestWorkerArgs) -> Result<()> {
    let key = match &a.secret {
        Some(s) => Some(Arc::new(
            tb_ingress::parse_whsec(s).map_err(|e| anyhow::anyhow!("--secret: {e}"))?,
        )),
        None => None,
    };
    let rate = if a.fail { 1.0 } else { a.fail_rate };
    let w = Worker {
        state: Arc::new(Mutex::new(Counters {
            fail_rate: rate,
            ..Default::default()
        })),
        key,
    };
    let app = Router::new()
        .route("/control", get(get_control).post(set_control))
        .fallback(attempt)
        .with_state(w.clone());
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("cannot listen on {}", a.listen))?;
    let addr = listener.local_addr()?;
    println!(
        "test-worker listening on http://{addr} (fail-rate {rate}, signatures {}); make it healthy with: curl -X POST http://{addr}/control -H 'content-type: application/json' -d '{{\"failRate\":0}}'",
        if w.key.is_some() { "checked" } else { "not checked" }
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

fn control_view(c: &Counters) -> Value {
    json!({"failRate": c.fail_rate, "requests": c.requests, "failed": c.failed})
}

async fn get_control(State(w): State<Worker>) -> Json<Value> {
    Json(control_view(&w.state.lock().unwrap()))
}

async fn set_control(State(w): State<Worker>, body: Bytes) -> Response {
    let rate = serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["failRate"].as_f64())
        .filter(|r| (0.0..=1.0).contains(r));
    let Some(rate) = rate else {
        let b = json!({"error": "validation_error", "message": "send {\"failRate\": 0..1}"});
        return (StatusCode::BAD_REQUEST, Json(b)).into_response();
    };
    let mut c = w.state.lock().unwrap();
    c.fail_rate = rate;
    println!("test-worker: fail-rate is now {rate}");
    Json(control_view(&c)).into_response()
}

async fn attempt(
    State(w): State<Worker>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let header = |k: &str| {
        headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_string()
    };
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let field = |p: &str| {
        v.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("-")
            .to_string()
    };
    let (status, rate) = {
        let mut c = w.state.lock().unwrap();
        c.requests += 1;
        let status = if method != Method::POST {
            StatusCode::METHOD_NOT_ALLOWED
        } else if w.key.as_ref().is_some_and(|k| {
            tb_ingress::standard_webhooks::verify_signature(
                k,
                300,
                &headers,
                &body,
                tb_engine::clock::now_s(),
            )
            .is_err()
        }) {
            StatusCode::UNAUTHORIZED
        } else if rand::random::<f64>() < c.fail_rate {
            StatusCode::INTERNAL_SERVER_ERROR
        } else {
            StatusCode::OK
        };
        if status != StatusCode::OK {
            c.failed += 1;
        }
        (status, c.fail_rate)
    };
    println!(
        "test-worker: {method} {} webhook-id={} run={} workflow={} subscription={} event={} -> {} (fail-rate {rate})",
        uri.path(),
        header("webhook-id"),
        field("/runId"),
        field("/workflowId"),
        field("/trigger/subscriptionId"),
        field("/trigger/eventType"),
        status.as_u16(),
    );
    let body = match status {
        StatusCode::OK => json!({"ok": true}),
        StatusCode::UNAUTHORIZED => {
            json!({"error": "signature_invalid", "message": "bad webhook-signature"})
        }
        StatusCode::METHOD_NOT_ALLOWED => {
            json!({"error": "method_not_allowed", "message": "POST a run"})
        }
        _ => json!({"error": "test_worker_failure", "message": "failing on purpose"}),
    };
    (status, Json(body)).into_response()
}
