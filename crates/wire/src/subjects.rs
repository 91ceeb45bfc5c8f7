//! Subjects and names of the `triggers.v2` topology (wire spec §3).

/// SDK -> orchestrator, request/reply: register a manifest.
pub const MANIFEST_REGISTER: &str = "triggers.v2.manifest.register";
/// SDK -> orchestrator, request/reply: fetch a stored manifest.
pub const MANIFEST_FETCH: &str = "triggers.v2.manifest.fetch";
/// SDK -> orchestrator: heartbeats, every [`HEARTBEAT_INTERVAL_S`] s.
pub const HEARTBEAT: &str = "triggers.v2.heartbeat";
/// Heartbeat period, in seconds; a service is down after [`MISSED_BEATS_DOWN`] missed beats.
pub const HEARTBEAT_INTERVAL_S: u64 = 5;
/// Missed heartbeats after which the orchestrator marks a service down.
pub const MISSED_BEATS_DOWN: u64 = 3;
/// The orchestrator's subscription to every CompletionEvent.
pub const FLOW_EVENTS_ALL: &str = "triggers.v2.flow.events.>";
/// Orchestrator -> every service: cross-service flow updates.
pub const BROADCAST_ALL: &str = "triggers.v2.flow.broadcast.all";
/// Environment variable that overrides a service's inbound stream name.
pub const SOURCE_STREAM_ENV: &str = "TRIGGERS_NATS_SOURCE_STREAM";
/// The service name the orchestrator reserves (its DLQ namespace is `triggers.v2.dlq.source.*`).
pub const RESERVED_SERVICE: &str = "source";

/// `triggers.v2.flow.events.<flow_id>`: where a service publishes a CompletionEvent.
pub fn flow_events(flow_id: &str) -> String {
    format!("triggers.v2.flow.events.{flow_id}")
}

/// `triggers.v2.flow.broadcast.<service>`: flow updates for one service.
pub fn broadcast(service: &str) -> String {
    format!("triggers.v2.flow.broadcast.{service}")
}

/// `triggers.v2.dlq.<service>.<action or kind>`: a service's dead letters.
pub fn dlq(service: &str, action_or_kind: &str) -> String {
    format!("triggers.v2.dlq.{service}.{action_or_kind}")
}

/// `triggers.v2.dlq.source.<source_id>`: the orchestrator's own dead letters.
pub fn dlq_source(source_id: &str) -> String {
    format!("triggers.v2.dlq.source.{source_id}")
}

/// True when `s` can end a subject (e.g. the flow id of `triggers.v2.flow.events.<flow_id>`):
/// non-empty dot-separated tokens without whitespace, control characters, `*` or `>`.
pub fn valid_subject_suffix(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|t| {
            !t.is_empty()
                && !t
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control() || c == '*' || c == '>')
        })
}

/// The inbound stream of `service`: `triggers-sources-<service>`, unless `override_name` (the value
/// of [`SOURCE_STREAM_ENV`]) is set and non-empty.
pub fn source_stream(service: &str, override_name: Option<&str>) -> String {
    match override_name.map(str::trim).filter(|s| !s.is_empty()) {
        Some(n) => n.to_string(),
        None => format!("triggers-sources-{service}"),
    }
}

/// A subject made safe for a consumer name: each of `.` `>` `*` space TAB `/` becomes `_` (wire spec
/// §3; the seed's empty slot in its list read as a space).
pub fn safe_subject(subject: &str) -> String {
    subject
        .chars()
        .map(|c| match c {
            '.' | '>' | '*' | ' ' | '\t' | '/' => '_',
            c => c,
        })
        .collect()
}

/// The durable pull consumer of one inbound subject: `triggers-<service>-<safe subject>`.
pub fn consumer_name(service: &str, subject: &str) -> String {
    format!("triggers-{service}-{}", safe_subject(subject))
}

/// Checks a service name: `^[A-Za-z0-9_-]+$` (it becomes part of stream, consumer and subject
/// names) and not [`RESERVED_SERVICE`]. Errors: the reason.
pub fn validate_service_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(format!(
            "service name {name:?}: use letters, digits, - and _ only"
        ));
    }
    if name == RESERVED_SERVICE {
        return Err(
            "service name \"source\" is reserved for the orchestrator's dead letters".into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_suffixes() {
        assert!(valid_subject_suffix("triage") && valid_subject_suffix("a.b-c_d"));
        for bad in ["", "a b", "a..b", ".a", "a.", "*", "a.>", "a\tb", "é\u{0}"] {
            assert!(!valid_subject_suffix(bad), "{bad:?}");
        }
    }

    #[test]
    fn names_follow_the_seed_example() {
        assert_eq!(
            consumer_name("my-python-svc", "triggers.v2.mysvc.inbound"),
            "triggers-my-python-svc-triggers_v2_mysvc_inbound"
        );
        assert_eq!(safe_subject("a.*.b > c\t/d"), "a___b___c__d");
        assert_eq!(source_stream("svc", None), "triggers-sources-svc");
        assert_eq!(source_stream("svc", Some(" other ")), "other");
        assert_eq!(dlq("svc", "send"), "triggers.v2.dlq.svc.send");
        assert_eq!(flow_events("f1"), "triggers.v2.flow.events.f1");
        assert!(validate_service_name("my-svc_2").is_ok());
        assert!(validate_service_name("my.svc").is_err());
        assert!(validate_service_name("source")
            .unwrap_err()
            .contains("reserved"));
    }
}
