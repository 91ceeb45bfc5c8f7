//! OpenWOP trigger-subscription registration (RFC 0099 §F.2, RFC 0230): `POST /v1/trigger-subscriptions`
//! creates a `webhook` subscription whose Standard Webhooks signing secret the host generates, returns
//! once, and shows afterwards only as a host-keyed fingerprint. The record (workflow, binding,
//! subscription config) is a subscription row like a configured one; its `whsec_` secret is sealed
//! ([`crate::sealing`]) and stored in the same transaction, with a `registration` change row, so every
//! replica on the database loads it ([`crate::sync`]). Registrations made before secrets were sealed in the store keep their
//! secret in a file under the secrets directory (`Registration::secret_file`) and are read from it as
//! before (not migrated).

use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use tb_core::binding::{Binding, BindingAction};
use tb_core::connector::ConnectorSpec;
use tb_core::ids::{new_id, IdKind};
use tb_core::retry::{Backoff, RetryPolicy};
use tb_core::subscription::Source;
use tb_core::{ErrorCode, TbError};
use tb_store::{StoreError, SubscriptionRecord};

use crate::catalog::{Registration, SubscriptionConfig, Verification};
use crate::sealing::{SecretKey, SECRET_KEY_ENV};
use crate::{clock, store_err, Engine};

/// Prefix of a secret name that is a sealed secret in the store (the rest is its id) rather than a
/// file under the secrets directory (outbound webhook and capability HMAC keys made before secrets were sealed in the store).
pub const STORED: &str = "store:";

/// Where host-generated secrets live: the sealing key (secrets kept in the store) and the directory
/// of secret files (pre-issue-#10 registrations, capability HMAC keys), plus the key that
/// fingerprints secrets.
#[derive(Debug, Clone)]
pub struct SecretStore {
    dir: PathBuf,
    fingerprint_key: Vec<u8>,
    sealing: Option<SecretKey>,
}

fn io(what: &str, p: &Path, e: std::io::Error) -> TbError {
    TbError::new(
        ErrorCode::Unavailable,
        format!("{what} {}: {e}", p.display()),
    )
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), TbError> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(path).map_err(|e| io("cannot create", path, e))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| io("cannot write", path, e))?;
    // Make the new directory entry durable too.
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("cannot sync", dir, e))?;
    }
    Ok(())
}

/// Purpose string of the fingerprint key derived from a shared sealing key.
const FINGERPRINT_PURPOSE: &str = "trigger-bridge secret fingerprint v1";

/// Name of the sealing key file generated in the secrets directory of a single-host (SQLite) store.
pub const SECRET_KEY_FILE: &str = "secret.key";

impl SecretStore {
    /// For a single-host store (SQLite): opens (creating) `dir`; the sealing key is
    /// [`SECRET_KEY_ENV`] when set, else `dir/secret.key` (32 random bytes as hex, created once, mode
    /// 0600). Fingerprints use the host key `dir/host.key` (created once), or a key derived from
    /// [`SECRET_KEY_ENV`] when that is set. The key file is used only while the variable is unset: to
    /// move a host to the variable, set it to the file's content (secrets sealed under one key do not
    /// open under another). Errors: `validation_error` for a malformed key, `unavailable` for a file
    /// that cannot be created or read.
    pub fn open(dir: &Path) -> Result<SecretStore, TbError> {
        let mut s = SecretStore::open_shared(dir)?;
        if s.sealing.is_none() {
            let key_path = dir.join(SECRET_KEY_FILE);
            if !key_path.exists() {
                write_private(&key_path, SecretKey::generate().to_hex().as_bytes())?;
            }
            let text =
                std::fs::read_to_string(&key_path).map_err(|e| io("cannot read", &key_path, e))?;
            s.sealing = Some(SecretKey::parse(&text).map_err(|e| {
                TbError::new(e.code, format!("{}: {}", key_path.display(), e.message))
            })?);
        }
        Ok(s)
    }

    /// For a store shared by several replicas (PostgreSQL): opens (creating) `dir`; the sealing key is
    /// [`SECRET_KEY_ENV`] only (a key file on one host would not open the secrets on another). When
    /// it is unset the store opens, but registering a subscription or webhook is refused
    /// ([`SecretStore::sealing_key`]). Errors: as [`SecretStore::open`].
    pub fn open_shared(dir: &Path) -> Result<SecretStore, TbError> {
        let key = SecretKey::from_env()?;
        SecretStore::with_key(dir, key)
    }

