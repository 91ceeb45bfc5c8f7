//! The TOML configuration file (DESIGN §8 Config): server settings, subscriptions, workflows and
//! bindings, with secrets by reference (`env:NAME`, `file:PATH`), and its validation.
//!
//! [`load`] parses and validates everything and returns every problem at once, each naming the entry
//! and saying what to fix; [`Loaded::into_catalog`] resolves secrets into the engine's catalog.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tb_core::binding::{Binding, BindingAction};
use tb_core::connector::{ConnectorSpec, SignatureEncoding};
use tb_core::normalized::FieldValue;
use tb_core::retry::RetryPolicy;
use tb_core::subscription::Source;
use tb_core::workflow::{Executor, Workflow};
use tb_engine::{Catalog, SubscriptionConfig};

/// Default body limit: 25 MiB (GitHub's own cap; signals-and-connectors §1.4).
pub const DEFAULT_MAX_BODY_BYTES: usize = tb_engine::catalog::DEFAULT_MAX_BODY_BYTES;
/// Default dedup window: 24 h (the OpenWOP Layer-1 floor), in seconds.
pub const DEFAULT_DEDUP_WINDOW_S: u64 = 86_400;
/// Default breaker threshold: consecutive failed attempts before `active -> failed`.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = tb_engine::catalog::DEFAULT_FAILURE_THRESHOLD;
/// Default delivery lease, in ms.
pub const DEFAULT_LEASE_MS: u64 = 60_000;
/// Least headroom of the lease over the longest executor timeout, in ms (`check-config` refuses less).
pub const LEASE_MARGIN_MS: u64 = 1_000;
/// Default http executor timeout, in ms.
pub const DEFAULT_EXECUTOR_TIMEOUT_MS: u64 = 15_000;

/// Days raw request bodies are kept after their receipt settled when `[server].body_retention_days`
/// is unset (`serve`'s sweeper and `sweep`).
pub const DEFAULT_BODY_RETENTION_DAYS: u32 = 7;

/// Days a dead-lettered delivery stays readable when `[server].dead_letter_retention_days` is unset
/// (RFC 0232 `retentionDays`; `serve`'s sweeper, the API's purge date and `sweep`).
pub const DEFAULT_DEAD_LETTER_RETENTION_DAYS: u32 = 14;

/// `[server]`.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// Listen address, e.g. `127.0.0.1:8080`.
    pub listen: Option<String>,
    /// Directory of the SQLite store; with `database_url`, only of `secrets/` (host key and registered
    /// signing secrets), not locked.
    pub data_dir: Option<PathBuf>,
    /// PostgreSQL store, `postgres://user[:password]@host[:port]/database[?param=value]` (see
    /// `tb_store::postgres::parse_url`); unset = SQLite in `data_dir`. `serve --database-url` /
    /// `TRIGGER_BRIDGE_DATABASE_URL` replaces it. Printed only with the password masked.
    pub database_url: Option<String>,
    /// NATS server with JetStream for queue subscriptions (`nats://host:4222`); `serve --nats-url`
    /// overrides it.
    pub nats_url: Option<String>,
    /// Connections of the PostgreSQL pool, one thread each (default 8, 1 to 256). Every replica opens
    /// this many: keep replicas x pool size under the server's `max_connections`.
    pub database_pool_size: Option<usize>,
    /// Delivery lease in ms (default 60 000): a crashed attempt is retried after this. Renewed every
    /// lease/3 while an attempt is in flight; must be at least the longest http executor
    /// `timeout_ms` plus [`LEASE_MARGIN_MS`].
    pub lease_ms: Option<u64>,
    /// Default of every subscription's `failure_window_ms` (default 60 000 = 1 min): the breaker
    /// (`active -> failed`) needs `failure_threshold` consecutive failures AND no success for this long.
    pub failure_window_ms: Option<u64>,
    /// Default of every subscription's `dead_letter_after_ms` (default 432 000 000 = 5 days): a
    /// subscription is dead-lettered only after failing continuously (no success) for this long ...
    pub dead_letter_after_ms: Option<u64>,
    /// ... with at least this many failed attempts (default 10, at least 1).
    pub dead_letter_min_failures: Option<u32>,
    /// This host's id in discovery and run ancestry (default `trigger-bridge`).
    pub host_id: Option<String>,
    /// Days a dead-lettered delivery stays readable (default [`DEFAULT_DEAD_LETTER_RETENTION_DAYS`];
    /// RFC 0232 `retentionDays`).
    pub dead_letter_retention_days: Option<u32>,
    /// Days raw request bodies are kept after their receipt settled (default
    /// [`DEFAULT_BODY_RETENTION_DAYS`]); receipts stay.
    pub body_retention_days: Option<u32>,
    /// Outbound webhooks are durable (retried, dead-lettered; default true) or best-effort (one attempt,
    /// breaker: 4 failures open it for 1 h).
    pub webhooks_durable: Option<bool>,
    /// Let outbound webhooks reach private / loopback addresses over http (local testing only; also
    /// `OPENWOP_WEBHOOK_ALLOW_PRIVATE=true`).
    pub webhook_allow_private: Option<bool>,
    /// Writes that may wait for the store's writer thread, in jobs (default 10 000, 1 to 1 000 000).
    /// A write beyond it is refused at once: 503 `unavailable` with `Retry-After: 1`.
    pub writer_queue_capacity: Option<usize>,
    /// Seconds between two exports of a signed audit head checkpoint (the log line `audit checkpoint
    /// seq=.. head=.. mac=..` and the gauge `tb_audit_checkpoint_seq`; default 60, 1 to 86 400).
    pub audit_checkpoint_secs: Option<u64>,
    // The HTTP edge: timeouts and caps of inbound connections and bodies; see
    // [`ServerSection::edge`] for the defaults. `check-config` refuses zero values.
    /// ms a client has to send a request's headers (default 10 000); then the connection is closed.
    pub header_timeout_ms: Option<u64>,
    /// ms of the longest gap between two body chunks (default 15 000); then 408 `request_timeout`.
    /// Also how long shutdown waits for open connections.
    pub body_timeout_ms: Option<u64>,
    /// Least average body rate in bytes/s, counted from the headers, once `body_min_rate_grace_ms` has
    /// passed (default 16 384 = 16 KiB/s; 0 = off); slower is 408 `request_timeout`. See
    /// [`tb_api::body::DEFAULT_BODY_MIN_RATE`] for why.
    pub body_min_rate_bytes_per_s: Option<u64>,
    /// ms after the headers before `body_min_rate_bytes_per_s` applies (default 2 000; 1 to 3 600 000).
    pub body_min_rate_grace_ms: Option<u64>,
    /// ms an idle keep-alive connection (no request in progress) stays open (default 5 000). The header
    /// timeout also runs while a connection waits for its next request, so the effective idle close is
    /// the smaller of the two.
    pub idle_timeout_ms: Option<u64>,
    /// Connections open at once (default 512); over it a new connection gets 503 `unavailable` with
    /// `Retry-After: 1` and is closed. Keep it under the process's open-files limit.
    pub max_connections: Option<usize>,
    /// Ingest bodies buffered (before verification) at once (default 64); over it 503 `unavailable`.
    pub max_inflight_bodies: Option<usize>,
    /// Of those, the most one ingest target may hold: one subscription, or all capability URLs together
    /// (default 16, or `max_inflight_bodies` when smaller; 1 ..= `max_inflight_bodies`). Over it that
    /// target alone gets 503 `unavailable` with `Retry-After: 1`, so trickling bodies to one URL cannot
    /// take the slots of the others.
    pub max_inflight_bodies_per_target: Option<usize>,
    /// Bytes of ingest bodies buffered at once, all subscriptions together (default 268 435 456 =
    /// 256 MiB); over it 503 `unavailable`. Must be at least every subscription's `max_body_bytes`.
    pub body_budget_bytes: Option<usize>,
    // Per-client fairness (docs/limits.md "Per-client limits"): a client is an IPv4 address or an
    // IPv6 /64, behind a trusted proxy the address the proxy names.
    /// Connections one client address holds at once (default 64, or a quarter of `max_connections`
    /// when smaller; 1 ..= `max_connections`). Over it that client's new connection is answered 503
    /// `unavailable` with `Retry-After: 1` (or closed at once when it already has a few being
    /// refused); other clients are not affected. Connections from a trusted proxy are exempt.
    pub max_connections_per_client: Option<usize>,
    /// Of one target's body slots (`max_inflight_bodies_per_target`), the most one client address
    /// may hold (default a quarter of them, at least 1; 1 ..= `max_inflight_bodies_per_target`).
    /// Over it that client's body is 503 `unavailable` with `Retry-After: 1`.
    pub max_inflight_bodies_per_client: Option<usize>,
    /// Proxies (addresses or CIDR ranges, e.g. `10.0.0.0/8`, `2001:db8::/48`) whose
    /// `client_address_header` names the client; from any other peer the TCP peer is the client.
    /// Default none. The older spelling `[rate_limits].trusted_proxies` is read when this is unset.
    pub trusted_proxies: Option<Vec<String>>,
    /// The header the trusted proxies name the client in: `x-forwarded-for` (default) or `forwarded`
    /// (RFC 7239). Only that header is read: the other one is whatever the client wrote.
    pub client_address_header: Option<String>,
}

