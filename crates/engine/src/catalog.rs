//! The operator catalog: subscriptions (with resolved secrets), bindings and workflows, as loaded from the
//! config file. Immutable once the engine starts; states live in the store.

use std::collections::HashMap;
use std::sync::Arc;

use tb_core::binding::Binding;
use tb_core::connector::ConnectorSpec;
use tb_core::retry::RetryPolicy;
use tb_core::subscription::Source;
use tb_core::workflow::Workflow;
use tb_store::SubscriptionDef;

/// Source-authenticity policy (OpenWOP `verification.mode`, RFC 0099 §F.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verification {
    /// An unverified request starts nothing (401).
    #[default]
    Required,
    /// Verify when possible; deliver either way, stamping `verified` on the receipt.
    BestEffort,
    /// No check.
    None,
}

/// What an OpenWOP registration (`POST /v1/trigger-subscriptions`) added: the workflow it starts and
/// where its host-generated signing secret lives.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Registration {
    pub workflow_id: String,
    /// File name of the `whsec_` secret under the secrets directory, for registrations made before
    /// `None` (not serialized): the secret is sealed in the store under the subscription id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<String>,
    /// While a rotation's overlap lasts: its end (Unix ms, exclusive). The previous secret is sealed in
    /// the store under [`crate::registration::previous_secret_id`].
    #[serde(
        default,
        rename = "previousSecretUntil",
        skip_serializing_if = "Option::is_none"
    )]
    pub previous_secret_until: Option<i64>,
}

/// The secret a rotation replaced, accepted beside the current one until `until_ms`
/// (`tb_core::rotation`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviousSecret {
    /// Resolved key bytes, as [`SubscriptionConfig::secret`] (never stored, never logged).
    pub secret: Vec<u8>,
    /// When the overlap ends (Unix ms, exclusive).
    pub until_ms: i64,
}

/// One subscription's runtime configuration.
#[derive(Debug, Clone)]
pub struct SubscriptionConfig {
    pub id: String,
    pub source: Source,
    pub connector: ConnectorSpec,
    /// Resolved key bytes (never stored, never logged).
    pub secret: Vec<u8>,
    /// The previous secret while a rotation's overlap lasts ([`PreviousSecret`]).
    pub previous_secret: Option<PreviousSecret>,
    pub retry: RetryPolicy,
    /// How long a dedup key is remembered, in seconds (receipts are kept at least this long).
    pub dedup_window_s: u64,
    /// Largest accepted request body, in bytes.
    pub max_body_bytes: usize,
    /// Consecutive failed attempts that trip `active -> failed` (with no success for
    /// `failure.failure_window_ms`); 0 never trips. Config default [`DEFAULT_FAILURE_THRESHOLD`].
    pub failure_threshold: u32,
    /// Breaker window and continuous-failure rule of dead-lettering.
    pub failure: tb_core::subscription::FailurePolicy,
    pub verification: Verification,
    /// When false every request is a new receipt (no dedup key is held).
    pub dedup_enabled: bool,
    /// Host-keyed, truncated fingerprint of the secret (<= 32 characters), shown instead of the secret.
    pub fingerprint: Option<String>,
    /// Set for subscriptions registered through the API.
    pub registration: Option<Registration>,
    /// Authenticated requests accepted per fixed UTC minute (`tb_core::rate`); beyond it 429
    /// `rate_limited` with `Retry-After`, counted, and the first few a minute recorded as
    /// `rate_limited` receipts. 0 = unlimited.
    pub rate_limit_per_min: u32,
    /// The automatic abuse-quarantine rule (off by default; `tb_core::quarantine`).
    pub quarantine: tb_core::quarantine::QuarantinePolicy,
    /// Header, JSON and content-coding limits of its requests (`[limits]` of the config, overridden
    /// by the subscription's own keys; docs/limits.md).
    pub limits: tb_core::limits::Limits,
}

