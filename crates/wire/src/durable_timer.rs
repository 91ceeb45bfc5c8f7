//! The Durable Timer private context (wire spec §11) and its release gate (§10).
//!
//! On a delivery the three private headers travel together; [`check`] validates them against the
//! payload bytes of this hop, and the caller then strips them ([`crate::headers::strip_private`])
//! before a handler or any onward routing sees the message. The context is compact JSON (OPEN-9
//! \[choice\]): `{"v":1,"kind":"root","flow_id":…,"flow_version":…,"root_execution_id":…}` exactly for
//! a root context; an `elapsed` context carries those keys and more (their names are not specified,
//! so they are accepted as they come).

use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::flow::FlowBody;
use crate::headers::{get, DURABLE_TIMER};
use crate::manifest::Manifest;

/// The runtime capability every service of a Durable Timer lineage must declare.
pub const CAPABILITY: &str = "durable_timer.v1";

const ROOT_KEYS: [&str; 5] = ["v", "kind", "flow_id", "flow_version", "root_execution_id"];

/// A validated context.
#[derive(Debug, Clone, PartialEq)]
pub struct TimerContext {
    /// `root` or `elapsed`.
    pub kind: String,
    pub root_execution_id: String,
    /// The whole context object.
    pub context: Value,
}

/// Validates the triplet among `headers` against `payload` (the exact bytes of this hop). `Ok(None)`:
/// no triplet. Errors (a DLQ entry of kind `envelope`, then `+TERM`): only some of the three headers,
/// a context that is not the JSON object described above, `Execution-Id` other than the context's
/// `root_execution_id`, or `Payload-SHA256` other than the lowercase hex SHA-256 of `payload`.
pub fn check(headers: &[(String, String)], payload: &[u8]) -> Result<Option<TimerContext>, String> {
    let [ctx, exec, sha] = DURABLE_TIMER.map(|n| get(headers, n));
    let (ctx, exec, sha) = match (ctx, exec, sha) {
        (None, None, None) => return Ok(None),
        (Some(c), Some(e), Some(s)) => (c, e, s),
        _ => return Err("durable timer headers come as a triplet; some are missing".into()),
    };
    let context: Value = serde_json::from_str(ctx)
        .map_err(|_| "X-Triggers-Durable-Timer-Context is not JSON".to_string())?;
    let o = context
        .as_object()
        .ok_or("X-Triggers-Durable-Timer-Context is not a JSON object")?;
    if o.get("v") != Some(&Value::from(1)) {
        return Err("durable timer context version is not 1".into());
    }
    let kind = o.get("kind").and_then(Value::as_str).unwrap_or("");
    for k in ROOT_KEYS {
        if !o.contains_key(k) {
            return Err(format!("durable timer context lacks {k:?}"));
        }
    }
    match kind {
        "root" => {
            if let Some(extra) = o.keys().find(|k| !ROOT_KEYS.contains(&k.as_str())) {
                return Err(format!(
                    "root durable timer context has an extra key {extra:?}"
                ));
            }
        }
        "elapsed" => {}
        other => {
            return Err(format!(
                "durable timer context kind {other:?} is not root or elapsed"
            ))
        }
    }
    let root = o["root_execution_id"].as_str().unwrap_or("");
    if root.is_empty() || exec != root {
        return Err("X-Triggers-Execution-Id is not the context's root_execution_id".into());
    }
    if sha != hex::encode(Sha256::digest(payload)) {
        return Err("X-Triggers-Durable-Timer-Payload-SHA256 is not the payload's".into());
    }
    Ok(Some(TimerContext {
        kind: kind.into(),
        root_execution_id: root.into(),
        context,
    }))
}

