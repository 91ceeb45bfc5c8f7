//! Abuse quarantine (the automatic rule is [`tb_core::quarantine`]): a quarantined
//! subscription refuses every request with 403 `subscription_quarantined` before its body is read.
//!
//! The quarantined set lives in the store (`subscription_quarantines`, with a change row), is cached
//! here, and reaches the other replicas through the configuration sync (at most one poll interval,
//! or at once on PostgreSQL's `LISTEN` hint). Every quarantine and release is audited: an operator's
//! through the API's audit layer, the automatic rule's here with the actor `rule:quarantine`.

use std::collections::HashMap;

use tb_core::quarantine::COUNTED_OUTCOMES;
use tb_core::rate::{self, Scope};
use tb_core::{ErrorCode, TbError};
use tb_store::{IngressCountQuery, QuarantineRecord};

use crate::{clock, store_err, Engine};

/// Longest operator reason (bytes); a longer one is refused.
pub const MAX_REASON_BYTES: usize = 500;

impl Engine {
    /// The quarantine of `subscription`, if it is quarantined (a cache read, no I/O).
    pub fn quarantined(&self, subscription: &str) -> Option<QuarantineRecord> {
        self.quarantines
            .read()
            .expect("quarantine lock")
            .get(subscription)
            .cloned()
    }