impl SubscriptionConfig {
    /// The label this subscription's metrics and `/ready` use: its id when it comes from the configuration
    /// file, else [`REGISTERED_LABEL`] (a registered id is the unguessable part of its ingest URL).
    pub fn public_label(&self) -> &str {
        if self.registration.is_some() {
            REGISTERED_LABEL
        } else {
            &self.id
        }
    }

    /// A webhook subscription with the defaults a config file gets: the default retry policy (Svix
    /// schedule), a 24 h dedup window, [`DEFAULT_MAX_BODY_BYTES`], breaker threshold
    /// [`DEFAULT_FAILURE_THRESHOLD`], the default [`tb_core::subscription::FailurePolicy`], verification
    /// `required`, dedup on, no rate limit. `secret` is the resolved key bytes.
    pub fn webhook(id: &str, connector: ConnectorSpec, secret: &[u8]) -> SubscriptionConfig {
        SubscriptionConfig {
            id: id.into(),
            source: Source::Webhook,
            connector,
            secret: secret.to_vec(),
            previous_secret: None,
            retry: RetryPolicy::default(),
            dedup_window_s: 86_400,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            failure_threshold: DEFAULT_FAILURE_THRESHOLD,
            failure: Default::default(),
            verification: Verification::Required,
            dedup_enabled: true,
            fingerprint: None,
            registration: None,
            rate_limit_per_min: 0,
            quarantine: Default::default(),
            limits: Default::default(),
        }
    }

    /// A `schedule` subscription: no connector secret, no body limit to speak of, dedup on
    /// (each tick's key is its nominal instant), the default retry and failure policies.
    pub fn schedule(id: &str, spec: tb_core::schedule::ScheduleSpec) -> SubscriptionConfig {
        SubscriptionConfig {
            source: Source::Schedule,
            verification: Verification::None,
            max_body_bytes: 64 * 1024,
            ..SubscriptionConfig::webhook(id, ConnectorSpec::Schedule(spec), &[])
        }
    }

    /// A `queue` subscription on NATS JetStream: dedup on (`Nats-Msg-Id`, else stream +
    /// sequence), messages up to [`tb_core::queue::DEFAULT_MAX_MESSAGE_BYTES`], the default retry and
    /// failure policies.
    pub fn queue(id: &str, spec: tb_core::queue::QueueSpec) -> SubscriptionConfig {
        SubscriptionConfig {
            source: Source::Queue,
            verification: Verification::None,
            max_body_bytes: tb_core::queue::DEFAULT_MAX_MESSAGE_BYTES,
            ..SubscriptionConfig::webhook(id, ConnectorSpec::Nats(spec), &[])
        }
    }

    /// The secret-free definition persisted in the store.
    pub fn store_def(&self) -> SubscriptionDef {
        SubscriptionDef {
            id: self.id.clone(),
            source: self.source,
            connector: self.connector.name().to_string(),
            config: serde_json::json!({
                "connector": self.connector,
                "retryPolicy": self.retry,
                "dedupWindowS": self.dedup_window_s,
                "maxBodyBytes": self.max_body_bytes,
                "verification": self.verification,
                "dedupEnabled": self.dedup_enabled,
                "secretFingerprint": self.fingerprint,
                "registration": self.registration,
                "rateLimitPerMin": self.rate_limit_per_min,
                "quarantine": self.quarantine,
            }),
            failure_threshold: self.failure_threshold,
        }
    }
}

/// Default breaker threshold: consecutive failed attempts before `active -> failed`.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 5;

/// What public surfaces call every subscription registered through the API instead of its id
/// ([`Catalog::public_label`]): `api`, the bucket their metrics are added up in.
pub const REGISTERED_LABEL: &str = "api";

/// Default body limit: 25 MiB (GitHub's own cap; signals-and-connectors §1.4), in bytes.
pub const DEFAULT_MAX_BODY_BYTES: usize = 25 * 1024 * 1024;

