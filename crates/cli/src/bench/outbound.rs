//! Outbound: drives ingest into a subscription whose binding starts an `http` run, and runs the local
//! receiver those runs are POSTed to, answering 500 for `--fail-rate` of requests. Reports how fast
//! runs are delivered and the time from each request to its successful delivery at the receiver.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use rand::Rng;

use super::load;
use super::report::{histogram, latency_line};
use super::LoadOpts;

#[derive(Default)]
struct Receiver {
    ok: AtomicU64,
    failed: AtomicU64,
    /// runId -> first successful receive time (Unix µs).
    delivered: Mutex<HashMap<String, u64>>,
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Runs the outbound benchmark.
pub async fn run(o: &LoadOpts, port: u16, fail_rate: f64) -> Result<()> {
    let rx = Arc::new(Receiver::default());
    let r2 = rx.clone();
    let app = axum::Router::new().route(
        "/run",
        axum::routing::post(move |body: axum::body::Bytes| {
            let rx = r2.clone();
            async move {
                if rand::rng().random::<f64>() < fail_rate {
                    rx.failed.fetch_add(1, Ordering::Relaxed);
                    return axum::http::StatusCode::INTERNAL_SERVER_ERROR;
                }
                rx.ok.fetch_add(1, Ordering::Relaxed);
                if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) {
                    if let Some(id) = v["runId"].as_str() {
                        rx.delivered
                            .lock()
                            .expect("lock")
                            .entry(id.to_string())
                            .or_insert_with(unix_us);
                    }
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .with_context(|| format!("receiver cannot listen on 127.0.0.1:{port}"))?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    eprintln!("receiver on http://127.0.0.1:{port}/run (fail rate {fail_rate})");

    let start = Instant::now();
    let r = load::drive(o, "outbound").await?;
    println!(
        "{}",
        super::report::summary("outbound ingest", &r, o.baseline)
    );
    // Wait for every accepted run to reach the receiver (retries included), at most 120 s.
    let want = r.runs.len();
    let wait_start = Instant::now();
    while rx.delivered.lock().expect("lock").len() < want
        && wait_start.elapsed() < Duration::from_secs(120)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let delivered = rx.delivered.lock().expect("lock").clone();
    // Rate over the time until the last delivery (not until the wait gave up).
    let last_us = delivered.values().copied().max().unwrap_or(0);
    let start_us = unix_us().saturating_sub(start.elapsed().as_micros() as u64);
    let elapsed = (last_us.saturating_sub(start_us) as f64 / 1e6).max(0.001);
    let mut hist = histogram();
    for (run, sent) in &r.runs {
        if let Some(at) = delivered.get(run) {
            let _ = hist.record(at.saturating_sub(*sent).max(1));
        }
    }
    eprintln!("{}", latency_line("request->delivered at receiver", &hist));
    if delivered.len() < want {
        eprintln!("{} runs were not delivered within 120 s (dead-lettered? see `trigger-bridge deliveries list --state dead-lettered`)", want - delivered.len());
    }
    println!(
        "outbound: {:.0} deliveries/s, {} of {} runs delivered, {} receiver 500s, p50 {:.2} ms, p99 {:.2} ms (request->delivered)",
        delivered.len() as f64 / elapsed,
        delivered.len(),
        want,
        rx.failed.load(Ordering::Relaxed),
        hist.value_at_quantile(0.5) as f64 / 1000.0,
        hist.value_at_quantile(0.99) as f64 / 1000.0,
    );
    Ok(())
}
