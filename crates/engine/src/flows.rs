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

/// A flow's version: the first 12 hex digits of the SHA-256 of its whole body as sent (`body_text`,
/// the JSON of a [`FlowBody`]). Any change of the body (a node, its action, the target subject that
/// follows the service's nats source `default`, the Durable Timer flag) is a new version, and the
/// same body is the same version on every replica: services replace a flow only when its version
/// differs (triggers.v2 §10 broadcast; `tb_wire::flow::FlowTable`; docs/wire.md).
pub fn body_version(body_text: &str) -> String {
    hex::encode(Sha256::digest(body_text.as_bytes()))[..12].to_string()
}

/// The JSON text of a flow body, as [`for_service`] sends it.
fn body_text(b: &FlowBody) -> String {
    serde_json::to_string(b).expect("a flow body encodes")
}

/// The version of nats workflow `w`'s flow for `manifest` ([`body_version`] of [`body`]): what
/// [`for_service`] hands the service and what the `X-Triggers-Flow-Version` of its messages says.
/// `None` for another executor.
pub fn version(w: &Workflow, manifest: &Manifest) -> Option<String> {
    body(w, manifest).map(|b| body_version(&body_text(&b)))
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
        let text = body_text(&b);
        flows.push(FlowEnvelope {
            id: w.id.clone(),
            version: body_version(&text),
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
        // The version follows the body.
        let m = manifest(None);
        assert_ne!(
            version(&wf("a", "svc", false), &m),
            version(&wf("a", "svc", true), &m)
        );
        assert_eq!(
            version(&wf("a", "svc", false), &m),
            version(&wf("a", "svc", false), &m)
        );
        assert_eq!(
            version(&wf("a", "svc", false), &m).as_ref(),
            Some(&flows[0].version)
        );
        assert_eq!(
            version(
                &Workflow {
                    id: "noop".into(),
                    executor: Executor::Noop
                },
                &m
            ),
            None
        );
    }

    /// A service that registers again with another nats source `default` gets the same workflow with
    /// a new `config.target`: a changed body is a new version, so a service that replaces a flow only
    /// when the version differs (`tb_wire::flow::FlowTable`) takes the new body.
    #[test]
    fn a_changed_body_is_a_new_version_that_replaces_the_stale_flow() {
        let ws = [wf("a", "svc", false)];
        let with_default = |subject: &str| {
            let mut m = manifest(None);
            m.service_sources.as_mut().unwrap()[0].default = subject.into();
            m
        };
        let (first, _) = for_service(ws.iter(), &with_default("triggers.v2.svc.in"));
        let (moved, _) = for_service(ws.iter(), &with_default("triggers.v2.svc.moved"));
        assert_ne!(first[0].body.get(), moved[0].body.get());
        assert_ne!(
            first[0].version, moved[0].version,
            "a changed body is a new version"
        );
        let (same, _) = for_service(ws.iter(), &with_default("triggers.v2.svc.in"));
        assert_eq!(
            same[0].version, first[0].version,
            "the same body, the same version"
        );
        let mut table = tb_wire::flow::FlowTable::default();
        assert_eq!(table.apply(&first[0]), tb_wire::flow::Applied::Added);
        assert_eq!(table.apply(&moved[0]), tb_wire::flow::Applied::Replaced);
        assert!(moved[0].body.get().contains("triggers.v2.svc.moved"));
    }
}
