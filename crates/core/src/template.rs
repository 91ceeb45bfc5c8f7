//! `{field}` templates over normalized fields: coalesce keys (`{repository.full_name}#{pull_request.number}`),
//! signal names (`pr.{action}`) and the variables a prompt template refers to. Only allowlisted normalized
//! fields can be named (checked by `check-config`); nothing here evaluates payload code.

use serde_json::{Map, Value};

use crate::normalized::NormalizedEvent;

/// The field names a template refers to, in order. Errors: an unbalanced `{` / `}` or an empty `{}`.
pub fn fields(template: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut rest = template;
    while let Some(open) = rest.find(['{', '}']) {
        if rest.as_bytes()[open] == b'}' {
            return Err("unbalanced '}' in template".into());
        }
        let after = &rest[open + 1..];
        let close = after
            .find('}')
            .ok_or_else(|| "unclosed '{' in template".to_string())?;
        let name = &after[..close];
        if name.is_empty() || name.contains('{') {
            return Err("a template placeholder must name a field, as in {action}".into());
        }
        out.push(name.to_string());
        rest = &after[close + 1..];
    }
    Ok(out)
}

/// Renders the template with the event's field values (strings as-is, numbers and booleans in JSON
/// form). Errors: the name of the first field the event does not carry.
pub fn render(template: &str, ev: &NormalizedEvent) -> Result<String, String> {
    let mut out = String::with_capacity(template.len() + 16);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            return Err("unclosed '{'".into());
        };
        let name = &after[..close];
        match ev.field(name) {
            Some(Value::String(s)) => out.push_str(&s),
            Some(v @ (Value::Number(_) | Value::Bool(_))) => out.push_str(&v.to_string()),
            _ => return Err(name.to_string()),
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The values of the fields a template refers to (absent fields are left out): a prompt's variables,
/// carried next to the template text and never spliced into it.
pub fn variables(template: &str, ev: &NormalizedEvent) -> Value {
    let mut m = Map::new();
    for f in fields(template).unwrap_or_default() {
        if let Some(v) = ev.field(&f) {
            m.insert(f, v);
        }
    }
    Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev() -> NormalizedEvent {
        NormalizedEvent {
            event: "pull_request".into(),
            action: Some("synchronize".into()),
            fields: [
                ("repository.full_name".to_string(), json!("o/r")),
                ("pull_request.number".to_string(), json!(7)),
            ]
            .into_iter()
            .collect(),
        }
    }

    #[test]
    fn renders_keys_and_names() {
        let e = ev();
        assert_eq!(
            render("{repository.full_name}#{pull_request.number}", &e).unwrap(),
            "o/r#7"
        );
        assert_eq!(render("pr.{action}", &e).unwrap(), "pr.synchronize");
        assert_eq!(render("{sender.login}", &e).unwrap_err(), "sender.login");
        assert_eq!(
            fields("a{x}b{y.z}").unwrap(),
            vec!["x".to_string(), "y.z".to_string()]
        );
        assert!(fields("a{").is_err());
        assert!(fields("a}").is_err());
        assert!(fields("{}").is_err());
        assert_eq!(
            variables(
                "Review {repository.full_name} #{pull_request.number} by {sender.login}",
                &e
            ),
            json!({"repository.full_name": "o/r", "pull_request.number": 7})
        );
    }
}
