//! The storage-limit baseline: how many 1 KiB rows per second SQLite commits durably on this disk, with
//! the store's own settings (WAL, `synchronous=FULL`) and its own group-commit writer (one job = one
//! row, batched exactly as ingest commits are).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tb_store::sqlite::writer::Writer;

use super::report::{histogram, latency_line};

/// Runs the baseline for `duration` with `writers` concurrent producers; prints `storage: N rows/s`.
pub async fn run(duration: Duration, writers: usize, row_bytes: usize, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let scratch = tempfile_in(dir)?;
    let path = scratch.join("baseline.db");
    let conn = tb_store::sqlite::open_configured(&path).map_err(|e| anyhow::anyhow!("{e}"))?;
    conn.execute_batch(
        "CREATE TABLE rows (id INTEGER PRIMARY KEY, k TEXT NOT NULL, v BLOB NOT NULL)",
    )?;
    let writer = Arc::new(Writer::start(conn, Default::default()));
    let row = Arc::new(vec![b'x'; row_bytes]);
    let count = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let (writer, row, count) = (writer.clone(), row.clone(), count.clone());
        tasks.push(tokio::spawn(async move {
            let mut hist = histogram();
            let mut n = 0u64;
            while Instant::now() < deadline {
                let (row, key) = (row.clone(), format!("w{w}-{n}"));
                let t = Instant::now();
                writer
                    .write(move |c| {
                        c.exec(
                            "INSERT INTO rows (k, v) VALUES (?1, ?2)",
                            tb_store::p![key, row[..]],
                        )
                        .map(|_| ())
                    })
                    .await
                    .expect("baseline write");
                let _ = hist.record(t.elapsed().as_micros().max(1) as u64);
                n += 1;
                count.fetch_add(1, Ordering::Relaxed);
            }
            hist
        }));
    }
    let progress = {
        let count = count.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            let mut last = 0;
            loop {
                tick.tick().await;
                let n = count.load(Ordering::Relaxed);
                eprintln!(
                    "  storage {:>4.0}s  {n:>9} rows  {:>7} rows/s",
                    start.elapsed().as_secs_f64(),
                    n - last
                );
                last = n;
            }
        })
    };
    let mut hist = histogram();
    for t in tasks {
        hist.add(&t.await?).ok();
    }
    progress.abort();
    let elapsed = start.elapsed().as_secs_f64();
    writer.close().await;
    std::fs::remove_dir_all(&scratch).ok();
    eprintln!("{}", latency_line("storage commit latency", &hist));
    println!(
        "storage: {:.0} rows/s ({} B rows, {writers} writers, fsync on every group commit)",
        count.load(Ordering::Relaxed) as f64 / elapsed,
        row_bytes
    );
    Ok(())
}

fn tempfile_in(dir: &Path) -> Result<std::path::PathBuf> {
    let p = dir.join(format!("bench-storage-{}", std::process::id()));
    std::fs::create_dir_all(&p)?;
    Ok(p)
}
