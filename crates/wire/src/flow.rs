//! The flow a service is handed (register reply `flows`, broadcasts), and how an inbound message
//! finds its action. The protocol leaves the flow body opaque (OPEN-4, OPEN-10); this is the
//! project's \[choice\], documented in `docs/wire.md`:
//!
//! * a body is `{"nodes": [FlowNode, ...], "durable_timer": bool}`; a node names the service, the
//!   action and the transport it is reached by (`config.target` = the inbound subject);
//! * a message selects its node by `X-Triggers-Flow-Id` + `X-Triggers-Source-Node-Id`; a node id that
//!   names an action of the service directly also routes (so a message never depends on having seen
//!   the flow first);
//! * a broadcast FlowEnvelope with a `null` body withdraws the flow.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::shapes::FlowEnvelope;

fn is_false(b: &bool) -> bool {
    !*b
}

/// A node's transport settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeConfig {
    /// The subject the node's input is published to (a `service_sources[].default`).
    pub target: String,
}

/// One service node of a flow.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FlowNode {
    pub id: String,
    /// `service` for a service action.
    #[serde(rename = "type")]
    pub kind: String,
    pub service: String,
    pub action: String,
    /// `nats`.
    pub transport: String,
    pub config: NodeConfig,
}

/// A flow's graph as this project writes it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct FlowBody {
    pub nodes: Vec<FlowNode>,
    /// The flow is a Durable Timer lineage: its release is gated by
    /// [`crate::durable_timer::check_release`].
    #[serde(skip_serializing_if = "is_false")]
    pub durable_timer: bool,
}

/// The flows a service knows, by id (its register reply, then broadcasts).
#[derive(Debug, Clone, Default)]
pub struct FlowTable {
    flows: HashMap<String, (String, FlowBody)>,
}

/// What applying a broadcast changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Added,
    Replaced,
    /// Same id and version: nothing changed.
    Unchanged,
    Withdrawn,
    /// A body that is not a flow body (kept out; logged by the caller).
    Refused,
}

impl FlowTable {
    /// Applies one FlowEnvelope: a `null` body withdraws the flow; a known id is replaced only when
    /// the version differs.
    pub fn apply(&mut self, f: &FlowEnvelope) -> Applied {
        if f.body.0.is_none() || f.body.get() == "null" {
            return match self.flows.remove(&f.id) {
                Some(_) => Applied::Withdrawn,
                None => Applied::Unchanged,
            };
        }
        let Ok(body) = serde_json::from_str::<FlowBody>(f.body.get()) else {
            return Applied::Refused;
        };
        match self.flows.get(&f.id) {
            Some((v, _)) if *v == f.version => Applied::Unchanged,
            known => {
                let replaced = known.is_some();
                self.flows.insert(f.id.clone(), (f.version.clone(), body));
                if replaced {
                    Applied::Replaced
                } else {
                    Applied::Added
                }
            }
        }
    }

    /// The version of flow `id`, when known.
    pub fn version(&self, id: &str) -> Option<&str> {
        self.flows.get(id).map(|(v, _)| v.as_str())
    }

    /// Number of flows known.
    pub fn len(&self) -> usize {
        self.flows.len()
    }

    /// True when no flow is known.
    pub fn is_empty(&self) -> bool {
        self.flows.is_empty()
    }

    /// The action a message is for: the node `source_node_id` of flow `flow_id` when the flow is
    /// known and the node is this service's, else `source_node_id` itself when it names one of
    /// `actions`. `None`: no action (a DLQ entry of kind `unknown_action`).
    pub fn route<'a>(
        &'a self,
        service: &str,
        flow_id: &str,
        source_node_id: &'a str,
        actions: &[&str],
    ) -> Option<&'a str> {
        let by_flow = self.flows.get(flow_id).and_then(|(_, b)| {
            b.nodes
                .iter()
                .find(|n| n.id == source_node_id && n.service == service)
                .map(|n| n.action.as_str())
        });
        by_flow
            .or_else(|| actions.contains(&source_node_id).then_some(source_node_id))
            .filter(|a| actions.contains(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::Raw;

    fn env(id: &str, version: &str, body: &str) -> FlowEnvelope {
        FlowEnvelope {
            id: id.into(),
            version: version.into(),
            body: Raw::parse(body).unwrap(),
        }
    }

    #[test]
    fn broadcasts_apply_by_id_and_version_and_route_messages() {
        let mut t = FlowTable::default();
        let body = r#"{"nodes":[{"id":"n1","type":"service","service":"svc","action":"greet","transport":"nats","config":{"target":"triggers.v2.svc.inbound"}}]}"#;
        assert_eq!(t.apply(&env("f", "1", body)), Applied::Added);
        assert_eq!(t.apply(&env("f", "1", body)), Applied::Unchanged);
        assert_eq!(t.apply(&env("f", "2", body)), Applied::Replaced);
        assert_eq!(t.version("f"), Some("2"));
        assert_eq!(
            t.apply(&env("g", "1", r#"{"nodes":"x"}"#)),
            Applied::Refused
        );
        let actions = ["greet", "other"];
        assert_eq!(t.route("svc", "f", "n1", &actions), Some("greet"));
        // A node of another service does not route here; an action name does, flow or not.
        assert_eq!(t.route("svc2", "f", "n1", &actions), None);
        assert_eq!(t.route("svc", "unknown", "other", &actions), Some("other"));
        assert_eq!(t.route("svc", "unknown", "nope", &actions), None);
        assert_eq!(t.apply(&env("f", "3", "null")), Applied::Withdrawn);
        assert_eq!(t.route("svc", "f", "n1", &actions), None);
        assert!(t.is_empty());
    }
}