/// The HTTP edge keys of `[server]` with their defaults applied ([`ServerSection::edge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge {
    pub header_timeout_ms: u64,
    pub body_timeout_ms: u64,
    pub body_min_rate_bytes_per_s: u64,
    pub body_min_rate_grace_ms: u64,
    pub idle_timeout_ms: u64,
    pub max_connections: usize,
    pub max_inflight_bodies: usize,
    pub max_inflight_bodies_per_target: usize,
    pub body_budget_bytes: usize,
    /// `[server].max_connections_per_client`: connections one client address (IPv6: its /64) may
    /// hold at once; default 64 or a quarter of `max_connections` when smaller
    /// (`tb_core::front_door::default_connections_per_client`, docs/limits.md "Per-client limits").
    pub max_connections_per_client: usize,
    /// `[server].max_inflight_bodies_per_client`: of one subscription's body slots, the most one
    /// client address may hold at once; default a quarter of `max_inflight_bodies_per_target`, at
    /// least 1 (`tb_core::front_door::default_bodies_per_client`, docs/limits.md "Per-client limits").
    pub max_inflight_bodies_per_client: usize,
}

/// Default of `[server].header_timeout_ms`.
pub const DEFAULT_HEADER_TIMEOUT_MS: u64 = 10_000;
/// Default of `[server].idle_timeout_ms`.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 5_000;
/// Default of `[server].max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

impl ServerSection {
    /// The HTTP edge values with defaults applied.
    pub fn edge(&self) -> Edge {
        let max_inflight_bodies = self
            .max_inflight_bodies
            .unwrap_or(tb_api::body::DEFAULT_MAX_INFLIGHT_BODIES);
        let max_connections = self.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS);
        let per_target = self.max_inflight_bodies_per_target.unwrap_or(
            tb_api::body::DEFAULT_MAX_INFLIGHT_BODIES_PER_TARGET.min(max_inflight_bodies),
        );
        Edge {
            header_timeout_ms: self.header_timeout_ms.unwrap_or(DEFAULT_HEADER_TIMEOUT_MS),
            body_timeout_ms: self
                .body_timeout_ms
                .unwrap_or(tb_api::body::DEFAULT_BODY_TIMEOUT_MS),
            body_min_rate_bytes_per_s: self
                .body_min_rate_bytes_per_s
                .unwrap_or(tb_api::body::DEFAULT_BODY_MIN_RATE),
            body_min_rate_grace_ms: self
                .body_min_rate_grace_ms
                .unwrap_or(tb_api::body::DEFAULT_BODY_MIN_RATE_GRACE_MS),
            idle_timeout_ms: self.idle_timeout_ms.unwrap_or(DEFAULT_IDLE_TIMEOUT_MS),
            max_connections,
            max_inflight_bodies,
            max_inflight_bodies_per_target: per_target,
            body_budget_bytes: self
                .body_budget_bytes
                .unwrap_or(tb_api::body::DEFAULT_BODY_BUDGET_BYTES),
            max_connections_per_client: self.max_connections_per_client.unwrap_or(
                tb_core::front_door::default_connections_per_client(max_connections),
            ),
            max_inflight_bodies_per_client: self
                .max_inflight_bodies_per_client
                .unwrap_or(tb_core::front_door::default_bodies_per_client(per_target)),
        }
    }

    /// Every invalid value, each naming its key and what to set.
    fn edge_problems(&self, largest_body: usize) -> Vec<String> {
        let e = self.edge();
        let mut errs = Vec::new();
        for (key, v) in [
            ("header_timeout_ms", e.header_timeout_ms),
            ("body_timeout_ms", e.body_timeout_ms),
            ("body_min_rate_grace_ms", e.body_min_rate_grace_ms),
            ("idle_timeout_ms", e.idle_timeout_ms),
            ("max_connections", e.max_connections as u64),
            ("max_inflight_bodies", e.max_inflight_bodies as u64),
            ("body_budget_bytes", e.body_budget_bytes as u64),
        ] {
            if v == 0 {
                errs.push(format!("[server].{key} must be at least 1"));
            }
        }
        for (key, v) in [
            ("header_timeout_ms", e.header_timeout_ms),
            ("body_timeout_ms", e.body_timeout_ms),
            ("body_min_rate_grace_ms", e.body_min_rate_grace_ms),
            ("idle_timeout_ms", e.idle_timeout_ms),
        ] {
            if v > 3_600_000 {
                errs.push(format!(
                    "[server].{key} = {v} is over one hour (3600000 ms); use a smaller value"
                ));
            }
        }
        if e.max_inflight_bodies > e.max_connections {
            errs.push(format!(
                "[server].max_inflight_bodies ({}) must not exceed max_connections ({})",
                e.max_inflight_bodies, e.max_connections
            ));
        }
        if e.max_inflight_bodies > 0
            && !(1..=e.max_inflight_bodies).contains(&e.max_inflight_bodies_per_target)
        {
            errs.push(format!(
                "[server].max_inflight_bodies_per_target ({}) must be between 1 and max_inflight_bodies ({})",
                e.max_inflight_bodies_per_target, e.max_inflight_bodies
            ));
        }
        if e.max_connections > 0 && !(1..=e.max_connections).contains(&e.max_connections_per_client)
        {
            errs.push(format!(
                "[server].max_connections_per_client ({}) must be between 1 and max_connections ({})",
                e.max_connections_per_client, e.max_connections
            ));
        }
        if e.max_inflight_bodies_per_target > 0
            && !(1..=e.max_inflight_bodies_per_target).contains(&e.max_inflight_bodies_per_client)
        {
            errs.push(format!(
                "[server].max_inflight_bodies_per_client ({}) must be between 1 and max_inflight_bodies_per_target ({})",
                e.max_inflight_bodies_per_client, e.max_inflight_bodies_per_target
            ));
        }
        if e.body_budget_bytes < largest_body || e.body_budget_bytes > u32::MAX as usize {
            errs.push(format!(
                "[server].body_budget_bytes ({}) must be between the largest subscription max_body_bytes ({largest_body}) and 4294967295, or that body can never be buffered",
                e.body_budget_bytes
            ));
        }
        errs
    }

    /// The store's writer queue bound in jobs: `writer_queue_capacity` or its default.
    pub fn writer_queue_capacity(&self) -> usize {
        self.writer_queue_capacity
            .unwrap_or(tb_store::sqlite::writer::DEFAULT_QUEUE_CAPACITY)
    }

    /// `body_retention_days`, else [`DEFAULT_BODY_RETENTION_DAYS`].
    pub fn body_retention(&self) -> u32 {
        self.body_retention_days
            .unwrap_or(DEFAULT_BODY_RETENTION_DAYS)
    }

    /// `dead_letter_retention_days`, else [`DEFAULT_DEAD_LETTER_RETENTION_DAYS`].
    pub fn dead_letter_retention(&self) -> u32 {
        self.dead_letter_retention_days
            .unwrap_or(DEFAULT_DEAD_LETTER_RETENTION_DAYS)
    }
}

/// `[subscriptions.hmac]`: settings of the generic `hmac` connector.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HmacSection {
    pub signature_header: String,
    pub signature_prefix: Option<String>,
    #[serde(default)]
    pub encoding: SignatureEncoding,
    pub timestamp_header: Option<String>,
    pub tolerance_s: Option<u64>,
    pub id_header: Option<String>,
    pub event_header: Option<String>,
}

/// `[subscriptions.azure_devops]`: settings of the `azure-devops` connector (signals-and-connectors §2.2).
/// At least one is required; with both, both must pass.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AzureDevopsSection {
    /// The service hook's `basicAuthUsername`; the subscription's secret is its `basicAuthPassword`.
    pub basic_username: Option<String>,
    /// A header set in the service hook's `httpHeaders` (`Name:value`); its value must be the secret.
    pub header_name: Option<String>,
}

/// `[subscriptions.retry]`: every field optional, defaulting to the Svix schedule.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RetrySection {
    pub max_attempts: Option<u32>,
    pub backoff: Option<tb_core::retry::Backoff>,
    pub initial_ms: Option<u64>,
    pub max_ms: Option<u64>,
    pub jitter: Option<f64>,
    pub schedule_ms: Option<Vec<u64>>,
}

impl RetrySection {
    fn policy(&self) -> RetryPolicy {
        let d = RetryPolicy::default();
        let custom_shape =
            self.backoff.is_some() || self.initial_ms.is_some() || self.max_ms.is_some();
        RetryPolicy {
            max_attempts: self.max_attempts.unwrap_or(d.max_attempts),
            backoff: self.backoff.unwrap_or(d.backoff),
            initial_ms: self.initial_ms.unwrap_or(d.initial_ms),
            max_ms: self
                .max_ms
                .unwrap_or(d.max_ms.max(self.initial_ms.unwrap_or(0))),
            jitter: self.jitter.unwrap_or(d.jitter),
            schedule_ms: if custom_shape {
                self.schedule_ms.clone()
            } else {
                self.schedule_ms.clone().or(d.schedule_ms)
            },
        }
    }
}

/// `[limits]` (the defaults of every webhook subscription) and `[subscriptions.limits]` (one
/// subscription's own): the header, JSON and content-coding limits of requests (docs/limits.md). A
/// key left out takes the `[limits]` value, else the default of [`tb_core::limits`].
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// Most objects / arrays open at once in a JSON body (default 64, 1 to 128); over it 413.
    pub max_json_depth: Option<u32>,
    /// Longest JSON string (a key or a value) in bytes as sent (default 1 048 576); over it 413.
    pub max_json_string_bytes: Option<usize>,
    /// Most values inside JSON objects and arrays, all levels together (default 100 000); over it 413.
    pub max_json_fields: Option<usize>,
    /// Most request headers (default 100); over it 431.
    pub max_headers: Option<usize>,
    /// Most bytes of header names and values together (default 32 768); over it 431.
    pub max_header_bytes: Option<usize>,
    /// Content codings accepted besides identity: `["gzip"]` or none (the default: every compressed
    /// body is 415). A decoded body is what the signature is checked over and what is stored.
    pub content_encodings: Option<Vec<String>>,
    /// Most bytes a compressed body may decode to (default: the subscription's `max_body_bytes`);
    /// over it 413.
    pub max_decompressed_bytes: Option<usize>,
    /// Most times a compressed body may expand (default 100); over it 413.
    pub max_decompression_ratio: Option<u32>,
}

