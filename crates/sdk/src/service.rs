//! A service: its manifest, and the loop that registers it, applies flows, consumes its inbound
//! subjects, heartbeats and shuts down gracefully (wire spec §3 start-up and shutdown order).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, stream};
use futures_util::StreamExt;
use tb_wire::flow::Applied;
use tb_wire::manifest::{hash, validate, Manifest, ServiceSource, PROTOCOL_VERSION};
use tb_wire::time::WireTime;
use tb_wire::{json, subjects, FlowEnvelope, Heartbeat, RegisterReply};

use crate::action::Action;
use crate::flows::Flows;
use crate::handle::{self, Shared};

/// Why a service stopped or could not start. Its `Debug` is its `Display` (so `main` returning
/// `Result<(), Error>` prints a sentence).
pub enum Error {
    /// The service's own declaration is invalid (a bad name, duplicate actions, a bad source).
    Config(String),
    /// The NATS server could not be reached.
    Connect(String),
    /// Registration failed: no orchestrator answered (no responders or 10 s timeout), or it refused
    /// the manifest (its `error`). Start-up fails fast on it.
    Register(String),
    /// The inbound stream or a consumer could not be opened.
    JetStream(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Config(m) => write!(f, "service declaration: {m}"),
            Error::Connect(m) => write!(f, "NATS: {m}"),
            Error::Register(m) => write!(f, "register: {m} (start the bridge with --nats-url first: a service fails fast when no orchestrator answers)"),
            Error::JetStream(m) => write!(f, "JetStream: {m}"),
        }
    }
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::error::Error for Error {}

/// The register request's timeout (the protocol's 10 s).
pub const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// A `triggers.v2` service: a name, a version, inbound NATS sources and typed actions.
pub struct Service {
    name: String,
    version: String,
    sources: Vec<ServiceSource>,
    actions: Vec<Action>,
    supports_nodes: Vec<String>,
    capabilities: Vec<String>,
    ack_wait: Option<Duration>,
    concurrency: usize,
    flows: Flows,
}

impl Service {
    /// A service named `name` (`^[A-Za-z0-9_-]+$`, not `source`), version `dev`, no sources or
    /// actions yet, 16 messages handled at once.
    pub fn new(name: impl Into<String>) -> Service {
        Service {
            name: name.into(),
            version: "dev".into(),
            sources: Vec::new(),
            actions: Vec::new(),
            supports_nodes: Vec::new(),
            capabilities: Vec::new(),
            ack_wait: None,
            concurrency: 16,
            flows: Flows::default(),
        }
    }

    /// The `service_version` sent in the manifest and heartbeats.
    pub fn version(mut self, version: impl Into<String>) -> Service {
        self.version = version.into();
        self
    }

    /// A NATS inbound source named `name` taking messages on `subject` (captured by the stream
    /// `triggers-sources-<service>`, consumed by the durable `triggers-<service>-<safe subject>`).
    pub fn source(mut self, name: impl Into<String>, subject: impl Into<String>) -> Service {
        self.sources.push(ServiceSource {
            name: name.into(),
            transport: "nats".into(),
            default: subject.into(),
        });
        self
    }

    /// Adds an action.
    pub fn action(mut self, action: Action) -> Service {
        self.actions.push(action);
        self
    }

    /// Declares a supported flow node kind (`condition`, `lookup`, `mapping`, ...).
    pub fn supports_node(mut self, node: impl Into<String>) -> Service {
        self.supports_nodes.push(node.into());
        self
    }

    /// Declares a runtime capability (e.g. `durable_timer.v1`).
    pub fn capability(mut self, capability: impl Into<String>) -> Service {
        self.capabilities.push(capability.into());
        self
    }

    /// How long JetStream waits for an answer before redelivering a message to another replica
    /// (default: twice the longest action timeout plus 5 s, at least 30 s: a message may wait in the client's buffer for about one handler round before it is taken). While a handler runs, progress
    /// (`+WPI`) is sent every third of it.
    pub fn ack_wait(mut self, ack_wait: Duration) -> Service {
        self.ack_wait = Some(ack_wait);
        self
    }

