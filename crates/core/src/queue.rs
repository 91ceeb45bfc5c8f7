//! Queue sources: what a `queue` subscription consumes, and how a message becomes an
//! inbound event. The consumer itself (NATS JetStream, a durable pull consumer with explicit ack) is an
//! edge module of the engine; the rules that do not need a connection live here.
//!
//! **Dedup.** A message's identity is its `Nats-Msg-Id` header when present (the publisher's id, which
//! JetStream itself de-duplicates within the stream's window), else (stream, stream sequence). A
//! redelivery (our ack was lost, or we died between commit and ack) has the same identity, so the
//! receipt's unique dedup key, not JetStream's ack, is what guarantees one run.

use serde::{Deserialize, Serialize};

/// Default [`QueueSpec::max_ack_pending`]: messages handed out and not yet acked, per consumer.
pub const DEFAULT_MAX_ACK_PENDING: i64 = 1_000;
/// Default [`QueueSpec::batch`]: messages asked for per pull.
pub const DEFAULT_BATCH: usize = 64;
/// Default [`QueueSpec::ack_wait_ms`]: 30 000 ms; in-progress acks are sent every third of it while
/// a message is handled.
pub const DEFAULT_ACK_WAIT_MS: u64 = 30_000;
/// Largest accepted message payload, in bytes (1 MiB, NATS's default `max_payload`).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 1 << 20;

/// The event type of every queue message (`queue.message`: normalized event `queue`, action
/// `message`).
pub const MESSAGE_EVENT: &str = "queue";
/// The action of every queue message.
pub const MESSAGE_ACTION: &str = "message";

/// The normalized fields a message carries: `queue.subject`, `queue.stream`, `queue.sequence` (the
/// stream sequence), and `type` (a JSON payload's top-level string `type`, when it has one).
pub const FIELDS: &[&str] = &["queue.subject", "queue.stream", "queue.sequence", "type"];

fn default_max_ack_pending() -> i64 {
    DEFAULT_MAX_ACK_PENDING
}

fn default_batch() -> usize {
    DEFAULT_BATCH
}

fn default_ack_wait_ms() -> u64 {
    DEFAULT_ACK_WAIT_MS
}

/// A queue subscription as configured (config `[subscriptions.queue]`, the stored config).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QueueSpec {
    /// The JetStream stream consumed.
    pub stream: String,
    /// Subjects taken from it (the consumer's filter); empty: the whole stream. With
    /// `create_stream`, the stream's subjects.
    #[serde(default)]
    pub subjects: Vec<String>,
    /// Create the stream (file storage, these subjects) when it does not exist, and again if it is
    /// deleted. Default false: a missing stream is an error the subscription shows (`failed`).
    #[serde(default)]
    pub create_stream: bool,
    /// Durable consumer name (default `tb-<subscription id>`); shared by every replica.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumer: Option<String>,
    /// Unacked messages outstanding per consumer (default [`DEFAULT_MAX_ACK_PENDING`]).
    #[serde(default = "default_max_ack_pending")]
    pub max_ack_pending: i64,
    /// Messages per pull (default [`DEFAULT_BATCH`]).
    #[serde(default = "default_batch")]
    pub batch: usize,
    /// How long JetStream waits for an ack before redelivering, in ms (default
    /// [`DEFAULT_ACK_WAIT_MS`]).
    #[serde(default = "default_ack_wait_ms")]
    pub ack_wait_ms: u64,
}

impl QueueSpec {
    /// A spec with every default for `stream`.
    pub fn new(stream: &str) -> QueueSpec {
        QueueSpec {
            stream: stream.into(),
            subjects: Vec::new(),
            create_stream: false,
            consumer: None,
            max_ack_pending: DEFAULT_MAX_ACK_PENDING,
            batch: DEFAULT_BATCH,
            ack_wait_ms: DEFAULT_ACK_WAIT_MS,
        }
    }

    /// The durable consumer's name for subscription `id`.
    pub fn consumer_name(&self, id: &str) -> String {
        self.consumer.clone().unwrap_or_else(|| format!("tb-{id}"))
    }