    /// Opens (creating) `dir` with this sealing key (`None`: secrets cannot be sealed). Fingerprints
    /// use a key derived from `key`, or the host key `dir/host.key` without one. Errors: `unavailable`.
    pub fn with_key(dir: &Path, key: Option<SecretKey>) -> Result<SecretStore, TbError> {
        tb_store::create_private_dir(dir).map_err(|e| io("cannot create", dir, e))?;
        let fingerprint_key = match &key {
            Some(k) => k.derive(FINGERPRINT_PURPOSE),
            None => {
                let key_path = dir.join("host.key");
                if !key_path.exists() {
                    write_private(&key_path, &rand::random::<[u8; 32]>())?;
                }
                std::fs::read(&key_path).map_err(|e| io("cannot read", &key_path, e))?
            }
        };
        Ok(SecretStore {
            dir: dir.to_path_buf(),
            fingerprint_key,
            sealing: key,
        })
    }

    /// The sealing key. Errors: `unavailable` saying that [`SECRET_KEY_ENV`] must be set (the same
    /// 32-byte key on every replica) before secrets can be created or read from a shared store.
    pub fn sealing_key(&self) -> Result<&SecretKey, TbError> {
        self.sealing.as_ref().ok_or_else(|| {
            TbError::new(
                ErrorCode::Unavailable,
                format!(
                    "{SECRET_KEY_ENV} is not set: with a database shared by several replicas, host-generated secrets are sealed under that key (32 bytes as hex or base64, the same on every replica); set it and restart"
                ),
            )
        })
    }

    /// `fp_` + the first 24 hex characters of HMAC-SHA256(fingerprint key, secret): host-keyed,
    /// truncated, 27 characters (OpenWOP `secretFingerprint` <= 32).
    pub fn fingerprint(&self, secret: &[u8]) -> String {
        let mut m = Hmac::<Sha256>::new_from_slice(&self.fingerprint_key).expect("any key length");
        m.update(secret);
        format!("fp_{}", &hex::encode(m.finalize().into_bytes())[..24])
    }

    /// Writes a new secret file (mode 0600, fsync'd with its directory).
    pub fn write(&self, file: &str, bytes: &[u8]) -> Result<(), TbError> {
        write_private(&self.dir.join(file), bytes)
    }

    /// Reads a secret file as text.
    pub fn read_raw(&self, file: &str) -> Result<String, TbError> {
        let p = self.dir.join(file);
        std::fs::read_to_string(&p)
            .map(|s| s.trim().to_string())
            .map_err(|e| io("cannot read", &p, e))
    }

    /// Removes the secret file `file` of this store's directory (a rotated legacy registration's).
    /// Errors: `validation_error` for a name that is not one plain file name (nothing outside the
    /// directory is ever removed), `unavailable` for the OS error.
    fn remove_file(&self, file: &str) -> Result<(), TbError> {
        let plain = matches!(
            Path::new(file).components().collect::<Vec<_>>().as_slice(),
            [std::path::Component::Normal(_)]
        );
        if !plain {
            return Err(TbError::new(
                ErrorCode::ValidationError,
                format!("{file:?} is not a file name of the secrets directory"),
            ));
        }
        let p = self.dir.join(file);
        std::fs::remove_file(&p).map_err(|e| io("cannot remove", &p, e))
    }

    fn read(&self, file: &str) -> Result<Vec<u8>, TbError> {
        let p = self.dir.join(file);
        let text = std::fs::read_to_string(&p).map_err(|e| io("cannot read", &p, e))?;
        tb_ingress::parse_whsec(text.trim())
            .map_err(|e| TbError::new(ErrorCode::Internal, format!("{}: {e}", p.display())))
    }

