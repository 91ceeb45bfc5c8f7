//! `trigger-bridge bench`: load generator and benchmarks. Speed goals are measured here,
//! never asserted in tests. Every command shows progress on stderr and ends with ONE summary line on
//! stdout that a script can parse, e.g. `ingest: 12345 req/s, p50 1.2 ms, p90 2.0 ms, p99 8.4 ms, max
//! 20.1 ms, errors 0`.

mod drain;
mod load;
mod outbound;
mod report;
mod services;
mod sources;
mod storage;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;

/// Options every load-driving command shares.
#[derive(clap::Args, Debug, Clone)]
pub struct LoadOpts {
    /// How long to drive load, in seconds
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Concurrent connections (each keeps one HTTP/1.1 keep-alive connection busy)
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// Base URL of the server under test; several replicas as a comma-separated list (connection i
    /// goes to replica i mod n, as a round-robin load balancer would spread them)
    #[arg(
        long,
        default_value = "http://127.0.0.1:8080",
        env = "TRIGGER_BRIDGE_SERVER"
    )]
    pub server: String,
    /// Trigger subscription to post to (a standard-webhooks subscription)
    #[arg(long, default_value = "standard")]
    pub subscription: String,
    /// Its whsec_ secret
    #[arg(long, env = "STANDARD_WEBHOOK_SECRET", hide_env_values = true)]
    pub secret: String,
    /// Open loop: send at this many requests per second in total (latency counts from the scheduled
    /// send time, so a slow server is not hidden); default: closed loop (each connection sends as soon
    /// as its previous answer arrived)
    #[arg(long)]
    pub rate: Option<f64>,
    /// Share of requests that repeat an earlier webhook-id (0.0 to 1.0)
    #[arg(long, default_value_t = 0.0)]
    pub duplicates: f64,
    /// Request body size in bytes
    #[arg(long, default_value_t = 1024)]
    pub body_bytes: usize,
    /// Storage baseline in rows/s (from `bench storage`), to report throughput as a ratio of it
    #[arg(long)]
    pub baseline: Option<f64>,
}

impl LoadOpts {
    fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.duration.max(0.1))
    }

    /// The replicas of `--server`, each without a trailing `/` (at least one).
    pub fn servers(&self) -> Vec<String> {
        let list: Vec<String> = self
            .server
            .split(',')
            .map(|s| s.trim().trim_end_matches('/').to_string())
            .filter(|s| !s.is_empty())
            .collect();
        if list.is_empty() {
            vec![self.server.clone()]
        } else {
            list
        }
    }

    /// The first replica of `--server` (reads that any replica can answer go there).
    pub fn first_server(&self) -> String {
        self.servers().swap_remove(0)
    }
}