    /// Every quarantined subscription, by id (cache).
    pub fn quarantine_list(&self) -> Vec<QuarantineRecord> {
        let mut v: Vec<_> = self
            .quarantines
            .read()
            .expect("quarantine lock")
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| a.subscription_id.cmp(&b.subscription_id));
        v
    }

    /// Re-reads the quarantined set from the store (start, and every `quarantine` change) and sets
    /// the `tb_subscription_quarantined` gauge of every webhook subscription. Errors: the store's.
    pub async fn reload_quarantines(&self) -> Result<(), TbError> {
        let all = self.store.quarantines().await.map_err(store_err)?;
        let map: HashMap<_, _> = all
            .into_iter()
            .map(|q| (q.subscription_id.clone(), q))
            .collect();
        // Per configured subscription 0 or 1; the registered ones (whose ids are the secret part of
        // their ingest URLs) are added up under `api` (`Catalog::public_label`).
        let catalog = self.catalog();
        // `api` is always shown (0 without any), so it falls back to 0 when the last one goes.
        let mut quarantined: HashMap<&str, f64> = [(crate::catalog::REGISTERED_LABEL, 0.0)].into();
        for s in catalog.subscriptions() {
            let label = catalog.public_label(&s.id);
            let on = f64::from(u8::from(map.contains_key(&s.id)));
            *quarantined.entry(label).or_default() += on;
            if s.previous_secret.is_some() {
                // Shown from the start, so "stopped growing" can be told from "never used".
                metrics::counter!("tb_previous_secret_accepted_total", "subscription" => label.to_string())
                    .increment(0);
            }
        }
        for (label, n) in quarantined {
            metrics::gauge!("tb_subscription_quarantined", "subscription" => label.to_string())
                .set(n);
        }
        *self.quarantines.write().expect("quarantine lock") = map;
        Ok(())
    }

    /// Quarantines `subscription` now. `by`: the operator's key name (`None`: the automatic rule).
    /// Returns the record in force (the earlier one when it already was quarantined) and whether this
    /// call made it. Errors: `not_found` (404) no such subscription; `validation_error` (400) an empty
    /// reason, one over [`MAX_REASON_BYTES`] or with control characters; the store's.
    pub async fn quarantine(
        &self,
        subscription: &str,
        reason: &str,
        by: Option<String>,
    ) -> Result<(QuarantineRecord, bool), TbError> {
        if self.catalog().subscription(subscription).is_none() {
            return Err(TbError::new(
                ErrorCode::NotFound,
                "no such trigger subscription",
            ));
        }
        let reason = reason.trim();
        if reason.is_empty() {
            return Err(TbError::new(
                ErrorCode::ValidationError,
                "say why: `reason` must not be empty",
            ));
        }
        if reason.len() > MAX_REASON_BYTES {
            return Err(TbError::new(
                ErrorCode::ValidationError,
                format!(
                    "`reason` is {} bytes; at most {MAX_REASON_BYTES}",
                    reason.len()
                ),
            ));
        }
        if reason.chars().any(char::is_control) {
            return Err(TbError::new(
                ErrorCode::ValidationError,
                "`reason` must be one line of text without control characters",
            ));
        }
        let rec = QuarantineRecord {
            subscription_id: subscription.to_string(),
            since: clock::now_ms(),
            reason: reason.to_string(),
            quarantined_by: by,
        };
        let made = self
            .store
            .quarantine_subscription(rec.clone())
            .await
            .map_err(store_err)?;
        self.reload_quarantines().await?;
        if made {
            metrics::counter!("tb_quarantines_total", "subscription" => self.catalog().public_label(subscription).to_string(), "by" => if rec.quarantined_by.is_some() { "operator" } else { "rule" }).increment(1);
            tracing::warn!(subscription, reason = %rec.reason, "subscription quarantined: every request is refused (403) until an operator releases it");
        }
        let now = self.quarantined(subscription).unwrap_or(rec);
        Ok((now, made))
    }

    /// Releases `subscription`. Returns whether it was quarantined. Errors: `not_found` (404) no such
    /// subscription; the store's.
    pub async fn release(&self, subscription: &str) -> Result<bool, TbError> {
        if self.catalog().subscription(subscription).is_none() {
            return Err(TbError::new(
                ErrorCode::NotFound,
                "no such trigger subscription",
            ));
        }
        let was = self
            .store
            .release_subscription(subscription, clock::now_ms())
            .await
            .map_err(store_err)?;
        self.reload_quarantines().await?;
        if was {
            tracing::info!(subscription, "subscription released from quarantine");
        }
        Ok(was)
    }

    /// Runs the automatic rule of every webhook subscription that has one and is not quarantined: one
    /// read of its last minutes' refusal counts (summed over every replica) each, and a quarantine,
    /// audited as `rule:quarantine`, where [`tb_core::quarantine::QuarantinePolicy::sustained`] says so.
    /// Failures are logged; the next minute tries again.
    pub async fn apply_quarantine_rules(&self, now_ms: i64) {
        let minute = rate::minute_of(now_ms);
        let subs: Vec<_> = self
            .catalog()
            .subscriptions()
            .filter(|s| s.quarantine.enabled())
            .map(|s| (s.id.clone(), s.quarantine))
            .collect();
        for (id, policy) in subs {
            if self.quarantined(&id).is_some() {
                continue;
            }
            let rows = match self
                .store
                .ingress_counts(IngressCountQuery {
                    since_minute: minute - i64::from(policy.minutes.max(1)),
                    scope: Some(Scope::Subscription.as_str().into()),
                    key: Some(id.clone()),
                    limit: 1000,
                })
                .await
            {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(subscription = %id, error = %e, "reading refusal counts for the quarantine rule failed");
                    continue;
                }
            };
            let counts: Vec<(i64, u64)> = rows
                .iter()
                .filter(|r| COUNTED_OUTCOMES.contains(&r.outcome.as_str()))
                .map(|r| (r.minute, r.n))
                .collect();
            if !policy.sustained(&counts, minute) {
                continue;
            }
            let reason = policy.reason();
            match self.quarantine(&id, &reason, None).await {
                Ok((_, true)) => {
                    let entry = tb_core::audit::NewEntry {
                        at: clock::now_ms(),
                        actor: "rule:quarantine".into(),
                        action: "subscription.quarantine".into(),
                        target: id.clone(),
                        outcome: "ok".into(),
                        detail: serde_json::json!({"rule": {"refusalsPerMin": policy.refusals_per_min, "minutes": policy.minutes}}).to_string(),
                    };
                    if let Err(e) = self.append_audit(entry).await {
                        tracing::error!(subscription = %id, error = %e, "auditing an automatic quarantine failed");
                    }
                }
                Ok((_, false)) => {}
                Err(e) => {
                    tracing::warn!(subscription = %id, error = %e, "quarantining failed")
                }
            }
        }
    }
}