    /// The secret named `name`: `store:<id>` ([`STORED`]) is the secret sealed in `store` under
    /// `id` ([`SecretStore::open_stored`]); any other name is a secret file of this store's directory
    /// (outbound webhook and capability HMAC keys made before secrets were sealed in the store).
    /// Errors: those of [`SecretStore::open_stored`], or `internal` for an unreadable file.
    pub async fn open_named(
        &self,
        store: &dyn tb_store::Store,
        name: &str,
    ) -> Result<Vec<u8>, TbError> {
        // The one reference parser decides; a legacy file name has no scheme and is not a reference.
        match tb_core::secret_ref::SecretRef::parse(name) {
            Ok(tb_core::secret_ref::SecretRef::Store(id)) => self.open_stored(store, &id).await,
            _ => self.read_raw(name).map(String::into_bytes),
        }
    }

    /// The plaintext of the secret stored sealed under `id` in `store`. Errors: `not_found` when no
    /// secret is stored under `id`; `unavailable` without a sealing key; `internal` for a wrong key.
    pub async fn open_stored(
        &self,
        store: &dyn tb_store::Store,
        id: &str,
    ) -> Result<Vec<u8>, TbError> {
        let sealed = store
            .sealed_secret(id)
            .await
            .map_err(store_err)?
            .ok_or_else(|| TbError::new(ErrorCode::NotFound, format!("no stored secret {id}")))?;
        self.sealing_key()?.open(id, &sealed)
    }
}

/// A registration request (OpenWOP `TriggerSubscriptionRegistration`, webhook source).
#[derive(Debug, Clone, PartialEq)]
pub struct RegistrationRequest {
    pub workflow_id: String,
    pub dedup_enabled: bool,
    /// `maxAttempts` and `backoff`; `None` keeps the default policy.
    pub retry: Option<(Option<u32>, Option<Backoff>)>,
    pub verification: Verification,
}

/// What a registration created; `signing_secret` is shown once.
#[derive(Debug, Clone)]
pub struct Registered {
    pub subscription_id: String,
    pub signing_secret: String,
    pub fingerprint: String,
}

fn policy(retry: Option<(Option<u32>, Option<Backoff>)>) -> RetryPolicy {
    let mut p = RetryPolicy::default();
    if let Some((max, backoff)) = retry {
        if let Some(m) = max {
            p.max_attempts = m.max(1);
        }
        match backoff {
            Some(Backoff::None) => (p.backoff, p.schedule_ms) = (Backoff::None, None),
            Some(Backoff::Fixed) => (p.backoff, p.schedule_ms) = (Backoff::Fixed, None),
            _ => {}
        }
    }
    p
}

fn config_of(
    id: &str,
    reg: Registration,
    secret: Vec<u8>,
    previous_secret: Option<crate::catalog::PreviousSecret>,
    fingerprint: String,
    req_like: (&RetryPolicy, bool, Verification),
) -> (SubscriptionConfig, Binding) {
    let (retry, dedup_enabled, verification) = req_like;
    let binding = Binding {
        rate_limit_per_min: 0,
        id: id.to_string(),
        subscription: id.to_string(),
        event_types: vec!["*".into()],
        filter: Default::default(),
        action: BindingAction::start_run(reg.workflow_id.clone()),
        inputs: Default::default(),
    };
    let sub = SubscriptionConfig {
        previous_secret,
        quarantine: Default::default(),
        id: id.to_string(),
        source: Source::Webhook,
        connector: ConnectorSpec::StandardWebhooks { tolerance_s: 300 },
        secret,
        retry: retry.clone(),
        dedup_window_s: 86_400,
        max_body_bytes: crate::catalog::DEFAULT_MAX_BODY_BYTES,
        failure_threshold: crate::catalog::DEFAULT_FAILURE_THRESHOLD,
        failure: Default::default(),
        verification,
        dedup_enabled,
        fingerprint: Some(fingerprint),
        registration: Some(reg),
        rate_limit_per_min: 0,
        limits: Default::default(),
    };
    (sub, binding)
}