impl LimitsSection {
    /// These keys over `base` (the `[limits]` values over the defaults). Errors: an unknown coding,
    /// or what [`tb_core::limits::Limits::validate`] finds.
    pub fn over(&self, base: &tb_core::limits::Limits) -> Result<tb_core::limits::Limits, String> {
        let mut l = base.clone();
        if let Some(v) = self.max_json_depth {
            l.json.max_depth = v;
        }
        if let Some(v) = self.max_json_string_bytes {
            l.json.max_string_bytes = v;
        }
        if let Some(v) = self.max_json_fields {
            l.json.max_fields = v;
        }
        if let Some(v) = self.max_headers {
            l.max_headers = v;
        }
        if let Some(v) = self.max_header_bytes {
            l.max_header_bytes = v;
        }
        if let Some(v) = &self.content_encodings {
            l.content_encodings = v
                .iter()
                .map(|c| {
                    tb_core::limits::ContentCoding::parse(c).ok_or_else(|| {
                        format!(
                            "content_encodings: unknown coding {c:?}; the one accepted is \"gzip\""
                        )
                    })
                })
                .collect::<Result<_, _>>()?;
        }
        if self.max_decompressed_bytes.is_some() {
            l.max_decompressed_bytes = self.max_decompressed_bytes;
        }
        if let Some(v) = self.max_decompression_ratio {
            l.max_decompression_ratio = v;
        }
        l.validate()?;
        Ok(l)
    }
}

/// `[rate_limits]` (docs/limits.md "Rate limits"): requests a fixed UTC minute, counted before the
/// body is read; 0 or absent = unlimited.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimitsSection {
    /// Webhook and capability requests a minute over the whole server (every replica together).
    pub global_per_min: Option<u32>,
    /// Requests a minute from one client address (IPv6: one /64).
    pub source_per_min: Option<u32>,
    /// Wrong API keys (bearer or console login) one client address may send per minute before every
    /// key it sends is refused (429) until its minute ends; 0 = no limit. Default
    /// `tb_core::failed_auth::DEFAULT_LIMIT` (docs/limits.md "Wrong API keys").
    pub failed_keys_per_min: Option<u32>,
    /// The older spelling of `[server].trusted_proxies` (read when that is unset; both set is an
    /// error): proxies (addresses or CIDR ranges, e.g. `10.0.0.0/8`) whose forwarded header names the
    /// client. Without it the peer address is the client.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
}

impl RateLimitsSection {
    /// The engine's quotas and who the client of a request is: these limits, with
    /// `[server].trusted_proxies` (or this section's older `trusted_proxies`) and
    /// `[server].client_address_header`. Errors: every entry of the proxies that is not an address
    /// or range, an unknown header, both spellings of the proxies set.
    pub fn quotas(
        &self,
        server: &ServerSection,
    ) -> Result<tb_engine::edge::IngressQuotas, Vec<String>> {
        let mut errs = Vec::new();
        let (key, list) = match &server.trusted_proxies {
            Some(list) => {
                if !self.trusted_proxies.is_empty() {
                    errs.push("[rate_limits].trusted_proxies and [server].trusted_proxies are both set: keep the list in [server].trusted_proxies only (it also applies to the rate limits)".to_string());
                }
                ("[server].trusted_proxies", list)
            }
            None => ("[rate_limits].trusted_proxies", &self.trusted_proxies),
        };
        let mut trusted = Vec::new();
        for p in list {
            match parse_cidr(p) {
                Some(n) => trusted.push(n),
                None => errs.push(format!(
                    "{key}: {p:?} is not an address or a CIDR range (e.g. 10.0.0.0/8)"
                )),
            }
        }
        let header = match &server.client_address_header {
            None => tb_core::front_door::ForwardedHeader::default(),
            Some(h) => tb_core::front_door::ForwardedHeader::parse(h).unwrap_or_else(|| {
                errs.push(format!(
                    "[server].client_address_header = {h:?}: use \"x-forwarded-for\" or \"forwarded\""
                ));
                Default::default()
            }),
        };
        if !errs.is_empty() {
            return Err(errs);
        }
        Ok(tb_engine::edge::IngressQuotas {
            global_per_min: self.global_per_min.unwrap_or(0),
            source_per_min: self.source_per_min.unwrap_or(0),
            trusted_proxies: trusted,
            forwarded_header: header,
        })
    }
}

/// An address or a CIDR range (`10.0.0.0/8`, `192.0.2.1`, `2001:db8::/32`), host bits allowed
/// (`10.1.2.3/8` is `10.0.0.0/8`); `None` when it is neither.
fn parse_cidr(s: &str) -> Option<ipnet::IpNet> {
    let s = s.trim();
    s.parse::<ipnet::IpNet>()
        .map(|n| n.trunc())
        .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .ok()
}

/// `[subscriptions.quarantine]` (docs/limits.md "Quarantine"): the automatic abuse quarantine.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuarantineSection {
    /// Refused requests a minute (signature failures, rate-limited, over a size limit) that count as
    /// abuse; 0 = never automatically.
    pub refusals_per_min: u32,
    /// Complete minutes in a row that must reach it (default 5).
    pub minutes: Option<u32>,
}

/// `[subscriptions.rotation]` (docs/configuration.md "Rotating a signing secret"): while it lasts, a
/// request signed with the previous secret is accepted too.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotationSection {
    /// The secret being replaced (`env:NAME` or `file:PATH`, in the format `secret` takes).
    pub previous_secret: String,
    /// When the previous secret stops being accepted: RFC 3339, at most 30 days ahead.
    pub until: String,
}

/// `[[subscriptions]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionSection {
    pub id: String,
    #[serde(default = "default_source")]
    pub source: String,
    /// A webhook's connector (`github`, `standard-webhooks`, `hmac`, `azure-devops`); unused by a schedule.
    #[serde(default)]
    pub connector: String,
    /// `env:NAME` or `file:PATH` (a webhook's signing secret; a schedule has none).
    #[serde(default)]
    pub secret: String,
    #[serde(default)]
    pub retry: RetrySection,
    pub dedup_window_s: Option<u64>,
    pub max_body_bytes: Option<usize>,
    pub failure_threshold: Option<u32>,
    /// Overrides `[server].failure_window_ms` for this subscription (ms).
    pub failure_window_ms: Option<u64>,
    /// Overrides `[server].dead_letter_after_ms` for this subscription (ms).
    pub dead_letter_after_ms: Option<u64>,
    /// Overrides `[server].dead_letter_min_failures` for this subscription.
    pub dead_letter_min_failures: Option<u32>,
    /// Standard Webhooks / hmac timestamp tolerance in seconds (default 300).
    pub tolerance_s: Option<u64>,
    /// Authenticated requests per minute before 429 `rate_limited` (default: unlimited).
    pub rate_limit_per_min: Option<u32>,
    /// This subscription's header, JSON and content-coding limits over `[limits]`.
    pub limits: Option<LimitsSection>,
    /// The automatic abuse quarantine (off without it).
    pub quarantine: Option<QuarantineSection>,
    /// A signing-secret rotation in progress: the previous secret, accepted until `until`.
    pub rotation: Option<RotationSection>,
    pub hmac: Option<HmacSection>,
    pub azure_devops: Option<AzureDevopsSection>,
    /// With `source = "schedule"`: the cron schedule.
    pub schedule: Option<ScheduleSection>,
    /// With `source = "queue"`: the NATS JetStream stream and consumer.
    pub queue: Option<QueueSection>,
}

/// `[subscriptions.queue]` (docs/configuration.md "Queues").
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueSection {
    /// The JetStream stream.
    pub stream: String,
    /// Subjects taken (the consumer's filter; with `create_stream`, the stream's subjects).
    #[serde(default)]
    pub subjects: Vec<String>,
    /// Create the stream when it does not exist (default false).
    #[serde(default)]
    pub create_stream: bool,
    /// Durable consumer name (default `tb-<id>`).
    pub consumer: Option<String>,
    /// Unacked messages outstanding (default 1000).
    pub max_ack_pending: Option<i64>,
    /// Messages per pull (default 64).
    pub batch: Option<usize>,
    /// Redelivery wait for an unacked message, ms (default 30000).
    pub ack_wait_ms: Option<u64>,
}

impl QueueSection {
    fn spec(&self) -> Result<tb_core::queue::QueueSpec, String> {
        let d = tb_core::queue::QueueSpec::new(&self.stream);
        let spec = tb_core::queue::QueueSpec {
            subjects: self.subjects.clone(),
            create_stream: self.create_stream,
            consumer: self.consumer.clone(),
            max_ack_pending: self.max_ack_pending.unwrap_or(d.max_ack_pending),
            batch: self.batch.unwrap_or(d.batch),
            ack_wait_ms: self.ack_wait_ms.unwrap_or(d.ack_wait_ms),
            ..d
        };
        spec.validate()?;
        Ok(spec)
    }
}

