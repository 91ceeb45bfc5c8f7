//! `trigger-bridge`: the server (`serve`), its maintenance commands (`migrate`, `check-config`), the
//! provider-exact signer (`send`), and client commands over the HTTP API.

// mimalloc instead of glibc's allocator: on the ingest path malloc/free were ~19 % of the server's
// instructions, with futex contention when the writer thread frees what request threads allocated
// (bench/analysis.md, "Where a request's CPU goes").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod api_client;
mod audit_client;
mod bench;
mod client;
mod completions;
mod data_lock;
mod http_server;
mod mcp_cmd;
mod migrate;
mod migrate_copy;
mod replay_client;
mod replica;
mod role;
mod schedules_client;
mod send;
mod serve;
mod services_client;
mod sessions_client;
mod store_open;
mod sweep;
mod telemetry;
mod test_worker;

use trigger_bridge::{config, db_url, listen};

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Durable inbound-work bridge: every webhook that reaches it starts exactly one piece of work.
#[derive(Parser, Debug)]
#[command(name = "trigger-bridge", version, about, long_about = None)]
struct Cli {
    /// Client options (`--server`, `--json`, `--api-key`), global: accepted before or after the
    /// command group (`trigger-bridge --server URL runs list` = `trigger-bridge runs list --server URL`).
    #[command(flatten)]
    client: api_client::ClientOpts,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the server: ingest endpoints, delivery worker and API (or one of them: --role).
    Serve(serve::ServeArgs),
    /// Create or upgrade the store's schema, then exit.
    Migrate(migrate::MigrateArgs),
    /// Run one retention pass now (settled receipts' bodies, old dead letters, expired idempotency and
    /// signal records), print what it removed, then exit. A SQLite store's server must be stopped.
    Sweep(sweep::SweepArgs),
    /// Validate a config file (connectors, secrets, workflows, bindings) and say what to fix.
    CheckConfig {
        /// Configuration file (TOML).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Print the SHA-256 of an API key read from stdin (one line; a trailing newline is not part of
    /// the key), for `[[api_keys]] sha256 = "..."`: `echo -n "$KEY" | trigger-bridge hash-key`
    HashKey,
    /// Sign and post a payload file exactly as the provider would.
    Send(send::SendArgs),
    /// Load generator and benchmarks (storage, ingest, e2e, outbound, drain).
    Bench {
        #[command(subcommand)]
        cmd: bench::BenchCmd,
    },
    /// Inspect receipts (one per inbound request).
    Receipts {
        #[command(subcommand)]
        cmd: client::ReceiptsCmd,
    },
    /// Inspect deliveries (one per receipt and matching binding) and their attempts.
    Deliveries {
        #[command(subcommand)]
        cmd: client::DeliveriesCmd,
    },
    /// Inspect runs; drive sessions (waits, prompts, turns) and cancel runs.
    Runs {
        #[command(subcommand)]
        cmd: client::RunsCmd,
    },
    /// List, pause, resume, quarantine and release trigger subscriptions; rotate a registered one's
    /// signing secret; their request counts.
    Subscriptions {
        #[command(subcommand)]
        cmd: client::SubscriptionsCmd,
    },
    /// Create, list, preview, pause, resume and retire cron schedules.
    Schedules {
        #[command(subcommand)]
        cmd: schedules_client::SchedulesCmd,
    },
    /// The audit log of operator actions; `audit list --verify` checks its hash chain.
    Audit {
        #[command(subcommand)]
        cmd: audit_client::AuditCmd,
    },
    /// List the triggers.v2 services registered over NATS and their liveness.
    Services {
        #[command(subcommand)]
        cmd: services_client::ServicesCmd,
    },
    /// Raise and inspect signals on runs (sessions).
    Signals {
        #[command(subcommand)]
        cmd: sessions_client::SignalsCmd,
    },
    /// List bindings; revoke or restore one at once.
    Bindings {
        #[command(subcommand)]
        cmd: sessions_client::BindingsCmd,
    },
    /// A flaky HTTP worker for the quickstart: answers the http executor's runs with 200 or 500
    TestWorker(test_worker::TestWorkerArgs),
    /// Print a shell completion script (bash, zsh or fish) to stdout
    Completions {
        /// Shell to complete for
        #[arg(value_enum)]
        shell: completions::CompletionShell,
    },
    /// Model Context Protocol server for agents: session tools (wait_for_signal, wait_for_any,
    /// raise_signal, claim_turn, ...) and, with webhooks:manage, operator tools; stdio by default.
    Mcp(mcp_cmd::McpArgs),
    /// Mint, list and revoke capability URLs (POST /v1/hooks/{token} raises one signal on one run).
    Capabilities {
        #[command(subcommand)]
        cmd: sessions_client::CapabilitiesCmd,
    },
}

/// Client commands die quietly on a closed pipe (`trigger-bridge runs show ID | head`) like other Unix
/// tools, instead of panicking on the write. Never for `serve`, `bench`, `test-worker` or `mcp`, whose
/// sockets must keep Rust's default (SIGPIPE ignored, EPIPE returned): hyper writes with `writev`,
/// which raises SIGPIPE when the server closed first (a 413 answered before the body was read), and
/// that must be an error result, not a silent death.
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: called once at start, before any thread exists; only resets a signal disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// The log subscriber (and, with an OTLP endpoint, the span exporter: [`telemetry::init`]).
fn init_tracing(
    otlp_endpoint: Option<&str>,
    replica: &str,
) -> anyhow::Result<
    Option<(
        opentelemetry_sdk::trace::SdkTracerProvider,
        telemetry::OtlpClient,
    )>,
> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info".into())
        .add_directive(
            format!("{}=trace", replica::SPAN_TARGET)
                .parse()
                .expect("a valid directive"),
        );
    let json = std::env::var("TRIGGER_BRIDGE_LOG_FORMAT").is_ok_and(|v| v == "json");
    // Colours only on a terminal: log files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    telemetry::init(filter, json, ansi, otlp_endpoint, Some(replica))
}