/// Registers a webhook subscription that starts `workflow_id` for every verified event.
/// Errors: `validation_error` (unknown workflow), `unavailable` (secret or store write failed).
pub async fn register(
    engine: &Engine,
    secrets: &SecretStore,
    req: RegistrationRequest,
) -> Result<Registered, TbError> {
    if engine.catalog().workflow(&req.workflow_id).is_none() {
        return Err(TbError::new(
            ErrorCode::ValidationError,
            "workflowId does not name a workflow this host can start",
        ));
    }
    let id = format!("sub_{}", &new_id(IdKind::Event)[4..]);
    // Minted ids never collide with a route, but the rule is the same as for configured ones.
    tb_core::ids::validate_subscription_id(&id)
        .map_err(|m| TbError::new(ErrorCode::ValidationError, m))?;
    let sealing = secrets.sealing_key()?;
    let key: [u8; 32] = rand::random();
    let signing_secret = format!("whsec_{}", STANDARD.encode(key));
    let sealed = sealing.seal(&id, signing_secret.as_bytes());
    let fingerprint = secrets.fingerprint(&key);
    let reg = Registration {
        workflow_id: req.workflow_id.clone(),
        secret_file: None,
        previous_secret_until: None,
    };
    let retry = policy(req.retry);
    let (sub, binding) = config_of(
        &id,
        reg,
        key.to_vec(),
        None,
        fingerprint.clone(),
        (&retry, req.dedup_enabled, req.verification),
    );
    let rec = engine
        .store
        .register_subscription(sub.store_def(), vec![(id.clone(), sealed)], clock::now_ms())
        .await
        .map_err(store_err)?;
    engine.add_to_catalog(sub, binding, rec.state);
    tracing::info!(subscription = %id, workflow = %req.workflow_id, "trigger subscription registered");
    Ok(Registered {
        subscription_id: id,
        signing_secret,
        fingerprint,
    })
}

/// The registered subscriptions in the store, rebuilt with their secrets (on start). A registration
/// whose secret cannot be read is logged and skipped (404 until its secret is restored); everything
/// else loads. Returns how many loaded. Errors: the store's.
pub async fn load_registered(engine: &Engine, secrets: &SecretStore) -> Result<usize, TbError> {
    let mut n = 0;
    for rec in engine.store.list_subscriptions().await.map_err(store_err)? {
        if load_record(engine, secrets, rec).await {
            n += 1;
        }
    }
    Ok(n)
}

/// Reloads one registered subscription after a `registration` change (another replica registered
/// it): adds or replaces it in the catalog, or removes it when its row is gone. Errors: the store's.
pub async fn refresh_registration(
    engine: &Engine,
    secrets: &SecretStore,
    id: &str,
) -> Result<(), TbError> {
    match engine.store.get_subscription(id).await {
        Ok(rec) => {
            load_record(engine, secrets, rec).await;
            Ok(())
        }
        Err(StoreError::NotFound {
            kind: tb_store::RecordKind::Subscription,
        }) => {
            engine.remove_from_catalog(id);
            Ok(())
        }
        Err(e) => Err(store_err(e)),
    }
}

/// Adds the registration of `rec` to the catalog; false when `rec` is not a registration or its
/// secret cannot be read (logged).
async fn load_record(engine: &Engine, secrets: &SecretStore, rec: SubscriptionRecord) -> bool {
    if rec.source == Source::Schedule {
        return crate::schedules::load(engine, &rec);
    }
    let Ok(reg) = serde_json::from_value::<Registration>(rec.config["registration"].clone()) else {
        return false;
    };
    let secret = match &reg.secret_file {
        Some(file) => secrets.read(file),
        None => open_whsec(secrets, engine, &rec.id).await,
    };
    let secret = match secret {
        Ok(s) => s,
        Err(e) => {
            // One lost secret must not stop the bridge: that subscription is not served (404)
            // until its secret is restored; everything else starts.
            tracing::error!(subscription = %rec.id, error = %e.message, "registered subscription not loaded: its secret cannot be read");
            engine.set_unsealable(&rec.id, Some(e.message));
            return false;
        }
    };
    let retry: RetryPolicy =
        serde_json::from_value(rec.config["retryPolicy"].clone()).unwrap_or_default();
    let verification: Verification =
        serde_json::from_value(rec.config["verification"].clone()).unwrap_or_default();
    let dedup = rec.config["dedupEnabled"].as_bool().unwrap_or(true);
    // The previous secret of a rotation, while its overlap lasts; one that cannot be read is logged
    // and dropped (the current secret still works).
    let previous = match reg.previous_secret_until {
        Some(until) if tb_core::rotation::previous_accepted(until, clock::now_ms()) => {
            match open_whsec(secrets, engine, &previous_secret_id(&rec.id)).await {
                Ok(s) => Some(crate::catalog::PreviousSecret {
                    secret: s,
                    until_ms: until,
                }),
                Err(e) => {
                    tracing::error!(subscription = %rec.id, error = %e.message, "the previous secret of a rotation cannot be read; only the current one is accepted");
                    None
                }
            }
        }
        _ => None,
    };
    let fp = secrets.fingerprint(&secret);
    let (sub, binding) = config_of(
        &rec.id,
        reg,
        secret,
        previous,
        fp,
        (&retry, dedup, verification),
    );
    engine.add_to_catalog(sub, binding, rec.state);
    engine.set_unsealable(&rec.id, None);
    true
}

