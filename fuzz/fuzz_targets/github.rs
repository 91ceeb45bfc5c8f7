//! GitHub: verify (X-Hub-Signature-256 over the raw bytes) + normalize, JSON and form bodies.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trigger_bridge_fuzz::{check, set, split, SECRET};

fuzz_target!(|data: &[u8]| {
    let Some(mut r) = split(data) else { return };
    if r.sign {
        let sig = tb_ingress::github::sign(SECRET, r.body);
        set(&mut r.headers, "x-hub-signature-256", &sig);
    }
    let out = tb_ingress::github::verify(SECRET, &r.headers, r.body, &r.limits);
    check(&out);
});
