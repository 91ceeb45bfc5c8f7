//! Capability endpoints (signals-and-connectors §4): an operator mints a URL `POST /v1/hooks/{token}`
//! that raises ONE named signal on ONE run, like an implicit `raise_signal` binding. The token is shown
//! once and stored only as its SHA-256; every bad, expired, revoked or used-up token gets the same 404;
//! revocation takes effect on the next request (the lookup and the use count are in the receipt's
//! transaction).

use base64::Engine as _;
use bytes::Bytes;
use http::HeaderMap;
use serde_json::json;
use tb_core::dedup::dedup_key;
use tb_core::delivery::{DeliveryKind, DeliveryState};
use tb_core::ids::{new_id, IdKind};
use tb_core::receipt::ReceiptSource;
use tb_core::{ErrorCode, TbError};
use tb_ingress::capability as cap;
use tb_store::{CapabilityRecord, NewDelivery};

use crate::accept::{accept, Dedup, Inbound, Routing};
use crate::ingest::IngestAnswer;
use crate::registration::SecretStore;
use crate::{clock, store_err, Engine};

/// Largest body of a capability request, in bytes (32 KiB, signals-and-connectors §4.2); the HTTP
/// edge reads at most this much, so its 413 names this limit.
pub use tb_ingress::capability::MAX_BODY_BYTES;

/// Token prefix; the rest is 256 random bits as 43 base64url characters.
pub const TOKEN_PREFIX: &str = "tbcap_";
/// Default lifetime: 30 days, in seconds.
pub const DEFAULT_EXPIRES_S: u64 = 30 * 86_400;
/// Longest lifetime: 90 days, in seconds.
pub const MAX_EXPIRES_S: u64 = 90 * 86_400;
/// Requests per minute one endpoint accepts (signals-and-connectors §4.2 reference: ~60/min).
pub const RATE_PER_MIN: u32 = 60;
/// Default and largest `maxUses`.
pub const DEFAULT_MAX_USES: u64 = 1_000;
pub const MAX_MAX_USES: u64 = 1_000_000;

/// A mint request (`POST /v1/capabilities`).
#[derive(Debug, Clone, Default)]
pub struct MintRequest {
    pub run_id: String,
    /// Signal name raised on every request.
    pub signal: String,
    pub label: Option<String>,
    /// Lifetime in seconds (default 30 days, at most 90).
    pub expires_in_s: Option<u64>,
    /// 1 ..= 1 000 000 (default 1 000).
    pub max_uses: Option<u64>,
    /// Raised signals also enqueue a wake turn.
    pub wake: bool,
    /// Require `X-Signature-256` over the body with a host-generated secret (shown once).
    pub hmac: bool,
}

/// What a mint returns: the only time the token (and HMAC secret) is shown.
#[derive(Debug, Clone)]
pub struct Minted {
    pub record: CapabilityRecord,
    /// `tbcap_...`: the path is `/v1/hooks/{token}`.
    pub token: String,
    /// Hex HMAC key, when `hmac` was asked for.
    pub hmac_secret: Option<String>,
}

fn bad(msg: impl Into<String>) -> TbError {
    TbError::new(ErrorCode::ValidationError, msg)
}