/// `serve` on a runtime whose every thread (and the main thread) stays inside the span
/// `replica{replica=<id>}`: every log line of the process carries the replica id, and every span made
/// in it is its child. Errors: a refused `--replica-id`, a runtime that cannot start, or `serve`'s own.
fn serve_as_replica(args: serve::ServeArgs) -> anyhow::Result<i32> {
    let replica = args.replica_id()?;
    let otlp = init_tracing(args.otlp_endpoint.as_deref(), &replica)?;
    let span = replica::span(&replica);
    let thread_span = span.clone();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(move || {
            // Entered for the thread's whole life: never exited, so the guard is leaked on purpose.
            std::mem::forget(thread_span.clone().entered());
        })
        .build()?;
    let (provider, client) = otlp.unzip();
    if let Some(c) = &client {
        c.runtime(rt.handle().clone());
    }
    let _main = span.entered();
    let result = rt.block_on(serve::run(args, replica)).map(|_| 0);
    // The last spans are sent while the runtime still runs (their requests run on it).
    telemetry::shutdown(provider);
    result
}

/// mimalloc's `mi_option_purge_delay` (its `mimalloc.h`, enum `mi_option_e`, the same index in its v2
/// and v3): how long freed memory stays committed before it goes back to the OS, in ms (default 10).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() -> ExitCode {
    // Freed memory goes back to the OS at once: a burst of large bodies must not leave the process
    // holding their pages past the body budget (docs/limits.md; `crates/cli/tests/edge.rs`, ten parallel
    // 25 MiB bodies peak at ~1.45x their size with mimalloc's default delay, ~1.25x with none).
    // SAFETY: set before any other thread exists; mimalloc reads the option when it purges.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
    let cli = Cli::parse();
    if !matches!(
        cli.cmd,
        Cmd::Serve(_) | Cmd::Bench { .. } | Cmd::TestWorker(_) | Cmd::Mcp(_)
    ) {
        restore_sigpipe();
    }
    let result = match cli.cmd {
        Cmd::Serve(a) => serve_as_replica(a),
        cmd => tokio::runtime::Runtime::new()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(command(cli.client, cmd))),
    };
    match result {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Every command but `serve`.
async fn command(opts: api_client::ClientOpts, cmd: Cmd) -> anyhow::Result<i32> {
    match cmd {
        Cmd::Serve(_) => unreachable!("serve runs on its own runtime"),
        Cmd::Migrate(a) if a.copy.requested() => migrate_copy::run(a.copy).await.map(|()| 0),
        Cmd::Migrate(a) => migrate::run(a).await,
        Cmd::Sweep(a) => sweep::run(a, opts.json).await,
        Cmd::CheckConfig { config } => match config::load(&config) {
            Ok(l) => {
                let (s, b, w) = &l.catalog_parts;
                let keys = match l.api_keys.len() {
                    0 => "no API keys: the management API is open".to_string(),
                    _ => format!(
                        "API keys: {}",
                        l.api_keys
                            .iter()
                            .map(|k| k.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                };
                println!(
                    "{}: ok ({} subscriptions, {} workflows, {} bindings); {keys}",
                    config.display(),
                    s.len(),
                    w.len(),
                    b.len()
                );
                for n in &l.notes {
                    println!("  note: {n}");
                }
                let nats_runs = w
                    .iter()
                    .filter(|w| matches!(w.executor, tb_core::workflow::Executor::Nats { .. }))
                    .count();
                let env_url = std::env::var("TRIGGER_BRIDGE_NATS_URL").is_ok_and(|v| !v.is_empty());
                if nats_runs > 0 && l.server.nats_url.is_none() && !env_url {
                    eprintln!("note: {nats_runs} workflow(s) use the nats executor and the config sets no [server] nats_url: serve needs --nats-url (or TRIGGER_BRIDGE_NATS_URL), else their deliveries fail with nats_unavailable");
                }
                Ok(0)
            }
            Err(errs) => {
                eprintln!("{} has {} problem(s):", config.display(), errs.len());
                for e in errs {
                    eprintln!("  - {e}");
                }
                Ok(1)
            }
        },
        Cmd::HashKey => (|| {
            let mut key = String::new();
            std::io::stdin().read_line(&mut key)?;
            let key = key.trim_end_matches(['\r', '\n']);
            anyhow::ensure!(
                !key.is_empty(),
                "no key on stdin; usage: echo -n \"$KEY\" | trigger-bridge hash-key"
            );
            if key.len() < 24 {
                // A guessable key guards every scope it holds; warn, but let a test key through.
                eprintln!(
                    "warning: a key of {} characters is easy to guess; use at least 24 random ones \
                     (e.g. tbk_$(openssl rand -hex 24))",
                    key.len()
                );
            }
            println!("sha256 = \"{}\"", hex::encode(tb_api::auth::digest(key)));
            Ok(0)
        })(),
        Cmd::Send(a) => send::run(a).await,
        Cmd::Bench { cmd } => bench::run(cmd).await.map(|_| 0),
        Cmd::Receipts { cmd } => client::receipts(&opts, cmd).await.map(|_| 0),
        Cmd::Deliveries { cmd } => client::deliveries(&opts, cmd).await.map(|_| 0),
        Cmd::Runs { cmd } => client::runs(&opts, cmd).await.map(|_| 0),
        Cmd::Subscriptions { cmd } => client::subscriptions(&opts, cmd).await.map(|_| 0),
        Cmd::Schedules { cmd } => schedules_client::schedules(&opts, cmd).await.map(|_| 0),
        Cmd::Services { cmd } => services_client::services(&opts, cmd).await.map(|_| 0),
        Cmd::Audit { cmd } => audit_client::audit(&opts, cmd).await,
        Cmd::Signals { cmd } => sessions_client::signals(&opts, cmd).await.map(|_| 0),
        Cmd::Bindings { cmd } => sessions_client::bindings(&opts, cmd).await.map(|_| 0),
        Cmd::Capabilities { cmd } => sessions_client::capabilities(&opts, cmd).await.map(|_| 0),
        Cmd::TestWorker(a) => test_worker::run(a).await.map(|_| 0),
        Cmd::Mcp(a) => mcp_cmd::run(&opts, a).await.map(|_| 0),
        Cmd::Completions { shell } => {
            completions::write::<Cli>(shell, &mut std::io::stdout());
            Ok(0)
        }
    }
}