/// Deletes the sealed previous secrets of registrations whose rotation overlap has ended at `now`
/// (the sweeper calls it every pass): nothing accepts them any more, so nothing keeps them at rest.
/// The store re-checks each end under the subscription's lock. Returns how many were deleted; a
/// failure is logged and the rest go on.
pub async fn drop_ended_previous_secrets(engine: &Engine, now: i64) -> usize {
    let ended: Vec<String> = engine
        .catalog()
        .subscriptions()
        .filter(|s| {
            s.registration
                .as_ref()
                .and_then(|r| r.previous_secret_until)
                .is_some_and(|u| !tb_core::rotation::previous_accepted(u, now))
        })
        .map(|s| s.id.clone())
        .collect();
    let mut n = 0;
    for id in ended {
        match engine
            .store
            .drop_ended_previous_secret(&id, &previous_secret_id(&id), now)
            .await
        {
            Ok(true) => n += 1,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(subscription = %id, error = %e, "removing an ended rotation's previous secret failed")
            }
        }
    }
    n
}

/// The id the previous secret of a rotated registration is sealed under (the current one is under
/// the subscription id itself).
pub fn previous_secret_id(subscription: &str) -> String {
    format!("{subscription}#previous")
}

/// The key bytes of the `whsec_` secret sealed under `id`. Errors: those of
/// [`SecretStore::open_stored`], or `internal` for a sealed text that is not a `whsec_` secret.
async fn open_whsec(secrets: &SecretStore, engine: &Engine, id: &str) -> Result<Vec<u8>, TbError> {
    whsec_key(id, &secrets.open_stored(engine.store.as_ref(), id).await?)
}

/// The key bytes of the opened `whsec_` text `text` of secret `id`. Errors: `internal` for another text.
fn whsec_key(id: &str, text: &[u8]) -> Result<Vec<u8>, TbError> {
    tb_ingress::parse_whsec(String::from_utf8_lossy(text).trim())
        .map_err(|e| TbError::new(ErrorCode::Internal, format!("secret {id}: {e}")))
}

/// What a rotation gave: the new secret (shown once), its fingerprint, and until when the previous
/// secret is still accepted (`None`: it no longer is). Its `Debug` never shows the secret.
#[derive(Clone)]
pub struct Rotated {
    pub subscription_id: String,
    pub signing_secret: String,
    pub fingerprint: String,
    pub previous_secret_until: Option<i64>,
}

impl std::fmt::Debug for Rotated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rotated")
            .field("subscription_id", &self.subscription_id)
            .field("signing_secret", &"<redacted>")
            .field("fingerprint", &self.fingerprint)
            .field("previous_secret_until", &self.previous_secret_until)
            .finish()
    }
}