/// Mints an endpoint. Errors: `validation_error` (signal name, lifetime, uses, label over 128
/// characters, `hmac` without a secret store); `not_found` unknown run; `target_terminal` ended run.
pub async fn mint(
    engine: &Engine,
    secrets: Option<&SecretStore>,
    req: MintRequest,
    created_by: Option<String>,
) -> Result<Minted, TbError> {
    tb_core::signal::validate_name(&req.signal).map_err(bad)?;
    let expires_s = req.expires_in_s.unwrap_or(DEFAULT_EXPIRES_S);
    if expires_s == 0 || expires_s > MAX_EXPIRES_S {
        return Err(bad(format!(
            "expiresInS must be between 1 and {MAX_EXPIRES_S} (90 days)"
        )));
    }
    let max_uses = req.max_uses.unwrap_or(DEFAULT_MAX_USES);
    if !(1..=MAX_MAX_USES).contains(&max_uses) {
        return Err(bad(format!("maxUses must be between 1 and {MAX_MAX_USES}")));
    }
    if req
        .label
        .as_ref()
        .is_some_and(|l| l.chars().count() > 128 || l.chars().any(char::is_control))
    {
        return Err(bad(
            "label is at most 128 characters, without control characters",
        ));
    }
    let id = new_id(IdKind::Capability);
    let token = format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(rand::random::<[u8; 32]>())
    );
    // The HMAC key is sealed in the store, in the capability's own transaction, so every replica can
    // verify the endpoint's requests; its record names it `store:<capability id>`.
    let (hmac_file, hmac_secret, sealed) = if req.hmac {
        let store = secrets.ok_or_else(|| bad("this server has no secret store for HMAC keys"))?;
        let secret = hex::encode(rand::random::<[u8; 32]>());
        let sealed = store.sealing_key()?.seal(&id, secret.as_bytes());
        (
            Some(format!("{}{id}", crate::registration::STORED)),
            Some(secret),
            Some(sealed),
        )
    } else {
        (None, None, None)
    };
    let now = clock::now_ms();
    let record = CapabilityRecord {
        id,
        run_id: req.run_id,
        signal: req.signal,
        label: req.label,
        wake: req.wake,
        hmac: hmac_file.is_some(),
        hmac_file,
        created_by,
        created_at: now,
        expires_at: now + (expires_s * 1000) as i64,
        max_uses,
        use_count: 0,
        revoked_at: None,
    };
    engine
        .store
        .create_capability_sealed(record.clone(), cap::hash_token(&token), sealed)
        .await
        .map_err(store_err)?;
    tracing::info!(endpoint = %record.id, run = %record.run_id, "capability endpoint minted");
    Ok(Minted {
        record,
        token,
        hmac_secret,
    })
}

/// Revokes an endpoint: the next request gets 404. Idempotent, like binding revocation. Errors:
/// `not_found`.
pub async fn revoke(engine: &Engine, id: &str) -> Result<CapabilityRecord, TbError> {
    let r = engine
        .store
        .revoke_capability(id, clock::now_ms())
        .await
        .map_err(store_err)?;
    tracing::info!(endpoint = %id, "capability endpoint revoked");
    Ok(r)
}

fn not_found() -> TbError {
    TbError::new(ErrorCode::NotFound, "no such endpoint")
}

/// The live endpoint of `token`, looked up BEFORE its request body is read (so a made-up token costs
/// one SHA-256 and one indexed read, and never a body slot). Errors: `not_found`, alike for unknown /
/// revoked / expired / used-up tokens (signals-and-connectors §4.2).
pub async fn find(engine: &Engine, token: &str) -> Result<CapabilityRecord, TbError> {
    match engine
        .store
        .capability_by_hash(&cap::hash_token(token), clock::now_ms())
        .await
        .map_err(store_err)?
    {
        Some(c) => Ok(c),
        None => {
            metrics::counter!("tb_receipts_total", "connector" => "capability", "outcome" => "not_found")
                .increment(1);
            Err(not_found())
        }
    }
}

