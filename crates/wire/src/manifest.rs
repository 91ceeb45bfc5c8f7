//! The manifest a service registers, and its `manifest_hash` (wire spec §6.5, §7).
//!
//! The hash is a contract between independent implementations, so it is derived from typed subset
//! structs ([`HashInput`]), never by serializing the whole manifest and deleting fields: actions keep
//! only name, schemas, timeout, retry and DLQ; catalog fields are not in it; lists are sorted;
//! always-present empty lists hash as `null`; the two runtime lists are left out when empty (so a
//! service without them keeps its hash); schemas are re-read as Go's `map[string]any` (sorted keys,
//! float numbers); the bytes are Go's with HTML escaping off.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::json::{go_any, to_vec};

/// The protocol version this crate speaks.
pub const PROTOCOL_VERSION: &str = "1.0.0";

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// A retry policy: delay after failed attempt k is `min(initial_backoff_ms * backoff_factor^(k-1),
/// max_backoff_ms)` (0 = no cap).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Retry {
    pub max_attempts: i64,
    pub initial_backoff_ms: i64,
    pub backoff_factor: f64,
    pub max_backoff_ms: i64,
}

impl Retry {
    /// Total attempts allowed by `retry` (OPEN-8 \[choice\]: no policy = 1 attempt; at least 1).
    pub fn attempts(retry: Option<&Retry>) -> i64 {
        retry.map_or(1, |r| r.max_attempts.max(1))
    }

    /// The delay in ms after failed attempt `k` (1-based): `min(initial_backoff_ms *
    /// backoff_factor^(k-1), max_backoff_ms)`, with `max_backoff_ms = 0` uncapped (OPEN-8) and a
    /// factor below 1 read as 1. Seed example 100 ms x 2.0: 100, 200, 400, ...
    pub fn delay_ms(&self, k: i64) -> u64 {
        let factor = if self.backoff_factor.is_finite() {
            self.backoff_factor.max(1.0)
        } else {
            1.0
        };
        let raw =
            self.initial_backoff_ms.max(0) as f64 * factor.powi((k.max(1) - 1).min(64) as i32);
        let capped = if self.max_backoff_ms > 0 {
            raw.min(self.max_backoff_ms as f64)
        } else {
            raw
        };
        // A JetStream nak delay is i64 nanoseconds: larger would overflow (and redeliver at once).
        capped.min((i64::MAX / 1_000_000) as f64) as u64
    }
}

/// One action a service offers. Catalog fields are kept as sent (and never hashed).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Action {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<String>,
    pub input_schema: Option<Value>,
    pub result_schema: Option<Value>,
    #[serde(skip_serializing_if = "is_zero")]
    pub timeout_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry: Option<Retry>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub dlq: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action_env: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result_event: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compatibility: Option<Value>,
}

/// Where a service takes work from (e.g. `{"name":"nats","transport":"nats","default":"<subject>"}`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ServiceSource {
    pub name: String,
    pub transport: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub default: String,
}

/// A parameter or result field of a runtime lookup.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct InputField {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip_serializing_if = "is_false")]
    pub required: bool,
}

/// A read the engine may issue to the service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Lookup {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub params: Option<Vec<InputField>>,
    pub result_fields: Option<Vec<InputField>>,
}

/// The register request body. `null` lists are accepted (Go nil slices).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Manifest {
    pub protocol_version: String,
    pub service: String,
    pub service_version: String,
    pub manifest_hash: String,
    pub actions: Option<Vec<Action>>,
    pub service_sources: Option<Vec<ServiceSource>>,
    pub supports_nodes: Option<Vec<String>>,
    #[serde(skip_serializing_if = "is_false")]
    pub supports_rate_limit: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_capabilities: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_lookups: Option<Vec<Lookup>>,
}

#[derive(Serialize)]
struct HashAction {
    name: String,
    input_schema: Value,
    result_schema: Value,
    #[serde(skip_serializing_if = "is_zero")]
    timeout_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry: Option<Retry>,
    #[serde(skip_serializing_if = "String::is_empty")]
    dlq: String,
}

#[derive(Serialize)]
struct HashLookup {
    name: String,
    params: Option<Vec<InputField>>,
    result_fields: Option<Vec<InputField>>,
}

/// The hashed subset of a manifest, in the order the hash writes it.
#[derive(Serialize)]
pub struct HashInput {
    actions: Option<Vec<HashAction>>,
    service_sources: Option<Vec<ServiceSource>>,
    supports_nodes: Option<Vec<String>>,
    supports_rate_limit: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime_capabilities: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime_lookups: Option<Vec<HashLookup>>,
}

/// `Some(list)` unless it is empty: an always-present empty list hashes as `null`.
fn non_empty<T>(v: Vec<T>) -> Option<Vec<T>> {
    (!v.is_empty()).then_some(v)
}

