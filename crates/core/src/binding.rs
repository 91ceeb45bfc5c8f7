//! Bindings: operator-owned routing rules (DESIGN §2, signals-and-connectors §0.2) and their matching.
//!
//! A binding names one subscription, the event types it takes, an equality filter on normalized fields
//! (an allowlist: never payload code, never JSONPath), ONE action, and how normalized fields fill the
//! run's inputs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::normalized::{FieldValue, NormalizedEvent};

mod coalescing;

pub use coalescing::*;

/// What a coalescing `start_run` binding does when a live session already holds the key
/// (signals-and-connectors §0.2: the match must say explicitly what happens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnExisting {
    /// Nothing: the delivery is delivered and names the existing run.
    #[default]
    Noop,
    /// Raise the binding's `signal` on the existing session.
    Signal,
    /// Enqueue the binding's `prompt` on the existing session.
    Prompt,
}

/// The one fixed action a binding takes (DESIGN §2 binding; signals-and-connectors §0.2). Every target,
/// workflow, signal name and prompt comes from here; the payload only fills `{field}` placeholders from
/// allowlisted normalized fields.
///
/// A `raise_signal` / `enqueue_prompt` target is either a fixed `run`, or the live session of `workflow`
/// holding the rendered `coalesce_key`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum BindingAction {
    /// Start one run of `workflow` per delivery. With a `coalesce_key` template (session workflows only),
    /// the first event with a key starts the session and later ones take `on_existing` on it.
    StartRun {
        workflow: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        coalesce_key: Option<String>,
        #[serde(default)]
        on_existing: OnExisting,
        /// Signal name template for `on_existing = "signal"` (e.g. `pr.{action}`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<String>,
        /// Prompt template for `on_existing = "prompt"`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompt: Option<String>,
        /// Raised signals also enqueue a wake turn.
        #[serde(default)]
        wake: bool,
    },
    /// Raise the named signal (template) on one target.
    RaiseSignal {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        workflow: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        coalesce_key: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run: Option<String>,
        signal: String,
        #[serde(default)]
        wake: bool,
    },
    /// Enqueue a prompt from the server-owned template on one target.
    EnqueuePrompt {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        workflow: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        coalesce_key: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run: Option<String>,
        prompt: String,
    },
}

impl BindingAction {
    /// A plain `start_run` of `workflow` (no coalescing).
    pub fn start_run(workflow: impl Into<String>) -> Self {
        BindingAction::StartRun {
            workflow: workflow.into(),
            coalesce_key: None,
            on_existing: OnExisting::Noop,
            signal: None,
            prompt: None,
            wake: false,
        }
    }

    /// The action's wire name (`start_run`, `raise_signal`, `enqueue_prompt`), stored on deliveries.
    pub fn name(&self) -> &'static str {
        match self {
            BindingAction::StartRun { .. } => "start_run",
            BindingAction::RaiseSignal { .. } => "raise_signal",
            BindingAction::EnqueuePrompt { .. } => "enqueue_prompt",
        }
    }

    /// The workflow this action starts or targets, if any.
    pub fn workflow(&self) -> Option<&str> {
        match self {
            BindingAction::StartRun { workflow, .. } => Some(workflow),
            BindingAction::RaiseSignal { workflow, .. }
            | BindingAction::EnqueuePrompt { workflow, .. } => workflow.as_deref(),
        }
    }
}

/// The rendered parameters of one delivery's action, stored with the delivery (JSON, camelCase). Fixed
/// at routing time, so a retry performs exactly the same action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ActionParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coalesce_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_existing: Option<OnExisting>,
    /// Rendered signal name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    #[serde(default)]
    pub wake: bool,
    /// Prompt template text (never spliced with payload values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Values of the fields the prompt refers to (untrusted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variables: Option<Value>,
    /// Fixed target run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
}

/// Why a matching binding could not be turned into a delivery; the delivery is recorded dead-lettered
/// with this reason and the receipt ends `routing_failed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteError {
    /// A template names a field the event does not carry (`template_field_missing`).
    FieldMissing(String),
    /// The rendered signal name is not `[a-z0-9_.-]{1,64}` (`invalid_signal_name`).
    InvalidSignalName,
}

