//! Standard Webhooks: verify (webhook-id / -timestamp / -signature candidates) + normalize, and the
//! unverified read of best-effort subscriptions.
#![no_main]
use libfuzzer_sys::fuzz_target;
use trigger_bridge_fuzz::{check, set, split, NOW, SECRET};

fuzz_target!(|data: &[u8]| {
    let Some(mut r) = split(data) else { return };
    if r.sign {
        let id = r
            .headers
            .get("webhook-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("msg_fuzz_0000000000")
            .to_string();
        set(&mut r.headers, "webhook-id", &id);
        set(&mut r.headers, "webhook-timestamp", &NOW.to_string());
        let sig = tb_ingress::standard_webhooks::sign(SECRET, &id, NOW, r.body);
        // Keep the input's other candidates beside the right one.
        let others = r
            .headers
            .get("webhook-signature")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        set(
            &mut r.headers,
            "webhook-signature",
            &format!("{others} {sig}"),
        );
    }
    let out =
        tb_ingress::standard_webhooks::verify(SECRET, 300, &r.headers, r.body, NOW, &r.limits);
    check(&out);
    check(&tb_ingress::standard_webhooks::read_unverified(
        &r.headers, r.body, &r.limits,
    ));
});