    /// How many messages are handled at once (default 16, at least 1).
    pub fn concurrency(mut self, n: usize) -> Service {
        self.concurrency = n.max(1);
        self
    }

    /// The flows this service knows once it runs.
    pub fn flows(&self) -> Flows {
        self.flows.clone()
    }

    /// The consumer's `max_deliver`: the most attempts of any action plus 20 spare deliveries (a
    /// DLQ or CompletionEvent write that failed is retried by redelivery), at least 100. Finite, so
    /// a message the client cannot even read (a header value that is not UTF-8 drops the
    /// connection) stops being redelivered.
    fn max_deliver(&self) -> i64 {
        let most = self
            .actions
            .iter()
            .map(|a| tb_wire::manifest::Retry::attempts(a.retry.as_ref()))
            .max()
            .unwrap_or(1);
        (most + 20).max(100)
    }

    fn effective_ack_wait(&self) -> Duration {
        self.ack_wait.unwrap_or_else(|| {
            let longest = self
                .actions
                .iter()
                .map(|a| a.timeout)
                .max()
                .unwrap_or_default();
            (2 * longest + Duration::from_secs(5)).max(Duration::from_secs(30))
        })
    }

    /// The manifest this service registers, `manifest_hash` filled in.
    pub fn manifest(&self) -> Manifest {
        let actions = self
            .actions
            .iter()
            .map(|a| tb_wire::manifest::Action {
                name: a.name.clone(),
                description: a.description.clone(),
                input_schema: Some(a.input_schema.clone()),
                result_schema: Some(a.result_schema.clone()),
                timeout_ms: a.timeout.as_millis() as i64,
                retry: a.retry.clone(),
                dlq: a
                    .dlq
                    .clone()
                    .unwrap_or_else(|| subjects::dlq(&self.name, &a.name)),
                result_event: a
                    .emit_result_event
                    .then(|| tb_wire::result_event::derive(&self.name, &a.name, &a.result_schema))
                    .flatten(),
                ..Default::default()
            })
            .collect::<Vec<_>>();
        let some = |v: Vec<String>| (!v.is_empty()).then_some(v);
        let mut caps = self.capabilities.clone();
        caps.sort();
        let mut m = Manifest {
            protocol_version: PROTOCOL_VERSION.into(),
            service: self.name.clone(),
            service_version: self.version.clone(),
            manifest_hash: String::new(),
            actions: (!actions.is_empty()).then_some(actions),
            service_sources: (!self.sources.is_empty()).then(|| self.sources.clone()),
            supports_nodes: some(self.supports_nodes.clone()),
            supports_rate_limit: false,
            runtime_capabilities: some(caps),
            runtime_lookups: None,
        };
        m.manifest_hash = hash(&m);
        m
    }

    fn check(&self, m: &Manifest) -> Result<(), Error> {
        if self.sources.iter().any(|s| s.default.is_empty()) {
            return Err(Error::Config("a source needs a subject".into()));
        }
        validate(m).map_err(Error::Config)
    }

    /// Connects to `url` and runs until Ctrl-C (SIGINT) or SIGTERM, then shuts down gracefully.
    /// Errors: see [`Error`]; start-up fails fast when no orchestrator accepts the manifest.
    pub async fn run(self, url: &str) -> Result<(), Error> {
        self.run_until(url, shutdown_signal()).await
    }

    /// Connects to `url` and runs until `shutdown` resolves, then shuts down gracefully and drains
    /// the connection.
    pub async fn run_until(
        self,
        url: &str,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), Error> {
        let client = async_nats::ConnectOptions::new()
            .name(format!("triggers.v2 service {}", self.name))
            .connect(url)
            .await
            .map_err(|e| Error::Connect(format!("{url}: {e}")))?;
        let r = self.run_with_client(client.clone(), shutdown).await;
        let _ = client.drain().await;
        r
    }

