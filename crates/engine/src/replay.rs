//! Bulk dead-letter replay of one subscription: select by filter (store), confirm (core rule
//! `tb_core::replay::decide`), then replay each selected delivery exactly like the single replay
//! (`Store::replay_delivery`: one transaction per delivery, so a concurrent or repeated replay of the
//! same delivery is refused and reported as skipped, never replayed twice).

use tb_core::replay::{self, ReplayFilter, ReplayMode};
use tb_core::TbError;
use tb_store::{DeadLetterSelect, StoreError};

use crate::{clock, store_err, Engine};

const DAY_MS: i64 = 86_400_000;

/// One bulk replay request: `dry_run` defaults to true (preview); a replay needs `expect` = the
/// previewed count. `limit` is the batch (1 to `tb_core::replay::MAX_BATCH`, default the cap).
#[derive(Debug, Clone, Default)]
pub struct BulkReplay {
    pub subscription_id: String,
    pub filter: ReplayFilter,
    pub dry_run: Option<bool>,
    pub expect: Option<u64>,
    pub limit: Option<u64>,
    /// Dead letters older than this many days are not selected (the list's retention).
    pub retention_days: u32,
}

/// A selected delivery that was not replayed, and why (`not_dead_lettered`, or the store's error code).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub delivery_id: String,
    pub reason: String,
}

/// The answer of a bulk replay call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BulkOutcome {
    /// `count` dead letters match; `sample` = the first ids (oldest first, at most
    /// `tb_core::replay::SAMPLE_SIZE`); `more` = more match than one call replays.
    Preview {
        count: u64,
        sample: Vec<String>,
        more: bool,
    },
    /// `replayed` delivery ids (each got one more attempt), `skipped`, and `remaining` = matching dead
    /// letters left after this batch (the `expect` of the next call; `more` = `remaining > 0`).
    Replayed {
        replayed: Vec<String>,
        skipped: Vec<Skipped>,
        remaining: u64,
    },
}

/// Runs one call. Errors: 400 `validation_error` (filter, limit, missing `expect`), 404 `not_found`
/// (unknown subscription), 409 `replay_count_changed` (nothing replayed), store errors.
pub async fn replay_dead_letters(engine: &Engine, req: BulkReplay) -> Result<BulkOutcome, TbError> {
    req.filter.validate()?;
    let limit = replay::batch_limit(req.limit)?;
    engine
        .store
        .get_subscription(&req.subscription_id)
        .await
        .map_err(store_err)?;
    let now = clock::now_ms();
    let preview = req.dry_run.unwrap_or(true);
    let sel = engine
        .store
        .dead_letter_selection(DeadLetterSelect {
            subscription_id: req.subscription_id.clone(),
            from: req.filter.from_ms,
            to: req.filter.to_ms,
            error_class: req.filter.error_class.clone(),
            not_before: now - req.retention_days as i64 * DAY_MS,
            limit: if preview {
                replay::SAMPLE_SIZE.min(limit)
            } else {
                limit
            },
        })
        .await
        .map_err(store_err)?;
    match replay::decide(req.dry_run, req.expect, sel.count)? {
        ReplayMode::Preview => Ok(BulkOutcome::Preview {
            count: sel.count,
            sample: sel.delivery_ids,
            more: sel.count > limit as u64,
        }),
        ReplayMode::Replay => {
            let mut replayed = Vec::new();
            let mut skipped = Vec::new();
            for id in &sel.delivery_ids {
                match engine.store.replay_delivery(id, clock::now_ms()).await {
                    Ok(_) => replayed.push(id.clone()),
                    Err(StoreError::Conflict(_)) | Err(StoreError::NotFound { .. }) => skipped
                        .push(Skipped {
                            delivery_id: id.clone(),
                            reason: replay::SKIP_NOT_DEAD_LETTERED.into(),
                        }),
                    Err(e) => {
                        // Deliveries replayed so far stay replayed (each is its own transaction);
                        // wake the worker for them before answering with the error.
                        if !replayed.is_empty() {
                            engine.work_ready.notify_one();
                        }
                        return Err(store_err(e));
                    }
                }
            }
            if !replayed.is_empty() {
                engine.work_ready.notify_one();
            }
            metrics::counter!("tb_dead_letter_replays_total", "mode" => "bulk")
                .increment(replayed.len() as u64);
            tracing::info!(
                subscription = %req.subscription_id,
                replayed = replayed.len(),
                skipped = skipped.len(),
                "dead letters replayed in bulk by operator"
            );
            let remaining = sel.count - sel.delivery_ids.len() as u64;
            Ok(BulkOutcome::Replayed {
                replayed,
                skipped,
                remaining,
            })
        }
    }
}
