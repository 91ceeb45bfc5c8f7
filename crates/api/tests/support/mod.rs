//! Shared harness of the API tests: a server (engine + worker + API) on an ephemeral port with a SQLite
//! store in a temp dir, a GitHub subscription whose `pr-opened` binding starts `wf`, and a local worker.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::Value;
use tb_core::binding::{Binding, BindingAction};
use tb_core::connector::ConnectorSpec;
use tb_core::retry::{Backoff, RetryPolicy};
pub use tb_core::subscription::FailurePolicy;
use tb_core::workflow::{Executor, Workflow};
use tb_engine::worker::WorkerConfig;
use tb_engine::{Catalog, Engine, SubscriptionConfig};
use tb_store::sqlite::SqliteStore;
use tb_store::Store;

pub const GH_SECRET: &str = "test-github-secret";
pub const WORKER_KEY: &[u8] = b"0123456789abcdef01234567";

pub fn fixtures() -> std::path::PathBuf {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
    assert!(
        p.is_dir(),
        "fixtures not found at {} (the repo's tests/fixtures)",
        p.display()
    );
    p
}

pub fn fast_retry(max: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts: max,
        backoff: Backoff::Fixed,
        initial_ms: 20,
        max_ms: 20,
        jitter: 0.0,
        schedule_ms: None,
    }
}

pub struct Server {
    pub base: String,
    pub engine: Arc<Engine>,
    pub http: reqwest::Client,
    pub _dir: tempfile::TempDir,
}

/// A failure policy without time windows (the breaker and dead-lettering judge counts only): what
/// [`start`] gives, so a test that is not about the windows sees its transitions at once.
pub const IMMEDIATE: FailurePolicy = FailurePolicy {
    failure_window_ms: 0,
    dead_letter_after_ms: 0,
    dead_letter_min_failures: 1,
};

/// Starts engine + worker + API. `worker_url`: when set, the `pr-opened` binding's workflow is `http`.
/// The subscription's failure policy is [`IMMEDIATE`].
pub async fn start(worker_url: Option<String>, retry: RetryPolicy, threshold: u32) -> Server {
    start_with_keys(worker_url, retry, threshold, Vec::new()).await
}

/// [`start`] with the subscription's failure policy and the worker's lease (ms) and idle poll.
pub async fn start_with(
    worker_url: Option<String>,
    retry: RetryPolicy,
    threshold: u32,
    failure: FailurePolicy,
    worker: WorkerConfig,
) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    let (sub, binding, wf) = github_catalog(worker_url, retry, threshold, failure);
    serve_with(
        dir,
        store,
        Catalog::new(vec![sub], vec![binding], vec![wf]),
        Vec::new(),
        worker,
    )
    .await
}

/// [`start`] with API keys configured.
pub async fn start_with_keys(
    worker_url: Option<String>,
    retry: RetryPolicy,
    threshold: u32,
    keys: Vec<trigger_bridge_api::auth::ApiKey>,
) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    let (sub, binding, wf) = github_catalog(worker_url, retry, threshold, IMMEDIATE);
    serve(
        dir,
        store,
        Catalog::new(vec![sub], vec![binding], vec![wf]),
        keys,
    )
    .await
}

/// The `github` subscription, its `pr-opened` binding and the `wf` workflow (`http` to `worker_url`
/// with a 2 s timeout, else `noop`).
pub fn github_catalog(
    worker_url: Option<String>,
    retry: RetryPolicy,
    threshold: u32,
    failure: FailurePolicy,
) -> (SubscriptionConfig, Binding, Workflow) {
    let sub = SubscriptionConfig {
        retry,
        max_body_bytes: 1 << 20,
        failure_threshold: threshold,
        failure,
        ..SubscriptionConfig::webhook("github", ConnectorSpec::Github, GH_SECRET.as_bytes())
    };
    let wf = match worker_url {
        Some(url) => Workflow {
            id: "wf".into(),
            executor: Executor::Http {
                url,
                secret: WORKER_KEY.to_vec(),
                timeout_ms: 2_000,
                // The test workers listen on 127.0.0.1.
                allow_private: true,
                non_retryable_statuses: tb_core::delivery::DEFAULT_NON_RETRYABLE_STATUSES.to_vec(),
            },
        },
        None => Workflow {
            id: "wf".into(),
            executor: Executor::Noop,
        },
    };
    let binding = Binding {
        rate_limit_per_min: 0,
        id: "pr-opened".into(),
        subscription: "github".into(),
        event_types: vec!["pull_request.opened".into()],
        filter: Default::default(),
        action: BindingAction::start_run("wf"),
        inputs: [("number".to_string(), "pull_request.number".to_string())]
            .into_iter()
            .collect(),
    };
    (sub, binding, wf)
}

