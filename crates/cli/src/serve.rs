//! `trigger-bridge serve`: opens (and migrates) the store (SQLite in the data dir, or PostgreSQL with
//! `--database-url`), starts the engine, the parts of its `--role` (delivery worker and timers, HTTP
//! ingest and API), and shuts down gracefully on SIGINT / SIGTERM (stop accepting, let attempts in flight
//! record their outcome, close open connections after at most `body_timeout_ms`, flush the writer). A
//! second signal during the shutdown exits at once with code 130.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tb_engine::worker::{self, WorkerConfig};
use tb_engine::Engine;

use crate::config;
use crate::role::Role;
use crate::store_open::{self, Choice};

/// `serve` flags.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Configuration file (TOML): subscriptions, workflows, bindings.
    #[arg(long, short, env = "TRIGGER_BRIDGE_CONFIG")]
    pub config: PathBuf,
    /// Listen address, `ip:port` or `host:port` [default: [server].listen, else 127.0.0.1:8080];
    /// replaces [server].listen, even an invalid one.
    #[arg(long, env = "TRIGGER_BRIDGE_LISTEN")]
    pub listen: Option<String>,
    /// Directory of the SQLite store, created on first start [default: [server].data_dir, else ./data].
    /// With --database-url it holds only secrets/ (host key, registered signing secrets) and is not locked.
    #[arg(long, env = "TRIGGER_BRIDGE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// PostgreSQL store, postgres://user[:password]@host[:port]/db, shared by every replica
    /// [default: [server].database_url, else SQLite in the data dir]. Printed with the password masked.
    #[arg(long, env = "TRIGGER_BRIDGE_DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// NATS server with JetStream, nats://host[:port], for queue subscriptions, triggers.v2 services
    /// and the nats executor [default: [server].nats_url, else none: queue subscriptions report an
    /// error and nats runs fail with nats_unavailable; the rest runs].
    #[arg(long, env = "TRIGGER_BRIDGE_NATS_URL", hide_env_values = true)]
    pub nats_url: Option<String>,
    /// Export spans over OTLP/HTTP (protobuf) to this collector base URL, e.g.
    /// `http://otel-collector:4318` (spans go to `<URL>/v1/traces`). Off by default; the standard
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` also turns it on. See docs/operations.md "Tracing".
    #[arg(long, env = "TRIGGER_BRIDGE_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// What this process runs: api (ingest and API), worker (deliveries and timers; HTTP only
    /// /health, /ready, /metrics) or all.
    #[arg(long, value_enum, default_value_t = Role::All)]
    pub role: Role,
    /// This process's id in every log line and as the lease owner of its deliveries; unique per
    /// process [default: <host>-<pid>].
    #[arg(long, env = "TRIGGER_BRIDGE_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// Old spelling of `--role api`.
    #[arg(long, hide = true, conflicts_with = "role")]
    pub no_worker: bool,
}

impl ServeArgs {
    /// The role, `--no-worker` read as `--role api`.
    pub fn role(&self) -> Role {
        if self.no_worker {
            Role::Api
        } else {
            self.role
        }
    }

    /// `--replica-id`, or the default `<host>-<pid>`. Errors: an id [`crate::replica::check`] refuses.
    pub fn replica_id(&self) -> anyhow::Result<String> {
        match &self.replica_id {
            Some(id) => {
                crate::replica::check(id).map_err(|e| anyhow::anyhow!(e))?;
                Ok(id.clone())
            }
            None => Ok(crate::replica::default_id()),
        }
    }
}

/// Runs the server until a shutdown signal, as `replica` (the worker's lease owner; the caller puts
/// it in the log's span).
pub async fn run(args: ServeArgs, replica: String) -> anyhow::Result<()> {
    let role = args.role();
    let override_listen = args.listen.is_some();
    let override_url = args.database_url.is_some();
    let loaded = config::load_with(&args.config, |c| {
        if override_listen {
            c.server.listen = None;
        }
        if override_url {
            c.server.database_url = None;
        }
    })
    .map_err(|errs| {
        anyhow::anyhow!(
            "{} has {} problem(s):\n  - {}",
            args.config.display(),
            errs.len(),
            errs.join("\n  - ")
        )
    })?;
    let quotas = loaded.quotas.clone();
    let failed_keys_per_min = loaded.failed_keys_per_min;
    // The accept loop exempts these peers from the per-client connection share; the API reads the
    // client from their forwarded header (both through the same list).
    let trusted_proxies = quotas.trusted_proxies.clone();
    for n in &loaded.notes {
        tracing::warn!("{n}");
    }
    let (server, catalog, keys) = loaded.into_catalog();
    let edge = server.edge();
    let listen_text = args
        .listen
        .clone()
        .or_else(|| server.listen.clone())
        .unwrap_or_else(|| "127.0.0.1:8080".into());
    let listen: SocketAddr = crate::listen::resolve(&listen_text).await?;
    if keys.is_empty() {
        if !listen.ip().is_loopback() {
            anyhow::bail!(
                "refusing to serve the management API on {listen} without API keys: set TRIGGER_BRIDGE_API_KEY or add [[api_keys]] to the config"
            );
        }
        tracing::warn!("no API keys configured: the management API is open to anyone on this machine (set TRIGGER_BRIDGE_API_KEY)");
    }
    let writer_queue_capacity = server.writer_queue_capacity();
    let nats_url = args.nats_url.clone().or(server.nats_url.clone());
    let data_dir = args
        .data_dir
        .or(server.data_dir.clone())
        .unwrap_or_else(|| PathBuf::from("./data"));
    let choice = Choice::pick(
        args.database_url.or(server.database_url.clone()),
        server.database_pool_size,
        &data_dir,
    );
    // SQLite: the lock is held until the process ends, so a second server on this directory is refused.
    let opened = store_open::open(&choice, writer_queue_capacity).await?;
    let _lock = opened.lock;
    let store = opened.store;
    tracing::info!(store = %opened.label, role = role.as_str(), "store open");
    let shared = matches!(choice, Choice::Postgres { .. });
    if !shared && (!role.runs_worker() || !role.serves_api()) {
        tracing::warn!(
            role = role.as_str(),
            "--role {} on SQLite: the data dir is locked to this process, so no other process can run the other role on it; {}",
            role.as_str(),
            if role.serves_api() {
                "deliveries wait until a server with the worker runs on this data dir"
            } else {
                "nothing is ingested here"
            }
        );
    }
    if shared {
        tracing::info!(
            data_dir = %data_dir.display(),
            "PostgreSQL store: the data dir holds only secrets/ (host.key, secret files of registrations made before secrets were sealed in the store) and is not locked; registrations made through the API are sealed in the database under TRIGGER_BRIDGE_SECRET_KEY, which every replica must share"
        );
    }
    // Several replicas: the sealing key comes from the environment only (the same on every replica);
    // one host: a key file made once under secrets/ when the environment has none.
    let secrets_dir = data_dir.join("secrets");
    let secrets = if shared {
        tb_engine::registration::SecretStore::open_shared(&secrets_dir)
    } else {
        tb_engine::registration::SecretStore::open(&secrets_dir)
    }
    .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let catalog = catalog.with_fingerprints(|s| secrets.fingerprint(s));
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full("tb_attempt_duration_seconds".into()),
            &[
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                15.0, 30.0,
            ],
        )
        .context("metrics buckets")?
        .install_recorder()
        .context("installing the metrics recorder")?;
    let engine = Engine::start(store.clone(), catalog)
        .await
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    engine.set_ingress_quotas(quotas);
    engine.set_failed_keys_limit(failed_keys_per_min);
    // The audit chain's key, derived from the sealing key: the database does not hold it
    // (docs/operations.md, "The audit log"). Set before the first append below.
    engine.set_audit_key(secrets.sealing_key().ok().map(|k| k.audit_key()));
    audit_config_load(&engine, &args.config, &replica, keys.len()).await;
    if server.webhook_allow_private == Some(true) {
        tracing::warn!(
            "webhook_allow_private is on: outbound webhooks may reach private addresses"
        );
        engine
            .webhook_allow_private
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    engine.webhooks_durable.store(
        server.webhooks_durable.unwrap_or(true),
        std::sync::atomic::Ordering::Relaxed,
    );
    let registered = tb_engine::registration::load_registered(&engine, &secrets)
        .await
        .map_err(|e| anyhow::anyhow!("loading registered subscriptions: {}", e.message))?;
    let hooks = tb_engine::webhooks::load(&engine, &secrets)
        .await
        .map_err(|e| anyhow::anyhow!("loading webhooks: {}", e.message))?;
    if hooks > 0 {
        tracing::info!(webhooks = hooks, "outbound webhooks loaded");
    }
    if registered > 0 {
        tracing::info!(registered, "registered trigger subscriptions loaded");
    }

    crate::http_server::fit_open_files_limit(edge.max_connections);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let local = listener.local_addr()?;
    print_banner(&engine, local, &opened.label, role, &replica);

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let wcfg = WorkerConfig {
        owner: replica.clone(),
        lease_ms: server.lease_ms.unwrap_or(60_000),
        ..WorkerConfig::default()
    };
    let worker = role
        .runs_worker()
        .then(|| tokio::spawn(worker::run(engine.clone(), wcfg, stop_rx.clone())));
    // Durable timers of waits run with the worker role.
    let timers = role
        .runs_worker()
        .then(|| tokio::spawn(tb_engine::sessions::timers(engine.clone(), stop_rx.clone())));
    // Queue subscriptions consume with the worker role, one durable consumer per subscription shared
    // by every replica. The client reconnects on its own; until it is connected the consumers show
    // degraded in /ready.
    // The deployment has a queue bus when one is configured, whichever role this process runs (an
    // api replica answers discovery for the worker replicas that consume).
    engine
        .queue_bus
        .store(nats_url.is_some(), std::sync::atomic::Ordering::Relaxed);
    let client = match &nats_url {
        Some(url) => {
            crate::config::check_nats_url(url)
                .map_err(|e| anyhow::anyhow!("--nats-url / [server].nats_url: {e}"))?;
            let c = async_nats::ConnectOptions::new()
                .retry_on_initial_connect()
                .name(format!("trigger-bridge {replica}"))
                .connect(url.as_str())
                .await
                .map_err(|e| anyhow::anyhow!("cannot use the NATS server {url:?}: {e}"))?;
            tracing::info!(url = %url, "NATS: JetStream queues, the triggers.v2 orchestrator and the nats executor");
            engine.set_nats(c.clone());
            Some(c)
        }
        None => {
            let nats_runs = engine
                .catalog()
                .workflows()
                .filter(|w| matches!(w.executor, tb_core::workflow::Executor::Nats { .. }))
                .count();
            if nats_runs > 0 {
                tracing::warn!(workflows = nats_runs, "workflows use the nats executor but no NATS server is set (--nats-url): their deliveries fail with nats_unavailable");
            }
            None
        }
    };
    let queues = role.runs_worker().then(|| {
        tokio::spawn(tb_engine::queue::run(
            engine.clone(),
            client.clone(),
            stop_rx.clone(),
        ))
    });
    // The triggers.v2 orchestrator (manifest register/fetch, heartbeats) answers from the store on
    // every replica, one per request (a queue group).
    let orchestrator = client.clone().map(|c| {
        tokio::spawn(tb_engine::orchestrator::run(
            engine.clone(),
            c,
            stop_rx.clone(),
        ))
    });
    // Cron schedules fire with the worker role; every replica runs the loop, and the ticks' dedup
    // keys and the cursor's compare-and-set make each tick fire once (no leader).
    let scheduler = role
        .runs_worker()
        .then(|| tokio::spawn(tb_engine::scheduler::run(engine.clone(), stop_rx.clone())));
    // Duplicate counters are kept in memory by ingest: flushed where ingest runs.
    let dups = role
        .serves_api()
        .then(|| tokio::spawn(tb_engine::duplicates::run(engine.clone(), stop_rx.clone())));
    // Rate-limit and refusal counts, shared through the store once a second, and the automatic
    // quarantine rule once a minute: where ingest runs.
    let counts = role
        .serves_api()
        .then(|| tokio::spawn(tb_engine::rate_limit::run(engine.clone(), stop_rx.clone())));
    // Configuration another replica changed (pause, revocation, registration, webhooks) reaches this
    // one through the store's change log; harmless with one process.
    let sync = tokio::spawn(tb_engine::sync::run(
        engine.clone(),
        Some(secrets.clone()),
        stop_rx.clone(),
    ));
    // Due deliveries and session changes committed by another replica wake this one's worker and
    // long-polls at once (PostgreSQL LISTEN); ends at once on SQLite.
    let wake = tokio::spawn(tb_engine::wake::run(engine.clone(), stop_rx.clone()));
    // Signed checkpoints of the audit log's head, in the log (docs/operations.md, "The audit log").
    let checkpoints = tokio::spawn(tb_engine::audit::checkpoints(
        engine.clone(),
        std::time::Duration::from_secs(
            server
                .audit_checkpoint_secs
                .unwrap_or(tb_engine::audit::DEFAULT_CHECKPOINT_EVERY.as_secs()),
        ),
        stop_rx.clone(),
    ));
    let sweeper = role.runs_worker().then(|| {
        tokio::spawn(tb_engine::sweeper::run(
            engine.clone(),
            tb_engine::sweeper::SweeperConfig::in_days(
                server.body_retention(),
                server.dead_letter_retention(),
                std::time::Duration::from_secs(60),
            ),
            stop_rx.clone(),
        ))
    });

    let state = tb_api::AppState {
        engine: engine.clone(),
        metrics: Some(metrics),
        keys: tb_api::auth::ApiKeys(std::sync::Arc::new(keys)),
        secrets: Some(secrets),
        host: tb_api::discovery::HostInfo {
            host_id: server
                .host_id
                .clone()
                .unwrap_or_else(|| "trigger-bridge".into()),
            dead_letter_retention_days: server.dead_letter_retention(),
            ..Default::default()
        },
    };
    let app = if role.serves_api() {
        // The operator console is served beside the API, over the API's handlers.
        tb_api::router(state.clone()).merge(tb_console::router(state))
    } else {
        ops_router(state)
    };
    let app = tb_api::body::layer(
        app,
        tb_api::body::BodyRules {
            timeout: Duration::from_millis(edge.body_timeout_ms),
            min_rate_bytes_per_s: edge.body_min_rate_bytes_per_s,
            min_rate_grace: Duration::from_millis(edge.body_min_rate_grace_ms),
        },
        Arc::new(
            tb_api::body::IngestGate::new(edge.max_inflight_bodies, edge.body_budget_bytes)
                .with_per_target(edge.max_inflight_bodies_per_target)
                .with_per_client(edge.max_inflight_bodies_per_client),
        ),
    );
    // Every answer, the body layer's own refusals included, carries `X-Content-Type-Options: nosniff`.
    let app = app.layer(axum::middleware::map_response(tb_api::nosniff));
    let open = Arc::new(crate::http_server::OpenConnections::default());
    let grace = Duration::from_millis(edge.body_timeout_ms);
    let http = crate::http_server::serve(
        listener,
        app,
        crate::http_server::EdgeConfig {
            header_timeout: Duration::from_millis(edge.header_timeout_ms),
            idle_timeout: Duration::from_millis(edge.idle_timeout_ms),
            max_connections: edge.max_connections,
            max_connections_per_client: edge.max_connections_per_client,
            shutdown_grace: grace,
        },
        trusted_proxies,
        open.clone(),
        stop_rx.clone(),
    );
    let closing = engine.clone();
    let signals = tokio::spawn(async move {
        let mut signals = Signals::new();
        signals.next().await;
        tracing::info!(
            attempts_in_flight = closing.attempts_in_flight.load(Ordering::Relaxed),
            connections_open = open.get(),
            grace_ms = grace.as_millis() as u64,
            "shutting down: no new connections; waiting for the attempts in flight to record their outcome and for open connections (closed after the grace); a second signal exits at once"
        );
        let _ = stop_tx.send(true);
        // Long-polls (turns:claim, waits) answer now instead of holding the shutdown.
        closing.close();
        signals.next().await;
        tracing::warn!(
            attempts_in_flight = closing.attempts_in_flight.load(Ordering::Relaxed),
            connections_open = open.get(),
            "second signal: exiting now without waiting (attempts in flight are retried after their lease)"
        );
        std::process::exit(130);
    });
    http.await;
    if let Some(w) = worker {
        let _ = w.await;
    }
    if let Some(t) = timers {
        let _ = t.await;
    }
    for t in [dups, counts, sweeper, scheduler, queues, orchestrator]
        .into_iter()
        .flatten()
    {
        let _ = t.await;
    }
    let _ = sync.await;
    let _ = wake.await;
    let _ = checkpoints.await;
    store.close().await;
    signals.abort();
    tracing::info!("stopped cleanly");
    Ok(())
}

/// The HTTP face of `--role worker`: `/health`, `/ready` and `/metrics` only; everything else is the
/// API's 404 envelope.
fn ops_router(state: tb_api::AppState) -> axum::Router {
    use axum::routing::get;
    axum::Router::new()
        .route("/health", get(tb_api::ops::health))
        .route("/ready", get(tb_api::ops::ready))
        .route("/metrics", get(tb_api::ops::metrics))
        .fallback(tb_api::error::not_found)
        .layer(axum::middleware::from_fn(tb_api::error::envelope_errors))
        .with_state(state)
}

fn print_banner(engine: &Engine, addr: SocketAddr, store: &str, role: Role, replica: &str) {
    println!(
        "trigger-bridge {} listening on http://{addr}",
        env!("CARGO_PKG_VERSION")
    );
    println!("store: {store}");
    println!("role: {}, replica: {replica}", role.as_str());
    if !role.serves_api() {
        println!("ingest and the API are served by the api replicas (this one: /health, /ready, /metrics)");
        return;
    }
    println!("console: http://{addr}/ui");
    println!("ingest URLs:");
    let catalog = engine.catalog();
    let w = catalog
        .subscriptions()
        .map(|s| s.id.len())
        .max()
        .unwrap_or(0);
    for s in catalog.subscriptions() {
        match &s.connector {
            tb_core::connector::ConnectorSpec::Schedule(spec) => println!(
                "  {:<w$}  {:<18} cron \"{}\" in {} (no ingest URL; trigger-bridge schedules next {})",
                s.id, "schedule", spec.cron, spec.timezone, s.id
            ),
            tb_core::connector::ConnectorSpec::Nats(q) => println!(
                "  {:<w$}  {:<18} JetStream stream {} (no ingest URL; consumer {})",
                s.id,
                "nats",
                q.stream,
                q.consumer_name(&s.id)
            ),
            _ => println!(
                "  {:<w$}  {:<18} http://{addr}/v1/trigger-subscriptions/{}/ingest",
                s.id,
                s.connector.name(),
                s.id
            ),
        }
    }
    let github = catalog
        .subscriptions()
        .find(|s| s.connector.name() == "github")
        .cloned();
    if let Some(s) = github {
        println!("send a test event:");
        println!(
            "  trigger-bridge send --url http://{addr}/v1/trigger-subscriptions/{}/ingest --connector github \\\n    --secret \"$GITHUB_WEBHOOK_SECRET\" --event pull_request --file tests/fixtures/github/pull_request/00-opened.json",
            s.id
        );
        println!("  trigger-bridge runs list --server http://{addr}");
    }
}

/// SIGINT (Ctrl-C) and SIGTERM, listened to from start to exit so a second one is seen too.
struct Signals {
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Signals {
                int: signal(SignalKind::interrupt()).expect("SIGINT handler"),
                term: signal(SignalKind::terminate()).expect("SIGTERM handler"),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// Waits for the next SIGINT or SIGTERM.
    async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Records in the audit log that this replica loaded its configuration: the file's
/// SHA-256, so a changed file shows as a new hash between two loads. A failed append is logged; the
/// server still starts.
async fn audit_config_load(engine: &Engine, path: &std::path::Path, replica: &str, keys: usize) {
    use sha2::Digest;
    let hash = std::fs::read(path)
        .map(|b| hex::encode(sha2::Sha256::digest(&b)))
        .unwrap_or_default();
    // Secret rotations in force: which subscriptions still accept a previous secret, and
    // until when. Never the secrets.
    let rotations: serde_json::Map<String, serde_json::Value> = engine
        .catalog()
        .subscriptions()
        .filter_map(|s| {
            s.previous_secret
                .as_ref()
                .map(|p| (s.id.clone(), tb_store::rfc3339(p.until_ms).into()))
        })
        .collect();
    let mut detail = serde_json::json!({"configSha256": hash, "apiKeys": keys});
    if !rotations.is_empty() {
        detail["secretRotations"] = rotations.into();
    }
    let e = tb_core::audit::NewEntry {
        at: tb_engine::clock::now_ms(),
        actor: format!("replica:{replica}"),
        action: "config.load".into(),
        target: path.display().to_string(),
        outcome: "ok".into(),
        detail: detail.to_string(),
    };
    if let Err(err) = engine.append_audit(e).await {
        tracing::error!(error = %err, "the audit entry of the configuration load was not recorded");
    }
}
