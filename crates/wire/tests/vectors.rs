//! Every derived vector (`testdata/derived/`, see `testdata/PROVENANCE.md`): Go encoding rules,
//! the time codec, every message shape in both HTML-escaping variants, and the manifest hashes.

use serde_json::Value;
use tb_wire::json::{compact, go_any, go_float, go_float32, to_string, Raw};
use tb_wire::manifest::{hash, HashInput, Manifest};
use tb_wire::time::{format_rfc3339nano, parse_rfc3339nano, WireTime};
use tb_wire::{CompletionEvent, DlqEntry, Envelope, Heartbeat, RegisterReply};

fn load(name: &str) -> Value {
    let path = format!("{}/testdata/derived/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

#[test]
fn floats_are_written_as_go_writes_them() {
    let v = load("go-encoding-vectors.derived.json");
    let cases = v["float64_marshal"].as_array().unwrap();
    assert_eq!(cases.len(), 17);
    for c in cases {
        let want = c["go_json"].as_str().unwrap();
        // The value, from Go's shortest round-trip text.
        let x: f64 = c["strconv_g17"].as_str().unwrap().parse().unwrap();
        assert_eq!(go_float(x), want, "{c}");
    }
    assert_eq!(go_float32(0.1), v["float32_0_1_marshal"].as_str().unwrap());
}

#[test]
fn strings_are_escaped_as_go_escapes_them() {
    let v = load("go-encoding-vectors.derived.json");
    for c in v["string_marshal"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        if name == "invalid_utf8" {
            continue; // cannot occur in a Rust String
        }
        // The input string is what Go's escape-free encoder wrote, decoded.
        let s: String =
            serde_json::from_str(c["encoder_noescape_trimmed"].as_str().unwrap()).unwrap();
        let (plain, html) = (to_string(&s, false).unwrap(), to_string(&s, true).unwrap());
        if name == "short_escapes" {
            // Made with Go 1.19 (\u0008 \u000c); Go >= 1.22, which the crate follows, writes \b \f.
            assert_eq!(plain, r#""\b\f\n\r\t""#);
            assert_eq!(html, r#""\b\f\n\r\t""#);
            continue;
        }
        assert_eq!(
            plain,
            c["encoder_noescape_trimmed"].as_str().unwrap(),
            "{name}"
        );
        assert_eq!(html, c["json_marshal"].as_str().unwrap(), "{name}");
    }
}

#[test]
fn maps_raw_messages_and_any_round_trips_match_go() {
    let v = load("go-encoding-vectors.derived.json");
    // Map keys sorted byte-wise.
    let m: Value = serde_json::from_str(v["map_key_order"].as_str().unwrap()).unwrap();
    assert_eq!(
        to_string(&m, false).unwrap(),
        v["map_key_order"].as_str().unwrap()
    );
    // A RawMessage is compacted, its numbers and escapes kept; HTML mode escapes inside it.
    let r = &v["rawmessage_compaction"];
    #[derive(serde::Serialize)]
    struct Body {
        body: Raw,
    }
    let b = Body {
        body: Raw::parse(r["input_raw"].as_str().unwrap()).unwrap(),
    };
    assert_eq!(
        to_string(&b, false).unwrap(),
        r["encoder_noescape_trimmed"].as_str().unwrap()
    );
    assert_eq!(
        to_string(&b, true).unwrap(),
        r["json_marshal"].as_str().unwrap()
    );
    // Through map[string]any: floats everywhere, keys sorted.
    let a = &v["roundtrip_via_map_any"];
    let input: Value = serde_json::from_str(a["input"].as_str().unwrap()).unwrap();
    let any = go_any(&input);
    assert_eq!(
        to_string(&any, false).unwrap(),
        a["encoder_noescape_trimmed"].as_str().unwrap()
    );
    assert_eq!(
        to_string(&any, true).unwrap(),
        a["json_marshal"].as_str().unwrap()
    );
    assert_eq!(compact("{ \"a\" : [1, 2.0] }"), r#"{"a":[1,2.0]}"#);
}

#[test]
fn times_trim_like_go_pad_on_request_and_decode_both() {
    let v = load("go-encoding-vectors.derived.json");
    for c in v["time_time_marshal"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let go: String = serde_json::from_str(c["go_json"].as_str().unwrap()).unwrap();
        let padded: String =
            serde_json::from_str(c["padded_9_digit_layout"].as_str().unwrap()).unwrap();
        // Both forms decode to the same instant.
        let t = parse_rfc3339nano(&go).unwrap();
        assert_eq!(parse_rfc3339nano(&padded).unwrap(), t, "{name}");
        if name == "zero_value" {
            assert_eq!(t, WireTime::default());
            assert_eq!(format_rfc3339nano(&t, false), go);
            continue;
        }
        assert_eq!(
            t.unix_nanos().to_string(),
            c["unix_nano"].as_str().unwrap(),
            "{name}"
        );
        if name.starts_with("offset_") {
            // We always emit UTC (spec §5.5): the same instant, written with Z.
            assert!(format_rfc3339nano(&t, false).ends_with('Z'));
            continue;
        }
        assert_eq!(format_rfc3339nano(&t, false), go, "{name}");
        assert_eq!(format_rfc3339nano(&t, true), padded, "{name}");
    }
    assert!(
        parse_rfc3339nano("2026-05-26T14:30:45.1234567890Z").is_err(),
        "10 digits"
    );
}

/// Decodes `bytes` as `T`, encodes it again in both variants and compares with Go's bytes.
fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(c: &Value) {
    let name = c["name"].as_str().unwrap();
    let plain = c["go_encoder_noescape"].as_str().unwrap();
    let marshal = c["go_json_marshal"].as_str().unwrap();
    let value: T = serde_json::from_str(plain).unwrap();
    assert_eq!(
        to_string(&value, false).unwrap(),
        plain,
        "{name} (escaping off)"
    );
    assert_eq!(
        to_string(&value, true).unwrap(),
        marshal,
        "{name} (json.Marshal)"
    );
}

#[test]
fn every_message_shape_encodes_to_gos_bytes() {
    let v = load("wire-vectors.derived.json");
    let shapes = v["message_shape_vectors"].as_array().unwrap();
    assert_eq!(shapes.len(), 8);
    for c in shapes {
        match c["name"].as_str().unwrap() {
            "envelope" => round_trip::<Envelope>(c),
            "heartbeat" => round_trip::<Heartbeat>(c),
            "completion_event_ok" | "completion_event_error" => round_trip::<CompletionEvent>(c),
            "dlq_entry" => {
                round_trip::<DlqEntry>(c);
                let e: DlqEntry =
                    serde_json::from_str(c["go_encoder_noescape"].as_str().unwrap()).unwrap();
                // `<idempotency_key>:dlq:<occurred_at ns>`: fixed per entry, so a repeat collapses.
                assert_eq!(e.msg_id(), v["dlq_msg_id_example"].as_str().unwrap());
            }
            n if n.starts_with("register_reply") => round_trip::<RegisterReply>(c),
            other => panic!("a shape vector this test does not know: {other}"),
        }
    }
}

#[test]
fn manifest_hashes_match_every_vector_and_follow_the_rules() {
    let v = load("wire-vectors.derived.json");
    let cases = v["manifest_hash_vectors"].as_array().unwrap();
    assert_eq!(cases.len(), 4);
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let m: Manifest = serde_json::from_value(c["input_manifest"].clone()).unwrap();
        let canonical = String::from_utf8(HashInput::of(&m).canonical()).unwrap();
        assert_eq!(
            canonical,
            c["canonical_hash_input"].as_str().unwrap(),
            "{name}"
        );
        assert_eq!(hash(&m), c["manifest_hash"].as_str().unwrap(), "{name}");
    }
    // Stable under reordering of every list and every object's keys; any hashed field changes it.
    let base: Manifest = serde_json::from_value(cases[1]["input_manifest"].clone()).unwrap();
    let mut shuffled = base.clone();
    shuffled.actions.as_mut().unwrap().reverse();
    shuffled.service_sources.as_mut().unwrap().reverse();
    shuffled.supports_nodes.as_mut().unwrap().reverse();
    shuffled.runtime_capabilities.as_mut().unwrap().reverse();
    shuffled.runtime_lookups.as_mut().unwrap().reverse();
    for l in shuffled.runtime_lookups.as_mut().unwrap() {
        if let Some(p) = l.params.as_mut() {
            p.reverse();
        }
    }
    shuffled.actions.as_mut().unwrap()[0].display_name =
        Some("catalog fields are not hashed".into());
    shuffled.service_version = "9.9.9".into();
    assert_eq!(hash(&shuffled), hash(&base));
    let mut changed = base.clone();
    changed.actions.as_mut().unwrap()[0].timeout_ms += 1;
    assert_ne!(hash(&changed), hash(&base));
    let mut changed = base.clone();
    changed.supports_rate_limit = !changed.supports_rate_limit;
    assert_ne!(hash(&changed), hash(&base));
}

#[test]
fn a_register_refuses_what_the_spec_refuses() {
    let v = load("wire-vectors.derived.json");
    let mut m: Manifest =
        serde_json::from_value(v["manifest_hash_vectors"][0]["input_manifest"].clone()).unwrap();
    assert_eq!(
        tb_wire::manifest::validate(&m).unwrap_err(),
        "manifest_hash_mismatch",
        "the seed's elided hash is not the manifest's (the spec's reply token)"
    );
    m.manifest_hash = hash(&m);
    assert!(tb_wire::manifest::validate(&m).is_ok());
    m.service = "source".into();
    m.manifest_hash = hash(&m);
    assert!(tb_wire::manifest::validate(&m)
        .unwrap_err()
        .contains("reserved"));
    m.service = "svc".into();
    m.protocol_version = "2.0.0".into();
    assert!(tb_wire::manifest::validate(&m).unwrap_err().contains("1.x"));
}