/// One request to `POST /v1/hooks/{token}` for the endpoint [`find`] returned, in the order of
/// signals-and-connectors §4.2: (token lookup: [`find`], before the body is read; the body is then read
/// at most [`MAX_BODY_BYTES`], so an oversized one is 413 as it arrives), HMAC when configured
/// (401), the key (`tb_core::idempotency::parse_key`: a key that is not 1 to 255 URL-safe ASCII
/// characters, or two `Idempotency-Key` headers, is 400 `validation_error`), rate limit
/// ([`RATE_PER_MIN`], 429 with `Retry-After`), size (413),
/// content type and encoding (415), JSON (422), `Idempotency-Key` dedup (same key and body: 200
/// duplicate; same key, other body: 409 `conflict`), terminal target (409 `target_terminal`), then one
/// commit of receipt + delivery + use count, which checks the endpoint again (revoked, expired or used
/// up meanwhile: the same 404). The JSON body becomes the signal's data (untrusted).
pub async fn ingest(
    engine: &Engine,
    secrets: Option<&SecretStore>,
    c: &CapabilityRecord,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<IngestAnswer, TbError> {
    let now = clock::now_ms();
    let count = |outcome: &'static str| {
        metrics::counter!("tb_receipts_total", "connector" => "capability", "outcome" => outcome)
            .increment(1)
    };
    if let Some(name) = &c.hmac_file {
        let secret = secrets
            .ok_or_else(|| TbError::new(ErrorCode::Unavailable, "secret store unavailable"))?
            .open_named(engine.store.as_ref(), name)
            .await
            .map_err(|e| {
                // The caller may retry: this replica cannot read the key (no or another sealing key,
                // or the key is gone), which says nothing about the request.
                tracing::error!(endpoint = %c.id, error = %e.message, "cannot read the endpoint's HMAC key");
                TbError::new(
                    ErrorCode::Unavailable,
                    format!(
                        "this replica cannot read the endpoint's HMAC key; check that {} is the same on every replica",
                        crate::sealing::SECRET_KEY_ENV
                    ),
                )
            })?;
        if let Err(e) = cap::verify_hmac(&secret, headers, &body) {
            count("rejected");
            return Err(TbError::new(e.code(), e.to_string()));
        }
    }
    // The same rule as the management API's Layer-1 idempotency, before anything is counted or
    // stored: a key that would be ignored would let one request be accepted twice.
    let idem = tb_core::idempotency::parse_key(
        headers
            .get_all("idempotency-key")
            .iter()
            .map(http::HeaderValue::as_bytes),
    )
    .inspect_err(|_| count("rejected"))?;
    let level = crate::rate_limit::Level {
        scope: tb_core::rate::Scope::Endpoint,
        key: &c.id,
        limit: RATE_PER_MIN,
    };
    if let Err(refusal) = engine.rate_limits.admit(clock::now_ms(), &[level]) {
        count("rate_limited");
        return Err(refusal.error());
    }
    if body.len() > cap::MAX_BODY_BYTES {
        count("too_large");
        return Err(TbError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "body is {} bytes; capability endpoints accept at most {}",
                body.len(),
                cap::MAX_BODY_BYTES
            ),
        ));
    }
    let data = cap::parse_body(headers, &body, &Default::default()).map_err(|e| {
        count("rejected");
        TbError::new(e.code(), e.to_string())
    })?;
    let inbound = Inbound {
        source: ReceiptSource::Capability,
        subscription: c.id.clone(),
        counter: Some("capability"),
        provider_event_id: Some(idem.unwrap_or("none").to_string()),
        event_type: "capability".into(),
        normalized: json!({"event": "capability", "fields": {"endpoint": c.id, "signal": c.signal}}),
        body,
        content_type: Some("application/json".into()),
        received_at: now,
        // Without an `Idempotency-Key` every request is its own (a key unique to the receipt).
        dedup: idem.map(|k| Dedup {
            key: dedup_key(&c.id, k),
            window_ms: 86_400_000,
            same_body: true,
        }),
        rate_limit_per_min: None,
        routing: Routing::Fixed(vec![NewDelivery {
            id: new_id(IdKind::Delivery),
            kind: DeliveryKind::CapabilitySignal,
            binding_id: c.id.clone(),
            action: "raise_signal".into(),
            workflow_id: None,
            run_id: Some(c.run_id.clone()),
            inputs: data,
            params: Some(json!({"run": c.run_id, "signal": c.signal, "wake": c.wake})),
            state: DeliveryState::Pending,
            dead_letter_reason: None,
        }]),
        capability: Some(c.id.clone()),
        target_run: Some(c.run_id.clone()),
        trace_parent: crate::trace::from_headers(headers),
    };
    accept(engine, inbound).await?.answer()
}
