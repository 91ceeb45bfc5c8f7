//! The redacted view of a receipt's body (issue #13): what an operator with `operator:bodies` may
//! see. Only JSON bodies are shown; every value under a key that names a credential or personal
//! contact (see [`SENSITIVE`]) becomes `"[redacted]"`, at any depth; long strings are cut.

use serde_json::Value;

/// Parts of key names whose values are replaced (compared lowercase, `-` and `_` ignored).
pub const SENSITIVE: &[&str] = &[
    "token",
    "secret",
    "password",
    "passwd",
    "authorization",
    "apikey",
    "signature",
    "cookie",
    "privatekey",
    "credential",
    "email",
    "phone",
    "sessionid",
];

/// Longest string kept whole, in characters; longer ones end in `…`.
pub const MAX_STRING: usize = 512;

/// Whether a key's value is hidden.
pub fn sensitive(key: &str) -> bool {
    let k: String = key
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(char::to_lowercase)
        .collect();
    SENSITIVE.iter().any(|s| k.contains(s))
}

/// The redacted copy of `v`.
pub fn json(v: &Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.iter()
                .map(|(k, v)| {
                    let v = if sensitive(k) && !v.is_null() {
                        Value::String("[redacted]".into())
                    } else {
                        json(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(json).collect()),
        Value::String(s) if s.chars().count() > MAX_STRING => {
            Value::String(s.chars().take(MAX_STRING).chain(['…']).collect())
        }
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json as j;

    #[test]
    fn credentials_and_contacts_are_hidden_at_any_depth() {
        let v = j!({"pusher": {"name": "octo", "email": "o@example.com"}, "hook": {"config": {"secret": "s3", "url": "u"}},
            "items": [{"Access_Token": "t"}, {"id": 1}], "X-Hub-Signature-256": "sha256=..", "number": 2});
        let r = json(&v);
        assert_eq!(r["pusher"], j!({"name": "octo", "email": "[redacted]"}));
        assert_eq!(
            r["hook"]["config"],
            j!({"secret": "[redacted]", "url": "u"})
        );
        assert_eq!(r["items"], j!([{"Access_Token": "[redacted]"}, {"id": 1}]));
        assert_eq!(r["X-Hub-Signature-256"], "[redacted]");
        assert_eq!(r["number"], 2);
    }

    #[test]
    fn long_strings_are_cut() {
        let r = json(&j!({"body": "x".repeat(2000)}));
        assert_eq!(r["body"].as_str().unwrap().chars().count(), MAX_STRING + 1);
    }
}
