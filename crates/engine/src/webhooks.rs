//! Outbound webhooks (OpenWOP `webhooks.md` v1.2, durable mode RFC 0083): registrations, and the
//! delivery of run events as `{runId, workspaceId, event}` signed with the v1 scheme
//! (`X-openwop-Signature: sha256=<hex HMAC-SHA256(secret, "{timestamp}.{body}")>`). Each delivery is a
//! `webhook` delivery of the engine: written with its run event, retried (5 attempts, 500 ms doubling),
//! dead-lettered, and counted in the registration's trigger-subscription states.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;
use tb_core::delivery::ActionResult;
use tb_core::ids::new_id;
use tb_core::retry::{Backoff, RetryPolicy};
use tb_core::subscription::Source;
use tb_core::{ErrorCode, TbError};
use tb_store::{DeliveryRecord, SubscriptionDef, WebhookRecord};

use crate::registration::SecretStore;
use crate::{clock, ssrf, store_err, Engine};

/// A live webhook as the worker needs it.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    pub secret: String,
    pub tenant_id: String,
    /// RFC 0201 opt-in: the `whsec_` key for Standard Webhooks headers.
    pub standard_key: Option<Vec<u8>>,
}

/// Live webhooks by id, and the best-effort circuit breakers.
#[derive(Debug, Default)]
pub struct Registry(
    RwLock<HashMap<String, Target>>,
    std::sync::Mutex<HashMap<String, Breaker>>,
);

/// Best-effort breaker of one webhook (webhooks.md): 4 consecutive failures open it for 1 h; then one
/// half-open probe decides; 100 failures within 7 days mark the subscription `failed`.
#[derive(Debug, Default, Clone)]
pub struct Breaker {
    consecutive: u32,
    open_until_ms: i64,
    /// Failure times (ms) within the rolling 7 days.
    recent: std::collections::VecDeque<i64>,
}

/// Consecutive failures that open the breaker.
pub const BREAKER_TRIP: u32 = 4;
/// How long an open breaker drops deliveries, in ms.
pub const BREAKER_OPEN_MS: i64 = 3_600_000;
/// Failures within 7 days that mark the webhook `failed`.
pub const BREAKER_FAIL_LIMIT: usize = 100;
const WEEK_MS: i64 = 7 * 86_400_000;

impl Breaker {
    /// Whether a delivery may be attempted at `now` (closed, or open long enough for a probe).
    pub fn allows(&self, now: i64) -> bool {
        now >= self.open_until_ms
    }

    /// Records an attempt's outcome at `now`; returns true when the 7-day failure limit is reached.
    pub fn record(&mut self, ok: bool, now: i64) -> bool {
        if ok {
            self.consecutive = 0;
            self.open_until_ms = 0;
            return false;
        }
        self.consecutive += 1;
        if self.consecutive >= BREAKER_TRIP {
            self.open_until_ms = now + BREAKER_OPEN_MS;
        }
        self.recent.push_back(now);
        while self.recent.front().is_some_and(|t| *t < now - WEEK_MS) {
            self.recent.pop_front();
        }
        self.recent.len() >= BREAKER_FAIL_LIMIT
    }
}

impl Registry {
    fn get(&self, id: &str) -> Option<Target> {
        self.0.read().expect("webhooks lock").get(id).cloned()
    }
    fn put(&self, id: String, t: Target) {
        self.0.write().expect("webhooks lock").insert(id, t);
    }
    fn remove(&self, id: &str) {
        self.0.write().expect("webhooks lock").remove(id);
    }
    /// Replaces every target at once (breakers are kept).
    fn replace(&self, all: HashMap<String, Target>) {
        *self.0.write().expect("webhooks lock") = all;
    }
    /// Whether any webhook is live (a read lock, no allocation).
    pub fn any_live(&self) -> bool {
        !self.0.read().expect("webhooks lock").is_empty()
    }
    /// Ids of the live webhooks, sorted.
    pub fn ids(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .0
            .read()
            .expect("webhooks lock")
            .keys()
            .cloned()
            .collect();
        v.sort();
        v
    }
}

/// Prefix of a [`WebhookRecord`] secret name that is a sealed secret in the store (see
/// [`crate::registration::STORED`]).
pub use crate::registration::STORED;

/// Retry policy of webhook deliveries. Durable (reference v2 host defaults): 5 attempts, 500 ms
/// doubling. Best-effort (`webhooks.durable` off): one attempt, no retry.
pub fn policy(durable: bool) -> RetryPolicy {
    if durable {
        retry_policy()
    } else {
        RetryPolicy {
            max_attempts: 1,
            backoff: Backoff::None,
            initial_ms: 0,
            max_ms: 0,
            jitter: 0.0,
            schedule_ms: None,
        }
    }
}