fn sorted_fields(v: &Option<Vec<InputField>>) -> Option<Vec<InputField>> {
    let mut f = v.clone().unwrap_or_default();
    f.sort_by(|a, b| a.name.cmp(&b.name));
    non_empty(f)
}

impl HashInput {
    /// The hashed subset of `m` (wire spec §7).
    pub fn of(m: &Manifest) -> HashInput {
        let schema = |s: &Option<Value>| s.as_ref().map_or(Value::Null, go_any);
        let mut actions: Vec<HashAction> = m
            .actions
            .iter()
            .flatten()
            .map(|a| HashAction {
                name: a.name.clone(),
                input_schema: schema(&a.input_schema),
                result_schema: schema(&a.result_schema),
                timeout_ms: a.timeout_ms,
                retry: a.retry.clone(),
                dlq: a.dlq.clone(),
            })
            .collect();
        actions.sort_by(|a, b| a.name.cmp(&b.name));
        let mut sources = m.service_sources.clone().unwrap_or_default();
        sources.sort_by(|a, b| a.name.cmp(&b.name));
        let mut nodes = m.supports_nodes.clone().unwrap_or_default();
        nodes.sort();
        let mut caps = m.runtime_capabilities.clone().unwrap_or_default();
        caps.sort();
        let mut lookups: Vec<HashLookup> = m
            .runtime_lookups
            .iter()
            .flatten()
            .map(|l| HashLookup {
                name: l.name.clone(),
                params: sorted_fields(&l.params),
                result_fields: sorted_fields(&l.result_fields),
            })
            .collect();
        lookups.sort_by(|a, b| a.name.cmp(&b.name));
        HashInput {
            actions: non_empty(actions),
            service_sources: non_empty(sources),
            supports_nodes: non_empty(nodes),
            supports_rate_limit: m.supports_rate_limit,
            runtime_capabilities: non_empty(caps),
            runtime_lookups: non_empty(lookups),
        }
    }

    /// The canonical bytes: Go's, HTML escaping off, no trailing newline.
    pub fn canonical(&self) -> Vec<u8> {
        to_vec(self, false).expect("the hash input encodes")
    }
}

/// `sha256:<lowercase hex>` of `m`'s canonical hash input.
pub fn hash(m: &Manifest) -> String {
    format!(
        "sha256:{}",
        hex::encode(Sha256::digest(HashInput::of(m).canonical()))
    )
}

/// Checks what a register must refuse (wire spec §10, \[SPEC\] rules): a protocol major other than 1,
/// a bad or reserved service name, duplicate action / source / capability names, nats sources whose
/// subjects give one consumer name, and a `manifest_hash` that is not the manifest's
/// (`manifest_hash_mismatch`). Errors: a short reason, sent as the reply's `error`.
pub fn validate(m: &Manifest) -> Result<(), String> {
    if m.protocol_version.split('.').next() != Some("1") {
        return Err(format!(
            "protocol_version {:?}: this orchestrator speaks 1.x",
            m.protocol_version
        ));
    }
    crate::subjects::validate_service_name(&m.service)?;
    let mut names: Vec<&str> = m
        .actions
        .iter()
        .flatten()
        .map(|a| a.name.as_str())
        .collect();
    names.sort();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Err("duplicate action name".into());
    }
    let sources = m.service_sources.iter().flatten();
    let mut names: Vec<&str> = sources.clone().map(|s| s.name.as_str()).collect();
    names.sort();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Err("duplicate service source name".into());
    }
    let mut consumers: Vec<String> = sources
        .filter(|s| s.transport == "nats")
        .map(|s| crate::subjects::consumer_name(&m.service, &s.default))
        .collect();
    consumers.sort();
    if consumers.windows(2).any(|w| w[0] == w[1]) {
        return Err("two nats sources' subjects give the same consumer name (they differ only in . > * / space or tab)".into());
    }
    let mut caps: Vec<&String> = m.runtime_capabilities.iter().flatten().collect();
    caps.sort();
    if caps.windows(2).any(|w| w[0] == w[1]) {
        return Err("duplicate runtime capability".into());
    }
    let expected = hash(m);
    if m.manifest_hash != expected {
        return Err("manifest_hash_mismatch".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_follow_the_policy() {
        let r = Retry {
            max_attempts: 3,
            initial_backoff_ms: 100,
            backoff_factor: 2.0,
            max_backoff_ms: 5000,
        };
        assert_eq!(
            [1, 2, 3, 7, 8].map(|k| r.delay_ms(k)),
            [100, 200, 400, 5000, 5000]
        );
        let uncapped = Retry {
            max_backoff_ms: 0,
            ..r.clone()
        };
        assert_eq!(uncapped.delay_ms(8), 12_800);
        assert_eq!((Retry::attempts(Some(&r)), Retry::attempts(None)), (3, 1));
        let zero = Retry {
            max_attempts: 0,
            ..r
        };
        assert_eq!(Retry::attempts(Some(&zero)), 1);
    }
}
