//! The triggers.v2 decoder: heartbeat, CompletionEvent, flow envelope and manifest bodies, envelope
//! headers and the Durable Timer context, and RFC 3339 times. What decodes re-encodes to bytes that
//! decode to the same value.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tb_wire::manifest::Manifest;
use tb_wire::{CompletionEvent, FlowEnvelope, Heartbeat};

fn round_trip<T>(body: &[u8])
where
    T: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
{
    if let Ok(v) = serde_json::from_slice::<T>(body) {
        let again = tb_wire::json::to_vec(&v, false).expect("a decoded value encodes");
        let back: T = serde_json::from_slice(&again).expect("its own bytes decode");
        assert_eq!(back, v);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    match which % 6 {
        0 => round_trip::<Heartbeat>(body),
        1 => round_trip::<CompletionEvent>(body),
        2 => {
            if let Ok(f) = serde_json::from_slice::<FlowEnvelope>(body) {
                let _ = tb_wire::json::to_vec(&f, false);
            }
        }
        3 => {
            if let Ok(m) = serde_json::from_slice::<Manifest>(body) {
                let _ = tb_wire::manifest::validate(&m);
                let _ = tb_wire::manifest::hash(&m);
            }
        }
        4 => {
            let text = String::from_utf8_lossy(body);
            let headers: Vec<(String, String)> = text
                .lines()
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.to_string(), v.trim().to_string()))
                .collect();
            let env = tb_wire::headers::from_headers(&headers);
            let _ = tb_wire::headers::to_headers(&env);
            let _ = tb_wire::durable_timer::check(&headers, body);
        }
        _ => {
            if let Ok(text) = std::str::from_utf8(body) {
                if let Ok(t) = tb_wire::time::parse_rfc3339nano(text) {
                    let s = tb_wire::time::format_rfc3339nano(&t, true);
                    let back = tb_wire::time::parse_rfc3339nano(&s).expect("its own format parses");
                    assert_eq!(back.unix_nanos(), t.unix_nanos());
                }
            }
        }
    }
});