/// The release gate of a Durable Timer lineage (§10): every service node's service must be
/// registered with `runtime_capabilities` containing [`CAPABILITY`], reached over transport `nats`,
/// with a non-empty `config.target` equal to the `default` of one of its `nats` service sources.
/// Flows that are not Durable Timer lineages pass. Errors: a stable code and the node:
/// `durable_timer_service_unknown`, `durable_timer_capability_missing`,
/// `durable_timer_transport_not_nats`, `durable_timer_target_mismatch` (a transport-only match fails).
pub fn check_release(flow: &FlowBody, manifests: &[Manifest]) -> Result<(), String> {
    if !flow.durable_timer {
        return Ok(());
    }
    for n in flow.nodes.iter().filter(|n| n.kind == "service") {
        let Some(m) = manifests.iter().find(|m| m.service == n.service) else {
            return Err(format!(
                "durable_timer_service_unknown: node {} ({})",
                n.id, n.service
            ));
        };
        if !m
            .runtime_capabilities
            .iter()
            .flatten()
            .any(|c| c == CAPABILITY)
        {
            return Err(format!(
                "durable_timer_capability_missing: service {} does not declare {CAPABILITY}",
                n.service
            ));
        }
        if n.transport != "nats" {
            return Err(format!(
                "durable_timer_transport_not_nats: node {} uses {:?}",
                n.id, n.transport
            ));
        }
        let target = &n.config.target;
        let ok = !target.is_empty()
            && m.service_sources
                .iter()
                .flatten()
                .any(|s| s.transport == "nats" && s.default == *target);
        if !ok {
            return Err(format!(
                "durable_timer_target_mismatch: node {} target {target:?} is no nats source of {}",
                n.id, n.service
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::{FlowNode, NodeConfig};
    use crate::manifest::ServiceSource;

    fn hs(ctx: &str, exec: &str, payload: &[u8]) -> Vec<(String, String)> {
        vec![
            ("x-triggers-durable-timer-context".into(), ctx.into()),
            ("X-TRIGGERS-EXECUTION-ID".into(), exec.into()),
            (
                "X-Triggers-Durable-Timer-Payload-SHA256".into(),
                hex::encode(Sha256::digest(payload)),
            ),
        ]
    }

    const ROOT: &str =
        r#"{"v":1,"kind":"root","flow_id":"f","flow_version":"1","root_execution_id":"e1"}"#;

    #[test]
    fn the_triplet_is_checked_against_the_payload() {
        assert_eq!(check(&[], b"{}"), Ok(None));
        let ok = check(&hs(ROOT, "e1", b"{}"), b"{}").unwrap().unwrap();
        assert_eq!(
            (ok.kind.as_str(), ok.root_execution_id.as_str()),
            ("root", "e1")
        );
        let err = |h: Vec<(String, String)>, p: &[u8]| check(&h, p).unwrap_err();
        assert!(err(hs(ROOT, "e2", b"{}"), b"{}").contains("root_execution_id"));
        assert!(err(hs(ROOT, "e1", b"{}"), b"{ }").contains("SHA256"));
        let extra = r#"{"v":1,"kind":"root","flow_id":"f","flow_version":"1","root_execution_id":"e1","x":1}"#;
        assert!(err(hs(extra, "e1", b"{}"), b"{}").contains("extra key"));
        let elapsed = r#"{"v":1,"kind":"elapsed","flow_id":"f","flow_version":"1","root_execution_id":"e1","timer":"t"}"#;
        assert!(check(&hs(elapsed, "e1", b"{}"), b"{}").unwrap().is_some());
        assert!(err(hs("[1]", "e1", b"{}"), b"{}").contains("object"));
        let mut two = hs(ROOT, "e1", b"{}");
        two.pop();
        assert!(err(two, b"{}").contains("triplet"));
    }

    #[test]
    fn release_needs_the_capability_and_a_nats_target_of_the_service() {
        let m = |caps: Option<Vec<String>>| Manifest {
            service: "svc".into(),
            runtime_capabilities: caps,
            service_sources: Some(vec![ServiceSource {
                name: "nats".into(),
                transport: "nats".into(),
                default: "triggers.v2.svc.inbound".into(),
            }]),
            ..Default::default()
        };
        let node = |transport: &str, target: &str| FlowNode {
            id: "n1".into(),
            kind: "service".into(),
            service: "svc".into(),
            action: "a".into(),
            transport: transport.into(),
            config: NodeConfig {
                target: target.into(),
            },
        };
        let flow = |n: FlowNode| FlowBody {
            nodes: vec![n],
            durable_timer: true,
        };
        let caps = Some(vec![CAPABILITY.to_string()]);
        assert_eq!(
            check_release(
                &flow(node("nats", "triggers.v2.svc.inbound")),
                &[m(caps.clone())]
            ),
            Ok(())
        );
        let code = |f: FlowBody, ms: &[Manifest]| check_release(&f, ms).unwrap_err();
        assert!(
            code(flow(node("nats", "triggers.v2.svc.inbound")), &[m(None)])
                .starts_with("durable_timer_capability_missing")
        );
        assert!(code(
            flow(node("nats", "triggers.v2.svc.inbound")),
            &[m(Some(vec!["durable_timer.v2".into()]))]
        )
        .starts_with("durable_timer_capability_missing"));
        assert!(code(
            flow(node("http", "triggers.v2.svc.inbound")),
            &[m(caps.clone())]
        )
        .starts_with("durable_timer_transport_not_nats"));
        // A transport-only match (empty or other target) fails.
        assert!(code(flow(node("nats", "")), &[m(caps.clone())])
            .starts_with("durable_timer_target_mismatch"));
        assert!(
            code(flow(node("nats", "triggers.v2.other")), &[m(caps.clone())])
                .starts_with("durable_timer_target_mismatch")
        );
        assert!(code(flow(node("nats", "x")), &[]).starts_with("durable_timer_service_unknown"));
        // Not a Durable Timer lineage: no gate.
        let plain = FlowBody {
            nodes: vec![node("http", "")],
            durable_timer: false,
        };
        assert_eq!(check_release(&plain, &[]), Ok(()));
    }
}