/// `[subscriptions.schedule]` (docs/configuration.md "Schedules").
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSection {
    /// 5 fields (minute hour day-of-month month day-of-week), or 6 with seconds first.
    pub cron: String,
    /// IANA time zone (default `UTC`).
    pub timezone: Option<String>,
    /// Fire each tick up to this many ms late (stable per tick; default 0).
    pub jitter_ms: Option<u64>,
    /// RFC 3339: no tick before it.
    pub start: Option<String>,
    /// RFC 3339: no tick after it.
    pub end: Option<String>,
    /// A tick is on time until this many ms past its fire time (default 60 000).
    pub grace_ms: Option<u64>,
    /// `skip` (default), `run_once` or `all`.
    pub missed: Option<tb_core::schedule::MissedTicks>,
    /// With `missed = "all"`: at most this many missed ticks fire (default 10).
    pub catch_up_max: Option<u32>,
    /// `allow` (default), `skip` or `buffer_one`.
    pub overlap: Option<tb_core::schedule::Overlap>,
}

impl ScheduleSection {
    /// The spec, compiled once to check it. Errors: one message per problem.
    fn spec(&self) -> Result<tb_core::schedule::ScheduleSpec, String> {
        use tb_core::schedule::{parse_instant, Schedule, ScheduleSpec};
        let d = ScheduleSpec::new(&self.cron);
        let spec = ScheduleSpec {
            timezone: self.timezone.clone().unwrap_or(d.timezone),
            jitter_ms: self.jitter_ms.unwrap_or(0),
            start_ms: self
                .start
                .as_deref()
                .map(parse_instant)
                .transpose()
                .map_err(|e| format!("start: {e}"))?,
            end_ms: self
                .end
                .as_deref()
                .map(parse_instant)
                .transpose()
                .map_err(|e| format!("end: {e}"))?,
            grace_ms: self.grace_ms.unwrap_or(d.grace_ms),
            missed: self.missed.unwrap_or_default(),
            catch_up_max: self.catch_up_max.unwrap_or(d.catch_up_max),
            overlap: self.overlap.unwrap_or_default(),
            cron: self.cron.trim().to_string(),
        };
        let compiled = Schedule::new(spec.clone()).map_err(|e| {
            // The core names the API's fields; say the config's keys.
            e.replace("jitterMs", "jitter_ms")
                .replace("catchUpMax", "catch_up_max")
                .replace("graceMs", "grace_ms")
                .replace("startMs is after endMs", "start is after end")
        })?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        compiled.check_fires_after(now)?;
        Ok(spec)
    }
}

fn default_source() -> String {
    "webhook".into()
}

/// `[[workflows]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowSection {
    pub id: String,
    /// `noop`, `http`, `session` or `nats`.
    pub executor: String,
    /// Worker URL (http executor).
    pub url: Option<String>,
    /// Signing secret reference of the http executor (a `whsec_` value).
    pub secret: Option<String>,
    /// Request timeout in ms (http executor; default 15 000).
    pub timeout_ms: Option<u64>,
    /// Http executor: the worker may be on a private, loopback, link-local or ULA address (default
    /// false: such a destination fails the attempt with `destination_forbidden`).
    pub allow_private: Option<bool>,
    /// Session executor: the operator-set session template (identity, agent, model/provider policy,
    /// namespace, tools, repository access, budgets, concurrency), opaque to the bridge and handed to the
    /// session's driver in its start turn. Never filled from a payload.
    pub session: Option<toml::Table>,
    /// Session executor: signals buffered per run before the overflow policy applies (default 64).
    pub mailbox_bound: Option<u32>,
    /// Session executor: `reject` (429 / retry; default) or `drop_oldest` (recorded as an event).
    pub mailbox_overflow: Option<tb_core::signal::Overflow>,
    /// Nats executor: the `triggers.v2` service that runs the action (`^[A-Za-z0-9_-]+$`).
    pub service: Option<String>,
    /// Nats executor: the service's action.
    pub action: Option<String>,
    /// Nats executor: the flow is a Durable Timer lineage (released only to a service declaring
    /// `durable_timer.v1` with a nats source; default false).
    pub durable_timer: Option<bool>,
    /// Http executor: worker answers (300 to 599) that are never retried; the delivery is
    /// dead-lettered at the first one (default `[410]`; `[]` retries every failure).
    pub non_retryable_statuses: Option<Vec<u16>>,
    /// Advertise this workflow in OpenWOP discovery `fixtures` (a seeded workflow a conformance suite
    /// starts by id, e.g. `conformance-idempotent`; default false; `conformance-noop` always is).
    pub fixture: Option<bool>,
}

/// `[[bindings]]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindingSection {
    pub id: String,
    pub subscription: String,
    pub event_types: Vec<String>,
    #[serde(default)]
    pub filter: BTreeMap<String, OneOrMany>,
    /// `start_run`, `raise_signal` or `enqueue_prompt`.
    pub action: String,
    /// start_run: the workflow to start; raise_signal / enqueue_prompt: the session workflow whose
    /// session holding `coalesce_key` is the target.
    pub workflow: Option<String>,
    /// Template over normalized fields, e.g. `{repository.full_name}#{pull_request.number}`.
    pub coalesce_key: Option<String>,
    /// start_run with coalesce_key: what a later event with the same key does (`noop`, `signal`, `prompt`).
    pub on_existing: Option<tb_core::binding::OnExisting>,
    /// Signal name template, e.g. `pr.{action}`.
    pub signal: Option<String>,
    /// Server-owned prompt template; `{field}` placeholders are sent as untrusted variables.
    pub prompt: Option<String>,
    /// Raised signals also enqueue a wake turn.
    #[serde(default)]
    pub wake: bool,
    /// raise_signal / enqueue_prompt: a fixed target run id (instead of workflow + coalesce_key).
    pub run: Option<String>,
    #[serde(default)]
    pub inputs: BTreeMap<String, String>,
    /// Matched events a minute before the request is answered 429 `rate_limited` (default: unlimited).
    pub rate_limit_per_min: Option<u32>,
}

/// Builds and checks a binding's action against the (already validated) workflows. Errors: every
/// problem, each saying what to set.
fn binding_action(
    b: &BindingSection,
    workflows: &[Workflow],
    defined: &[&str],
) -> Result<BindingAction, Vec<String>> {
    let mut errs = Vec::new();
    let is_session = |id: &str| {
        workflows
            .iter()
            .any(|w| w.id == id && matches!(w.executor, Executor::Session { .. }))
    };
    // A workflow that is defined but failed its own validation is reported there, not here.
    if let Some(w) = &b.workflow {
        if !defined.contains(&w.as_str()) {
            errs.push(format!(
                "workflow {w:?} does not exist (defined: {})",
                defined.join(", ")
            ));
        }
    }
    // A signal-name template must give a valid name: check its fixed parts with placeholders filled.
    let check_signal = |t: &str, errs: &mut Vec<String>| {
        let probe: String = t
            .split(['{', '}'])
            .enumerate()
            .map(|(i, p)| if i % 2 == 1 { "x" } else { p })
            .collect();
        if let Err(e) = tb_core::signal::validate_name(&probe) {
            errs.push(format!("signal {t:?}: {e}"));
        }
    };
    let target_ok = |errs: &mut Vec<String>| {
        match (&b.run, &b.workflow, &b.coalesce_key) {
        (Some(_), None, None) | (None, Some(_), Some(_)) => {}
        (Some(_), _, _) => errs.push(format!(
            "{}: set either run or workflow + coalesce_key, not both",
            b.action
        )),
        _ => errs.push(format!(
            "{} needs a target: either run = \"run_...\", or workflow = \"<session workflow>\" with coalesce_key = \"{{field}}...\"",
            b.action
        )),
    }
    };
    let action = match b.action.as_str() {
        "start_run" => {
            let Some(workflow) = b.workflow.clone() else {
                return Err(vec!["start_run needs workflow = \"<workflow id>\"".into()]);
            };
            if b.run.is_some() {
                errs.push("run applies to raise_signal / enqueue_prompt only".into());
            }
            let on_existing = b.on_existing.unwrap_or_default();
            if b.coalesce_key.is_some() && !is_session(&workflow) {
                errs.push(format!("coalesce_key needs a session workflow; {workflow:?} is not one (executor = \"session\")"));
            }
            if b.coalesce_key.is_none() && b.on_existing.is_some() {
                errs.push("on_existing applies only with a coalesce_key".into());
            }
            match on_existing {
                tb_core::binding::OnExisting::Signal => match &b.signal {
                    Some(t) => check_signal(t, &mut errs),
                    None => errs.push("on_existing = \"signal\" needs signal = \"name or template, e.g. pr.{action}\"".into()),
                },
                tb_core::binding::OnExisting::Prompt if b.prompt.is_none() => {
                    errs.push("on_existing = \"prompt\" needs prompt = \"...\"".into())
                }
                _ => {}
            }
            BindingAction::StartRun {
                workflow,
                coalesce_key: b.coalesce_key.clone(),
                on_existing,
                signal: b.signal.clone(),
                prompt: b.prompt.clone(),
                wake: b.wake,
            }
        }
        "raise_signal" => {
            target_ok(&mut errs);
            let Some(signal) = b.signal.clone() else {
                errs.push(
                    "raise_signal needs signal = \"name or template, e.g. pr.{action}\"".into(),
                );
                return Err(errs);
            };
            check_signal(&signal, &mut errs);
            BindingAction::RaiseSignal {
                workflow: b.workflow.clone(),
                coalesce_key: b.coalesce_key.clone(),
                run: b.run.clone(),
                signal,
                wake: b.wake,
            }
        }
        "enqueue_prompt" => {
            target_ok(&mut errs);
            let Some(prompt) = b.prompt.clone() else {
                errs.push("enqueue_prompt needs prompt = \"...\"".into());
                return Err(errs);
            };
            BindingAction::EnqueuePrompt {
                workflow: b.workflow.clone(),
                coalesce_key: b.coalesce_key.clone(),
                run: b.run.clone(),
                prompt,
            }
        }
        other => {
            return Err(vec![format!(
                "action {other:?} is not supported; use start_run, raise_signal or enqueue_prompt"
            )])
        }
    };
    if errs.is_empty() {
        Ok(action)
    } else {
        Err(errs)
    }
}

