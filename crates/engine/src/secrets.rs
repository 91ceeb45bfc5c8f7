//! Resolving secret references: the one interface every configured secret goes through.
//! A [`tb_core::secret_ref::SecretRef`] names the secret; a [`SecretProvider`] turns it into bytes.
//!
//! Built in: `env:` ([`EnvProvider`]) and `file:` ([`FileProvider`]). `store:` names a secret the
//! bridge sealed in its own store (registrations, webhooks) and is opened by
//! [`crate::registration::SecretStore::open_named`] against the store, never here. Any other scheme
//! is an external provider (a vault, a cloud secret manager): a build that has one registers it with
//! [`Providers::with`] under its name, and references `<name>:<key>` then resolve through it; without
//! one such a reference is refused with the names that are known.
//!
//! Every error is a sentence that says what to fix and never contains the secret.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tb_core::secret_ref::SecretRef;

/// Something that resolves the key part of a reference (`NAME` of `env:NAME`) to the secret, as text.
/// Errors: a sentence, never the secret.
pub trait SecretProvider: Send + Sync {
    fn resolve(&self, key: &str) -> Result<String, String>;
}

/// `env:NAME`: the environment variable, set and not empty.
#[derive(Debug, Default, Clone, Copy)]
pub struct EnvProvider;

impl SecretProvider for EnvProvider {
    fn resolve(&self, name: &str) -> Result<String, String> {
        match std::env::var(name) {
            Ok(v) if !v.is_empty() => Ok(v),
            Ok(_) => Err(format!(
                "environment variable {name} is empty; set it to the secret"
            )),
            Err(_) => Err(format!(
                "environment variable {name} is not set; export {name}=<secret> before starting"
            )),
        }
    }
}

/// `file:PATH`: the file's content with trailing newlines trimmed, not empty; a relative path is
/// against `base` (the config file's folder).
#[derive(Debug, Clone)]
pub struct FileProvider {
    pub base: PathBuf,
}

impl SecretProvider for FileProvider {
    fn resolve(&self, p: &str) -> Result<String, String> {
        let path = self.base.join(p);
        let s = std::fs::read_to_string(&path).map_err(|e| {
            let shown = std::path::absolute(&path).unwrap_or_else(|_| path.clone());
            format!(
                "cannot read secret file {} (file: paths are relative to the config file's folder): {e}",
                shown.display()
            )
        })?;
        let s = s.trim_end_matches(['\r', '\n']);
        if s.is_empty() {
            return Err(format!("secret file {} is empty", path.display()));
        }
        Ok(s.to_string())
    }
}

/// The providers a configuration resolves through: `env:` and `file:` always, plus the external ones
/// registered by name.
#[derive(Clone)]
pub struct Providers {
    file: FileProvider,
    external: BTreeMap<String, Arc<dyn SecretProvider>>,
}

impl std::fmt::Debug for Providers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Providers")
            .field("file_base", &self.file.base)
            .field("external", &self.external.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Providers {
    /// The built-in providers, `file:` paths relative to `base`.
    pub fn new(base: impl Into<PathBuf>) -> Providers {
        Providers {
            file: FileProvider { base: base.into() },
            external: BTreeMap::new(),
        }
    }

    /// Adds the external provider `name` (a name [`tb_core::secret_ref::is_provider_name`] accepts;
    /// panics on another: a programming error, not input).
    pub fn with(mut self, name: &str, provider: Arc<dyn SecretProvider>) -> Providers {
        assert!(
            tb_core::secret_ref::is_provider_name(name),
            "{name:?} cannot name a secret provider"
        );
        self.external.insert(name.to_string(), provider);
        self
    }

    /// Parses and resolves `reference`. Errors: a malformed reference; `store:` (it names a secret the
    /// bridge generated and is opened against the store, not from a config file); an external
    /// provider that is not registered; the provider's own error.
    pub fn resolve(&self, reference: &str) -> Result<String, String> {
        match SecretRef::parse(reference)? {
            SecretRef::Env(name) => EnvProvider.resolve(&name),
            SecretRef::File(path) => self.file.resolve(&path),
            SecretRef::Store(_) => Err(
                "store: names a secret the bridge generated and sealed (registrations, webhooks); in the config file use env:NAME or file:PATH"
                    .into(),
            ),
            SecretRef::External { provider, key } => match self.external.get(&provider) {
                Some(p) => p.resolve(&key),
                None => Err(format!(
                    "no secret provider {provider:?} is configured; known: env, file{}",
                    self.external
                        .keys()
                        .map(|k| format!(", {k}"))
                        .collect::<String>()
                )),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl SecretProvider for Fixed {
        fn resolve(&self, key: &str) -> Result<String, String> {
            match key {
                "gh" => Ok("from-the-vault".into()),
                other => Err(format!("no entry {other}")),
            }
        }
    }

    #[test]
    fn each_scheme_goes_to_its_provider() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("s.txt"), "from-a-file\n").unwrap();
        std::env::set_var("TB_SECRETS_TEST_VAR", "from-the-env");
        let p = Providers::new(dir.path()).with("vault", Arc::new(Fixed));
        assert_eq!(
            p.resolve("env:TB_SECRETS_TEST_VAR").unwrap(),
            "from-the-env"
        );
        assert_eq!(p.resolve("file:s.txt").unwrap(), "from-a-file");
        assert_eq!(p.resolve("vault:gh").unwrap(), "from-the-vault");
        assert_eq!(p.resolve("vault:other").unwrap_err(), "no entry other");
        let e = p.resolve("aws-sm:prod/gh").unwrap_err();
        assert!(
            e.contains("\"aws-sm\"") && e.ends_with("known: env, file, vault"),
            "{e}"
        );
        assert!(p
            .resolve("store:sub_1")
            .unwrap_err()
            .contains("env:NAME or file:PATH"));
        assert!(p
            .resolve("env:TB_SECRETS_TEST_UNSET")
            .unwrap_err()
            .contains("is not set"));
        assert!(p
            .resolve("file:missing.txt")
            .unwrap_err()
            .contains("cannot read"));
        std::fs::write(dir.path().join("empty.txt"), "\n").unwrap();
        assert!(p
            .resolve("file:empty.txt")
            .unwrap_err()
            .contains("is empty"));
    }
}
