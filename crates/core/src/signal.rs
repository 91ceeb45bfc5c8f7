//! Durable signals (DESIGN §2 signal, §5.8; signals-and-connectors §5.1-§5.3): the `SessionSignalV1`
//! envelope, its validation rules, and the per-run mailbox policy.

use serde::{Deserialize, Serialize};
use serde_json::Value;

mod mailbox;

pub use mailbox::*;

/// Who raised a signal. Stamped by the server from the authenticated caller or the receipt; a caller
/// never supplies it (signals-and-connectors §5.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SignalSource {
    /// `api`, `webhook`, `session` or `system`.
    pub kind: SourceKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor_id: Option<String>,
}

/// `source.kind` of a signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceKind {
    Api,
    Webhook,
    Session,
    System,
}

impl SourceKind {
    /// Wire string (`source.kind`), also the `source` label of `tb_signals_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Api => "api",
            SourceKind::Webhook => "webhook",
            SourceKind::Session => "session",
            SourceKind::System => "system",
        }
    }
}

/// The versioned signal envelope `SessionSignalV1` (signals-and-connectors §5.1), as stored and served.
/// `data` and `payload_ref` are mutually exclusive; large payloads go by reference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionSignalV1 {
    /// Always 1.
    pub version: u8,
    pub signal_id: String,
    pub name: String,
    pub source: SignalSource,
    /// ISO-8601 UTC.
    pub raised_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_ref: Option<String>,
    pub wake: bool,
}

/// Largest inline `data`, serialized, in bytes (signals-and-connectors §5.1: 32 KiB).
pub const MAX_INLINE_DATA_BYTES: usize = 32 * 1024;
/// Largest `data` accepted at all (stored by reference above [`MAX_INLINE_DATA_BYTES`]): 512 KiB, so a
/// request carrying it fits the API's 1 MiB body limit.
pub const MAX_DATA_BYTES: usize = 512 * 1024;
/// Deepest nesting of `data` (signals-and-connectors §5.1).
pub const MAX_DATA_DEPTH: usize = 16;
/// Most JSON nodes in inline `data` (signals-and-connectors §5.1).
pub const MAX_DATA_NODES: usize = 4096;

/// Checks a signal name: `[a-z0-9_.-]{1,64}` (signals-and-connectors §5.1, dots allowed in this project).
/// Errors: a message saying what is allowed (never echoing the name).
pub fn validate_name(name: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err("a signal name is 1 to 64 characters of a-z, 0-9, '_', '.' and '-'".into())
    }
}

/// Checks a caller-chosen `signalId`: 1-128 characters of `[A-Za-z0-9._:-]` (signals-and-connectors §5.1).
pub fn validate_signal_id(id: &str) -> Result<(), String> {
    let ok = (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err("signalId is 1 to 128 characters of A-Z, a-z, 0-9, '.', '_', ':' and '-'".into())
    }
}

/// Where a signal's data goes.
#[derive(Debug, Clone, PartialEq)]
pub enum DataPlacement {
    /// No data.
    None,
    /// Small enough to keep on the signal.
    Inline(Value),
    /// Over [`MAX_INLINE_DATA_BYTES`] (or too deep / too many nodes for inline): kept outside the event log
    /// and referenced by `payloadRef`; the bytes are the serialized JSON.
    Reference(Vec<u8>),
}

/// Decides where `data` is kept. Errors: the serialized data is over [`MAX_DATA_BYTES`].
pub fn place_data(data: Option<Value>) -> Result<DataPlacement, String> {
    let Some(v) = data else {
        return Ok(DataPlacement::None);
    };
    let bytes = serde_json::to_vec(&v).map_err(|e| e.to_string())?;
    if bytes.len() > MAX_DATA_BYTES {
        return Err(format!(
            "signal data is {} bytes serialized; at most {MAX_DATA_BYTES} are accepted",
            bytes.len()
        ));
    }
    let (depth, nodes) = shape(&v, 1);
    if bytes.len() <= MAX_INLINE_DATA_BYTES && depth <= MAX_DATA_DEPTH && nodes <= MAX_DATA_NODES {
        Ok(DataPlacement::Inline(v))
    } else {
        Ok(DataPlacement::Reference(bytes))
    }
}

