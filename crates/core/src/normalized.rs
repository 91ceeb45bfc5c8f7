//! The normalized event: the small, allowlisted view of a receipt that routing may look at (DESIGN §2,
//! signals-and-connectors §0.4). Connectors build it after verifying the raw bytes; bindings, filters and
//! input mappings see nothing else.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A scalar field value (string, integer or boolean). Objects and arrays never enter a normalized event.
pub type FieldValue = serde_json::Value;

/// Allowlisted view of one inbound event.
///
/// * `event` is the provider's event name (`pull_request`, `push`, `ping`, or for Standard Webhooks the
///   payload's `type` field when present, else `webhook`).
/// * `action` is the provider's sub-action (`opened`, `closed`, ...) when it has one.
/// * `fields` holds named scalar fields such as `repository.full_name` or `pull_request.number`; the
///   names a connector may fill are listed by that connector (see `trigger_bridge_ingress::normalized_fields`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct NormalizedEvent {
    pub event: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(default)]
    pub fields: BTreeMap<String, FieldValue>,
}

impl NormalizedEvent {
    /// The event type routing matches on: `event.action` when there is an action, else `event`
    /// (e.g. `pull_request.opened`, `push`).
    pub fn event_type(&self) -> String {
        match &self.action {
            Some(a) => format!("{}.{}", self.event, a),
            None => self.event.clone(),
        }
    }

    /// Looks up a field by name; `event` and `action` are addressable as fields too.
    pub fn field(&self, name: &str) -> Option<FieldValue> {
        match name {
            "event" => Some(FieldValue::String(self.event.clone())),
            "action" => self.action.clone().map(FieldValue::String),
            _ => self.fields.get(name).cloned(),
        }
    }
}