/// A binding of `sub` that starts `wf` for every `pull_request.opened`, with no inputs and a rate limit
/// of `per_min` (0 = none).
pub fn opened_binding(id: &str, sub: &str, wf: &str, per_min: u32) -> Binding {
    Binding {
        rate_limit_per_min: per_min,
        id: id.into(),
        subscription: sub.into(),
        event_types: vec!["pull_request.opened".into()],
        filter: Default::default(),
        action: BindingAction::start_run(wf),
        inputs: Default::default(),
    }
}

/// A fresh SQLite store in a new temp dir.
pub fn store() -> (tempfile::TempDir, Arc<dyn Store>) {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    (dir, store)
}

/// Starts engine + worker + timer loop + API over `catalog` with a store in `dir` (lease 5 s).
pub async fn serve(
    dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    catalog: Catalog,
    keys: Vec<trigger_bridge_api::auth::ApiKey>,
) -> Server {
    let worker = WorkerConfig {
        lease_ms: 5_000,
        ..Default::default()
    };
    serve_with(dir, store, catalog, keys, worker).await
}

/// [`serve`] with the worker's settings.
pub async fn serve_with(
    dir: tempfile::TempDir,
    store: Arc<dyn Store>,
    catalog: Catalog,
    keys: Vec<trigger_bridge_api::auth::ApiKey>,
    worker: WorkerConfig,
) -> Server {
    let engine = Engine::start(store, catalog).await.unwrap();
    let (_tx, rx) = tokio::sync::watch::channel(false);
    std::mem::forget(_tx);
    tokio::spawn(tb_engine::sessions::timers(engine.clone(), rx.clone()));
    tokio::spawn(tb_engine::duplicates::run(engine.clone(), rx.clone()));
    tokio::spawn(tb_engine::rate_limit::run(engine.clone(), rx.clone()));
    tokio::spawn(tb_engine::worker::run(engine.clone(), worker, rx));
    let app = trigger_bridge_api::router(trigger_bridge_api::AppState {
        engine: engine.clone(),
        metrics: None,
        host: Default::default(),
        keys: trigger_bridge_api::auth::ApiKeys(Arc::new(keys)),
        secrets: Some(
            tb_engine::registration::SecretStore::open(&dir.path().join("secrets")).unwrap(),
        ),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    // With the peer address, as `serve` gives it (the per-source rate limit reads it).
    let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Server {
        base,
        engine,
        http: reqwest::Client::new(),
        _dir: dir,
    }
}

impl Server {
    pub async fn post_github(
        &self,
        event: &str,
        delivery: &str,
        body: Vec<u8>,
        secret: &str,
    ) -> (StatusCode, Value) {
        self.post_github_to("github", event, delivery, body, secret)
            .await
    }

    /// [`Server::post_github`] to the subscription `sub`.
    pub async fn post_github_to(
        &self,
        sub: &str,
        event: &str,
        delivery: &str,
        body: Vec<u8>,
        secret: &str,
    ) -> (StatusCode, Value) {
        let sig = tb_ingress::github::sign(secret.as_bytes(), &body);
        let r = self
            .http
            .post(format!(
                "{}/v1/trigger-subscriptions/{sub}/ingest",
                self.base
            ))
            .header("content-type", "application/json")
            .header("x-github-event", event)
            .header("x-github-delivery", delivery)
            .header("x-hub-signature-256", sig)
            .body(body)
            .send()
            .await
            .unwrap();
        let status = StatusCode::from_u16(r.status().as_u16()).unwrap();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// POSTs JSON to `path`; returns the status and the JSON answer (`Null` when empty).
    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = StatusCode::from_u16(r.status().as_u16()).unwrap();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> Value {
        self.http
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Polls until `f` holds on `GET path` (at most 10 s).
    pub async fn wait_for(&self, path: &str, f: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..400 {
            let v = self.get(path).await;
            if f(&v) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!(
            "condition on {path} not reached; last: {}",
            self.get(path).await
        )
    }
}

pub fn opened() -> Vec<u8> {
    std::fs::read(fixtures().join("github/pull_request/00-opened.json")).unwrap()
}

/// A local worker answering with `codes` in turn (then 200), counting requests and checking signatures.
pub async fn worker(codes: Vec<u16>) -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let app = axum::Router::new().route(
        "/run",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let h = h.clone();
                let codes = codes.clone();
                async move {
                    let n = h.fetch_add(1, Ordering::SeqCst);
                    let ok = tb_ingress::standard_webhooks::verify(
                        WORKER_KEY,
                        300,
                        &headers,
                        &body,
                        chrono_now(),
                        &Default::default(),
                    )
                    .is_ok();
                    assert!(
                        ok,
                        "worker request must carry a valid Standard Webhooks signature"
                    );
                    assert_eq!(headers["idempotency-key"], headers["webhook-id"]);
                    let code = *codes.get(n).unwrap_or(&200);
                    // A 503 asks for a pause: `Retry-After: 1` (s), which the policy clamps.
                    let retry_after = if code == 503 { "1" } else { "0" };
                    (
                        StatusCode::from_u16(code).unwrap(),
                        [("retry-after", retry_after)],
                    )
                }
            },
        ),
    );
    serve_worker(app, hits).await
}

/// Serves `app` (with a `/run` route) on an ephemeral port; returns its `/run` URL and `hits`.
pub async fn serve_worker(app: axum::Router, hits: Arc<AtomicUsize>) -> (String, Arc<AtomicUsize>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/run", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (url, hits)
}

pub fn chrono_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// A vendored OpenWOP schema from `tests/fixtures/openwop/`.
pub fn schema(name: &str) -> Value {
    let p = fixtures().join("openwop").join(name);
    serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

/// A Draft 2020-12 validator for a vendored schema; relative `$ref`s into
/// `run-event-payloads.schema.json` resolve against its vendored subset.
pub fn validator(name: &str) -> jsonschema::Validator {
    let payloads = schema("run-event-payloads.trigger-subset.schema.json");
    jsonschema::options()
        .with_resource(
            "https://openwop.dev/spec/v1/run-event-payloads.schema.json",
            jsonschema::Resource::from_contents(payloads).expect("resource"),
        )
        .build(&schema(name))
        .expect("schema compiles")
}

/// Asserts `instance` is valid, listing every error.
pub fn check(v: &jsonschema::Validator, instance: &Value) {
    let errs: Vec<String> = v
        .iter_errors(instance)
        .map(|e| format!("{e} at {}", e.instance_path))
        .collect();
    assert!(errs.is_empty(), "{errs:?}\n{instance}");
}

/// Signs a Standard Webhooks request with `secret` (a `whsec_` value) at `ts` (Unix s) and posts it
/// to `path`: the status and the JSON answer (`Null` when none).
pub async fn post_sw(
    s: &Server,
    path: &str,
    secret: &str,
    id: &str,
    body: &[u8],
    ts: i64,
) -> (u16, Value) {
    let key = tb_ingress::parse_whsec(secret).unwrap();
    let sig = tb_ingress::standard_webhooks::sign(&key, id, ts, body);
    let r = s
        .http
        .post(format!("{}{path}", s.base))
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", sig)
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}