/// A filter value: one scalar or a list of scalars.
#[derive(Debug, Deserialize, Clone)]
#[serde(untagged)]
pub enum OneOrMany {
    Many(Vec<FieldValue>),
    One(FieldValue),
}

/// `[[api_keys]]`: a key's name, the SHA-256 of the key in hex (`trigger-bridge hash-key` prints it),
/// and its scopes (`*` = all; see OpenWOP §12).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeySection {
    pub name: String,
    pub sha256: String,
    #[serde(default = "all_scopes")]
    pub scopes: Vec<String>,
    /// The OpenWOP tenants (workspaces) the key is a member of: outbound webhooks are registered and
    /// deleted only under one of them (`*` = every tenant; default `["default"]`).
    #[serde(default = "default_tenants")]
    pub tenants: Vec<String>,
}

fn all_scopes() -> Vec<String> {
    vec!["*".into()]
}

fn default_tenants() -> Vec<String> {
    vec![tb_api::auth::DEFAULT_TENANT.into()]
}

/// The whole file.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerSection,
    /// The request limits of every webhook subscription ([`LimitsSection`]).
    #[serde(default)]
    pub limits: LimitsSection,
    /// The server-wide request rate limits ([`RateLimitsSection`]).
    #[serde(default)]
    pub rate_limits: RateLimitsSection,
    #[serde(default)]
    pub subscriptions: Vec<SubscriptionSection>,
    #[serde(default)]
    pub workflows: Vec<WorkflowSection>,
    #[serde(default)]
    pub bindings: Vec<BindingSection>,
    #[serde(default)]
    pub api_keys: Vec<ApiKeySection>,
}

/// The previous secret of a rotation, resolved and parsed as `connector` takes it; `None` when the
/// overlap has ended (a note, not an error: a server restarted after `until` must start). Errors: a
/// reference that does not resolve, a bad format, the same value as the current secret, an `until`
/// that is not RFC 3339 or more than 30 days away.
fn previous_secret(
    r: &RotationSection,
    connector: &ConnectorSpec,
    current: &[u8],
    base: &Path,
) -> Result<Option<tb_engine::catalog::PreviousSecret>, String> {
    let until_ms = chrono::DateTime::parse_from_rfc3339(&r.until)
        .map_err(|e| {
            format!(
                "until {:?} is not an RFC 3339 time (e.g. 2026-12-09T00:00:00Z): {e}",
                r.until
            )
        })?
        .timestamp_millis();
    let now = chrono::Utc::now().timestamp_millis();
    if !tb_core::rotation::previous_accepted(until_ms, now) {
        return Ok(None);
    }
    tb_core::rotation::check_until(until_ms, now).map_err(|e| format!("until {}: {e}", r.until))?;
    let v =
        resolve_secret(&r.previous_secret, base).map_err(|e| format!("previous_secret: {e}"))?;
    let secret = match connector {
        ConnectorSpec::StandardWebhooks { .. } => tb_ingress::parse_whsec(&v)
            .map_err(|e| format!("previous_secret ({}): {e}", r.previous_secret))?,
        _ => v.into_bytes(),
    };
    if secret == current {
        return Err("previous_secret is the same as secret: point secret at the new value".into());
    }
    Ok(Some(tb_engine::catalog::PreviousSecret {
        secret,
        until_ms,
    }))
}

/// Resolves a secret reference through the one interface ([`tb_engine::secrets::Providers`]):
/// `env:NAME` (set, not empty), `file:PATH` (relative to `base`, trailing newlines trimmed, not
/// empty), or a registered external provider's `<name>:<key>`. Errors: what to fix, never the secret.
pub fn resolve_secret(reference: &str, base: &Path) -> Result<String, String> {
    tb_engine::secrets::Providers::new(base).resolve(reference)
}

fn parse_source(s: &str) -> Option<Source> {
    match s {
        "webhook" => Some(Source::Webhook),
        "schedule" => Some(Source::Schedule),
        "queue" => Some(Source::Queue),
        _ => None,
    }
}

/// A validated configuration, with secrets resolved: ready to become the engine's catalog.
pub struct Loaded {
    pub server: ServerSection,
    /// Configured API keys plus `TRIGGER_BRIDGE_API_KEY` (full scope) when set.
    pub api_keys: Vec<tb_api::auth::ApiKey>,
    pub catalog_parts: (Vec<SubscriptionConfig>, Vec<Binding>, Vec<Workflow>),
    /// Ids of the workflows marked `fixture = true`, advertised in discovery `fixtures`.
    pub fixtures: Vec<String>,
    /// `[rate_limits]` as the engine takes it.
    pub quotas: tb_engine::edge::IngressQuotas,
    /// `[rate_limits].failed_keys_per_min`, defaulted ([`RateLimitsSection::failed_keys_per_min`]).
    pub failed_keys_per_min: u32,
    /// Facts worth saying that are not errors, one line each: rotations in force and ended ones.
    /// `check-config` prints them; `serve` logs them.
    pub notes: Vec<String>,
}

impl Loaded {
    /// The engine catalog.
    pub fn into_catalog(self) -> (ServerSection, Catalog, Vec<tb_api::auth::ApiKey>) {
        let (s, b, w) = self.catalog_parts;
        let catalog = Catalog::new(s, b, w).with_fixtures(self.fixtures);
        (self.server, catalog, self.api_keys)
    }
}

/// Reads, parses and validates the config file at `path`. Errors: every problem found, one per line,
/// each prefixed with the entry it concerns.
pub fn load(path: &Path) -> Result<Loaded, Vec<String>> {
    load_with(path, |_| {})
}

/// [`load`], letting `adjust` change the parsed file before validation (`serve --listen` replaces
/// `[server].listen`, so an invalid value there does not stop a server started with the flag).
pub fn load_with(path: &Path, adjust: impl FnOnce(&mut Config)) -> Result<Loaded, Vec<String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| vec![format!("cannot read config {}: {e}", path.display())])?;
    let mut cfg: Config =
        toml::from_str(&text).map_err(|e| vec![format!("{}: {e}", path.display())])?;
    adjust(&mut cfg);
    let base = path.parent().unwrap_or(Path::new("."));
    validate(cfg, base)
}

/// GitHub webhook events a binding may name (docs.github.com "Webhook events and payloads"); a name
/// outside this list is almost always a typo, so it is refused with the list.
pub const GITHUB_EVENTS: &[&str] = &[
    "branch_protection_rule",
    "check_run",
    "check_suite",
    "code_scanning_alert",
    "commit_comment",
    "create",
    "delete",
    "deployment",
    "deployment_status",
    "discussion",
    "discussion_comment",
    "fork",
    "gollum",
    "installation",
    "issue_comment",
    "issues",
    "label",
    "member",
    "merge_group",
    "meta",
    "milestone",
    "package",
    "page_build",
    "ping",
    "project",
    "public",
    "pull_request",
    "pull_request_review",
    "pull_request_review_comment",
    "pull_request_review_thread",
    "push",
    "registry_package",
    "release",
    "repository",
    "repository_dispatch",
    "secret_scanning_alert",
    "security_advisory",
    "star",
    "status",
    "team",
    "team_add",
    "watch",
    "workflow_dispatch",
    "workflow_job",
    "workflow_run",
];

/// Actions of the GitHub webhook events whose action vocabulary is fixed (docs.github.com "Webhook
/// events and payloads"). A binding naming `event.action` for one of these events must use one of its
/// actions; other events are not checked.
pub const GITHUB_ACTIONS: &[(&str, &[&str])] = &[
    (
        "pull_request",
        &[
            "assigned",
            "auto_merge_disabled",
            "auto_merge_enabled",
            "closed",
            "converted_to_draft",
            "demilestoned",
            "dequeued",
            "edited",
            "enqueued",
            "labeled",
            "locked",
            "milestoned",
            "opened",
            "ready_for_review",
            "reopened",
            "review_request_removed",
            "review_requested",
            "synchronize",
            "unassigned",
            "unlabeled",
            "unlocked",
        ],
    ),
    (
        "issues",
        &[
            "assigned",
            "closed",
            "deleted",
            "demilestoned",
            "edited",
            "labeled",
            "locked",
            "milestoned",
            "opened",
            "pinned",
            "reopened",
            "transferred",
            "typed",
            "unassigned",
            "unlabeled",
            "unlocked",
            "unpinned",
            "untyped",
        ],
    ),
    ("issue_comment", &["created", "deleted", "edited"]),
    ("pull_request_review", &["dismissed", "edited", "submitted"]),
    (
        "pull_request_review_comment",
        &["created", "deleted", "edited"],
    ),
    ("pull_request_review_thread", &["resolved", "unresolved"]),
    (
        "check_run",
        &["completed", "created", "requested_action", "rerequested"],
    ),
    ("check_suite", &["completed", "requested", "rerequested"]),
    ("workflow_run", &["completed", "in_progress", "requested"]),
    (
        "workflow_job",
        &["completed", "in_progress", "queued", "waiting"],
    ),
    (
        "release",
        &[
            "created",
            "deleted",
            "edited",
            "prereleased",
            "published",
            "released",
            "unpublished",
        ],
    ),
    ("star", &["created", "deleted"]),
    ("watch", &["started"]),
];