/// Rotates the signing secret of registered subscription `id`: a new `whsec_` secret is
/// generated and sealed under `id`; the current one is sealed beside it and still accepted for
/// `overlap_s` seconds (0: refused at once; at most 30 days, [`tb_core::rotation::MAX_OVERLAP_MS`]).
/// The subscription row, both sealed secrets and the `registration` change row are one commit, so
/// every replica loads the pair. A second rotation during an overlap ends the first: only the secret
/// it replaces stays valid beside the new one.
///
/// Errors: `not_found` (404) no such subscription; `conflict` (409) a subscription from the config file
/// (its secret rotates there, `[subscriptions.rotation]`) or a schedule; `validation_error` (400) an
/// overlap over 30 days; `conflict` (409) also when another rotation committed between this one's
/// read and its commit (nothing written); `unavailable` (no sealing key, store write failed).
pub async fn rotate(
    engine: &Engine,
    secrets: &SecretStore,
    id: &str,
    overlap_s: u64,
) -> Result<Rotated, TbError> {
    // Rotations in this process run one at a time, so their commits reach the catalog in commit order
    // (across replicas the store's check and the change log order them).
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(current) = engine.catalog().subscription(id).cloned() else {
        return Err(engine.missing_subscription(id));
    };
    if current.source != Source::Webhook {
        return Err(TbError::new(
            ErrorCode::Conflict,
            format!(
                "subscription {id} is a {}: only a webhook has a signing secret",
                current.source.as_str()
            ),
        ));
    }
    let Some(reg) = current.registration.clone() else {
        return Err(TbError::new(
            ErrorCode::Conflict,
            format!(
                "subscription {id} comes from the config file: rotate its secret there ([subscriptions.rotation] with previous_secret and until)"
            ),
        ));
    };
    let overlap_ms = i64::try_from(overlap_s)
        .ok()
        .and_then(|s| s.checked_mul(1000))
        .filter(|ms| *ms <= tb_core::rotation::MAX_OVERLAP_MS)
        .ok_or_else(|| {
            TbError::new(
                ErrorCode::ValidationError,
                format!(
                    "overlapSeconds {overlap_s} is over 30 days ({} s); the previous secret must stop working",
                    tb_core::rotation::MAX_OVERLAP_MS / 1000
                ),
            )
        })?;
    let sealing = secrets.sealing_key()?;
    // The secret replaced is the one in the store now, not this replica's copy (which may lag
    // behind another replica's rotation); the commit checks it is still the one stored.
    let expected = engine.store.sealed_secret(id).await.map_err(store_err)?;
    let old_key = match (&expected, &reg.secret_file) {
        (Some(sealed_now), _) => whsec_key(id, &sealing.open(id, sealed_now)?)?,
        (None, Some(file)) => secrets.read(file)?,
        (None, None) => {
            return Err(TbError::new(
                ErrorCode::Conflict,
                format!("subscription {id} has no stored secret yet (this replica is ahead of the store); retry"),
            ))
        }
    };
    let now = clock::now_ms();
    let key: [u8; 32] = rand::random();
    let signing_secret = format!("whsec_{}", STANDARD.encode(key));
    let prev_id = previous_secret_id(id);
    let mut sealed = vec![(id.to_string(), sealing.seal(id, signing_secret.as_bytes()))];
    let until = (overlap_ms > 0).then_some(now + overlap_ms);
    let previous = until.map(|until_ms| {
        let text = format!("whsec_{}", STANDARD.encode(&old_key));
        sealed.push((prev_id.clone(), sealing.seal(&prev_id, text.as_bytes())));
        crate::catalog::PreviousSecret {
            secret: old_key.clone(),
            until_ms,
        }
    });
    // With no overlap the previous secret of an earlier rotation is deleted in the same commit.
    let remove = if until.is_none() {
        vec![prev_id.clone()]
    } else {
        Vec::new()
    };
    let legacy_file = reg.secret_file.clone();
    let reg = Registration {
        workflow_id: reg.workflow_id,
        // A registration that kept its secret in a file moves to the store now.
        secret_file: None,
        previous_secret_until: until,
    };
    let fingerprint = secrets.fingerprint(&key);
    let (sub, binding) = config_of(
        id,
        reg,
        key.to_vec(),
        previous,
        fingerprint.clone(),
        (&current.retry, current.dedup_enabled, current.verification),
    );
    let rec = engine
        .store
        .rotate_subscription_secret(sub.store_def(), expected, sealed, remove, now)
        .await
        .map_err(store_err)?;
    engine.add_to_catalog(sub, binding, rec.state);
    // The file of a registration made before secrets were sealed is no longer read: remove it.
    if let Some(file) = legacy_file {
        if let Err(e) = secrets.remove_file(&file) {
            tracing::warn!(subscription = %id, error = %e.message, "the old secret file of a rotated registration could not be removed");
        }
    }
    tracing::info!(subscription = %id, overlap_s, "signing secret rotated");
    Ok(Rotated {
        subscription_id: id.to_string(),
        signing_secret,
        fingerprint,
        previous_secret_until: until,
    })
}
