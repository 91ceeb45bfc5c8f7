//! Retention (DESIGN §7): a background task that, every `interval`, deletes raw bodies of settled
//! receipts older than `body_retention`, dead letters older than `dead_letter_retention` (RFC 0232
//! purge), expired idempotency records and settled signal records (with the body retention), in batches through the store's writer.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::{clock, Engine};

/// Retention settings.
#[derive(Debug, Clone)]
pub struct SweeperConfig {
    pub interval: Duration,
    /// How long raw bodies are kept after their receipt settled.
    pub body_retention: Duration,
    /// How long dead letters stay readable.
    pub dead_letter_retention: Duration,
    /// Rows per kind per transaction.
    pub batch: u32,
}

/// Runs until `shutdown` becomes true.
pub async fn run(engine: Arc<Engine>, cfg: SweeperConfig, mut shutdown: watch::Receiver<bool>) {
    loop {
        let now = clock::now_ms();
        loop {
            let r = engine
                .store
                .sweep(
                    now,
                    now - cfg.body_retention.as_millis() as i64,
                    now - cfg.dead_letter_retention.as_millis() as i64,
                    cfg.batch,
                )
                .await;
            match r {
                Ok(c) if c.bodies + c.dead_letters + c.idempotency + c.signals > 0 => {
                    tracing::info!(
                        bodies = c.bodies,
                        dead_letters = c.dead_letters,
                        idempotency = c.idempotency,
                        signals = c.signals,
                        "retention sweep"
                    );
                    metrics::counter!("tb_swept_total", "kind" => "bodies").increment(c.bodies);
                    metrics::counter!("tb_swept_total", "kind" => "dead_letters")
                        .increment(c.dead_letters);
                    metrics::counter!("tb_swept_total", "kind" => "signals").increment(c.signals);
                    // A full batch means more may be due: sweep again at once.
                    if c.bodies < cfg.batch as u64
                        && c.dead_letters < cfg.batch as u64
                        && c.idempotency < cfg.batch as u64
                        && c.signals < cfg.batch as u64
                    {
                        break;
                    }
                }
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "retention sweep failed");
                    break;
                }
            }
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
