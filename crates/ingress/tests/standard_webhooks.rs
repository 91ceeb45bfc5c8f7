//! Standard Webhooks v1 (signals-and-connectors §3) against the vendored vectors (`tests/fixtures`).

mod common;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::Value;
use trigger_bridge_ingress::standard_webhooks::{sign, verify, verify_signature};
use trigger_bridge_ingress::{parse_whsec, IngressError, Verified};

const SPEC_KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SPEC_ID: &str = "msg_p5jXN8AQM9LWM0D4loKWxJek";
const SPEC_TS: i64 = 1614265330;
const SPEC_BODY: &[u8] = br#"{"test": 2432232314}"#;
const SPEC_SIG: &str = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";

fn run(id: &str, ts: &str, sig: &str, body: &[u8], now: i64) -> Result<Verified, IngressError> {
    let key = parse_whsec(SPEC_KEY).unwrap();
    let h = common::headers(&[
        ("webhook-id", id),
        ("webhook-timestamp", ts),
        ("webhook-signature", sig),
    ]);
    verify(&key, 300, &h, body, now, &Default::default())
}

fn bad<T: std::fmt::Debug>(r: Result<T, IngressError>) -> bool {
    matches!(r, Err(IngressError::SignatureInvalid(_)))
}

#[test]
fn every_vector_gives_its_expected_result_and_sign_reproduces_it() {
    let file = common::json("standard-webhooks/vectors.json");
    let tolerance = file["tolerance_seconds"].as_u64().unwrap();
    let cases = file["cases"].as_array().unwrap();
    assert!(cases.len() >= 19, "vectors file shrank: {}", cases.len());
    let (mut valid, mut signed) = (0, 0);
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let key = parse_whsec(c["secret"].as_str().unwrap()).unwrap();
        let id = c["msg_id"].as_str().unwrap();
        let ts = c["timestamp"].as_i64().unwrap();
        let now = c["now"].as_i64().unwrap();
        let body = STANDARD.decode(c["body_b64"].as_str().unwrap()).unwrap();
        let sig = c["signature_header"].as_str().unwrap();
        let h = common::headers(&[
            ("webhook-id", id),
            ("webhook-timestamp", &ts.to_string()),
            ("webhook-signature", sig),
        ]);
        let got = verify_signature(&key, tolerance, &h, &body, now).map(str::to_owned);
        match c["expect"].as_str().unwrap() {
            "valid" => {
                valid += 1;
                let got_id = got.unwrap_or_else(|e| panic!("{name}: expected valid, got {e}"));
                assert_eq!(got_id, id, "{name}");
                if !sig.contains(' ') {
                    signed += 1;
                    assert_eq!(sign(&key, id, ts, &body), sig, "{name}: sign() differs");
                }
                // Full verify: an authentic body must also be a JSON object to be normalized.
                let is_object = serde_json::from_slice::<Value>(&body).is_ok_and(|v| v.is_object());
                let full = verify(&key, tolerance, &h, &body, now, &Default::default());
                if !is_object {
                    assert!(
                        matches!(full, Err(IngressError::Malformed(_))),
                        "{name}: non-object body must be 422"
                    );
                    continue;
                }
                let v = full.unwrap_or_else(|e| panic!("{name}: expected valid, got {e}"));
                assert_eq!(v.provider_event_id, id, "{name}");
                assert_eq!(v.event.action, None, "{name}");
                let parsed: Option<Value> = serde_json::from_slice(&body).ok();
                match parsed
                    .as_ref()
                    .and_then(|p| p.get("type"))
                    .and_then(Value::as_str)
                {
                    Some(t) => {
                        assert_eq!(v.event.event, t, "{name}");
                        assert_eq!(v.event.fields["type"], Value::from(t), "{name}");
                    }
                    None => {
                        assert_eq!(v.event.event, "webhook", "{name}");
                        assert!(v.event.fields.is_empty(), "{name}");
                    }
                }
            }
            "invalid" => assert!(
                matches!(got, Err(IngressError::SignatureInvalid(_))),
                "{name}: expected SignatureInvalid"
            ),
            other => panic!("{name}: unknown expect {other}"),
        }
    }
    assert!(valid >= 10 && signed >= 8, "valid={valid} signed={signed}");
}

/// The spec vector's id / timestamp / body with signature `sig`, verified at `now`.
fn spec_at(sig: &str, now: i64) -> Result<Verified, IngressError> {
    run(SPEC_ID, "1614265330", sig, SPEC_BODY, now)
}

