//! The redacted view of a receipt's body: what an operator with `operator:bodies` may
//! see. Only JSON bodies are shown. At any depth:
//! - a value under a key naming a credential or a personal contact ([`SENSITIVE`] as a part of the
//!   key, [`SENSITIVE_WORDS`] as a whole word of it) becomes `"[redacted]"`;
//! - a `{name|key: <such a name>, value: ...}` pair (headers as lists) has its `value` redacted;
//! - a string holding JSON is redacted inside; a `Bearer <x>` / `Basic <x>` / `token <x>` string
//!   and the user information of URLs (`https://user:pw@host`) and their `token=`-like query values
//!   are redacted;
//! - a credential of a listed shape anywhere in a string (an API key, a vendor token, a JWT, a PEM
//!   private key: the one list of [`crate::credentials`]) is replaced where it stands;
//! - strings longer than [`MAX_STRING`] are cut.
//!
//! A list of names cannot know every secret a sender invents: the view is for finding out what was
//! sent, and the role that may open it should be trusted with what slips through.

use serde_json::Value;

/// Parts of key names whose values are replaced (compared lowercase, `-`, `_` and `.` ignored).
pub const SENSITIVE: &[&str] = &[
    "token",
    "secret",
    "password",
    "passwd",
    "passphrase",
    "authorization",
    "apikey",
    "accesskey",
    "clientkey",
    "privatekey",
    "signature",
    "cookie",
    "credential",
    "email",
    "phone",
    "mobile",
    "sessionid",
    "bearer",
    "jwt",
];

/// Whole words of key names (split at `_`, `-`, `.` and lowercase-uppercase) whose values are
/// replaced: too short to match as parts (`auth` is in `author`).
pub const SENSITIVE_WORDS: &[&str] = &["auth", "key", "pin", "otp", "ssn", "pwd", "pass"];

/// Longest string kept whole, in characters; longer ones end in `…`.
pub const MAX_STRING: usize = 512;

const REDACTED: &str = crate::credentials::MASK;

/// Whether a key's value is hidden.
pub fn sensitive(key: &str) -> bool {
    let k: String = key
        .chars()
        .filter(|c| *c != '_' && *c != '-' && *c != '.')
        .flat_map(char::to_lowercase)
        .collect();
    if SENSITIVE.iter().any(|s| k.contains(s)) {
        return true;
    }
    // Words: split at separators and at a lowercase-uppercase step (`clientKey`).
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut prev_lower = false;
    for c in key.chars() {
        let boundary =
            c == '_' || c == '-' || c == '.' || c == ' ' || (c.is_uppercase() && prev_lower);
        if boundary && !cur.is_empty() {
            words.push(std::mem::take(&mut cur));
        }
        if c.is_alphanumeric() {
            cur.extend(c.to_lowercase());
        }
        prev_lower = c.is_lowercase();
    }
    words.push(cur);
    words.iter().any(|w| SENSITIVE_WORDS.contains(&w.as_str()))
}

/// A string with its credentials hidden: `Bearer` / `Basic` values, URL user information and
/// credential-named query values; a string holding a JSON object or array is redacted inside.
fn string(s: &str) -> Value {
    let t = s.trim_start();
    if t.starts_with('{') || t.starts_with('[') {
        if let Ok(inner) = serde_json::from_str::<Value>(s) {
            if inner.is_object() || inner.is_array() {
                return Value::String(json(&inner).to_string());
            }
        }
    }
    // An `Authorization` value: a scheme and one credential (however short), nothing after it. A
    // scheme word starting a sentence (`Bearer authentication required`) is left to the list below.
    let lower = t.to_ascii_lowercase();
    if ["bearer ", "basic ", "token "]
        .iter()
        .any(|p| lower.starts_with(p))
        && t.split_whitespace().count() == 2
    {
        return Value::String(REDACTED.into());
    }
    let mut out = s.to_string();
    // URL user information: scheme://user:pw@host -> scheme://[redacted]@host
    if let Some(i) = out.find("://") {
        let rest = &out[i + 3..];
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        if let Some(at) = rest[..end].rfind('@') {
            out = format!("{}://{REDACTED}{}", &out[..i], &rest[at..]);
        }
    }
    // Query values under credential names: ?token=abc -> ?token=[redacted]
    if let Some(q) = out.find('?') {
        let (head, query) = out.split_at(q + 1);
        let query: Vec<String> = query
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _)) if sensitive(k) => format!("{k}={REDACTED}"),
                _ => kv.to_string(),
            })
            .collect();
        out = format!("{head}{}", query.join("&"));
    }
    // Credentials of a listed shape anywhere in the text (crate::credentials), before the cut so
    // that a cut never leaves the head of one.
    if let std::borrow::Cow::Owned(masked) = crate::credentials::mask(&out, REDACTED) {
        out = masked;
    }
    if out.chars().count() > MAX_STRING {
        out = out.chars().take(MAX_STRING).chain(['…']).collect();
    }
    Value::String(out)
}

