//! The flows the orchestrator hands `triggers.v2` services (register reply, broadcasts): one per
//! catalog workflow with the `nats` executor, a single service node (wire flow body, see
//! `tb_wire::flow`). A Durable Timer workflow is released only when its service's manifest passes
//! `tb_wire::durable_timer::check_release`.

use sha2::{Digest, Sha256};
use tb_core::workflow::{Executor, Workflow};
use tb_wire::flow::{FlowBody, FlowNode, NodeConfig};
use tb_wire::json::Raw;
use tb_wire::manifest::Manifest;
use tb_wire::FlowEnvelope;

/// A workflow's flow version: the first 12 hex digits of the SHA-256 of its definition (a changed
/// definition is a new version; the same one is the same on every replica).
pub fn version(w: &Workflow) -> String {
    let bytes = serde_json::to_vec(w).unwrap_or_default();
    hex::encode(Sha256::digest(bytes))[..12].to_string()
}

/// The inbound subject of `manifest`: the `default` of its first `nats` service source.
pub fn inbound_subject(manifest: &Manifest) -> Option<&str> {
    manifest
        .service_sources
        .iter()
        .flatten()
        .find(|s| s.transport == "nats" && !s.default.is_empty())
        .map(|s| s.default.as_str())
}

/// The flow body of nats workflow `w` for `manifest` (its node targets the service's inbound
/// subject), or `None` for another executor.
pub fn body(w: &Workflow, manifest: &Manifest) -> Option<FlowBody> {
    let Executor::Nats {
        service,
        action,
        durable_timer,
    } = &w.executor
    else {
        return None;
    };
    Some(FlowBody {
        nodes: vec![FlowNode {
            id: action.clone(),
            kind: "service".into(),
            service: service.clone(),
            action: action.clone(),
            transport: "nats".into(),
            config: NodeConfig {
                target: inbound_subject(manifest).unwrap_or_default().to_string(),
            },
        }],
        durable_timer: *durable_timer,
    })
}

/// The flows of `workflows` that run on `manifest`'s service and pass the release gate; the
/// refused ones come back as `(workflow id, reason)`.
pub fn for_service<'a>(
    workflows: impl Iterator<Item = &'a Workflow>,
    manifest: &Manifest,
) -> (Vec<FlowEnvelope>, Vec<(String, String)>) {
    let (mut flows, mut refused) = (Vec::new(), Vec::new());
    for w in workflows {
        let Executor::Nats { service, .. } = &w.executor else {
            continue;
        };
        if *service != manifest.service {
            continue;
        }
        let Some(b) = body(w, manifest) else { continue };
        if let Err(e) = tb_wire::durable_timer::check_release(&b, std::slice::from_ref(manifest)) {
            refused.push((w.id.clone(), e));
            continue;
        }
        let text = serde_json::to_string(&b).expect("a flow body encodes");
        flows.push(FlowEnvelope {
            id: w.id.clone(),
            version: version(w),
            body: Raw::parse(&text).expect("an encoded body parses"),
        });
    }
    flows.sort_by(|a, b| a.id.cmp(&b.id));
    (flows, refused)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(caps: Option<Vec<String>>) -> Manifest {
        serde_json::from_value(serde_json::json!({
            "protocol_version": "1.0.0", "service": "svc", "service_version": "dev",
            "service_sources": [{"name": "in", "transport": "nats", "default": "triggers.v2.svc.in"}],
            "runtime_capabilities": caps,
        }))
        .unwrap()
    }

    fn wf(id: &str, service: &str, durable_timer: bool) -> Workflow {
        Workflow {
            id: id.into(),
            executor: Executor::Nats {
                service: service.into(),
                action: "act".into(),
                durable_timer,
            },
        }
    }

    #[test]
    fn a_service_gets_its_nats_workflows_and_the_gate_holds_back_timer_lineages() {
        let ws = [
            wf("b", "svc", false),
            wf("a", "svc", false),
            wf("other", "svc2", false),
            wf("timer", "svc", true),
            Workflow {
                id: "noop".into(),
                executor: Executor::Noop,
            },
        ];
        let (flows, refused) = for_service(ws.iter(), &manifest(None));
        assert_eq!(
            flows.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(
            flows[0].body.get(),
            r#"{"nodes":[{"id":"act","type":"service","service":"svc","action":"act","transport":"nats","config":{"target":"triggers.v2.svc.in"}}]}"#
        );
        assert_eq!(flows[0].version.len(), 12);
        assert_eq!(refused.len(), 1);
        assert!(
            refused[0].1.starts_with("durable_timer_capability_missing"),
            "{refused:?}"
        );
        let (flows, refused) =
            for_service(ws.iter(), &manifest(Some(vec!["durable_timer.v1".into()])));
        assert_eq!(flows.len(), 3);
        assert!(refused.is_empty());
        // The version follows the definition.
        assert_ne!(
            version(&wf("a", "svc", false)),
            version(&wf("a", "svc", true))
        );
        assert_eq!(
            version(&wf("a", "svc", false)),
            version(&wf("a", "svc", false))
        );
    }
}
