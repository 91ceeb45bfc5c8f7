//! The generic HMAC connector, hex and base64, with and without a timestamp, id and event header.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tb_core::connector::{ConnectorSpec, SignatureEncoding};
use trigger_bridge_fuzz::{check, set, split, NOW, SECRET};

fuzz_target!(|data: &[u8]| {
    let Some(mut r) = split(data) else { return };
    let variant = data.get(1).copied().unwrap_or(0);
    let spec = ConnectorSpec::Hmac {
        signature_header: "x-signature".into(),
        signature_prefix: (variant & 1 != 0).then(|| "sha256=".into()),
        encoding: if variant & 2 != 0 {
            SignatureEncoding::Base64
        } else {
            SignatureEncoding::Hex
        },
        timestamp_header: (variant & 4 != 0).then(|| "x-timestamp".into()),
        tolerance_s: 300,
        id_header: (variant & 8 != 0).then(|| "x-id".into()),
        event_header: (variant & 16 != 0).then(|| "x-event".into()),
    };
    if r.sign {
        let ts = (variant & 4 != 0).then_some(NOW);
        if let Some(ts) = ts {
            set(&mut r.headers, "x-timestamp", &ts.to_string());
        }
        let sig = tb_ingress::hmac_generic::sign(&spec, SECRET, ts, r.body);
        set(&mut r.headers, "x-signature", &sig);
    }
    check(&tb_ingress::verify(
        &spec, SECRET, &r.headers, r.body, NOW, &r.limits,
    ));
});
