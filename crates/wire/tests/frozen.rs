//! The project's own frozen vectors (`testdata/frozen/manifests.json`): manifests beyond the derived
//! ones, with the canonical hash input and hash this crate computed when they were frozen. A change
//! to any of them is a change of the wire contract: it must be deliberate (regenerate with
//! `TB_WIRE_FREEZE=1 cargo test -p trigger-bridge-wire --test frozen` and say why in the commit).

use serde_json::{json, Value};
use tb_wire::manifest::{hash, HashInput, Manifest};

fn cases() -> Vec<(&'static str, Value)> {
    vec![
        (
            "floats_and_unicode_in_schemas",
            json!({
                "protocol_version": "1.0.0", "service": "svc", "service_version": "1",
                "actions": [{"name": "z", "input_schema": {"type": "object", "properties": {
                    "ratio": {"type": "number", "minimum": 0.0, "maximum": 1.0, "default": 0.25},
                    "label": {"type": ["string", "null"], "pattern": "^[<>&]+$", "description": "é\u{2029}"}},
                    "required": ["ratio"]},
                    "result_schema": null, "timeout_ms": 2500,
                    "retry": {"max_attempts": 5, "initial_backoff_ms": 250, "backoff_factor": 1.0, "max_backoff_ms": 0}}],
                "service_sources": [{"name": "nats", "transport": "nats", "default": "svc.in"}],
                "supports_nodes": ["lookup"]
            }),
        ),
        (
            "lookups_and_capabilities_only",
            json!({
                "protocol_version": "1.0.0", "service": "lk", "service_version": "1",
                "actions": null, "service_sources": null, "supports_nodes": null,
                "runtime_capabilities": ["durable_timer.v1"],
                "runtime_lookups": [{"name": "b", "params": [{"name": "y", "type": "integer", "required": true}, {"name": "x", "type": "string"}], "result_fields": []},
                                    {"name": "a", "params": null, "result_fields": [{"name": "ok", "type": "boolean"}]}]
            }),
        ),
    ]
}

#[test]
fn frozen_manifest_vectors_hold() {
    let path = format!(
        "{}/testdata/frozen/manifests.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let computed: Vec<Value> = cases()
        .into_iter()
        .map(|(name, input)| {
            let m: Manifest = serde_json::from_value(input.clone()).unwrap();
            json!({
                "name": name,
                "input_manifest": input,
                "canonical_hash_input": String::from_utf8(HashInput::of(&m).canonical()).unwrap(),
                "manifest_hash": hash(&m),
            })
        })
        .collect();
    if std::env::var_os("TB_WIRE_FREEZE").is_some() {
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&computed).unwrap() + "\n",
        )
        .unwrap();
        return;
    }
    let frozen: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("frozen vectors")).unwrap();
    assert_eq!(frozen.len(), computed.len());
    for (f, c) in frozen.iter().zip(&computed) {
        assert_eq!(
            f["canonical_hash_input"], c["canonical_hash_input"],
            "{}",
            f["name"]
        );
        assert_eq!(f["manifest_hash"], c["manifest_hash"], "{}", f["name"]);
    }
}
