//! Bindings: operator-owned routing rules (DESIGN §2, signals-and-connectors §0.2) and their matching.
//!
//! A binding names one subscription, the event types it takes, an equality filter on normalized fields
//! (an allowlist: never payload code, never JSONPath), ONE action, and how normalized fields fill the
//! run's inputs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::normalized::{FieldValue, NormalizedEvent};

/// The one fixed action a binding takes. Only `start_run` exists so far; `raise_signal` and
/// `enqueue_prompt` arrive with sessions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum BindingAction {
    /// Start one run of `workflow` per delivery.
    StartRun { workflow: String },
}

/// An operator-owned routing rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Binding {
    pub id: String,
    pub subscription: String,
    /// Event types taken: `event.action` (e.g. `pull_request.opened`), `event` (any action of that event),
    /// or `*` (every event except `ping`, which never triggers a binding).
    pub event_types: Vec<String>,
    /// Equality filter: each named field must equal one of the listed values (AND across fields, OR within).
    #[serde(default)]
    pub filter: BTreeMap<String, Vec<FieldValue>>,
    #[serde(flatten)]
    pub action: BindingAction,
    /// Run inputs: input name -> normalized field name. A missing field leaves the input out.
    #[serde(default)]
    pub inputs: BTreeMap<String, String>,
}

impl Binding {
    /// True when this binding takes the event: its event type is listed and every filter field matches.
    /// `ping` never matches (signals-and-connectors §0.4: recorded, never triggers a binding).
    pub fn matches(&self, ev: &NormalizedEvent) -> bool {
        if ev.event == "ping" {
            return false;
        }
        let full = ev.event_type();
        let type_ok = self
            .event_types
            .iter()
            .any(|t| t == "*" || *t == full || *t == ev.event);
        type_ok
            && self
                .filter
                .iter()
                .all(|(name, allowed)| match ev.field(name) {
                    Some(v) => allowed.iter().any(|a| scalar_eq(a, &v)),
                    None => false,
                })
    }

    /// The run inputs this binding maps from the event's allowlisted fields.
    pub fn map_inputs(&self, ev: &NormalizedEvent) -> Value {
        let mut out = Map::new();
        for (input, field) in &self.inputs {
            if let Some(v) = ev.field(field) {
                out.insert(input.clone(), v);
            }
        }
        Value::Object(out)
    }
}

/// Compares scalars leniently across string / number so `"42"` in a TOML filter matches `42`.
fn scalar_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::String(x), Value::Number(n)) | (Value::Number(n), Value::String(x)) => {
            x == &n.to_string()
        }
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev(event: &str, action: Option<&str>, fields: &[(&str, Value)]) -> NormalizedEvent {
        NormalizedEvent {
            event: event.into(),
            action: action.map(Into::into),
            fields: fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }
    }

    fn binding(types: &[&str]) -> Binding {
        Binding {
            id: "b".into(),
            subscription: "s".into(),
            event_types: types.iter().map(|s| s.to_string()).collect(),
            filter: BTreeMap::new(),
            action: BindingAction::StartRun {
                workflow: "w".into(),
            },
            inputs: BTreeMap::new(),
        }
    }

    #[test]
    fn event_type_forms() {
        let opened = ev("pull_request", Some("opened"), &[]);
        let closed = ev("pull_request", Some("closed"), &[]);
        assert!(binding(&["pull_request.opened"]).matches(&opened));
        assert!(!binding(&["pull_request.opened"]).matches(&closed));
        assert!(binding(&["pull_request"]).matches(&closed));
        assert!(binding(&["*"]).matches(&closed));
        assert!(!binding(&["*"]).matches(&ev("ping", None, &[])));
        assert!(!binding(&["push"]).matches(&opened));
    }

    #[test]
    fn filter_and_inputs() {
        let e = ev(
            "pull_request",
            Some("opened"),
            &[
                ("repository.full_name", json!("o/r")),
                ("pull_request.number", json!(7)),
            ],
        );
        let mut b = binding(&["pull_request.opened"]);
        b.filter.insert(
            "repository.full_name".into(),
            vec![json!("x/y"), json!("o/r")],
        );
        b.filter
            .insert("pull_request.number".into(), vec![json!("7")]);
        assert!(b.matches(&e));
        b.filter.insert("sender.login".into(), vec![json!("z")]);
        assert!(!b.matches(&e), "a filter on an absent field never matches");
        b.inputs.insert("pr".into(), "pull_request.number".into());
        b.inputs.insert("who".into(), "sender.login".into());
        assert_eq!(b.map_inputs(&e), json!({"pr": 7}));
    }
}
