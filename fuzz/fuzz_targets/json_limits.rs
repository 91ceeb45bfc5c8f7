//! The JSON limits against the parser: whatever `check_json` lets through and serde_json parses is
//! within every limit (depth, each string's length, the count of values inside containers), and
//! whatever it refuses as over a limit really is over it when the parser can read it.
#![no_main]
use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use tb_core::limits::{check_json, Exceeded, JsonLimits, JsonRefusal};

struct Measure {
    depth: usize,
    longest: usize,
    fields: usize,
}

fn measure(v: &Value, at: usize, m: &mut Measure) {
    m.depth = m.depth.max(at);
    match v {
        Value::String(s) => m.longest = m.longest.max(s.len()),
        Value::Array(a) => {
            m.depth = m.depth.max(at + 1);
            m.fields += a.len();
            a.iter().for_each(|x| measure(x, at + 1, m));
        }
        Value::Object(o) => {
            m.depth = m.depth.max(at + 1);
            m.fields += o.len();
            for (k, x) in o {
                m.longest = m.longest.max(k.len());
                measure(x, at + 1, m);
            }
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&knob, body)) = data.split_first() else {
        return;
    };
    let limits = JsonLimits {
        max_depth: 1 + u32::from(knob & 7),
        max_string_bytes: 1 + usize::from(knob >> 3 & 7) * 4,
        max_fields: 1 + usize::from(knob >> 6) * 5,
    };
    let verdict = check_json(body, &limits);
    let parsed = serde_json::from_slice::<Value>(body);
    if std::str::from_utf8(body).is_err() {
        assert_eq!(verdict, Err(JsonRefusal::InvalidUtf8));
        return;
    }
    let Ok(v) = parsed else { return };
    let mut m = Measure {
        depth: 0,
        longest: 0,
        fields: 0,
    };
    measure(&v, 0, &mut m);
    match verdict {
        Ok(()) => {
            assert!(m.depth <= limits.max_depth as usize, "depth {}", m.depth);
            // Decoded strings are never longer than sent (escapes only shrink).
            assert!(m.longest <= limits.max_string_bytes, "string {}", m.longest);
            // Duplicate keys collapse in the parsed map: the parsed count is a lower bound.
            assert!(m.fields <= limits.max_fields, "fields {}", m.fields);
        }
        Err(JsonRefusal::Exceeded(Exceeded::JsonDepth)) => {
            assert!(m.depth > limits.max_depth as usize, "depth {}", m.depth)
        }
        Err(JsonRefusal::Exceeded(Exceeded::JsonFields)) => {
            // Duplicate keys may hide members from the parsed map, so only strings-free arrays
            // are exact; the check is never below the parsed count.
        }
        Err(_) => {}
    }
});
