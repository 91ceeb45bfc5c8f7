//! Secret references (signals-and-connectors §0 "secrets in a secret store by reference"):
//! the one parser of the strings that name a secret instead of holding it. The configuration file's
//! `secret` / `previous_secret`, and the names under which the bridge finds the secrets it generated,
//! are all references; resolving one is the job of a provider (`tb_engine::secrets`).
//!
//! Forms:
//! - `env:NAME`: an environment variable (`NAME`: letters, digits, `_`, not starting with a digit).
//! - `file:PATH`: a file's content, trailing newlines trimmed (a relative path is against the config
//!   file's folder).
//! - `store:ID`: a secret sealed in the bridge's own store (`sealed_secrets`, ChaCha20-Poly1305 under
//!   the sealing key): registrations' and webhooks' secrets.
//! - `<provider>:<key>`: an external provider (a lowercase name of 2 to 32 of `a-z`, `0-9`, `-`, e.g.
//!   `vault:kv/data/github#secret`); resolved by a provider registered under that name, refused when
//!   none is.
//!
//! Anything else, an inline secret above all, is refused: a secret must never sit in a config file.

/// Longest reference accepted, in bytes.
pub const MAX_REF_BYTES: usize = 1024;

/// The schemes the bridge resolves itself.
pub const BUILT_IN: [&str; 3] = ["env", "file", "store"];

/// A parsed secret reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretRef {
    /// `env:NAME`.
    Env(String),
    /// `file:PATH` (as written; relative paths are resolved by the caller).
    File(String),
    /// `store:ID`: a sealed secret in the store.
    Store(String),
    /// `<provider>:<key>`: resolved by the external provider `provider`.
    External { provider: String, key: String },
}

impl SecretRef {
    /// Parses a reference. Errors: what to write instead, as a sentence.
    pub fn parse(s: &str) -> Result<SecretRef, String> {
        const FORMS: &str = "env:NAME, file:PATH or store:ID (or <provider>:<key> for an external provider); inline secrets are not accepted";
        if s.len() > MAX_REF_BYTES {
            return Err(format!(
                "a secret reference is at most {MAX_REF_BYTES} bytes: {FORMS}"
            ));
        }
        let Some((scheme, rest)) = s.split_once(':') else {
            return Err(format!("secret must be a reference: {FORMS}"));
        };
        if rest.is_empty() {
            return Err(format!("{scheme}: names nothing: {FORMS}"));
        }
        if rest.chars().any(char::is_control) {
            return Err("a secret reference must not contain control characters".into());
        }
        match scheme {
            "env" => {
                let ok = rest.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                    && !rest.starts_with(|c: char| c.is_ascii_digit());
                if ok {
                    Ok(SecretRef::Env(rest.into()))
                } else {
                    Err(format!(
                        "env:{rest}: a variable name is letters, digits and _, not starting with a digit"
                    ))
                }
            }
            "file" => Ok(SecretRef::File(rest.into())),
            "store" => Ok(SecretRef::Store(rest.into())),
            p if is_provider_name(p) => Ok(SecretRef::External {
                provider: p.into(),
                key: rest.into(),
            }),
            // Most likely a secret that happens to contain ':' (a whsec_ value never does; an
            // inline password might): do not echo any of it.
            _ => Err(format!("secret must be a reference: {FORMS}")),
        }
    }

    /// The scheme (`env`, `file`, `store`, or the provider's name).
    pub fn scheme(&self) -> &str {
        match self {
            SecretRef::Env(_) => "env",
            SecretRef::File(_) => "file",
            SecretRef::Store(_) => "store",
            SecretRef::External { provider, .. } => provider,
        }
    }
}

/// An external provider's name: 2 to 32 of `a-z`, `0-9`, `-`, starting with a letter, and not a
/// built-in scheme.
pub fn is_provider_name(p: &str) -> bool {
    (2..=32).contains(&p.len())
        && p.starts_with(|c: char| c.is_ascii_lowercase())
        && p.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !BUILT_IN.contains(&p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_forms_parse() {
        assert_eq!(
            SecretRef::parse("env:GITHUB_SECRET"),
            Ok(SecretRef::Env("GITHUB_SECRET".into()))
        );
        assert_eq!(
            SecretRef::parse("file:secrets/gh.txt"),
            Ok(SecretRef::File("secrets/gh.txt".into()))
        );
        assert_eq!(
            SecretRef::parse("store:sub_1#previous"),
            Ok(SecretRef::Store("sub_1#previous".into()))
        );
        assert_eq!(
            SecretRef::parse("vault:kv/data/gh#secret"),
            Ok(SecretRef::External {
                provider: "vault".into(),
                key: "kv/data/gh#secret".into()
            })
        );
        assert_eq!(SecretRef::parse("vault:x").unwrap().scheme(), "vault");
    }

    #[test]
    fn inline_secrets_and_malformed_references_are_refused_without_echoing_them() {
        for (bad, says) in [
            (
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                "must be a reference",
            ),
            ("Hunter2:password", "must be a reference"),
            ("env:", "names nothing"),
            ("env:1ABC", "not starting with a digit"),
            ("env:A-B", "letters, digits and _"),
            ("file:a\nb", "control characters"),
            ("x:y", "must be a reference"),
        ] {
            let e = SecretRef::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let e = SecretRef::parse("Hunter2:password").unwrap_err();
        assert!(!e.contains("Hunter2") && !e.contains("password"), "{e}");
        assert!(
            SecretRef::parse(&format!("file:{}", "a".repeat(MAX_REF_BYTES)))
                .unwrap_err()
                .contains("at most")
        );
    }
}