/// The redacted copy of `v`.
pub fn json(v: &Value) -> Value {
    match v {
        Value::Object(o) => {
            // A `{name: "Authorization", value: ...}` pair names its own secret.
            let named = ["name", "key", "header"]
                .iter()
                .any(|k| o.get(*k).and_then(Value::as_str).is_some_and(sensitive));
            Value::Object(
                o.iter()
                    .map(|(k, v)| {
                        let hide = (sensitive(k) || (named && k == "value")) && !v.is_null();
                        (
                            k.clone(),
                            if hide {
                                Value::String(REDACTED.into())
                            } else {
                                json(v)
                            },
                        )
                    })
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(json).collect()),
        Value::String(s) => string(s),
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
    fn short_words_names_in_pairs_urls_and_nested_json() {
        let v = j!({"author": {"name": "octo"}, "auth": "x", "access_key": "a", "clientKey": "k", "pin": 1234,
            "keyboard": "kept", "passphrase": "p", "headers": [{"name": "Authorization", "value": "Basic abc"}, {"name": "Accept", "value": "json"}],
            "url": "https://user:s3cret@example.com/x?token=abc&page=2", "note": "Bearer eyJ", "nested": "{\"password\":\"leaked\"}"});
        let r = json(&v);
        assert_eq!(r["author"], j!({"name": "octo"}), "author is not auth");
        for k in [
            "auth",
            "access_key",
            "clientKey",
            "pin",
            "passphrase",
            "note",
        ] {
            assert_eq!(r[k], "[redacted]", "{k}");
        }
        assert_eq!(r["keyboard"], "kept");
        assert_eq!(
            r["headers"],
            j!([{"name": "Authorization", "value": "[redacted]"}, {"name": "Accept", "value": "json"}])
        );
        assert_eq!(
            r["url"],
            "https://[redacted]@example.com/x?token=[redacted]&page=2"
        );
        assert_eq!(r["nested"], "{\"password\":\"[redacted]\"}");
    }

    fn corpus(file: &str) -> Vec<(String, String)> {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/credentials")
            .join(file);
        crate::credentials::corpus(&std::fs::read_to_string(p).unwrap())
    }

    /// The corpus of tests/fixtures/credentials: a credential of any listed shape in free text (a
    /// comment, a list item), under a key that names nothing, is replaced where it stands; ordinary
    /// text is kept as sent.
    #[test]
    fn every_credential_shape_of_the_corpus_is_redacted_in_free_text() {
        let mut shown = Vec::new();
        for (name, example) in corpus("positives.txt") {
            let r = json(
                &j!({"comment": {"body": format!("my key is {example}")}, "list": [example.clone()]}),
            );
            if r != j!({"comment": {"body": "my key is [redacted]"}, "list": ["[redacted]"]}) {
                shown.push(format!("{name}: {r}"));
            }
        }
        assert_eq!(shown, Vec::<String>::new());
        let changed: Vec<String> = corpus("negatives.txt")
            .into_iter()
            .map(|(_, text)| text)
            .filter(|text| json(&j!({"comment": text})) != j!({"comment": text}))
            .collect();
        assert_eq!(changed, Vec::<String>::new());
    }

    #[test]
    fn long_strings_are_cut() {
        let r = json(&j!({"body": "x".repeat(2000)}));
        assert_eq!(r["body"].as_str().unwrap().chars().count(), MAX_STRING + 1);
    }
}
