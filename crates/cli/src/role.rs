//! `serve --role`: which parts of the server a process runs, so ingest/API replicas and delivery
//! replicas can be scaled apart on one PostgreSQL database.

/// The parts a `serve` process runs.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Role {
    /// HTTP ingest and the whole API; no delivery worker, no wait timers, no retention sweeper.
    Api,
    /// The delivery worker, the wait timers and the retention sweeper; over HTTP only `/health`,
    /// `/ready` and `/metrics`.
    Worker,
    /// Both (one process does everything; the default).
    #[default]
    All,
}

impl Role {
    /// Serves ingest and the API (and flushes ingest's duplicate counters).
    pub fn serves_api(self) -> bool {
        matches!(self, Role::Api | Role::All)
    }

    /// Runs the delivery worker, the durable timers of waits and the retention sweeper.
    pub fn runs_worker(self) -> bool {
        matches!(self, Role::Worker | Role::All)
    }

    /// The name used on the command line and in the log.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Api => "api",
            Role::Worker => "worker",
            Role::All => "all",
        }
    }
}
