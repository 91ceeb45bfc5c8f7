//! A capability URL's body rules (content type, coding, JSON under the limits) and its HMAC check.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trigger_bridge_fuzz::{set, split, SECRET};

fuzz_target!(|data: &[u8]| {
    let Some(mut r) = split(data) else { return };
    if r.sign {
        let sig = tb_ingress::capability::sign(SECRET, r.body);
        set(&mut r.headers, "x-signature", &sig);
    }
    let _ = tb_ingress::capability::verify_hmac(SECRET, &r.headers, r.body);
    if let Ok(v) = tb_ingress::capability::parse_body(&r.headers, r.body, &r.limits) {
        // What passed the limits is no deeper than they allow.
        assert!(depth(&v) <= r.limits.max_depth as usize);
    }
});

fn depth(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        serde_json::Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}
