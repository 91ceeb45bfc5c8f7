//! Envelope headers (wire spec §4): written in their canonical spelling, read case-insensitively.

use crate::shapes::Envelope;
use crate::time::{parse_rfc3339nano, WireTime};

pub const TRACE_ID: &str = "X-Triggers-Trace-Id";
pub const SPAN_ID: &str = "X-Triggers-Span-Id";
pub const TRACEPARENT: &str = "X-Triggers-Traceparent";
pub const FLOW_RUN_ID: &str = "X-Triggers-Flow-Run-Id";
pub const FLOW_ID: &str = "X-Triggers-Flow-Id";
pub const FLOW_VERSION: &str = "X-Triggers-Flow-Version";
pub const IDEMPOTENCY_KEY: &str = "X-Triggers-Idempotency-Key";
pub const SOURCE_NODE_ID: &str = "X-Triggers-Source-Node-Id";
pub const RETRY_COUNT: &str = "X-Triggers-Retry-Count";
pub const EMITTED_AT: &str = "X-Triggers-Emitted-At";
/// JetStream's dedup header: the idempotency key (or a DLQ entry's [`crate::DlqEntry::msg_id`]).
pub const NATS_MSG_ID: &str = "Nats-Msg-Id";
/// The Durable Timer private triplet (§4.2, §11): never copied into an envelope, removed before a
/// handler or any onward routing sees the message.
pub const DURABLE_TIMER: [&str; 3] = [
    "X-Triggers-Durable-Timer-Context",
    "X-Triggers-Execution-Id",
    "X-Triggers-Durable-Timer-Payload-SHA256",
];

/// The headers of `env`, canonical spelling, empty values left out; `Nats-Msg-Id` only with a
/// non-empty idempotency key. Values with CR or LF are left out (NATS forbids them).
pub fn to_headers(env: &Envelope) -> Vec<(&'static str, String)> {
    let retry = env.retry_count.to_string();
    let emitted = if env.emitted_at == WireTime::default() {
        String::new()
    } else {
        env.emitted_at.format()
    };
    let all = [
        (TRACE_ID, env.trace_id.clone()),
        (SPAN_ID, env.span_id.clone()),
        (TRACEPARENT, env.traceparent.clone()),
        (FLOW_RUN_ID, env.flow_run_id.clone()),
        (FLOW_ID, env.flow_id.clone()),
        (FLOW_VERSION, env.flow_version.clone()),
        (IDEMPOTENCY_KEY, env.idempotency_key.clone()),
        (SOURCE_NODE_ID, env.source_node_id.clone()),
        (RETRY_COUNT, retry),
        (EMITTED_AT, emitted),
        (NATS_MSG_ID, env.idempotency_key.clone()),
    ];
    all.into_iter()
        .filter(|(_, v)| !v.is_empty() && !v.contains(['\r', '\n']))
        .collect()
}

/// The value of `name` among `headers`, matched case-insensitively; the exact canonical spelling
/// wins over another spelling, else the first found.
pub fn get<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .or_else(|| headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)))
        .map(|(_, v)| v.as_str())
}

/// The envelope of a message's headers: missing ones are empty, a missing or unparsable retry count
/// is 0, a missing or unparsable emission time is the zero time.
pub fn from_headers(headers: &[(String, String)]) -> Envelope {
    let s = |n: &str| get(headers, n).unwrap_or("").to_string();
    Envelope {
        trace_id: s(TRACE_ID),
        span_id: s(SPAN_ID),
        traceparent: s(TRACEPARENT),
        flow_run_id: s(FLOW_RUN_ID),
        flow_id: s(FLOW_ID),
        flow_version: s(FLOW_VERSION),
        idempotency_key: s(IDEMPOTENCY_KEY),
        source_node_id: s(SOURCE_NODE_ID),
        retry_count: get(headers, RETRY_COUNT)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0),
        emitted_at: get(headers, EMITTED_AT)
            .and_then(|v| parse_rfc3339nano(v.trim()).ok())
            .unwrap_or_default(),
    }
}

/// `headers` without the Durable Timer triplet (any spelling), as a handler must receive them.
pub fn strip_private(headers: &[(String, String)]) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(k, _)| !DURABLE_TIMER.iter().any(|p| k.eq_ignore_ascii_case(p)))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn headers_round_trip_and_read_in_any_case() {
        let env = Envelope {
            trace_id: "4bf92f3577b34da6a3ce929d0e0e4736".into(),
            flow_run_id: "run-1".into(),
            idempotency_key: "idem-1".into(),
            retry_count: 2,
            emitted_at: WireTime::from_unix_nanos(1_779_805_846_120_000_000),
            ..Default::default()
        };
        let written = to_headers(&env);
        assert!(written.contains(&(RETRY_COUNT, "2".to_string())));
        assert!(written.contains(&(EMITTED_AT, "2026-05-26T14:30:46.12Z".to_string())));
        assert!(written.contains(&(NATS_MSG_ID, "idem-1".to_string())));
        assert!(
            !written.iter().any(|(k, _)| *k == SPAN_ID),
            "empty values are left out"
        );
        let lower: Vec<(String, String)> = written
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
            .collect();
        assert_eq!(from_headers(&lower), env);
        // The canonical spelling wins; a bad retry count is 0; a bad time the zero time.
        let mixed = h(&[
            ("x-triggers-flow-id", "other"),
            ("X-Triggers-Flow-Id", "flow-1"),
            ("X-TRIGGERS-RETRY-COUNT", "x"),
            ("x-triggers-emitted-at", "yesterday"),
        ]);
        let e = from_headers(&mixed);
        assert_eq!((e.flow_id.as_str(), e.retry_count), ("flow-1", 0));
        assert_eq!(e.emitted_at, WireTime::default());
    }

    #[test]
    fn the_durable_timer_triplet_never_reaches_a_handler() {
        let hs = h(&[
            ("X-Triggers-Durable-Timer-Context", "{}"),
            ("x-triggers-execution-id", "e1"),
            ("X-TRIGGERS-DURABLE-TIMER-PAYLOAD-SHA256", "ab"),
            ("X-Triggers-Flow-Id", "f"),
        ]);
        assert_eq!(strip_private(&hs), h(&[("X-Triggers-Flow-Id", "f")]));
    }
}
