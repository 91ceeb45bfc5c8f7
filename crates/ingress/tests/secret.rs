//! `whsec_` secret parsing (signals-and-connectors §3.2).

use base64::engine::general_purpose::{STANDARD, URL_SAFE};
use base64::Engine as _;
use trigger_bridge_ingress::secret::{format_whsec, parse_whsec, SecretFormatError};

fn key(n: usize) -> Vec<u8> {
    // Bytes chosen so that the base64 contains '+' and '/' (0xfb, 0xff).
    (0..n).map(|i| [0xfb, 0xff, 0x3e, i as u8][i % 4]).collect()
}

#[test]
fn accepts_24_and_64_byte_keys_and_round_trips() {
    for n in [24, 32, 64] {
        let k = key(n);
        let s = format_whsec(&k);
        assert!(s.starts_with("whsec_") && s.contains(['+', '/']), "{s}");
        assert_eq!(parse_whsec(&s).unwrap(), k);
    }
    let spec = parse_whsec("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
    assert_eq!(spec.len(), 24);
}

#[test]
fn rejects_malformed_secrets_with_actionable_errors() {
    let k = key(32);
    let good = STANDARD.encode(&k);
    let url = URL_SAFE.encode(&k);
    assert_ne!(good, url, "test key must differ between alphabets");
    let cases: Vec<(String, SecretFormatError)> = vec![
        (String::new(), SecretFormatError::Empty),
        ("whsec_".into(), SecretFormatError::Empty),
        (good.clone(), SecretFormatError::MissingPrefix),
        (format!("WHSEC_{good}"), SecretFormatError::MissingPrefix),
        (format!("v1,whsec_{good}"), SecretFormatError::VersionPrefix),
        (format!("whsec_{url}"), SecretFormatError::Base64Url),
        (format!("whsec_{good} "), SecretFormatError::Whitespace),
        (
            format!("whsec_{}\n{}", &good[..20], &good[20..]),
            SecretFormatError::Whitespace,
        ),
        (
            format!("whsec_{}", good.trim_end_matches('=')),
            SecretFormatError::InvalidBase64,
        ),
        ("whsec_not*base64!".into(), SecretFormatError::InvalidBase64),
        (
            format!("whsec_{}", STANDARD.encode(key(10))),
            SecretFormatError::BadLength(10),
        ),
        (
            format!("whsec_{}", STANDARD.encode(key(23))),
            SecretFormatError::BadLength(23),
        ),
        (
            format!("whsec_{}", STANDARD.encode(key(65))),
            SecretFormatError::BadLength(65),
        ),
    ];
    for (input, want) in cases {
        let err = parse_whsec(&input).unwrap_err();
        assert_eq!(err, want, "input {input:?}");
        let msg = err.to_string();
        assert!(!msg.contains(&good[..8]), "message leaks the secret: {msg}");
    }
    assert_eq!(
        SecretFormatError::BadLength(10).to_string(),
        "secret decodes to 10 bytes; a Standard Webhooks secret is 24 to 64 bytes"
    );
    assert!(SecretFormatError::MissingPrefix
        .to_string()
        .contains("must start with whsec_"));
}