/// Retry policy of durable webhook deliveries (reference v2 host defaults): 5 attempts, 500 ms doubling.
pub fn retry_policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 5,
        backoff: Backoff::Exponential,
        initial_ms: 500,
        max_ms: 60_000,
        jitter: 0.2,
        schedule_ms: None,
    }
}

// `secretFingerprint`: the host-keyed, truncated HMAC used for trigger subscriptions too
// ([`SecretStore::fingerprint`]); webhooks.md's unsalted "first 8 hex of SHA-256" is not used, because the
// webhook's subscription row must not show an unsalted digest (spec notes §16.5).

/// What a registration created; `secret` is shown once.
#[derive(Debug, Clone)]
pub struct Created {
    pub webhook_id: String,
    pub secret: String,
    pub fingerprint: String,
}

/// Registers a webhook after the SSRF check. With `standard_secret` (a `whsec_` value; RFC 0201
/// `standard-webhooks-1` opt-in) the endpoint must first echo a verification challenge.
/// Errors: `validation_error` with text `webhook_url_rejected: ...` (refused URL) or
/// `webhook_endpoint_unverified: ...` (no echo), `unavailable` for store or secret-file failures.
pub async fn register(
    engine: &Engine,
    secrets: &SecretStore,
    url: &str,
    events: Vec<String>,
    tenant_id: String,
    allow_private: bool,
    standard_secret: Option<String>,
) -> Result<Created, TbError> {
    let (host, addrs) = ssrf::check(url, allow_private).await.map_err(|r| {
        TbError::new(
            ErrorCode::ValidationError,
            format!("webhook_url_rejected: {}", r.0),
        )
    })?;
    let standard_key = match &standard_secret {
        Some(s) => {
            let key = tb_ingress::parse_whsec(s)
                .map_err(|e| TbError::new(ErrorCode::ValidationError, format!("secret: {e}")))?;
            verify_endpoint(url, &host, addrs[0]).await?;
            Some(key)
        }
        None => None,
    };
    let id = format!("wh_{}", &new_id(tb_core::ids::IdKind::Event)[4..]);
    let secret = format!("whk_{}", hex::encode(rand::random::<[u8; 32]>()));
    // Sealed in the store (so every replica can sign this webhook's deliveries), never in a file.
    let sealing = secrets.sealing_key()?;
    let mut sealed = vec![(
        format!("webhook:{id}"),
        sealing.seal(&format!("webhook:{id}"), secret.as_bytes()),
    )];
    if let Some(s) = &standard_secret {
        let sid = format!("webhook:{id}:whsec");
        sealed.push((sid.clone(), sealing.seal(&sid, s.as_bytes())));
    }
    let secret_file = format!("{STORED}{}", sealed[0].0);
    let standard_secret_file = sealed.get(1).map(|(sid, _)| format!("{STORED}{sid}"));
    let now = clock::now_ms();
    let def = SubscriptionDef {
        id: id.clone(),
        source: Source::Webhook,
        connector: "openwop-webhook".into(),
        config: serde_json::json!({"retryPolicy": retry_policy(), "dedupEnabled": true,
            "secretFingerprint": secrets.fingerprint(secret.as_bytes()), "outbound": true}),
        failure_threshold: 4,
    };
    let rec = WebhookRecord {
        id: id.clone(),
        url: url.into(),
        events,
        tenant_id: tenant_id.clone(),
        secret_file,
        standard_secret_file,
        created_at: now,
    };
    engine
        .store
        .create_webhook_sealed(rec, def, sealed)
        .await
        .map_err(store_err)?;
    let target = Target {
        url: url.into(),
        secret: secret.clone(),
        tenant_id,
        standard_key,
    };
    engine.webhooks.put(id.clone(), target);
    tracing::info!(webhook = %id, "outbound webhook registered");
    Ok(Created {
        webhook_id: id,
        fingerprint: secrets.fingerprint(secret.as_bytes()),
        secret,
    })
}