    /// Checks the spec. Errors: a message naming the field (stream and consumer names are JetStream
    /// names: 1 to 64 of letters, digits, `-`, `_`; subjects non-empty without spaces; batch 1 to
    /// 1000; `max_ack_pending` at least `batch`; `ack_wait_ms` 1 000 to 3 600 000; `create_stream`
    /// needs subjects).
    pub fn validate(&self) -> Result<(), String> {
        let name_ok = |n: &str| {
            !n.is_empty()
                && n.len() <= 64
                && n.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !name_ok(&self.stream) {
            return Err(format!(
                "stream {:?}: use 1 to 64 of letters, digits, - and _",
                self.stream
            ));
        }
        if let Some(c) = &self.consumer {
            if !name_ok(c) {
                return Err(format!(
                    "consumer {c:?}: use 1 to 64 of letters, digits, - and _"
                ));
            }
        }
        for s in &self.subjects {
            if s.is_empty() || s.bytes().any(|b| b.is_ascii_whitespace()) || s.len() > 256 {
                return Err(format!(
                    "subject {s:?}: non-empty, no spaces, at most 256 bytes"
                ));
            }
            let tokens: Vec<&str> = s.split('.').collect();
            let bad_wildcard = tokens.iter().enumerate().any(|(i, t)| {
                t.is_empty()
                    || (t.contains('>') && (*t != ">" || i + 1 != tokens.len()))
                    || (t.contains('*') && *t != "*")
            });
            if bad_wildcard {
                return Err(format!(
                    "subject {s:?}: dot-separated tokens; `*` is a whole token, `>` only the last (e.g. orders.*.created, orders.>)"
                ));
            }
        }
        if self.create_stream && self.subjects.is_empty() {
            return Err("create_stream needs subjects (the new stream's subjects)".into());
        }
        if !(1..=1000).contains(&self.batch) {
            return Err("batch: 1 to 1000".into());
        }
        if self.max_ack_pending < self.batch as i64 {
            return Err(format!(
                "max_ack_pending ({}) must be at least batch ({})",
                self.max_ack_pending, self.batch
            ));
        }
        if !(1_000..=3_600_000).contains(&self.ack_wait_ms) {
            return Err("ack_wait_ms: 1000 to 3600000 (1 s to 1 h)".into());
        }
        Ok(())
    }
}

/// The provider event id a message's dedup key is derived from: `msg-id:<Nats-Msg-Id>` when the
/// header is present and non-empty (control characters dropped, at most 256 bytes used), else
/// `seq:<stream>@<stream created, Unix ms>:<sequence>`: a stream deleted and created again restarts
/// its sequences at 1, and its new messages must not be taken for the old ones.
pub fn dedup_id(msg_id: Option<&str>, stream: &str, created_ms: i64, sequence: u64) -> String {
    let clean: Option<String> = msg_id
        .map(|m| m.chars().filter(|c| !c.is_control()).collect::<String>())
        .map(|m| m.trim().to_string())
        .filter(|m| !m.is_empty());
    match clean {
        Some(m) => {
            let cut = m
                .char_indices()
                .take_while(|(i, _)| *i < 256)
                .last()
                .map_or(0, |(i, c)| i + c.len_utf8());
            format!("msg-id:{}", &m[..cut])
        }
        None => format!("seq:{stream}@{created_ms}:{sequence}"),
    }
}

/// A header value fit to store and show: control characters dropped (PostgreSQL text refuses NUL),
/// at most `max` characters.
pub fn clean_header(v: &str, max: usize) -> String {
    v.chars().filter(|c| !c.is_control()).take(max).collect()
}

/// Deliveries of one message after which a commit that keeps failing for a reason other than an
/// unavailable store is given up: the message is kept as a `rejected` receipt and terminated.
pub const MAX_COMMIT_TRIES: i64 = 10;

/// Why a message cannot become an event; it is recorded as a `rejected` receipt and terminated
/// (`AckKind::Term`), never redelivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undecodable {
    /// Larger than the subscription's `max_body_bytes`.
    TooLarge,
    /// Not a JSON document.
    NotJson,
}

/// Decodes a payload: it must be a JSON document of at most `max_bytes`. Returns the payload's
/// top-level string `type`, when it has one (at most 128 bytes; longer ones are left out).
pub fn decode(payload: &[u8], max_bytes: usize) -> Result<Option<String>, Undecodable> {
    if payload.len() > max_bytes {
        return Err(Undecodable::TooLarge);
    }
    let v: serde_json::Value = serde_json::from_slice(payload).map_err(|_| Undecodable::NotJson)?;
    Ok(v.get("type")
        .and_then(|t| t.as_str())
        .filter(|t| t.len() <= 128)
        .map(str::to_string))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedup_prefers_the_publishers_id_and_falls_back_to_the_sequence() {
        assert_eq!(dedup_id(Some("order-7"), "ORDERS", 5, 9), "msg-id:order-7");
        assert_eq!(
            dedup_id(Some("or\0der-7"), "ORDERS", 5, 9),
            "msg-id:order-7"
        );
        assert_eq!(dedup_id(Some("  "), "ORDERS", 5, 9), "seq:ORDERS@5:9");
        assert_eq!(dedup_id(None, "ORDERS", 5, 9), "seq:ORDERS@5:9");
        assert_ne!(
            dedup_id(None, "ORDERS", 5, 9),
            dedup_id(None, "ORDERS", 6, 9),
            "a re-created stream's sequence 9 is another message"
        );
        assert_eq!(clean_header("text/\0plain\r\n", 100), "text/plain");
        let long = "é".repeat(300);
        let id = dedup_id(Some(&long), "S", 1, 1);
        assert!(id.len() <= "msg-id:".len() + 258, "{}", id.len());
    }

    #[test]
    fn decode_takes_json_only_and_reads_its_type() {
        assert_eq!(
            decode(br#"{"type":"order.created"}"#, 100),
            Ok(Some("order.created".into()))
        );
        assert_eq!(decode(br#"[1,2]"#, 100), Ok(None));
        assert_eq!(decode(b"\xff\xfe not json", 100), Err(Undecodable::NotJson));
        assert_eq!(decode(&[b' '; 101], 100), Err(Undecodable::TooLarge));
    }

    #[test]
    fn specs_are_checked_with_the_field_named() {
        assert!(QueueSpec::new("ORDERS").validate().is_ok());
        assert!(QueueSpec::new("a b")
            .validate()
            .unwrap_err()
            .starts_with("stream"));
        let mut s = QueueSpec::new("S");
        s.create_stream = true;
        assert!(s.validate().unwrap_err().contains("needs subjects"));
        s.subjects = vec!["orders.>".into()];
        assert!(s.validate().is_ok());
        s.batch = 0;
        assert!(s.validate().unwrap_err().starts_with("batch"));
        s.batch = 10;
        s.max_ack_pending = 5;
        assert!(s.validate().unwrap_err().starts_with("max_ack_pending"));
        assert_eq!(QueueSpec::new("S").consumer_name("orders"), "tb-orders");
        let mut w = QueueSpec::new("S");
        w.subjects = vec!["a.>.b".into()];
        assert!(w.validate().unwrap_err().contains("`>` only the last"));
        w.subjects = vec!["a.*.b".into(), "a.>".into()];
        assert!(w.validate().is_ok());
    }
}
