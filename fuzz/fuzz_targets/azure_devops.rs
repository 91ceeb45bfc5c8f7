//! Azure DevOps: Basic auth and/or the secret header, then the payload's id / eventType and fields.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tb_core::connector::ConnectorSpec;
use trigger_bridge_fuzz::{check, set, split, NOW, SECRET};

fuzz_target!(|data: &[u8]| {
    let Some(mut r) = split(data) else { return };
    let variant = data.get(1).copied().unwrap_or(0) % 3;
    let spec = ConnectorSpec::AzureDevops {
        basic_username: (variant != 1).then(|| "ado".into()),
        header_name: (variant != 0).then(|| "x-ado-secret".into()),
    };
    if r.sign {
        if variant != 1 {
            let auth = tb_ingress::azure_devops::basic_authorization("ado", SECRET);
            set(&mut r.headers, "authorization", &auth);
        }
        if variant != 0 {
            set(
                &mut r.headers,
                "x-ado-secret",
                std::str::from_utf8(SECRET).unwrap(),
            );
        }
    }
    check(&tb_ingress::verify(
        &spec, SECRET, &r.headers, r.body, NOW, &r.limits,
    ));
});
