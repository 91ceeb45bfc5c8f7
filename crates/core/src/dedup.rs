//! Dedup-key derivation (DESIGN §2, OpenWOP trigger-bridge §8: "dedupKey derives from (subscriptionId,
//! webhook-id), host-opaque").
//!
//! The key is `dk_` + the first 32 hex characters of SHA-256 over a domain-separated preimage, so it never
//! carries cleartext provider ids or payload content, and equal inputs always give equal keys.

use sha2::{Digest, Sha256};

/// Derives the dedup key of `(subscription_id, provider_event_id)`; 35 characters.
pub fn dedup_key(subscription_id: &str, provider_event_id: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"trigger-bridge:dedup:v1\0");
    h.update(subscription_id.as_bytes());
    h.update(b"\0");
    h.update(provider_event_id.as_bytes());
    let d = h.finalize();
    format!("dk_{}", &hex::encode(d)[..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoped_stable_and_opaque() {
        let a = dedup_key("github", "72d3162e-cc78-11e3-81ab-4c9367dc0958");
        assert_eq!(
            a,
            dedup_key("github", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
        );
        assert_ne!(
            a,
            dedup_key("github-2", "72d3162e-cc78-11e3-81ab-4c9367dc0958")
        );
        // The separator keeps ("ab","c") and ("a","bc") apart.
        assert_ne!(dedup_key("ab", "c"), dedup_key("a", "bc"));
        assert_eq!(a.len(), 35);
        assert!(!a.contains("72d3162e"));
    }
}