/// RFC 0201 endpoint verification: POST `{type: "openwop.webhook.verification", challenge}` (10 s, to the
/// checked address, no redirects); the receiver must answer 2xx echoing the challenge (as the body, or
/// as `{"challenge": ...}`). Errors: `validation_error` `webhook_endpoint_unverified: ...`.
async fn verify_endpoint(url: &str, host: &str, addr: std::net::SocketAddr) -> Result<(), TbError> {
    let unverified = |why: &str| {
        TbError::new(
            ErrorCode::ValidationError,
            format!("webhook_endpoint_unverified: {why}"),
        )
    };
    let challenge = hex::encode(rand::random::<[u8; 16]>());
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        // The pinned address, never a proxy from the environment.
        .no_proxy()
        .resolve(host, addr)
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|_| unverified("client"))?;
    let r = client
        .post(url)
        .json(&serde_json::json!({"type": "openwop.webhook.verification", "challenge": challenge}))
        .send()
        .await
        .map_err(|_| unverified("the endpoint did not answer"))?;
    if !r.status().is_success() {
        return Err(unverified("the endpoint did not answer 2xx"));
    }
    let text = r.text().await.unwrap_or_default();
    let echoed = text.trim() == challenge
        || serde_json::from_str::<serde_json::Value>(&text)
            .is_ok_and(|v| v["challenge"] == challenge.as_str());
    if echoed {
        Ok(())
    } else {
        Err(unverified("the endpoint did not echo the challenge"))
    }
}

/// Deletes a webhook of `tenant`. Errors: `not_found`.
pub async fn delete(engine: &Engine, id: &str, tenant: &str) -> Result<(), TbError> {
    engine
        .store
        .delete_webhook(id, tenant)
        .await
        .map_err(store_err)?;
    engine.webhooks.remove(id);
    Ok(())
}

/// Loads the live webhooks and their secrets, replacing the registry (on start, and after a `webhook`
/// change from any replica): a deleted webhook leaves it, a new one joins. A webhook whose secret
/// cannot be read is logged and skipped. Returns how many loaded. Errors: the store's (the registry
/// is then left as it was).
pub async fn load(engine: &Engine, secrets: &SecretStore) -> Result<usize, TbError> {
    let mut all = HashMap::new();
    for w in engine.store.list_webhooks().await.map_err(store_err)? {
        let secret = read_secret(engine, secrets, &w.secret_file)
            .await
            .and_then(|b| {
                String::from_utf8(b).map_err(|_| {
                    TbError::new(
                        ErrorCode::Internal,
                        format!("webhook {}: secret is not text", w.id),
                    )
                })
            });
        let standard_key = match w.standard_secret_file.as_deref() {
            None => Ok(None),
            Some(f) => read_secret(engine, secrets, f).await.and_then(|b| {
                tb_ingress::parse_whsec(String::from_utf8_lossy(&b).trim())
                    .map(Some)
                    .map_err(|e| TbError::new(ErrorCode::Internal, e.to_string()))
            }),
        };
        match (secret, standard_key) {
            (Ok(secret), Ok(standard_key)) => {
                let t = Target {
                    url: w.url,
                    secret: secret.trim().to_string(),
                    tenant_id: w.tenant_id,
                    standard_key,
                };
                all.insert(w.id.clone(), t);
            }
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(webhook = %w.id, error = %e.message, "webhook not loaded: its secret cannot be read")
            }
        }
    }
    let n = all.len();
    engine.webhooks.replace(all);
    Ok(n)
}

/// A webhook secret by its stored name (see [`SecretStore::open_named`]).
async fn read_secret(
    engine: &Engine,
    secrets: &SecretStore,
    name: &str,
) -> Result<Vec<u8>, TbError> {
    secrets.open_named(engine.store.as_ref(), name).await
}

/// The v1 signature of a body sent at `ts` (Unix s): lowercase hex HMAC-SHA256 over `"{ts}.{body}"`.
pub fn sign_v1(secret: &str, ts: i64, body: &[u8]) -> String {
    let mut m = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("any key length");
    m.update(ts.to_string().as_bytes());
    m.update(b".");
    m.update(body);
    hex::encode(m.finalize().into_bytes())
}

fn failed(class: impl Into<String>, permanent: bool) -> ActionResult {
    ActionResult::Failed {
        error_class: class.into(),
        retry_after_ms: None,
        permanent,
    }
}