/// Id of the always-present `noop` workflow advertised as an OpenWOP fixture.
pub const CONFORMANCE_NOOP: &str = "conformance-noop";

/// Most workflows one catalog advertises as OpenWOP fixtures (discovery `fixtures`).
pub const MAX_FIXTURES: usize = 64;

/// Subscriptions, bindings (grouped by subscription, in config order) and workflows.
#[derive(Debug, Default, Clone)]
pub struct Catalog {
    subs: HashMap<String, Arc<SubscriptionConfig>>,
    order: Vec<String>,
    bindings: HashMap<String, Vec<Binding>>,
    workflows: HashMap<String, Workflow>,
    /// Revoked binding ids: they match nothing and their open deliveries are refused.
    revoked: std::collections::HashSet<String>,
    /// Workflow ids advertised as OpenWOP fixtures besides [`CONFORMANCE_NOOP`] ([`Catalog::with_fixtures`]).
    fixtures: std::collections::BTreeSet<String>,
}

impl Catalog {
    /// Builds a catalog. The caller (config validation) has already checked references.
    pub fn new(
        subs: Vec<SubscriptionConfig>,
        bindings: Vec<Binding>,
        workflows: Vec<Workflow>,
    ) -> Catalog {
        let mut c = Catalog::default();
        for s in subs {
            c.order.push(s.id.clone());
            c.subs.insert(s.id.clone(), Arc::new(s));
        }
        for b in bindings {
            c.bindings
                .entry(b.subscription.clone())
                .or_default()
                .push(b);
        }
        for w in workflows {
            c.workflows.insert(w.id.clone(), w);
        }
        // The seeded fixture OpenWOP conformance suites start (advertised in discovery `fixtures`).
        c.workflows
            .entry(CONFORMANCE_NOOP.to_string())
            .or_insert_with(|| Workflow {
                id: CONFORMANCE_NOOP.to_string(),
                executor: tb_core::workflow::Executor::Noop,
            });
        c
    }

    /// Subscriptions in config order.
    pub fn subscriptions(&self) -> impl Iterator<Item = &Arc<SubscriptionConfig>> {
        self.order.iter().filter_map(|id| self.subs.get(id))
    }

    /// One subscription.
    pub fn subscription(&self, id: &str) -> Option<&Arc<SubscriptionConfig>> {
        self.subs.get(id)
    }

    /// The name the public surfaces (`/metrics` labels, `GET /ready`) may give the subscription `id`:
    /// its id when it comes from the configuration file, else [`REGISTERED_LABEL`]. The id of a
    /// subscription registered through the API is the unguessable part of its ingest URL and is
    /// shown only behind an API key (docs/operations.md, "Metrics"). An id this catalog does not hold
    /// (registered on another replica, not loaded here) is treated as registered.
    pub fn public_label<'a>(&'a self, id: &'a str) -> &'a str {
        match self.subs.get(id) {
            Some(s) => s.public_label(),
            None => REGISTERED_LABEL,
        }
    }

    /// Live (not revoked) bindings of a subscription, in config order.
    pub fn bindings_of(&self, subscription: &str) -> impl Iterator<Item = &Binding> {
        self.bindings
            .get(subscription)
            .map(Vec::as_slice)
            .unwrap_or(&[])
            .iter()
            .filter(|b| !self.revoked.contains(&b.id))
    }

    /// Every binding with whether it is revoked, in subscription then config order.
    pub fn all_bindings(&self) -> Vec<(&Binding, bool)> {
        let mut out = Vec::new();
        for sub in &self.order {
            for b in self.bindings.get(sub).map(Vec::as_slice).unwrap_or(&[]) {
                out.push((b, self.revoked.contains(&b.id)));
            }
        }
        out
    }

    /// True when the binding exists and is not revoked (checked again on every delivery).
    pub fn binding_live(&self, id: &str) -> bool {
        !self.revoked.contains(id) && self.bindings.values().flatten().any(|b| b.id == id)
    }