/// (depth, node count) of a JSON value.
fn shape(v: &Value, depth: usize) -> (usize, usize) {
    let children: Box<dyn Iterator<Item = &Value>> = match v {
        Value::Array(a) => Box::new(a.iter()),
        Value::Object(o) => Box::new(o.values()),
        _ => return (depth, 1),
    };
    children.fold((depth, 1), |(d, n), c| {
        let (cd, cn) = shape(c, depth + 1);
        (d.max(cd), n + cn)
    })
}

/// What happens when a signal arrives at a full mailbox (signals-and-connectors §5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    /// Refuse the new signal: `429 signal_buffer_full` to an API caller; a webhook delivery retries.
    #[default]
    Reject,
    /// Drop the oldest buffered signal and record `tb.signal.dropped`.
    DropOldest,
}

/// A run's mailbox policy: at most `bound` buffered signals, then `overflow`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MailboxPolicy {
    pub bound: u32,
    pub overflow: Overflow,
}

/// Default mailbox bound: 64 buffered signals per run.
pub const DEFAULT_MAILBOX_BOUND: u32 = 64;

impl Default for MailboxPolicy {
    fn default() -> Self {
        MailboxPolicy {
            bound: DEFAULT_MAILBOX_BOUND,
            overflow: Overflow::Reject,
        }
    }
}

/// What the mailbox does with one more signal when `buffered` are already held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Room: buffer it.
    Buffer,
    /// Full, policy `reject`.
    Reject,
    /// Full, policy `drop_oldest`: drop this many oldest, then buffer.
    DropOldest(u32),
}

/// The mailbox rule, in one place.
pub fn admit(policy: MailboxPolicy, buffered: u32) -> Admit {
    if buffered < policy.bound {
        return Admit::Buffer;
    }
    match policy.overflow {
        Overflow::Reject => Admit::Reject,
        Overflow::DropOldest => Admit::DropOldest(buffered + 1 - policy.bound),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_and_ids() {
        assert!(validate_name("pr.synchronize").is_ok());
        assert!(validate_name("a_b-c.9").is_ok());
        assert!(validate_name("").is_err());
        assert!(validate_name("PR.open").is_err());
        assert!(validate_name(&"a".repeat(65)).is_err());
        assert!(validate_name("a b").is_err());
        assert!(validate_signal_id("dlv_01:x.Y-z").is_ok());
        assert!(validate_signal_id("a/b").is_err());
        assert!(validate_signal_id(&"a".repeat(129)).is_err());
    }

    #[test]
    fn data_placement() {
        assert_eq!(place_data(None).unwrap(), DataPlacement::None);
        assert_eq!(
            place_data(Some(json!({"a": 1}))).unwrap(),
            DataPlacement::Inline(json!({"a": 1}))
        );
        let big = json!({"s": "x".repeat(40 * 1024)});
        assert!(matches!(
            place_data(Some(big)).unwrap(),
            DataPlacement::Reference(b) if b.len() > MAX_INLINE_DATA_BYTES
        ));
        let mut deep = json!(1);
        for _ in 0..20 {
            deep = json!([deep]);
        }
        assert!(matches!(
            place_data(Some(deep)).unwrap(),
            DataPlacement::Reference(_)
        ));
        let huge = json!("x".repeat(MAX_DATA_BYTES + 1));
        assert!(place_data(Some(huge)).is_err());
    }

    #[test]
    fn mailbox_policy() {
        let p = MailboxPolicy {
            bound: 2,
            overflow: Overflow::Reject,
        };
        assert_eq!(admit(p, 1), Admit::Buffer);
        assert_eq!(admit(p, 2), Admit::Reject);
        let d = MailboxPolicy {
            overflow: Overflow::DropOldest,
            ..p
        };
        assert_eq!(admit(d, 2), Admit::DropOldest(1));
    }
}
