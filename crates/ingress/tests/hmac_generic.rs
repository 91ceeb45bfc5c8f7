//! Generic HMAC-SHA256 connector (`ConnectorSpec::Hmac`).

mod common;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::Mac;
use sha2::{Digest, Sha256};
use tb_core::connector::{ConnectorSpec, SignatureEncoding};
use trigger_bridge_ingress::hmac_generic::{sign, verify};
use trigger_bridge_ingress::{IngressError, Verified};

const SECRET: &[u8] = b"generic-shared-secret";
const BODY: &[u8] = br#"{"build":42,"status":"ok"}"#;
const NOW: i64 = 1_732_900_000;

fn spec(encoding: SignatureEncoding, prefix: Option<&str>, ts: bool) -> ConnectorSpec {
    ConnectorSpec::Hmac {
        signature_header: "X-Signature".into(),
        signature_prefix: prefix.map(Into::into),
        encoding,
        timestamp_header: ts.then(|| "X-Timestamp".into()),
        tolerance_s: 300,
        id_header: None,
        event_header: None,
    }
}

fn bad<T: std::fmt::Debug>(r: Result<T, IngressError>) -> bool {
    matches!(r, Err(IngressError::SignatureInvalid(_)))
}

/// Verifies `body` under `spec` with the single header `x-signature: sig` at [`NOW`].
fn with_sig(spec: &ConnectorSpec, sig: &str, body: &[u8]) -> Result<Verified, IngressError> {
    verify(
        spec,
        SECRET,
        &common::headers(&[("X-Signature", sig)]),
        body,
        NOW,
    )
}

#[test]
fn hex_and_base64_without_timestamp() {
    // Independent reference: HMAC-SHA256 computed with the hmac crate directly.
    let mut mac = hmac::Hmac::<Sha256>::new_from_slice(SECRET).unwrap();
    mac.update(BODY);
    let raw = mac.finalize().into_bytes();
    let hex_spec = spec(SignatureEncoding::Hex, Some("sha256="), false);
    let hex_sig = sign(&hex_spec, SECRET, None, BODY);
    assert_eq!(hex_sig, format!("sha256={}", hex::encode(raw)));
    let v = with_sig(&hex_spec, &hex_sig, BODY).unwrap();
    let body_id = format!("sha256:{}", hex::encode(Sha256::digest(BODY)));
    assert_eq!(v.provider_event_id, body_id);
    assert_eq!(
        (v.event.event.as_str(), v.event.action, v.event.fields.len()),
        ("webhook", None, 0)
    );
    let upper = format!("sha256={}", hex_sig[7..].to_ascii_uppercase());
    assert!(with_sig(&hex_spec, &upper, BODY).is_ok());
    assert!(
        bad(with_sig(&hex_spec, &hex_sig[7..], BODY)),
        "prefix required"
    );
    assert!(bad(with_sig(&hex_spec, &hex_sig, b"{}")), "other body");
    assert!(
        bad(verify(&hex_spec, SECRET, &common::headers(&[]), BODY, NOW)),
        "no header"
    );

    let b64_spec = spec(SignatureEncoding::Base64, None, false);
    let b64_sig = sign(&b64_spec, SECRET, None, BODY);
    assert_eq!(b64_sig, STANDARD.encode(raw));
    assert!(with_sig(&b64_spec, &b64_sig, BODY).is_ok());
    assert!(
        bad(with_sig(&b64_spec, &hex_sig[7..], BODY)),
        "hex is not base64"
    );
}

#[test]
fn timestamped_signatures_and_staleness() {
    for enc in [SignatureEncoding::Hex, SignatureEncoding::Base64] {
        let s = spec(enc, None, true);
        let sig = sign(&s, SECRET, Some(NOW), BODY);
        assert_ne!(
            sig,
            sign(&s, SECRET, None, BODY),
            "timestamp must be signed"
        );
        let at = |ts: &str, now: i64| {
            let h = common::headers(&[("x-signature", &sig), ("x-timestamp", ts)]);
            verify(&s, SECRET, &h, BODY, now)
        };
        let ts = NOW.to_string();
        assert!(at(&ts, NOW + 300).is_ok() && at(&ts, NOW - 300).is_ok());
        assert!(bad(at(&ts, NOW + 301)), "stale timestamp refused");
        assert!(bad(at(&ts, NOW - 301)), "future timestamp refused");
        assert!(bad(at(&(NOW + 1).to_string(), NOW)), "timestamp is signed");
        assert!(bad(at("+1732900000", NOW)), "strict digits");
        assert!(bad(with_sig(&s, &sig, BODY)), "timestamp header required");
    }
}

#[test]
fn id_and_event_headers() {
    let s = ConnectorSpec::Hmac {
        signature_header: "x-signature".into(),
        signature_prefix: None,
        encoding: SignatureEncoding::Hex,
        timestamp_header: None,
        tolerance_s: 300,
        id_header: Some("x-delivery-id".into()),
        event_header: Some("x-event".into()),
    };
    let sig = sign(&s, SECRET, None, BODY);
    let (sg, id, ev) = (
        ("x-signature", sig.as_str()),
        ("x-delivery-id", "dlv-0001"),
        ("x-event", "build.completed"),
    );
    let h = common::headers(&[sg, id, ev]);
    let v = verify(&s, SECRET, &h, BODY, NOW).unwrap();
    assert_eq!(
        (v.provider_event_id.as_str(), v.event.event.as_str()),
        ("dlv-0001", "build.completed")
    );
    let r = verify(&s, SECRET, &common::headers(&[sg, ev]), BODY, NOW);
    assert_eq!(r, Err(IngressError::Malformed("missing id header")));
    let r = verify(&s, SECRET, &common::headers(&[sg, id]), BODY, NOW);
    assert_eq!(r, Err(IngressError::Malformed("missing event header")));
    let gz = common::headers(&[sg, id, ev, ("content-encoding", "gzip")]);
    let r = verify(&s, SECRET, &gz, BODY, NOW);
    assert!(matches!(r, Err(IngressError::UnsupportedMediaType(_))));
    // Dispatch through the crate entry point.
    assert_eq!(
        trigger_bridge_ingress::verify(&s, SECRET, &h, BODY, NOW, &Default::default()).unwrap(),
        v
    );
    assert!(trigger_bridge_ingress::normalized_fields(&s).is_empty());
}