    /// Runs on an existing connection until `shutdown` resolves: subscribe to both broadcast
    /// subjects, register (10 s), apply the reply's flows, open the stream and consumers, heartbeat
    /// every 5 s (the first at once); on shutdown send a heartbeat with `shutting_down: true`, stop
    /// pulling, wait for handlers in flight, send the last heartbeat (`shutting_down: true` again)
    /// and flush.
    pub async fn run_with_client(
        self,
        client: async_nats::Client,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), Error> {
        let manifest = self.manifest();
        self.check(&manifest)?;
        let nats_err = |e: async_nats::SubscribeError| Error::Connect(e.to_string());
        let mut own = client
            .subscribe(subjects::broadcast(&self.name))
            .await
            .map_err(nats_err)?;
        let mut all = client
            .subscribe(subjects::BROADCAST_ALL)
            .await
            .map_err(nats_err)?;
        let reply = register(&client, &manifest).await?;
        for f in reply.flows.iter().flatten() {
            self.apply(f);
        }
        tracing::info!(service = %self.name, hash = %manifest.manifest_hash, flows = self.flows.len(), "registered");
        let js = jetstream::new(client.clone());
        let ack_wait = self.effective_ack_wait();
        let consumers = self.open(&js, ack_wait).await?;
        let started_at = WireTime::now();
        let beat = |shutting_down: bool| Heartbeat {
            service: self.name.clone(),
            service_version: self.version.clone(),
            manifest_hash: manifest.manifest_hash.clone(),
            started_at,
            now: WireTime::now(),
            shutting_down,
        };
        send_heartbeat(&client, &beat(false)).await;
        let shared = Arc::new(Shared {
            service: self.name.clone(),
            client: client.clone(),
            js: js.clone(),
            actions: self
                .actions
                .iter()
                .map(|a| (a.name.clone(), a.clone()))
                .collect::<HashMap<_, _>>(),
            flows: self.flows.clone(),
            ack_wait,
            pending: Default::default(),
        });
        // Messages taken from the pull streams (handled, waiting for a slot, or being answered):
        // twice the concurrency plus one per source (an idle source holds one while it waits).
        let taken_total = 2 * self.concurrency + consumers.len();
        let taken = Arc::new(tokio::sync::Semaphore::new(taken_total));
        let permits = Arc::new(tokio::sync::Semaphore::new(self.concurrency));
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let mut loops: tokio::task::JoinSet<()> = tokio::task::JoinSet::new();
        for c in consumers {
            loops.spawn(handle::consume(
                shared.clone(),
                c,
                self.concurrency,
                permits.clone(),
                taken.clone(),
                stop_rx.clone(),
            ));
        }
        let mut ticker = tokio::time::interval(Duration::from_secs(subjects::HEARTBEAT_INTERVAL_S));
        ticker.tick().await;
        tokio::pin!(shutdown);
        let ended = loop {
            tokio::select! {
                Some(m) = own.next() => self.broadcast(&m.payload),
                Some(m) = all.next() => self.broadcast(&m.payload),
                _ = ticker.tick() => send_heartbeat(&client, &beat(false)).await,
                // A source's consumer went away (deleted on the server): stop, and say so.
                Some(_) = loops.join_next() => break Some(Error::JetStream("a source's consumer ended (deleted on the server?); restart the service to re-create it".into())),
                _ = &mut shutdown => break None,
            }
        };
        tracing::info!(service = %self.name, "shutting down: finishing handlers in flight");
        // Draining from now: the orchestrator shows it while the handlers in flight finish.
        send_heartbeat(&client, &beat(true)).await;
        let _ = stop.send(true);
        while loops.join_next().await.is_some() {}
        // Every `taken` back = no message in flight (handled, waiting for a slot or being answered).
        let _ = taken.acquire_many(taken_total as u32).await;
        send_heartbeat(&client, &beat(true)).await;
        let _ = client.flush().await;
        tracing::info!(service = %self.name, "stopped");
        match ended {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn apply(&self, f: &FlowEnvelope) {
        let applied = self.flows.0.write().unwrap().apply(f);
        match applied {
            Applied::Refused => tracing::warn!(flow = %f.id, "flow body is not a flow; ignored"),
            Applied::Unchanged => {}
            a => tracing::info!(flow = %f.id, version = %f.version, change = ?a, "flow applied"),
        }
    }

    fn broadcast(&self, payload: &[u8]) {
        match serde_json::from_slice::<FlowEnvelope>(payload) {
            Ok(f) => {
                tracing::info!(flow = %f.id, version = %f.version, "flow broadcast received");
                self.apply(&f)
            }
            Err(e) => tracing::warn!(error = %e, "broadcast that is not a FlowEnvelope; ignored"),
        }
    }

    /// Opens the inbound stream (creating it with work-queue retention, adding missing subjects) and
    /// one durable pull consumer per source.
    async fn open(
        &self,
        js: &jetstream::Context,
        ack_wait: Duration,
    ) -> Result<Vec<pull::Stream>, Error> {
        if self.sources.is_empty() {
            return Ok(Vec::new());
        }
        let override_name = std::env::var(subjects::SOURCE_STREAM_ENV).ok();
        let name = subjects::source_stream(&self.name, override_name.as_deref());
        let wanted: Vec<String> = self.sources.iter().map(|s| s.default.clone()).collect();
        let js_err = |e: String| Error::JetStream(format!("stream {name}: {e}"));
        let mut st = js
            .get_or_create_stream(stream::Config {
                name: name.clone(),
                subjects: wanted.clone(),
                retention: stream::RetentionPolicy::WorkQueue,
                duplicate_window: Duration::from_secs(120),
                ..Default::default()
            })
            .await
            .map_err(|e| js_err(e.to_string()))?;
        let info = st.info().await.map_err(|e| js_err(e.to_string()))?.clone();
        let missing: Vec<&String> = wanted
            .iter()
            .filter(|s| !info.config.subjects.contains(s))
            .collect();
        if !missing.is_empty() {
            let mut config = info.config.clone();
            config.subjects.extend(missing.into_iter().cloned());
            js.update_stream(config)
                .await
                .map_err(|e| js_err(e.to_string()))?;
        }
        let mut out = Vec::new();
        for s in &self.sources {
            let durable = subjects::consumer_name(&self.name, &s.default);
            let consumer = st
                .get_or_create_consumer(
                    &durable,
                    pull::Config {
                        durable_name: Some(durable.clone()),
                        filter_subject: s.default.clone(),
                        ack_policy: jetstream::consumer::AckPolicy::Explicit,
                        ack_wait,
                        max_deliver: self.max_deliver(),
                        max_ack_pending: 1000,
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| Error::JetStream(format!("consumer {durable}: {e}")))?;
            let messages = consumer
                .stream()
                .max_messages_per_batch(self.concurrency)
                .messages()
                .await
                .map_err(|e| Error::JetStream(format!("consumer {durable}: {e}")))?;
            out.push(messages);
        }
        Ok(out)
    }
}

/// Sends the manifest and reads the reply: no responders, a timeout or an `error` fail.
async fn register(client: &async_nats::Client, m: &Manifest) -> Result<RegisterReply, Error> {
    let body = json::to_vec(m, false).map_err(|e| Error::Config(e.to_string()))?;
    let req = async_nats::Request::new()
        .payload(body.into())
        .timeout(Some(REGISTER_TIMEOUT));
    let reply = client
        .send_request(subjects::MANIFEST_REGISTER, req)
        .await
        .map_err(|e| match e.kind() {
            async_nats::RequestErrorKind::NoResponders => Error::Register(
                "no orchestrator is listening on triggers.v2.manifest.register".into(),
            ),
            async_nats::RequestErrorKind::TimedOut => {
                Error::Register("the orchestrator did not answer within 10 s".into())
            }
            _ => Error::Register(e.to_string()),
        })?;
    let reply: RegisterReply = serde_json::from_slice(&reply.payload)
        .map_err(|e| Error::Register(format!("the reply is not a RegisterReply: {e}")))?;
    if !reply.error.is_empty() {
        return Err(Error::Register(format!("refused: {}", reply.error)));
    }
    Ok(reply)
}

async fn send_heartbeat(client: &async_nats::Client, hb: &Heartbeat) {
    let bytes = json::to_vec(hb, false).unwrap_or_default();
    if let Err(e) = client.publish(subjects::HEARTBEAT, bytes.into()).await {
        tracing::warn!(error = %e, "heartbeat not sent");
    }
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
