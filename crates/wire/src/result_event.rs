//! The `result_event` catalog entry an SDK derives for a flat typed output (wire spec §6.5: "for flat
//! typed object outputs the SDK derives `result_event` automatically; empty outputs omit it"). It is
//! a catalog field: never hashed. It must not carry `topic` in v2.
//!
//! \[choice\] (the protocol names the keys, not their values): `event_type` and `schema_id` are
//! `<service>.<action>.result`, `schema_version` is `"1"`, and `fields` lists the output's properties
//! as `{name, type, required}` (sorted by name, `required` left out when false).

use serde_json::{json, Value};

use crate::manifest::InputField;

const SCALARS: &[&str] = &["string", "integer", "number", "boolean"];

/// The scalar type of a property schema (`"T"` or `["T", "null"]`), and whether it admits null.
fn scalar(p: &Value) -> Option<(String, bool)> {
    match &p["type"] {
        Value::String(t) if SCALARS.contains(&t.as_str()) => Some((t.clone(), false)),
        Value::Array(ts) => {
            let named: Vec<&str> = ts.iter().filter_map(Value::as_str).collect();
            match named.as_slice() {
                [t, "null"] | ["null", t] if SCALARS.contains(t) => Some((t.to_string(), true)),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The `result_event` of action `action` of `service` whose normalized result schema is `schema`,
/// or `None` when the output is not a flat object of scalar properties (nested, a list, or no
/// properties at all).
pub fn derive(service: &str, action: &str, schema: &Value) -> Option<Value> {
    if schema["type"] != "object" {
        return None;
    }
    let props = schema["properties"].as_object()?;
    if props.is_empty() {
        return None;
    }
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut fields = Vec::with_capacity(props.len());
    for (name, p) in props {
        let (kind, nullable) = scalar(p)?;
        fields.push(InputField {
            name: name.clone(),
            kind,
            required: required.contains(&name.as_str()) && !nullable,
        });
    }
    fields.sort_by(|a, b| a.name.cmp(&b.name));
    let id = format!("{service}.{action}.result");
    Some(json!({
        "event_type": id,
        "schema_id": id,
        "schema_version": "1",
        "fields": fields,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_outputs_get_a_result_event_and_others_none() {
        let flat = json!({"type": "object", "required": ["delivered", "count"], "properties": {
            "delivered": {"type": "boolean"}, "count": {"type": "integer"},
            "note": {"type": ["string", "null"]}}});
        assert_eq!(
            derive("svc", "send", &flat).unwrap(),
            json!({"event_type": "svc.send.result", "schema_id": "svc.send.result",
                   "schema_version": "1", "fields": [
                {"name": "count", "type": "integer", "required": true},
                {"name": "delivered", "type": "boolean", "required": true},
                {"name": "note", "type": "string"}]})
        );
        assert!(derive("svc", "send", &flat).unwrap().get("topic").is_none());
        let nested = json!({"type": "object", "properties": {"a": {"type": "object"}}});
        assert_eq!(derive("svc", "send", &nested), None);
        let empty = json!({"type": "object", "properties": {}});
        assert_eq!(derive("svc", "send", &empty), None);
        assert_eq!(derive("svc", "send", &json!({"type": "string"})), None);
        assert_eq!(derive("svc", "send", &Value::Null), None);
    }
}
