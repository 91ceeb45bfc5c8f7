//! `trigger-bridge serve`: opens (and migrates) the store, starts the engine, the delivery worker and
//! the HTTP API, and shuts down gracefully on SIGINT / SIGTERM (stop accepting, let attempts in flight
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
use tb_store::sqlite::SqliteStore;
use tb_store::Store;

use crate::config;

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
    #[arg(long, env = "TRIGGER_BRIDGE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Do not run the delivery worker: ingest and API only (another process delivers, or the backlog
    /// waits; used by `bench drain`)
    #[arg(long)]
    pub no_worker: bool,
}

/// Runs the server until a shutdown signal.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let override_listen = args.listen.is_some();
    let loaded = config::load_with(&args.config, |c| {
        if override_listen {
            c.server.listen = None;
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
    let data_dir = args
        .data_dir
        .or(server.data_dir)
        .unwrap_or_else(|| PathBuf::from("./data"));
    // Held until the process ends: a second server on this directory is refused.
    let _lock = crate::data_lock::acquire(&data_dir)?;
    let store_opts = tb_store::sqlite::StoreOptions {
        writer: tb_store::sqlite::writer::WriterOptions {
            queue_capacity: writer_queue_capacity,
        },
        ..Default::default()
    };
    let store = SqliteStore::open_dir_with(&data_dir, store_opts)
        .with_context(|| format!("opening the store in {}", data_dir.display()))?;
    let db_path = store.path().to_path_buf();
    let secrets = tb_engine::registration::SecretStore::open(&data_dir.join("secrets"))
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let catalog = catalog.with_fingerprints(|s| secrets.fingerprint(s));
    let store: Arc<dyn Store> = Arc::new(store);
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
    print_banner(&engine, local, &db_path);

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let wcfg = WorkerConfig {
        lease_ms: server.lease_ms.unwrap_or(60_000),
        ..WorkerConfig::default()
    };
    let worker =
        (!args.no_worker).then(|| tokio::spawn(worker::run(engine.clone(), wcfg, stop_rx.clone())));
    // Durable timers of waits run with the worker role.
    let timers = (!args.no_worker)
        .then(|| tokio::spawn(tb_engine::sessions::timers(engine.clone(), stop_rx.clone())));
    let dups = tokio::spawn(tb_engine::duplicates::run(engine.clone(), stop_rx.clone()));
    let day = std::time::Duration::from_secs(86_400);
    let sweeper = tokio::spawn(tb_engine::sweeper::run(
        engine.clone(),
        tb_engine::sweeper::SweeperConfig {
            interval: std::time::Duration::from_secs(60),
            body_retention: day * server.body_retention_days.unwrap_or(7),
            dead_letter_retention: day * server.dead_letter_retention_days.unwrap_or(14),
            batch: 1000,
        },
        stop_rx.clone(),
    ));

    let app = tb_api::router(tb_api::AppState {
        engine: engine.clone(),
        metrics: Some(metrics),
        keys: tb_api::auth::ApiKeys(std::sync::Arc::new(keys)),
        secrets: Some(secrets),
        host: tb_api::discovery::HostInfo {
            host_id: server
                .host_id
                .clone()
                .unwrap_or_else(|| "trigger-bridge".into()),
            dead_letter_retention_days: server.dead_letter_retention_days.unwrap_or(14),
            ..Default::default()
        },
    });
    let app = tb_api::body::layer(
        app,
        tb_api::body::BodyRules {
            timeout: Duration::from_millis(edge.body_timeout_ms),
            min_rate_bytes_per_s: edge.body_min_rate_bytes_per_s,
            min_rate_grace: Duration::from_millis(edge.body_min_rate_grace_ms),
        },
        Arc::new(
            tb_api::body::IngestGate::new(edge.max_inflight_bodies, edge.body_budget_bytes)
                .with_per_target(edge.max_inflight_bodies_per_target),
        ),
    );
    let open = Arc::new(crate::http_server::OpenConnections::default());
    let grace = Duration::from_millis(edge.body_timeout_ms);
    let http = crate::http_server::serve(
        listener,
        app,
        crate::http_server::EdgeConfig {
            header_timeout: Duration::from_millis(edge.header_timeout_ms),
            idle_timeout: Duration::from_millis(edge.idle_timeout_ms),
            max_connections: edge.max_connections,
            shutdown_grace: grace,
        },
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
    let _ = dups.await;
    let _ = sweeper.await;
    store.close().await;
    signals.abort();
    tracing::info!("stopped cleanly");
    Ok(())
}

fn print_banner(engine: &Engine, addr: SocketAddr, db: &std::path::Path) {
    println!(
        "trigger-bridge {} listening on http://{addr}",
        env!("CARGO_PKG_VERSION")
    );
    println!("store: {}", db.display());
    println!("ingest URLs:");
    let catalog = engine.catalog();
    let w = catalog
        .subscriptions()
        .map(|s| s.id.len())
        .max()
        .unwrap_or(0);
    for s in catalog.subscriptions() {
        println!(
            "  {:<w$}  {:<18} http://{addr}/v1/trigger-subscriptions/{}/ingest",
            s.id,
            s.connector.name(),
            s.id
        );
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