    /// A copy that also advertises the workflows `ids` as OpenWOP fixtures (seeded workflow ids a
    /// conformance suite may start by name, e.g. `conformance-idempotent`; `[[workflows]] fixture =
    /// true`). Ids this catalog has no workflow for are left out (a fixture must be runnable).
    pub fn with_fixtures(&self, ids: impl IntoIterator<Item = String>) -> Catalog {
        let mut c = self.clone();
        c.fixtures
            .extend(ids.into_iter().filter(|id| c.workflows.contains_key(id)));
        c
    }

    /// The workflow ids discovery advertises in `fixtures` (OpenWOP trigger-bridge §5): always
    /// [`CONFORMANCE_NOOP`] first, then the declared ones in id order.
    pub fn fixtures(&self) -> Vec<&str> {
        let mut v = vec![CONFORMANCE_NOOP];
        v.extend(
            self.fixtures
                .iter()
                .map(String::as_str)
                .filter(|id| *id != CONFORMANCE_NOOP),
        );
        v
    }

    /// A copy with this set of revoked binding ids.
    pub fn with_revoked(&self, revoked: std::collections::HashSet<String>) -> Catalog {
        let mut c = self.clone();
        c.revoked = revoked;
        c
    }

    /// One workflow.
    pub fn workflow(&self, id: &str) -> Option<&Workflow> {
        self.workflows.get(id)
    }

    /// Every workflow (no order).
    pub fn workflows(&self) -> impl Iterator<Item = &Workflow> {
        self.workflows.values()
    }

    /// A copy with each subscription's secret fingerprint set by `f` (shown instead of the secret).
    pub fn with_fingerprints(&self, f: impl Fn(&[u8]) -> String) -> Catalog {
        let mut c = self.clone();
        for s in c.subs.values_mut() {
            let mut x = (**s).clone();
            x.fingerprint = Some(f(&x.secret));
            *s = Arc::new(x);
        }
        c
    }

    /// A copy of this catalog with this subscription and its binding, replacing a subscription of the
    /// same id and its bindings (a registration loaded again by another replica's change).
    pub fn with(&self, sub: SubscriptionConfig, binding: Binding) -> Catalog {
        let mut c = self.without(&sub.id);
        c.order.push(sub.id.clone());
        c.subs.insert(sub.id.clone(), Arc::new(sub));
        c.bindings
            .entry(binding.subscription.clone())
            .or_default()
            .push(binding);
        c
    }

    /// A copy of this catalog without the subscription `id` and its bindings.
    pub fn without(&self, id: &str) -> Catalog {
        let mut c = self.clone();
        c.order.retain(|s| s != id);
        c.subs.remove(id);
        c.bindings.remove(id);
        c
    }
}

/// The settings API-started runs are delivered with: the default retry policy, no connector secret.
pub fn api_runs_config() -> SubscriptionConfig {
    SubscriptionConfig {
        dedup_enabled: false,
        ..SubscriptionConfig::webhook(
            crate::API_SOURCE,
            ConnectorSpec::StandardWebhooks { tolerance_s: 300 },
            &[],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `webhook` promises the config defaults; the breaker threshold was 0 (never trips).
    #[test]
    fn webhook_gets_the_config_defaults() {
        let s = SubscriptionConfig::webhook("gh", ConnectorSpec::Github, b"k");
        assert_eq!(s.failure_threshold, DEFAULT_FAILURE_THRESHOLD);
        assert_eq!(s.failure_threshold, 5);
        assert_eq!(s.failure, tb_core::subscription::FailurePolicy::default());
        assert_eq!(s.store_def().failure_threshold, 5);
        assert_eq!(s.max_body_bytes, DEFAULT_MAX_BODY_BYTES);
        assert_eq!(s.dedup_window_s, 86_400);
    }
}