/// `body` with its own valid signature (spec key, id and timestamp), verified at the spec time.
fn self_signed(body: &[u8]) -> Result<Verified, IngressError> {
    let sig = sign(&parse_whsec(SPEC_KEY).unwrap(), SPEC_ID, SPEC_TS, body);
    run(SPEC_ID, "1614265330", &sig, body, SPEC_TS)
}

#[test]
fn spec_example_vector() {
    let key = parse_whsec(SPEC_KEY).unwrap();
    assert_eq!(sign(&key, SPEC_ID, SPEC_TS, SPEC_BODY), SPEC_SIG);
    let v = spec_at(SPEC_SIG, SPEC_TS).unwrap();
    assert_eq!(v.provider_event_id, SPEC_ID);
    assert_eq!(v.event.event, "webhook");
    // Tolerance is inclusive both ways.
    assert!(spec_at(SPEC_SIG, SPEC_TS + 300).is_ok());
    assert!(spec_at(SPEC_SIG, SPEC_TS - 300).is_ok());
    assert!(bad(spec_at(SPEC_SIG, SPEC_TS + 301)));
    assert!(bad(spec_at(SPEC_SIG, SPEC_TS - 301)));
}

#[test]
fn malformed_timestamps_and_ids_are_refused_without_panic() {
    let stamps = [
        "+1614265330",
        " 1614265330",
        "1614265330 ",
        "1614265330.0",
        "-1614265330",
    ];
    for ts in stamps
        .iter()
        .chain(&["1e9", "", "99999999999999999999", "1614265330000"])
    {
        assert!(
            bad(run(SPEC_ID, ts, SPEC_SIG, SPEC_BODY, SPEC_TS)),
            "{ts:?}"
        );
    }
    // Extreme clocks do not overflow.
    assert!(bad(run(
        SPEC_ID,
        "9223372036854775807",
        SPEC_SIG,
        SPEC_BODY,
        i64::MIN
    )));
    assert!(bad(run(SPEC_ID, "0", SPEC_SIG, SPEC_BODY, i64::MAX)));
    let key = parse_whsec(SPEC_KEY).unwrap();
    let long = "a".repeat(129);
    for id in [
        "msg.p5jXN8AQM9LWM0D4loKW",
        "short_id",
        "msg p5jXN8AQM9LWM0D4loKW",
        &long,
    ] {
        let sig = sign(&key, id, SPEC_TS, SPEC_BODY);
        assert!(
            bad(run(id, "1614265330", &sig, SPEC_BODY, SPEC_TS)),
            "{id:?}"
        );
    }
    let id128 = &long[..128];
    let sig = sign(&key, id128, SPEC_TS, SPEC_BODY);
    assert!(run(id128, "1614265330", &sig, SPEC_BODY, SPEC_TS).is_ok());
}

#[test]
fn missing_headers_are_signature_invalid() {
    let key = parse_whsec(SPEC_KEY).unwrap();
    let all = [
        ("Webhook-Id", SPEC_ID),
        ("WEBHOOK-TIMESTAMP", "1614265330"),
        ("webhook-signature", SPEC_SIG),
    ];
    for skip in 0..3 {
        let mut pairs = all.to_vec();
        pairs.remove(skip);
        let r = verify(
            &key,
            300,
            &common::headers(&pairs),
            SPEC_BODY,
            SPEC_TS,
            &Default::default(),
        );
        assert!(bad(r), "without {}", all[skip].0);
    }
    // Header names are case-insensitive; an empty key refuses.
    assert!(verify(
        &key,
        300,
        &common::headers(&all),
        SPEC_BODY,
        SPEC_TS,
        &Default::default()
    )
    .is_ok());
    assert!(bad(verify(
        &[],
        300,
        &common::headers(&all),
        SPEC_BODY,
        SPEC_TS,
        &Default::default()
    )));
}

#[test]
fn signature_list_is_bounded_and_skips_empty_entries() {
    let zero = "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    let at = |sig: String| spec_at(&sig, SPEC_TS);
    assert!(at(format!("  {zero}  v2,xyz  v1,!!notbase64 {SPEC_SIG}  ")).is_ok());
    assert!(at(format!("{} {SPEC_SIG}", vec![zero; 31].join(" "))).is_ok());
    assert!(bad(at(format!("{} {SPEC_SIG}", vec![zero; 32].join(" ")))));
    assert!(bad(at(format!("{}{SPEC_SIG}", " ".repeat(8200)))));
    assert!(bad(at(SPEC_SIG.replace("v1,", "v1a,"))));
    assert!(bad(at(SPEC_SIG.trim_end_matches('=').to_owned())));
}

