//! Retention (DESIGN §7): a background task that, every `interval`, deletes raw bodies of settled
//! receipts older than `body_retention`, dead letters older than `dead_letter_retention` (RFC 0232
//! purge), expired idempotency records and settled signal records (with the body retention), in batches through the store's writer. Each pass walks the
//! rows by the store's key cursor ([`SweepCursor`]) to the end, so rows that stay (unsettled receipts,
//! bodies already deleted) never stop it early.

use std::sync::Arc;
use std::time::Duration;

use tb_store::{Store, StoreResult, SweepCounts, SweepCursor};
use tokio::sync::watch;

use crate::{clock, Engine};

/// Rows examined per kind per transaction by the server's sweeper and by `trigger-bridge sweep`.
pub const BATCH: u32 = 1_000;

/// Retention settings.
#[derive(Debug, Clone)]
pub struct SweeperConfig {
    pub interval: Duration,
    /// How long raw bodies are kept after their receipt settled.
    pub body_retention: Duration,
    /// How long dead letters stay readable.
    pub dead_letter_retention: Duration,
    /// Rows examined per kind per transaction (the server uses 1 000).
    pub batch: u32,
}

impl SweeperConfig {
    /// Retentions given in whole days (as configured), a pass every `interval`, [`BATCH`] rows per step.
    pub fn in_days(body_days: u32, dead_letter_days: u32, interval: Duration) -> SweeperConfig {
        const DAY: Duration = Duration::from_secs(86_400);
        SweeperConfig {
            interval,
            body_retention: DAY * body_days,
            dead_letter_retention: DAY * dead_letter_days,
            batch: BATCH,
        }
    }
}

/// One full retention pass at `now` (ms): batch after batch (at most `cfg.batch` rows per kind each, one
/// transaction each), following the store's cursor until every body, dead letter, expired idempotency
/// record and settled signal record was examined, and returns the totals. The walk ends because the cursor only moves forward.
/// Errors: the store's (the pass stops; the next one starts over from the beginning).
pub async fn sweep_once(
    store: &dyn Store,
    now: i64,
    cfg: &SweeperConfig,
) -> StoreResult<SweepCounts> {
    let mut total = SweepCounts::default();
    let mut cursor = SweepCursor::default();
    loop {
        let page = store
            .sweep(
                now,
                now - cfg.body_retention.as_millis() as i64,
                now - cfg.dead_letter_retention.as_millis() as i64,
                cfg.batch,
                cursor,
            )
            .await?;
        total.bodies += page.counts.bodies;
        total.dead_letters += page.counts.dead_letters;
        total.idempotency += page.counts.idempotency;
        total.signals += page.counts.signals;
        match page.next {
            Some(next) => cursor = next,
            None => return Ok(total),
        }
    }
}

/// Runs until `shutdown` becomes true.
pub async fn run(engine: Arc<Engine>, cfg: SweeperConfig, mut shutdown: watch::Receiver<bool>) {
    loop {
        match sweep_once(&*engine.store, clock::now_ms(), &cfg).await {
            Ok(c) => {
                if c.bodies + c.dead_letters + c.idempotency + c.signals > 0 {
                    tracing::info!(
                        bodies = c.bodies,
                        dead_letters = c.dead_letters,
                        idempotency = c.idempotency,
                        signals = c.signals,
                        "retention sweep"
                    );
                }
                metrics::counter!("tb_swept_total", "kind" => "bodies").increment(c.bodies);
                metrics::counter!("tb_swept_total", "kind" => "dead_letters")
                    .increment(c.dead_letters);
                metrics::counter!("tb_swept_total", "kind" => "signals").increment(c.signals);
            }
            Err(e) => tracing::warn!(error = %e, "retention sweep failed"),
        }
        let dropped =
            crate::registration::drop_ended_previous_secrets(&engine, clock::now_ms()).await;
        if dropped > 0 {
            tracing::info!(
                secrets = dropped,
                "previous secrets of ended rotations removed"
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(cfg.interval) => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
    }
}
