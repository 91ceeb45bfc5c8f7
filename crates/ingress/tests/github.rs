//! GitHub connector (signals-and-connectors §1) against the vendored vectors (`tests/fixtures`) and real payloads.

mod common;

use serde_json::Value;
use sha2::{Digest, Sha256};
use trigger_bridge_ingress::github::{sign, verify};
use trigger_bridge_ingress::{IngressError, Verified};

const SECRET: &[u8] = b"It's a Secret to Everybody";
const DELIVERY: &str = "72d3162e-cc78-11e3-81ab-4c9367dc0958";
const JSON: (&str, &str) = ("content-type", "application/json");
const FORM: (&str, &str) = ("content-type", "application/x-www-form-urlencoded");

/// Verifies `body` under `secret` with event / delivery / signature headers plus `extra`.
fn check(
    secret: &[u8],
    event: &str,
    sig: &str,
    extra: &[(&str, &str)],
    body: &[u8],
) -> Result<Verified, IngressError> {
    let mut pairs = vec![
        ("x-github-event", event),
        ("x-github-delivery", DELIVERY),
        ("x-hub-signature-256", sig),
    ];
    pairs.extend_from_slice(extra);
    verify(secret, &common::headers(&pairs), body, &Default::default())
}

/// `body` signed with [`SECRET`] and verified as a JSON `event` delivery.
fn self_signed(event: &str, body: &[u8]) -> Result<Verified, IngressError> {
    check(SECRET, event, &sign(SECRET, body), &[JSON], body)
}

fn bad<T: std::fmt::Debug>(r: Result<T, IngressError>) -> bool {
    matches!(r, Err(IngressError::SignatureInvalid(_)))
}

#[test]
fn signature_vectors() {
    let file = common::json("github-signature/vectors.json");
    let vectors = file["vectors"].as_array().unwrap();
    assert!(vectors.len() >= 11);
    for v in vectors {
        let secret = v["secret"].as_str().unwrap().as_bytes();
        let want = v["header_value"].as_str().unwrap();
        let Some(rel) = v["file"].as_str() else {
            // GitHub's documented example: "Hello, World!" authenticates but is not JSON.
            let body = v["payload_utf8"].as_str().unwrap().as_bytes();
            assert_eq!(sign(secret, body), want);
            let r = check(secret, "ping", want, &[JSON], body);
            assert_eq!(r, Err(IngressError::Malformed("body is not valid JSON")));
            continue;
        };
        let body = std::fs::read(common::fixtures().join(rel)).unwrap();
        assert_eq!(
            body.len() as u64,
            v["body_bytes"].as_u64().unwrap(),
            "{rel} changed"
        );
        assert_eq!(
            hex::encode(Sha256::digest(&body)),
            v["body_sha256"].as_str().unwrap()
        );
        let event = rel.split('/').nth(1).unwrap();
        assert_eq!(sign(secret, &body), want, "{rel}");
        let ok = check(secret, event, want, &[JSON], &body).unwrap();
        assert_eq!(ok.provider_event_id, DELIVERY);
        let upper = format!("sha256={}", want[7..].to_ascii_uppercase());
        assert!(
            check(secret, event, &upper, &[JSON], &body).is_ok(),
            "upper-case hex"
        );
        let mut flipped = body.clone();
        flipped[body.len() / 2] ^= 0x01;
        assert!(bad(check(secret, event, want, &[JSON], &flipped)));
        assert!(bad(check(b"wrong secret", event, want, &[JSON], &body)));
        let legacy = v["legacy_sha1_header_value"].as_str().unwrap();
        let only_legacy = common::headers(&[
            ("x-github-event", event),
            ("x-github-delivery", DELIVERY),
            ("X-Hub-Signature", legacy),
        ]);
        let r = verify(secret, &only_legacy, &body, &Default::default());
        assert!(matches!(r, Err(IngressError::SignatureInvalid(m)) if m.contains("legacy sha1")));
    }
}

#[test]
fn form_encoded_body_is_verified_as_sent() {
    let form = b"payload=%7B%22zen%22%3A%22hi%22%7D";
    let sig = sign(SECRET, form);
    let v = check(SECRET, "ping", &sig, &[FORM], form).unwrap();
    assert_eq!((v.event.event.as_str(), v.event.action), ("ping", None));
    // The same JSON sent as JSON with the form's signature fails.
    assert!(bad(check(
        SECRET,
        "ping",
        &sig,
        &[JSON],
        br#"{"zen":"hi"}"#
    )));
    // A form without a payload field is malformed (after authentication).
    let r = check(SECRET, "ping", &sign(SECRET, b"zen=hi"), &[FORM], b"zen=hi");
    assert_eq!(
        r,
        Err(IngressError::Malformed("form body has no payload field"))
    );
}