/// Edit distance of two short words (Levenshtein), for "did you mean" hints.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The closest of `known` to `word` when it is close (at most 3 edits), for a "did you mean" hint.
fn closest<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edit_distance(word, k), *k))
        .filter(|(d, _)| *d <= 3)
        .min()
        .map(|(_, k)| k)
}

/// Azure DevOps service-hook event types the bridge normalizes first (signals-and-connectors §2.3); shown
/// in check-config messages. Other well-formed ADO event types (e.g. `workitem.updated`) are accepted too.
pub const AZURE_DEVOPS_EVENTS: &[&str] = &[
    "git.pullrequest.created",
    "git.pullrequest.updated",
    "git.pullrequest.merged",
    "ms.vss-code.git-pullrequest-comment-event",
    "git.push",
    "build.complete",
    "ms.vss-pipelines.run-state-changed-event",
    "workitem.created",
    "workitem.updated",
];

/// Checks one binding event type: `*`, `event` or `event.action`, each part `[a-z0-9_-]+`; for a
/// `github` subscription the event must be a GitHub webhook event. For an `azure-devops` subscription the
/// type is the payload's full `eventType`: dot-separated parts of `[a-z0-9-]+` (e.g.
/// `git.pullrequest.created`, `ms.vss-code.git-pullrequest-comment-event`), at most 128 bytes.
pub fn check_event_type(t: &str, connector: Option<&ConnectorSpec>) -> Result<(), String> {
    if t == "*" {
        return Ok(());
    }
    // A source the bridge produces has one event type.
    let produced = match connector {
        Some(ConnectorSpec::Schedule(_)) => Some("schedule.tick"),
        Some(ConnectorSpec::Nats(_)) => Some("queue.message"),
        _ => None,
    };
    if let Some(only) = produced {
        let event = only.split('.').next().unwrap_or(only);
        return if t == only || t == event {
            Ok(())
        } else {
            Err(format!(
                "{t:?}: this subscription's only event type is \"{only}\" (or \"*\")"
            ))
        };
    }
    if matches!(connector, Some(ConnectorSpec::AzureDevops { .. })) {
        let ok = t.len() <= 128
            && t.split('.').all(|p| {
                !p.is_empty()
                    && p.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            });
        return if ok {
            Ok(())
        } else {
            Err(format!(
                "{t:?} is not an Azure DevOps event type; use \"*\" or the full eventType, dot-separated lowercase parts of a-z 0-9 - (e.g. {})",
                AZURE_DEVOPS_EVENTS.join(", ")
            ))
        };
    }
    let part_ok = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    let mut parts = t.splitn(2, '.');
    let event = parts.next().unwrap_or("");
    if !part_ok(event) || !parts.next().is_none_or(part_ok) {
        return Err(format!("{t:?} is not an event type; use \"*\", \"event\" or \"event.action\" (e.g. \"pull_request.opened\")"));
    }
    if matches!(connector, Some(ConnectorSpec::Github)) && !GITHUB_EVENTS.contains(&event) {
        let hint = closest(event, GITHUB_EVENTS)
            .map(|k| format!("did you mean {k:?}? "))
            .unwrap_or_default();
        return Err(format!(
            "{event:?} is not a GitHub webhook event; {hint}known: {}",
            GITHUB_EVENTS.join(", ")
        ));
    }
    if let (Some(ConnectorSpec::Github), Some(action)) = (connector, t.split_once('.').map(|x| x.1))
    {
        if let Some((_, actions)) = GITHUB_ACTIONS.iter().find(|(e, _)| *e == event) {
            if !actions.contains(&action) {
                let hint = closest(action, actions)
                    .map(|k| format!("did you mean \"{event}.{k}\"? "))
                    .unwrap_or_default();
                return Err(format!(
                    "{action:?} is not an action of the GitHub {event:?} event; {hint}known: {}",
                    actions.join(", ")
                ));
            }
        }
    }
    Ok(())
}

/// A subscription whose events the bridge produces itself (`schedule`, `queue`): its section checked,
/// the webhook-only keys refused, the shared keys (retry, breaker, dedup window, body limit) applied.
/// Errors: one message per problem, each starting with `at`.
fn produced_source(
    s: &SubscriptionSection,
    source: Source,
    at: &str,
) -> Result<SubscriptionConfig, Vec<String>> {
    let mut errs = Vec::new();
    let (name, table, stray, built) = match source {
        Source::Schedule => (
            "schedule",
            "[subscriptions.schedule] table with cron = \"...\" (e.g. cron = \"*/5 * * * *\")",
            s.queue.is_some(),
            s.schedule.as_ref().map(|t| {
                t.spec()
                    .map(|spec| SubscriptionConfig::schedule(&s.id, spec))
            }),
        ),
        _ => (
            "queue",
            "[subscriptions.queue] table with stream = \"...\" (a NATS JetStream stream)",
            s.schedule.is_some(),
            s.queue
                .as_ref()
                .map(|t| t.spec().map(|spec| SubscriptionConfig::queue(&s.id, spec))),
        ),
    };
    let Some(built) = built else {
        return Err(vec![format!("{at}: source \"{name}\" needs a {table}")]);
    };
    if !s.connector.is_empty()
        || !s.secret.is_empty()
        || s.hmac.is_some()
        || s.azure_devops.is_some()
        || s.rotation.is_some()
        || stray
    {
        errs.push(format!("{at}: a {name} takes no connector, secret, rotation, hmac, azure_devops or other source table; remove them"));
    }
    let mut sub = match built {
        Ok(sub) => sub,
        Err(e) => {
            errs.push(format!("{at}: [subscriptions.{name}] {e}"));
            return Err(errs);
        }
    };
    sub.retry = s.retry.policy();
    if let Err(e) = sub.retry.validate() {
        errs.push(format!("{at}: retry: {e}"));
    }
    sub.failure_threshold = s.failure_threshold.unwrap_or(DEFAULT_FAILURE_THRESHOLD);
    if let Some(w) = s.dedup_window_s {
        if w == 0 && source == Source::Queue {
            errs.push(format!("{at}: dedup_window_s must be at least 1 for a queue: redeliveries are recognized by it"));
        }
        sub.dedup_window_s = w;
    }
    if let Some(m) = s.max_body_bytes.filter(|_| source == Source::Queue) {
        sub.max_body_bytes = m;
    }
    if errs.is_empty() {
        Ok(sub)
    } else {
        Err(errs)
    }
}

/// Checks a NATS server URL: `nats://` or `tls://` (several comma-separated), with a host.
/// Errors: what is wrong and an example.
pub fn check_nats_url(u: &str) -> Result<(), String> {
    for one in u.split(',').map(str::trim) {
        let rest = one
            .strip_prefix("nats://")
            .or_else(|| one.strip_prefix("tls://"))
            .ok_or_else(|| {
                format!("{one:?} is not a NATS URL; use nats://HOST:4222 (or tls://)")
            })?;
        if rest.is_empty() || rest.starts_with(':') {
            return Err(format!("{one:?} has no host; use nats://HOST:4222"));
        }
    }
    Ok(())
}