impl RouteError {
    /// The closed reason code recorded on the dead-lettered delivery.
    pub fn reason(&self) -> &'static str {
        match self {
            RouteError::FieldMissing(_) => "template_field_missing",
            RouteError::InvalidSignalName => "invalid_signal_name",
        }
    }
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
    /// Matched events this binding takes per fixed UTC minute (`crate::rate`); past it the whole
    /// request is answered 429 `rate_limited` with `Retry-After` and nothing is stored, so the sender
    /// retries it. 0 = unlimited (the default).
    #[serde(default)]
    pub rate_limit_per_min: u32,
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

    /// Renders this binding's action for `ev`: the coalesce key, signal name and prompt variables.
    /// Errors: [`RouteError`].
    pub fn params(&self, ev: &NormalizedEvent) -> Result<ActionParams, RouteError> {
        use crate::template::{render, variables};
        let key = |k: &Option<String>| -> Result<Option<String>, RouteError> {
            k.as_deref()
                .map(|t| render(t, ev).map_err(RouteError::FieldMissing))
                .transpose()
        };
        let name = |t: &str| -> Result<String, RouteError> {
            let n = render(t, ev).map_err(RouteError::FieldMissing)?;
            crate::signal::validate_name(&n).map_err(|_| RouteError::InvalidSignalName)?;
            Ok(n)
        };
        Ok(match &self.action {
            BindingAction::StartRun {
                coalesce_key,
                on_existing,
                signal,
                prompt,
                wake,
                ..
            } => {
                let coalesce = key(coalesce_key)?;
                let existing = coalesce.as_ref().map(|_| *on_existing);
                ActionParams {
                    signal: match (existing, signal) {
                        (Some(OnExisting::Signal), Some(t)) => Some(name(t)?),
                        _ => None,
                    },
                    variables: prompt.as_deref().map(|p| variables(p, ev)),
                    prompt: prompt.clone(),
                    coalesce_key: coalesce,
                    on_existing: existing,
                    wake: *wake,
                    run: None,
                }
            }
            BindingAction::RaiseSignal {
                coalesce_key,
                run,
                signal,
                wake,
                ..
            } => ActionParams {
                coalesce_key: key(coalesce_key)?,
                signal: Some(name(signal)?),
                wake: *wake,
                run: run.clone(),
                ..Default::default()
            },
            BindingAction::EnqueuePrompt {
                coalesce_key,
                run,
                prompt,
                ..
            } => ActionParams {
                coalesce_key: key(coalesce_key)?,
                variables: Some(variables(prompt, ev)),
                prompt: Some(prompt.clone()),
                run: run.clone(),
                ..Default::default()
            },
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
            rate_limit_per_min: 0,
            id: "b".into(),
            subscription: "s".into(),
            event_types: types.iter().map(|s| s.to_string()).collect(),
            filter: BTreeMap::new(),
            action: BindingAction::start_run("w"),
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

    #[test]
    fn params_render_from_allowlisted_fields_only() {
        let e = ev(
            "pull_request",
            Some("synchronize"),
            &[
                ("repository.full_name", json!("o/r")),
                ("pull_request.number", json!(7)),
            ],
        );
        let mut b = binding(&["pull_request"]);
        b.action = BindingAction::StartRun {
            workflow: "pr-session".into(),
            coalesce_key: Some("{repository.full_name}#{pull_request.number}".into()),
            on_existing: OnExisting::Signal,
            signal: Some("pr.{action}".into()),
            prompt: None,
            wake: false,
        };
        let p = b.params(&e).unwrap();
        assert_eq!(p.coalesce_key.as_deref(), Some("o/r#7"));
        assert_eq!(p.signal.as_deref(), Some("pr.synchronize"));
        assert_eq!(p.on_existing, Some(OnExisting::Signal));
        b.action = BindingAction::RaiseSignal {
            workflow: Some("pr-session".into()),
            coalesce_key: Some("{sender.login}".into()),
            run: None,
            signal: "x".into(),
            wake: true,
        };
        assert_eq!(
            b.params(&e).unwrap_err(),
            RouteError::FieldMissing("sender.login".into())
        );
        b.action = BindingAction::RaiseSignal {
            workflow: None,
            coalesce_key: None,
            run: Some("run_1".into()),
            signal: "{repository.full_name}".into(),
            wake: false,
        };
        assert_eq!(b.params(&e).unwrap_err(), RouteError::InvalidSignalName);
    }
}