#[test]
fn content_type_and_encoding_rules() {
    let body = br#"{"zen":"hi"}"#;
    let sig = sign(SECRET, body);
    let with = |extra: &[(&str, &str)]| check(SECRET, "ping", &sig, extra, body);
    assert!(with(&[]).is_ok(), "missing Content-Type is JSON");
    assert!(with(&[("Content-Type", "application/json; charset=utf-8")]).is_ok());
    assert!(with(&[("content-encoding", "identity")]).is_ok());
    let refused = [
        ("content-type", "text/plain"),
        ("content-encoding", "gzip"),
        ("content-type", "application/jsonx"),
    ];
    for extra in refused {
        let r = with(&[extra]);
        assert!(
            matches!(r, Err(IngressError::UnsupportedMediaType(_))),
            "{extra:?}"
        );
    }
}

#[test]
fn headers_and_body_shape_after_authentication() {
    let body = br#"{"zen":"hi"}"#;
    let sig = sign(SECRET, body);
    let only =
        |pairs: &[(&str, &str)]| verify(SECRET, &common::headers(pairs), body, &Default::default());
    let (ev, dl, sg) = (
        ("x-github-event", "ping"),
        ("x-github-delivery", DELIVERY),
        ("x-hub-signature-256", sig.as_str()),
    );
    let missing_sig = Err(IngressError::SignatureInvalid(
        "missing X-Hub-Signature-256",
    ));
    assert_eq!(only(&[ev, dl]), missing_sig);
    assert_eq!(
        only(&[dl, sg]),
        Err(IngressError::Malformed("missing X-GitHub-Event"))
    );
    assert_eq!(
        only(&[ev, sg]),
        Err(IngressError::Malformed("missing X-GitHub-Delivery"))
    );
    let long = "d".repeat(129);
    let r = only(&[ev, ("x-github-delivery", &long), sg]);
    assert_eq!(r, Err(IngressError::Malformed("invalid X-GitHub-Delivery")));
    assert_eq!(
        only(&[ev, ("x-github-delivery", " abc "), sg])
            .unwrap()
            .provider_event_id,
        "abc"
    );
    let r = self_signed("push", b"[1,2]");
    assert_eq!(
        r,
        Err(IngressError::Malformed("payload is not a JSON object"))
    );
    // Long strings are skipped, not truncated; objects never enter fields.
    let big = format!(
        r#"{{"repository":{{"full_name":"{}","id":7}},"sender":{{"login":{{}}}}}}"#,
        "a".repeat(513)
    );
    let v = self_signed("push", big.as_bytes()).unwrap();
    assert_eq!(v.event.fields.len(), 1);
    assert_eq!(v.event.fields["repository.id"], 7);
}

fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(v, |v, p| &v[p])
}

/// Asserts that normalized field `key` equals the payload's value (or is absent when the payload has none).
fn same(f: &std::collections::BTreeMap<String, Value>, json: &Value, key: &str, name: &str) {
    assert_eq!(
        f.get(key),
        Some(at(json, key)).filter(|x| !x.is_null()),
        "{name} {key}"
    );
}

#[test]
fn real_payloads_normalize_to_their_values() {
    let mut count = 0;
    for dir in std::fs::read_dir(common::fixtures().join("github")).unwrap() {
        let dir = dir.unwrap().path();
        let event = dir.file_name().unwrap().to_str().unwrap().to_owned();
        for file in std::fs::read_dir(&dir).unwrap() {
            let path = file.unwrap().path();
            let name = path.display().to_string();
            let body = std::fs::read(&path).unwrap();
            let json: Value = serde_json::from_slice(&body).unwrap();
            let v = self_signed(&event, &body).unwrap_or_else(|e| panic!("{name}: {e}"));
            count += 1;
            let f = &v.event.fields;
            assert_eq!(v.event.event, event, "{name}");
            let action = if event == "ping" {
                None
            } else {
                json["action"].as_str()
            };
            assert_eq!(v.event.action.as_deref(), action, "{name}");
            assert!(f
                .values()
                .all(|x| !x.is_object() && !x.is_array() && !x.is_null()));
            let keys: &[&str] = match event.as_str() {
                "pull_request" => &[
                    "number",
                    "pull_request.number",
                    "pull_request.head.sha",
                    "pull_request.head.ref",
                    "pull_request.base.ref",
                    "pull_request.merged",
                    "pull_request.draft",
                ],
                "issues" => &["issue.number"],
                "issue_comment" => &["issue.number", "comment.id"],
                "push" => &["ref", "before", "after"],
                "check_run" => &[
                    "check_run.status",
                    "check_run.conclusion",
                    "check_run.head_sha",
                ],
                _ => &[],
            };
            for key in [
                "repository.full_name",
                "repository.id",
                "sender.login",
                "installation.id",
            ]
            .iter()
            .chain(keys)
            {
                same(f, &json, key, &name);
            }
            for key in keys
                .iter()
                .filter(|k| k.ends_with("number") || k.ends_with("sha") || **k == "ref")
            {
                assert!(f.contains_key(*key), "{name}: {key} missing");
            }
        }
    }
    assert!(count >= 80, "only {count} payload files found");
}