/// Validates a parsed config (see [`load`]).
pub fn validate(cfg: Config, base: &Path) -> Result<Loaded, Vec<String>> {
    let mut errs = Vec::new();
    let mut notes = Vec::new();
    if let Some(l) = &cfg.server.listen {
        if let Err(e) = crate::listen::check(l) {
            errs.push(format!("[server].listen: {e}"));
        }
    }
    if let Some(u) = &cfg.server.nats_url {
        if let Err(e) = check_nats_url(u) {
            errs.push(format!("[server].nats_url: {e}"));
        }
    }
    if let Some(n) = cfg.server.writer_queue_capacity {
        let max = tb_store::sqlite::writer::MAX_QUEUE_CAPACITY;
        if n == 0 || n > max {
            errs.push(format!(
                "[server].writer_queue_capacity {n} is out of range; use 1 to {max} jobs (default {})",
                tb_store::sqlite::writer::DEFAULT_QUEUE_CAPACITY
            ));
        }
    }
    if let Some(n) = cfg.server.audit_checkpoint_secs {
        if !(1..=86_400).contains(&n) {
            errs.push(format!(
                "[server].audit_checkpoint_secs {n} is out of range; use 1 to 86400 seconds (default 60)"
            ));
        }
    }
    errs.extend(crate::db_url::problems(
        cfg.server.database_url.as_deref(),
        cfg.server.database_pool_size,
    ));
    if cfg.server.dead_letter_min_failures == Some(0) {
        errs.push("[server].dead_letter_min_failures must be at least 1 (default 10)".into());
    }
    let largest_body = cfg
        .subscriptions
        .iter()
        .map(|s| s.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES))
        .max()
        .unwrap_or(0);
    errs.extend(cfg.server.edge_problems(largest_body));
    let base_limits = cfg
        .limits
        .over(&tb_core::limits::Limits::default())
        .unwrap_or_else(|e| {
            errs.push(format!("[limits]: {e}"));
            tb_core::limits::Limits::default()
        });
    let mut subs = Vec::new();
    let mut seen = HashSet::new();
    for (i, s) in cfg.subscriptions.iter().enumerate() {
        let at = format!("subscriptions[{i}] ({})", s.id);
        if let Err(e) = tb_core::ids::validate_subscription_id(&s.id) {
            errs.push(format!("{at}: {e}"));
        }
        if !seen.insert(s.id.clone()) {
            errs.push(format!("{at}: duplicate subscription id"));
        }
        let Some(source) = parse_source(&s.source) else {
            errs.push(format!(
                "{at}: source {:?} is not supported; use \"webhook\", \"schedule\" or \"queue\"",
                s.source
            ));
            continue;
        };
        if source != Source::Webhook {
            match produced_source(s, source, &at) {
                Ok(sub) => subs.push(sub),
                Err(mut e) => errs.append(&mut e),
            }
            continue;
        }
        if s.schedule.is_some() || s.queue.is_some() {
            errs.push(format!("{at}: [subscriptions.schedule] / [subscriptions.queue] are only used with source = \"schedule\" / \"queue\""));
        }
        if s.connector.is_empty() || s.secret.is_empty() {
            errs.push(format!("{at}: a webhook subscription needs connector = \"...\" (github, standard-webhooks, hmac, azure-devops) and secret = \"env:NAME\" or \"file:PATH\""));
            continue;
        }
        let tolerance_s = s.tolerance_s.unwrap_or(300);
        let connector = match s.connector.as_str() {
            "github" => ConnectorSpec::Github,
            "standard-webhooks" => ConnectorSpec::StandardWebhooks { tolerance_s },
            "hmac" => match &s.hmac {
                Some(h) => ConnectorSpec::Hmac {
                    signature_header: h.signature_header.clone(),
                    signature_prefix: h.signature_prefix.clone(),
                    encoding: h.encoding,
                    timestamp_header: h.timestamp_header.clone(),
                    tolerance_s: h.tolerance_s.unwrap_or(tolerance_s),
                    id_header: h.id_header.clone(),
                    event_header: h.event_header.clone(),
                },
                None => {
                    errs.push(format!("{at}: connector \"hmac\" needs a [subscriptions.hmac] table with signature_header"));
                    continue;
                }
            },
            "azure-devops" => match &s.azure_devops {
                Some(a) => {
                    let (user, header) = (a.basic_username.as_deref(), a.header_name.as_deref());
                    if let Err(e) = tb_ingress::azure_devops::check_config(user, header) {
                        errs.push(format!("{at}: [subscriptions.azure_devops]: {e}"));
                        continue;
                    }
                    ConnectorSpec::AzureDevops {
                        basic_username: a.basic_username.clone(),
                        header_name: a.header_name.clone(),
                    }
                }
                None => {
                    errs.push(format!(
                        "{at}: connector \"azure-devops\" needs a [subscriptions.azure_devops] table with basic_username = \"...\" (the secret is the service hook's Basic-auth password) and/or header_name = \"X-Hook-Secret\" (the secret is that header's value)"
                    ));
                    continue;
                }
            },
            other => {
                errs.push(format!(
                    "{at}: unknown connector {other:?}; use github, standard-webhooks, hmac or azure-devops"
                ));
                continue;
            }
        };
        if s.azure_devops.is_some() && !matches!(connector, ConnectorSpec::AzureDevops { .. }) {
            errs.push(format!(
                "{at}: [subscriptions.azure_devops] is only used with connector = \"azure-devops\"; remove it or change the connector"
            ));
        }
        let secret = match resolve_secret(&s.secret, base) {
            Err(e) => {
                errs.push(format!("{at}: secret: {e}"));
                continue;
            }
            Ok(v) => match &connector {
                ConnectorSpec::StandardWebhooks { .. } => match tb_ingress::parse_whsec(&v) {
                    Ok(k) => k,
                    Err(e) => {
                        errs.push(format!("{at}: secret ({}): {e}", s.secret));
                        continue;
                    }
                },
                _ => v.into_bytes(),
            },
        };
        let previous_secret = match &s.rotation {
            None => None,
            Some(r) => match previous_secret(r, &connector, &secret, base) {
                Ok(Some(p)) => {
                    notes.push(format!(
                        "{at}: the previous secret is accepted until {} ([subscriptions.rotation])",
                        r.until
                    ));
                    Some(p)
                }
                // Ended: not a reason to refuse to start (a restart after `until` must work).
                Ok(None) => {
                    notes.push(format!(
                        "{at}: [subscriptions.rotation] ended at {}: the previous secret is no longer accepted; remove the section",
                        r.until
                    ));
                    None
                }
                Err(e) => {
                    errs.push(format!("{at}: [subscriptions.rotation] {e}"));
                    None
                }
            },
        };
        let retry = s.retry.policy();
        if let Err(e) = retry.validate() {
            errs.push(format!("{at}: retry: {e}"));
        }
        let d = tb_core::subscription::FailurePolicy::default();
        let failure = tb_core::subscription::FailurePolicy {
            failure_window_ms: s
                .failure_window_ms
                .or(cfg.server.failure_window_ms)
                .unwrap_or(d.failure_window_ms),
            dead_letter_after_ms: s
                .dead_letter_after_ms
                .or(cfg.server.dead_letter_after_ms)
                .unwrap_or(d.dead_letter_after_ms),
            dead_letter_min_failures: s
                .dead_letter_min_failures
                .or(cfg.server.dead_letter_min_failures)
                .unwrap_or(d.dead_letter_min_failures),
        };
        if let Err(e) = failure.validate() {
            errs.push(format!("{at}: {e}"));
        }
        let max_body_bytes = s.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
        if max_body_bytes == 0 {
            errs.push(format!("{at}: max_body_bytes must be at least 1"));
        }
        let quarantine = match &s.quarantine {
            None => tb_core::quarantine::QuarantinePolicy::default(),
            Some(q) => {
                let minutes = q.minutes.unwrap_or(5);
                if minutes == 0 || minutes > 60 {
                    errs.push(format!(
                        "{at}: [subscriptions.quarantine] minutes {minutes} is out of range; use 1 to 60"
                    ));
                }
                tb_core::quarantine::QuarantinePolicy {
                    refusals_per_min: q.refusals_per_min,
                    minutes: minutes.clamp(1, 60),
                }
            }
        };
        subs.push(SubscriptionConfig {
            previous_secret,
            quarantine,
            id: s.id.clone(),
            source,
            connector,
            secret,
            retry,
            dedup_window_s: s.dedup_window_s.unwrap_or(DEFAULT_DEDUP_WINDOW_S),
            max_body_bytes,
            failure_threshold: s.failure_threshold.unwrap_or(DEFAULT_FAILURE_THRESHOLD),
            failure,
            verification: Default::default(),
            dedup_enabled: true,
            fingerprint: None,
            registration: None,
            rate_limit_per_min: s.rate_limit_per_min.unwrap_or(0),
            limits: match s.limits.as_ref().map(|l| l.over(&base_limits)) {
                None => base_limits.clone(),
                Some(Ok(l)) => l,
                Some(Err(e)) => {
                    errs.push(format!("{at}: [subscriptions.limits] {e}"));
                    base_limits.clone()
                }
            },
        });
    }

    let mut workflows = Vec::new();
    let mut wf_ids = HashSet::new();
    for (i, w) in cfg.workflows.iter().enumerate() {
        let at = format!("workflows[{i}] ({})", w.id);
        if !wf_ids.insert(w.id.clone()) {
            errs.push(format!("{at}: duplicate workflow id"));
        }
        if w.non_retryable_statuses.is_some() && w.executor != "http" {
            errs.push(format!("{at}: non_retryable_statuses applies to the http executor only (the statuses its worker answers)"));
        }
        let executor = match w.executor.as_str() {
            "noop" => Executor::Noop,
            "session" => {
                let config = match &w.session {
                    Some(t) => match serde_json::to_value(t) {
                        Ok(v) => v,
                        Err(e) => {
                            errs.push(format!("{at}: session: {e}"));
                            continue;
                        }
                    },
                    None => serde_json::json!({}),
                };
                let d = tb_core::signal::MailboxPolicy::default();
                let bound = w.mailbox_bound.unwrap_or(d.bound);
                if bound == 0 || bound > 10_000 {
                    errs.push(format!("{at}: mailbox_bound must be between 1 and 10000"));
                }
                Executor::Session {
                    config,
                    mailbox: tb_core::signal::MailboxPolicy {
                        bound,
                        overflow: w.mailbox_overflow.unwrap_or(d.overflow),
                    },
                }
            }
            "http" => {
                let url = match &w.url {
                    Some(u) if u.starts_with("http://") || u.starts_with("https://") => u.clone(),
                    Some(u) => {
                        errs.push(format!(
                            "{at}: url {u:?} must start with http:// or https://"
                        ));
                        continue;
                    }
                    None => {
                        errs.push(format!(
                            "{at}: the http executor needs url = \"https://worker.example/runs\""
                        ));
                        continue;
                    }
                };
                let Some(r) = &w.secret else {
                    errs.push(format!("{at}: the http executor needs secret = \"env:NAME\" (a whsec_ signing secret)"));
                    continue;
                };
                let secret = match resolve_secret(r, base)
                    .and_then(|v| tb_ingress::parse_whsec(&v).map_err(|e| e.to_string()))
                {
                    Ok(k) => k,
                    Err(e) => {
                        errs.push(format!("{at}: secret: {e}"));
                        continue;
                    }
                };
                let timeout_ms = w.timeout_ms.unwrap_or(DEFAULT_EXECUTOR_TIMEOUT_MS);
                let lease_ms = cfg.server.lease_ms.unwrap_or(DEFAULT_LEASE_MS);
                if lease_ms < timeout_ms.saturating_add(LEASE_MARGIN_MS) {
                    errs.push(format!(
                        "{at}: timeout_ms = {timeout_ms} needs [server].lease_ms of at least {} (the timeout plus a {LEASE_MARGIN_MS} ms margin), but lease_ms is {lease_ms}: a lease shorter than the work lets another worker perform the same delivery again; raise lease_ms or lower timeout_ms",
                        timeout_ms.saturating_add(LEASE_MARGIN_MS)
                    ));
                }
                let allow_private = w.allow_private.unwrap_or(false);
                if let Some(f) = tb_engine::ssrf::forbidden_literal(&url, allow_private) {
                    errs.push(format!("{at}: url {url:?} names {}, a private, loopback, link-local or metadata address; if this worker is on your own network set allow_private = true", f.ip));
                } else if !allow_private && tb_engine::ssrf::forbidden_name(&url) {
                    errs.push(format!("{at}: url {url:?} names a local or metadata host; if this worker is on your own network set allow_private = true"));
                }
                let non_retryable_statuses = w
                    .non_retryable_statuses
                    .clone()
                    .unwrap_or_else(|| tb_core::delivery::DEFAULT_NON_RETRYABLE_STATUSES.to_vec());
                if let Err(e) =
                    tb_core::delivery::check_non_retryable_statuses(&non_retryable_statuses)
                {
                    errs.push(format!("{at}: {e}"));
                }
                Executor::Http {
                    url,
                    secret,
                    timeout_ms,
                    allow_private,
                    non_retryable_statuses,
                }
            }
            "nats" => {
                let (Some(service), Some(action)) = (&w.service, &w.action) else {
                    errs.push(format!("{at}: the nats executor needs service = \"NAME\" and action = \"NAME\" (a triggers.v2 service and one of its actions)"));
                    continue;
                };
                if !tb_wire::subjects::valid_subject_suffix(&w.id) {
                    errs.push(format!("{at}: a nats workflow's id is its flow id, which ends a NATS subject: use letters, digits, - _ and single dots, no spaces, * or >"));
                    continue;
                }
                if let Err(e) = tb_wire::subjects::validate_service_name(service) {
                    errs.push(format!("{at}: service: {e}"));
                    continue;
                }
                if action.is_empty() || action.contains(char::is_whitespace) {
                    errs.push(format!(
                        "{at}: action {action:?} must be a non-empty name without spaces"
                    ));
                    continue;
                }
                Executor::Nats {
                    service: service.clone(),
                    action: action.clone(),
                    durable_timer: w.durable_timer.unwrap_or(false),
                }
            }
            other => {
                errs.push(format!(
                    "{at}: unknown executor {other:?}; use noop, http, session or nats"
                ));
                continue;
            }
        };
        workflows.push(Workflow {
            id: w.id.clone(),
            executor,
        });
    }
    let fixtures: Vec<String> = cfg
        .workflows
        .iter()
        .filter(|w| w.fixture == Some(true))
        .map(|w| w.id.clone())
        .collect();
    if fixtures.len() > tb_engine::catalog::MAX_FIXTURES {
        errs.push(format!(
            "workflows: {} are marked fixture = true; at most {} may be",
            fixtures.len(),
            tb_engine::catalog::MAX_FIXTURES
        ));
    }

    let mut bindings = Vec::new();
    let mut b_ids = HashSet::new();
    for (i, b) in cfg.bindings.iter().enumerate() {
        let at = format!("bindings[{i}] ({})", b.id);
        if !b_ids.insert(b.id.clone()) {
            errs.push(format!("{at}: duplicate binding id"));
        }
        let sub = subs.iter().find(|s| s.id == b.subscription);
        if sub.is_none() && !cfg.subscriptions.iter().any(|s| s.id == b.subscription) {
            let known: Vec<_> = cfg.subscriptions.iter().map(|s| s.id.as_str()).collect();
            errs.push(format!(
                "{at}: subscription {:?} does not exist (defined: {})",
                b.subscription,
                known.join(", ")
            ));
        }
        let defined: Vec<&str> = cfg.workflows.iter().map(|w| w.id.as_str()).collect();
        let action = match binding_action(b, &workflows, &defined) {
            Ok(a) => Some(a),
            Err(e) => {
                for e in e {
                    errs.push(format!("{at}: {e}"));
                }
                None
            }
        };
        if b.event_types.is_empty() {
            errs.push(format!("{at}: event_types must list at least one type (e.g. \"pull_request.opened\" or \"*\")"));
        }
        // A subscription that failed validation still decides which event-type rules apply.
        let unvalidated_ado = ConnectorSpec::AzureDevops {
            basic_username: None,
            header_name: None,
        };
        let connector = sub.map(|s| &s.connector).or_else(|| {
            cfg.subscriptions
                .iter()
                .any(|s| s.id == b.subscription && s.connector == "azure-devops")
                .then_some(&unvalidated_ado)
        });
        for t in &b.event_types {
            if let Err(e) = check_event_type(t, connector) {
                errs.push(format!("{at}: event_types: {e}"));
            }
        }
        if let Some(sub) = sub {
            let allowed = tb_ingress::normalized_fields(&sub.connector);
            let ok = |f: &str| f == "event" || f == "action" || allowed.contains(&f);
            let mut named: Vec<String> =
                b.filter.keys().chain(b.inputs.values()).cloned().collect();
            let templates = [
                ("coalesce_key", &b.coalesce_key),
                ("signal", &b.signal),
                ("prompt", &b.prompt),
            ];
            for (what, t) in templates
                .iter()
                .filter_map(|(w, t)| t.as_deref().map(|t| (*w, t)))
            {
                match tb_core::template::fields(t) {
                    Ok(fs) => named.extend(fs),
                    Err(e) => errs.push(format!("{at}: {what}: {e}")),
                }
            }
            for f in &named {
                if !ok(f) {
                    errs.push(format!(
                        "{at}: field {f:?} is not normalized by connector {}; allowed: event, action, {}",
                        sub.connector.name(),
                        allowed.join(", ")
                    ));
                }
            }
        }
        let Some(action) = action else { continue };
        bindings.push(Binding {
            rate_limit_per_min: b.rate_limit_per_min.unwrap_or(0),
            id: b.id.clone(),
            subscription: b.subscription.clone(),
            event_types: b.event_types.clone(),
            filter: b
                .filter
                .iter()
                .map(|(k, v)| {
                    let vs = match v {
                        OneOrMany::Many(v) => v.clone(),
                        OneOrMany::One(v) => vec![v.clone()],
                    };
                    (k.clone(), vs)
                })
                .collect(),
            action,
            inputs: b.inputs.clone(),
        });
    }
    let mut api_keys = Vec::new();
    for (i, k) in cfg.api_keys.iter().enumerate() {
        let at = format!("api_keys[{i}] ({})", k.name);
        let mut sha = [0u8; 32];
        if hex::decode_to_slice(&k.sha256, &mut sha).is_err() {
            errs.push(format!("{at}: sha256 must be the 64-hex SHA-256 of the key (print it with `trigger-bridge hash-key`)"));
        }
        for s in &k.scopes {
            if s != "*" && !tb_api::auth::SCOPES.contains(&s.as_str()) {
                errs.push(format!(
                    "{at}: unknown scope {s:?}; use * or {}",
                    tb_api::auth::SCOPES.join(", ")
                ));
            }
        }
        for t in &k.tenants {
            if t.is_empty()
                || t.len() > tb_api::webhooks::MAX_TENANT_ID
                || !t.bytes().all(|b| b.is_ascii_graphic())
            {
                errs.push(format!(
                    "{at}: tenant {t:?} must be * or 1 to {} visible ASCII characters",
                    tb_api::webhooks::MAX_TENANT_ID
                ));
            }
        }
        api_keys.push(tb_api::auth::ApiKey {
            name: k.name.clone(),
            sha256: sha,
            scopes: k.scopes.clone(),
            tenants: k.tenants.clone(),
        });
    }
    if let Ok(k) = std::env::var("TRIGGER_BRIDGE_API_KEY") {
        if !k.is_empty() {
            api_keys.push(tb_api::auth::ApiKey::full_scope(
                "TRIGGER_BRIDGE_API_KEY",
                &k,
            ));
        }
    }
    // A key is known by its digest and named by its name: two entries sharing either would let one
    // key act under the other's name and scopes (the audit log would name the wrong key).
    for (i, a) in api_keys.iter().enumerate() {
        for b in &api_keys[..i] {
            if a.sha256 == b.sha256 {
                errs.push(format!("api_keys: {:?} and {:?} are the same key (the same sha256); give each its own key", b.name, a.name));
            } else if a.name == b.name {
                errs.push(format!("api_keys: two keys are named {:?}; names must be unique (the audit log records the name)", a.name));
            }
        }
    }
    let quotas = cfg.rate_limits.quotas(&cfg.server).unwrap_or_else(|e| {
        errs.extend(e);
        Default::default()
    });
    if errs.is_empty() {
        Ok(Loaded {
            api_keys,
            quotas,
            failed_keys_per_min: cfg
                .rate_limits
                .failed_keys_per_min
                .unwrap_or(tb_core::failed_auth::DEFAULT_LIMIT),
            notes,
            server: cfg.server,
            catalog_parts: (subs, bindings, workflows),
            fixtures,
        })
    } else {
        Err(errs)
    }
}