#[test]
fn body_rules_non_utf8_non_json_and_encoding() {
    // Authentic non-UTF-8 body: Malformed; forged: SignatureInvalid.
    let bin = b"\xff\xfe{\"type\":\"x\"}";
    let malformed = Err(IngressError::Malformed("body is not valid UTF-8"));
    assert_eq!(self_signed(bin), malformed);
    assert!(bad(run(SPEC_ID, "1614265330", SPEC_SIG, bin, SPEC_TS)));
    // Authentic but not a JSON object: 422, whatever it is.
    for body in [
        &b"hello, plain text"[..],
        b"",
        b"[1,2,3]",
        b"\"str\"",
        b"{not json",
    ] {
        assert!(
            matches!(self_signed(body), Err(IngressError::Malformed(_))),
            "{:?}",
            String::from_utf8_lossy(body)
        );
    }
    // A JSON object without `type` is event "webhook".
    let v = self_signed(br#"{"data":{}}"#).unwrap();
    assert_eq!(
        (v.event.event.as_str(), v.event.fields.len()),
        ("webhook", 0)
    );
    let v = self_signed(br#"{"type":"invoice.paid","data":{"amount":3}}"#).unwrap();
    assert_eq!(v.event.event, "invoice.paid");
    assert_eq!(v.event.fields["type"], "invoice.paid");
    // Compressed bodies are refused.
    let mut gz = common::headers(&[("webhook-id", SPEC_ID), ("webhook-timestamp", "1614265330")]);
    gz.insert("webhook-signature", SPEC_SIG.parse().unwrap());
    gz.insert("content-encoding", "gzip".parse().unwrap());
    let r = verify(
        &parse_whsec(SPEC_KEY).unwrap(),
        300,
        &gz,
        SPEC_BODY,
        SPEC_TS,
        &Default::default(),
    );
    assert!(matches!(r, Err(IngressError::UnsupportedMediaType(_))));
    // Only application/json (or no Content-Type) is taken.
    let mut text = common::headers(&[("webhook-id", SPEC_ID), ("webhook-timestamp", "1614265330")]);
    text.insert("webhook-signature", SPEC_SIG.parse().unwrap());
    text.insert("content-type", "text/plain".parse().unwrap());
    let r = verify(
        &parse_whsec(SPEC_KEY).unwrap(),
        300,
        &text,
        SPEC_BODY,
        SPEC_TS,
        &Default::default(),
    );
    assert!(matches!(r, Err(IngressError::UnsupportedMediaType(_))));
    text.insert(
        "content-type",
        "application/json; charset=utf-8".parse().unwrap(),
    );
    assert!(verify(
        &parse_whsec(SPEC_KEY).unwrap(),
        300,
        &text,
        SPEC_BODY,
        SPEC_TS,
        &Default::default()
    )
    .is_ok());
}

/// 10 000 signature candidates are refused by the header's size cap before one MAC is
/// compared, and 33 short ones (under 8 KiB) by the entry cap; 32 with the right one last still verify.
#[test]
fn ten_thousand_signature_candidates_are_refused_before_any_comparison() {
    let flood = vec!["v1,AAAA"; 10_000].join(" ");
    assert_eq!(
        run(SPEC_ID, &SPEC_TS.to_string(), &flood, SPEC_BODY, SPEC_TS).unwrap_err(),
        IngressError::SignatureInvalid("webhook-signature is too long")
    );
    let many = format!("{} {SPEC_SIG}", vec!["v1,AAAA"; 32].join(" "));
    assert_eq!(
        run(SPEC_ID, &SPEC_TS.to_string(), &many, SPEC_BODY, SPEC_TS).unwrap_err(),
        IngressError::SignatureInvalid("webhook-signature has too many entries")
    );
    let ok = format!("{} {SPEC_SIG}", vec!["v1,AAAA"; 31].join(" "));
    assert!(run(SPEC_ID, &SPEC_TS.to_string(), &ok, SPEC_BODY, SPEC_TS).is_ok());
}