/// Performs one webhook delivery: the run event (its id is in the delivery's receipt column), signed
/// and POSTed to the re-resolved, checked and pinned address, no redirects, 5 s timeout. 2xx is success.
pub async fn deliver(engine: &Engine, d: &DeliveryRecord) -> Result<(), ActionResult> {
    let Some(t) = engine.webhooks.get(&d.subscription_id) else {
        return Err(failed("webhook_deleted", true));
    };
    let durable = engine
        .webhooks_durable
        .load(std::sync::atomic::Ordering::Relaxed);
    if !durable {
        // Best-effort: the breaker decides whether this event is attempted at all.
        let now = clock::now_ms();
        let allowed = engine
            .webhooks
            .1
            .lock()
            .expect("breaker lock")
            .entry(d.subscription_id.clone())
            .or_default()
            .allows(now);
        if !allowed {
            return Err(failed("breaker_open", true));
        }
        let r = send(engine, d, &t).await;
        let limit = engine
            .webhooks
            .1
            .lock()
            .expect("breaker lock")
            .entry(d.subscription_id.clone())
            .or_default()
            .record(r.is_ok(), now);
        if limit {
            // The webhook breaker already judged (4 failures): trip the subscription at once.
            let input = tb_core::subscription::SubscriptionInput::AttemptFailed {
                streak: tb_core::subscription::FailureStreak {
                    last_success_at: None,
                    failures_since: u32::MAX,
                    first_failure_at: now,
                    now,
                },
                threshold: 1,
                policy: tb_core::subscription::FailurePolicy {
                    failure_window_ms: 0,
                    ..Default::default()
                },
            };
            if let Err(e) = engine
                .store
                .apply_subscription_input(&d.subscription_id, input, now)
                .await
            {
                tracing::warn!(webhook = %d.subscription_id, error = %e, "marking the webhook failed");
            }
        }
        return r;
    }
    send(engine, d, &t).await
}

/// One signed POST of the delivery's event to the webhook.
async fn send(engine: &Engine, d: &DeliveryRecord, t: &Target) -> Result<(), ActionResult> {
    let event = engine
        .store
        .get_run_event(d.run_id.as_deref().unwrap_or_default(), &d.receipt_id)
        .await
        .map_err(|_| failed("event_missing", true))?;
    let body = serde_json::json!({"runId": event.run_id, "workspaceId": t.tenant_id, "event": crate::wire_event::run_event_doc(&event)}).to_string();
    let (host, addrs) = ssrf::check(
        &t.url,
        engine
            .webhook_allow_private
            .load(std::sync::atomic::Ordering::Relaxed),
    )
    .await
    .map_err(|_| failed("url_rejected", false))?;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        // The pinned address, never a proxy from the environment.
        .no_proxy()
        .resolve(&host, addrs[0])
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|_| failed("client", false))?;
    let ts = clock::now_s();
    let sig = format!("sha256={}", sign_v1(&t.secret, ts, body.as_bytes()));
    let mut req = client
        .post(&t.url)
        .header("content-type", "application/json")
        .header(
            "user-agent",
            concat!("openwop-webhook-dispatcher/", env!("CARGO_PKG_VERSION")),
        );
    for (v1, v2, value) in [
        (
            "x-openwop-webhook-id",
            "openwop-webhook-id",
            d.subscription_id.clone(),
        ),
        (
            "x-openwop-event-type",
            "openwop-event-type",
            event.event_type.clone(),
        ),
        ("x-openwop-timestamp", "openwop-timestamp", ts.to_string()),
        ("x-openwop-signature", "openwop-signature", sig.clone()),
        (
            "x-openwop-signature-algorithm",
            "openwop-signature-algorithm",
            "v1".to_string(),
        ),
    ] {
        req = req.header(v1, value.clone()).header(v2, value);
    }
    if let Some(key) = &t.standard_key {
        // RFC 0201: Standard Webhooks headers too; the delivery id is the stable webhook-id.
        let sw = tb_ingress::standard_webhooks::sign(key, &d.id, ts, body.as_bytes());
        req = req
            .header("webhook-id", &d.id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", sw);
    }
    match req.body(body).send().await {
        Ok(r) if r.status().is_success() => Ok(()),
        Ok(r) => Err(failed(format!("http_{}", r.status().as_u16()), false)),
        Err(e) if e.is_timeout() => Err(failed("timeout", false)),
        Err(_) => Err(failed("connect", false)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaker_opens_after_four_failures_probes_after_an_hour_and_counts_the_week() {
        let mut b = Breaker::default();
        for i in 0..3 {
            assert!(!b.record(false, i));
            assert!(b.allows(i + 1), "closed until the 4th failure");
        }
        assert!(!b.record(false, 10));
        assert!(
            !b.allows(11) && !b.allows(10 + BREAKER_OPEN_MS - 1),
            "open for 1 h"
        );
        assert!(b.allows(10 + BREAKER_OPEN_MS), "half-open probe after 1 h");
        assert!(!b.record(true, 10 + BREAKER_OPEN_MS));
        assert!(
            b.allows(10 + BREAKER_OPEN_MS + 1),
            "a successful probe closes it"
        );
        let mut w = Breaker::default();
        let limit = (0..BREAKER_FAIL_LIMIT as i64)
            .map(|i| w.record(false, i * 1000))
            .last()
            .unwrap();
        assert!(limit, "100 failures within 7 days");
        let mut old = Breaker::default();
        for i in 0..99 {
            old.record(false, i);
        }
        assert!(
            !old.record(false, 8 * 86_400_000),
            "older failures leave the window"
        );
    }
}
