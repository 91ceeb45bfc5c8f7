//! Secrets at rest in a shared database: host-generated secrets (registration `whsec_`
//! keys, outbound webhook keys) are sealed with ChaCha20-Poly1305 under one 32-byte key every replica
//! is given (`TRIGGER_BRIDGE_SECRET_KEY`), so any replica can verify a registered webhook or sign an
//! outbound delivery, and the database alone reveals no secret.
//!
//! Sealed form: `0x01` (version) || 12-byte random nonce || ciphertext with its 16-byte tag; the
//! secret's id is the associated data, so a sealed value moved to another record does not open.

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use tb_core::{ErrorCode, TbError};

/// The environment variable holding the sealing key: 32 bytes as base64 (44 characters, standard
/// alphabet, padded) or as hex (64 characters).
pub const SECRET_KEY_ENV: &str = "TRIGGER_BRIDGE_SECRET_KEY";

const VERSION: u8 = 1;
const NONCE_LEN: usize = 12;

/// A 32-byte sealing key. Never printed (its `Debug` shows nothing of it).
#[derive(Clone)]
pub struct SecretKey([u8; 32]);

impl std::fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretKey(..)")
    }
}

impl SecretKey {
    /// A key from its 32 bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> SecretKey {
        SecretKey(bytes)
    }

    /// A fresh random key.
    pub fn generate() -> SecretKey {
        SecretKey(rand::random())
    }

    /// Parses 32 bytes written as hex (64 characters) or base64 (standard alphabet); surrounding
    /// whitespace is ignored. Errors: `validation_error` naming [`SECRET_KEY_ENV`]'s expected form
    /// (the text itself is never echoed).
    pub fn parse(text: &str) -> Result<SecretKey, TbError> {
        let t = text.trim();
        let bytes = if t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit()) {
            hex::decode(t).ok()
        } else {
            STANDARD.decode(t).ok()
        };
        match bytes.and_then(|b| <[u8; 32]>::try_from(b).ok()) {
            Some(k) => Ok(SecretKey(k)),
            None => Err(TbError::new(
                ErrorCode::ValidationError,
                format!(
                    "{SECRET_KEY_ENV} must be 32 bytes written as 64 hex characters or as base64"
                ),
            )),
        }
    }

    /// The key from [`SECRET_KEY_ENV`]; `Ok(None)` when it is unset or empty. Errors: as [`SecretKey::parse`].
    pub fn from_env() -> Result<Option<SecretKey>, TbError> {
        match std::env::var(SECRET_KEY_ENV) {
            Ok(v) if !v.trim().is_empty() => SecretKey::parse(&v).map(Some),
            _ => Ok(None),
        }
    }

    /// The key as 64 hex characters (what a generated key file holds).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// A 32-byte key derived from this one for `purpose` (HMAC-SHA256(key, purpose)); used for the
    /// secret fingerprints, so replicas sharing the key show the same fingerprints.
    pub fn derive(&self, purpose: &str) -> Vec<u8> {
        use hmac::Mac;
        let mut m =
            <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(&self.0).expect("any key length");
        m.update(purpose.as_bytes());
        m.finalize().into_bytes().to_vec()
    }

    /// The audit chain's key, derived from this one under [`tb_core::audit::KEY_PURPOSE`]: every replica
    /// given the same sealing key gets the same audit key, the database holds neither, and the audit key
    /// opens no secret.
    pub fn audit_key(&self) -> tb_core::audit::Key {
        let d = self.derive(tb_core::audit::KEY_PURPOSE);
        tb_core::audit::Key::from_bytes(d.try_into().expect("HMAC-SHA256 gives 32 bytes"))
    }

    /// Seals `plaintext` for the record `id` (the associated data). Never fails.
    pub fn seal(&self, id: &str, plaintext: &[u8]) -> Vec<u8> {
        let cipher = ChaCha20Poly1305::new(Key::from_slice(&self.0));
        let nonce: [u8; NONCE_LEN] = rand::random();
        let ct = cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plaintext,
                    aad: id.as_bytes(),
                },
            )
            .expect("ChaCha20-Poly1305 encryption of an in-memory secret cannot fail");
        let mut out = Vec::with_capacity(1 + NONCE_LEN + ct.len());
        out.push(VERSION);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ct);
        out
    }

    /// Opens what [`SecretKey::seal`] made for `id`. Errors: `internal`, with a message saying the
    /// secret `id` cannot be decrypted because this replica's [`SECRET_KEY_ENV`] is not the key it was
    /// sealed with (or the stored value was altered), or that the stored value is malformed.
    pub fn open(&self, id: &str, sealed: &[u8]) -> Result<Vec<u8>, TbError> {
        if sealed.len() < 1 + NONCE_LEN + 16 || sealed[0] != VERSION {
            return Err(TbError::new(
                ErrorCode::Internal,
                format!("secret {id}: the stored sealed value is malformed (unknown version or too short)"),
            ));
        }
        let cipher = ChaCha20Poly1305::new(Key::from_slice(&self.0));
        cipher
            .decrypt(
                Nonce::from_slice(&sealed[1..1 + NONCE_LEN]),
                Payload {
                    msg: &sealed[1 + NONCE_LEN..],
                    aad: id.as_bytes(),
                },
            )
            .map_err(|_| {
                TbError::new(
                    ErrorCode::Internal,
                    format!(
                        "secret {id} cannot be decrypted: {SECRET_KEY_ENV} is not the key it was sealed with \
                         (every replica must be given the same key), or the stored value was altered"
                    ),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_secret_opens_with_its_key_and_id_only() {
        let k = SecretKey::generate();
        let s = k.seal("sub_1", b"whsec_abc");
        assert_eq!(s.len(), 1 + 12 + 9 + 16, "version, nonce, text, tag");
        assert_eq!(s[0], 1);
        assert!(
            !s.windows(9).any(|w| w == b"whsec_abc"),
            "no plaintext at rest"
        );
        assert_eq!(k.open("sub_1", &s).unwrap(), b"whsec_abc");
        // Two seals of one secret differ (fresh nonce).
        assert_ne!(k.seal("sub_1", b"whsec_abc"), s);

        let wrong = SecretKey::generate();
        let e = wrong.open("sub_1", &s).unwrap_err();
        assert_eq!(e.code, ErrorCode::Internal);
        assert!(
            e.message.contains("secret sub_1 cannot be decrypted"),
            "{}",
            e.message
        );
        assert!(e.message.contains(SECRET_KEY_ENV), "{}", e.message);
        // Bound to its record: the same bytes under another id do not open.
        assert!(k.open("sub_2", &s).is_err());
        // Altered bytes do not open.
        let mut bad = s.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(k.open("sub_1", &bad).is_err());
        let e = k.open("sub_1", &s[..10]).unwrap_err();
        assert!(e.message.contains("malformed"), "{}", e.message);
    }

    #[test]
    fn keys_parse_from_hex_or_base64_and_nothing_else() {
        let k = SecretKey::from_bytes([7; 32]);
        assert_eq!(SecretKey::parse(&k.to_hex()).unwrap().0, [7; 32]);
        assert_eq!(
            SecretKey::parse(&format!(" {} \n", STANDARD.encode([7u8; 32])))
                .unwrap()
                .0,
            [7; 32]
        );
        for bad in [
            "",
            "abcd",
            &hex::encode([1u8; 31]),
            &STANDARD.encode([1u8; 33]),
        ] {
            let e = SecretKey::parse(bad).unwrap_err();
            assert!(e.message.contains("32 bytes"), "{}", e.message);
        }
        assert_eq!(format!("{k:?}"), "SecretKey(..)");
    }
}