/// `bench` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum BenchCmd {
    /// Storage limit: raw rate of committing 1 KiB rows with fsync, with the store's SQLite settings and
    /// its group-commit writer (the baseline ingest is compared against)
    Storage {
        /// How long to run, in seconds
        #[arg(long, default_value_t = 10.0)]
        duration: f64,
        /// Concurrent writers feeding the group commit
        #[arg(long, default_value_t = 32)]
        connections: usize,
        /// Row size in bytes
        #[arg(long, default_value_t = 1024)]
        row_bytes: usize,
        /// Directory for the scratch database (use the server's disk); removed afterwards
        #[arg(long, default_value = "./data")]
        data_dir: PathBuf,
    },
    /// Ingest: signed Standard Webhooks requests with unique ids (and --duplicates) to a running server
    Ingest(LoadOpts),
    /// End to end: ingest, then the time from each request to its run's `run.started` event
    E2e(LoadOpts),
    /// Outbound: runs delivered by the http executor to a local receiver started by this command
    Outbound {
        #[command(flatten)]
        load: LoadOpts,
        /// Port of the local receiver (the server's http workflow must point at it)
        #[arg(long, default_value_t = 18091)]
        receiver_port: u16,
        /// Share of receiver answers that are 500 (0.0 to 1.0)
        #[arg(long, default_value_t = 0.0)]
        fail_rate: f64,
    },
    /// Backlog drain: start a server without its worker, queue --count deliveries, restart it with the
    /// worker, and time the drain and the server's peak RSS
    Drain {
        /// Server configuration (its `standard` subscription must bind a noop run)
        #[arg(long, default_value = "bench/bench.toml")]
        config: PathBuf,
        /// Deliveries to queue
        #[arg(long, default_value_t = 100_000)]
        count: u64,
        /// Concurrent connections used to queue them
        #[arg(long, default_value_t = 64)]
        connections: usize,
        /// Store directory of the server under test (wiped first)
        #[arg(long, default_value = "./data/bench-drain")]
        data_dir: PathBuf,
        /// Run the server under test on this PostgreSQL database instead (not wiped: give it an empty
        /// schema, e.g. `?options=-c%20search_path%3Dbench`)
        #[arg(long)]
        database_url: Option<String>,
        /// Port for the server under test
        #[arg(long, default_value_t = 18090)]
        port: u16,
        /// Its whsec_ secret
        #[arg(long, env = "STANDARD_WEBHOOK_SECRET", hide_env_values = true)]
        secret: String,
    },
    /// Schedules: N schedules firing every minute, one scheduler pass per simulated minute (in
    /// process, scratch SQLite store): ticks/s, how late the last tick fires, CPU per tick
    Schedules {
        /// Schedules
        #[arg(long, default_value_t = 10_000)]
        count: usize,
        /// Simulated minutes
        #[arg(long, default_value_t = 3)]
        minutes: usize,
        /// Directory for the scratch store; removed afterwards
        #[arg(long, default_value = "./data")]
        data_dir: PathBuf,
    },
    /// Queue: M messages published to a fresh JetStream stream, then consumed (in process, scratch
    /// SQLite store): messages/s to receipts and to runs, CPU per message
    Queue {
        /// Messages
        #[arg(long, default_value_t = 10_000)]
        messages: usize,
        #[command(flatten)]
        on: InProcess,
    },
    /// Services: signed GitHub webhooks -> nats executor -> a triggers.v2 service (in process) ->
    /// CompletionEvent -> run completed; actions/s, p50/p99 latency, CPU per action (scratch SQLite
    /// store; needs NATS with JetStream)
    Services {
        /// Webhooks (= runs = actions)
        #[arg(long, default_value_t = 5_000)]
        events: usize,
        /// Senders, each waiting for its run to end before the next webhook
        #[arg(long, default_value_t = 32)]
        connections: usize,
        #[command(flatten)]
        on: InProcess,
    },
}

/// Where an in-process NATS bench runs: the NATS server and the scratch store's directory.
#[derive(clap::Args, Debug)]
pub struct InProcess {
    /// NATS server with JetStream
    #[arg(
        long,
        default_value = "nats://127.0.0.1:4222",
        env = "TRIGGER_BRIDGE_NATS_URL"
    )]
    nats_url: String,
    /// Directory for the scratch store; removed afterwards
    #[arg(long, default_value = "./data")]
    data_dir: PathBuf,
}

/// Runs a bench command.
pub async fn run(cmd: BenchCmd) -> Result<()> {
    match cmd {
        BenchCmd::Storage {
            duration,
            connections,
            row_bytes,
            data_dir,
        } => {
            storage::run(
                Duration::from_secs_f64(duration),
                connections,
                row_bytes,
                &data_dir,
            )
            .await
        }
        BenchCmd::Ingest(o) => {
            let r = load::drive(&o, "ingest").await?;
            println!("{}", report::summary("ingest", &r, o.baseline));
            Ok(())
        }
        BenchCmd::E2e(o) => {
            let r = load::drive(&o, "e2e").await?;
            println!("{}", report::summary("e2e ingest", &r, o.baseline));
            let h = load::run_started_latency(&o, &r).await?;
            println!("{}", report::latency_line("e2e request->run.started", &h));
            Ok(())
        }
        BenchCmd::Outbound {
            load,
            receiver_port,
            fail_rate,
        } => outbound::run(&load, receiver_port, fail_rate).await,
        BenchCmd::Schedules {
            count,
            minutes,
            data_dir,
        } => sources::schedules(count, minutes.max(1), &data_dir).await,
        BenchCmd::Queue { messages, on } => {
            sources::queue(messages.max(1), &on.nats_url, &on.data_dir).await
        }
        BenchCmd::Services {
            events,
            connections,
            on,
        } => {
            services::services(
                events.max(1),
                connections.max(1),
                &on.nats_url,
                &on.data_dir,
            )
            .await
        }
        BenchCmd::Drain {
            config,
            count,
            connections,
            data_dir,
            database_url,
            port,
            secret,
        } => {
            drain::run(
                &config,
                count,
                connections,
                &data_dir,
                database_url.as_deref(),
                port,
                &secret,
            )
            .await
        }
    }
}
