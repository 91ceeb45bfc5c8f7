//! The load generator: many keep-alive connections posting correctly signed Standard Webhooks requests
//! with unique ids (and a chosen share of duplicates), closed loop or open loop (`--rate`, latency from
//! the scheduled send time, so coordinated omission does not flatter a slow server).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use hdrhistogram::Histogram;
use rand::Rng;
use serde_json::Value;

use super::report::{histogram, LoadResult};
use super::LoadOpts;

#[derive(Default)]
struct Counters {
    answered: AtomicU64,
    errors: AtomicU64,
    /// The first error seen, to say what went wrong.
    first_error: std::sync::Mutex<Option<String>>,
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// A JSON body of exactly `n` bytes (at least the fixed part): `{"type":"bench.event","data":{"pad":"xx.."}}`.
pub fn body_of(n: usize) -> Bytes {
    let head = r#"{"type":"bench.event","data":{"pad":""#;
    let tail = r#""}}"#;
    let pad = n.saturating_sub(head.len() + tail.len());
    Bytes::from(format!("{head}{}{tail}", "x".repeat(pad)))
}

/// Ingest URL of a subscription.
pub fn ingest_url(server: &str, sub: &str) -> String {
    format!(
        "{}/v1/trigger-subscriptions/{sub}/ingest",
        server.trim_end_matches('/')
    )
}

/// Posts one signed request; returns the HTTP status and the parsed answer.
pub async fn post(
    http: &reqwest::Client,
    url: &str,
    key: &[u8],
    id: &str,
    body: &Bytes,
) -> Result<(u16, Value)> {
    let ts = (unix_us() / 1_000_000) as i64;
    let sig = tb_ingress::standard_webhooks::sign(key, id, ts, body);
    let r = http
        .post(url)
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", sig)
        .body(body.clone())
        .send()
        .await?;
    let status = r.status().as_u16();
    let v = r.json::<Value>().await.unwrap_or(Value::Null);
    Ok((status, v))
}

/// A keep-alive client sized for `connections`.
pub fn client(connections: usize) -> Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Ok(k) = std::env::var("TRIGGER_BRIDGE_API_KEY") {
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {k}").parse()?,
        );
    }
    Ok(reqwest::Client::builder()
        .default_headers(headers)
        .pool_max_idle_per_host(connections)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(30))
        .build()?)
}

/// Drives load as `o` says and returns what it measured. Progress goes to stderr once a second.
pub async fn drive(o: &LoadOpts, label: &str) -> Result<LoadResult> {
    let key = tb_ingress::parse_whsec(&o.secret).map_err(|e| anyhow::anyhow!("--secret: {e}"))?;
    if !(0.0..=1.0).contains(&o.duplicates) {
        bail!("--duplicates must be within 0.0..=1.0");
    }
    let servers = o.servers();
    let urls: Vec<String> = servers
        .iter()
        .map(|s| ingest_url(s, &o.subscription))
        .collect();
    let http = client(o.connections)?;
    // Fail fast with a clear message when a server is not there.
    for s in &servers {
        http.get(format!("{s}/health"))
            .send()
            .await
            .with_context(|| format!("cannot reach {s} (is `trigger-bridge serve` running?)"))?;
    }
    let body = body_of(o.body_bytes);
    let prefix: String = rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(10)
        .map(char::from)
        .collect();
    let counters = Arc::new(Counters::default());
    let start = Instant::now();
    let deadline = start + o.duration();
    let interval = o
        .rate
        .map(|r| Duration::from_secs_f64(o.connections as f64 / r.max(0.001)));

    let ticker = {
        let c = counters.clone();
        let label = label.to_string();
        tokio::spawn(async move {
            let mut last = 0;
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                let n = c.answered.load(Ordering::Relaxed);
                eprintln!(
                    "  {label} {:>4.0}s  {n:>9} answered  {:>7} req/s  errors {}",
                    start.elapsed().as_secs_f64(),
                    n - last,
                    c.errors.load(Ordering::Relaxed)
                );
                last = n;
            }
        })
    };

    let mut tasks = Vec::new();
    for w in 0..o.connections {
        let (http, url, key, body, prefix, counters) = (
            http.clone(),
            urls[w % urls.len()].clone(),
            key.clone(),
            body.clone(),
            prefix.clone(),
            counters.clone(),
        );
        let dup_share = o.duplicates;
        tasks.push(tokio::spawn(async move {
            let mut hist = histogram();
            let (mut accepted, mut duplicates) = (0u64, 0u64);
            let mut runs = Vec::new();
            let mut sent_ids: Vec<String> = Vec::new();
            let mut seq: u64 = 0;
            let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::from_os_rng();
            loop {
                let scheduled = match interval {
                    Some(iv) => {
                        let at = start + iv.mul_f64(seq as f64) + iv.mul_f64(w as f64 / 64.0);
                        tokio::time::sleep_until(at.into()).await;
                        at
                    }
                    None => Instant::now(),
                };
                if scheduled >= deadline {
                    break;
                }
                let id = if !sent_ids.is_empty() && rng.random::<f64>() < dup_share {
                    sent_ids[rng.random_range(0..sent_ids.len())].clone()
                } else {
                    let id = format!("msg_{prefix}_{w:04}_{seq:010}");
                    if sent_ids.len() < 4096 {
                        sent_ids.push(id.clone());
                    }
                    id
                };
                seq += 1;
                let sent_us = unix_us();
                match post(&http, &url, &key, &id, &body).await {
                    Ok((202, v)) => {
                        accepted += 1;
                        if let Some(r) = v["runId"].as_str() {
                            runs.push((r.to_string(), sent_us));
                        }
                    }
                    Ok((200, _)) => duplicates += 1,
                    other => {
                        if counters.errors.fetch_add(1, Ordering::Relaxed) == 0 {
                            let what = match other {
                                Ok((st, v)) => format!("HTTP {st} {v}"),
                                Err(e) => format!("{e:#}"),
                            };
                            *counters.first_error.lock().expect("lock") = Some(what);
                        }
                        continue;
                    }
                }
                counters.answered.fetch_add(1, Ordering::Relaxed);
                let _ = hist.record(scheduled.elapsed().as_micros().max(1) as u64);
            }
            (hist, accepted, duplicates, runs)
        }));
    }
    let mut out = LoadResult {
        hist: histogram(),
        answered: 0,
        accepted: 0,
        duplicates: 0,
        errors: 0,
        elapsed: Duration::ZERO,
        runs: Vec::new(),
    };
    for t in tasks {
        let (h, a, d, r) = t.await?;
        out.hist.add(&h).ok();
        out.accepted += a;
        out.duplicates += d;
        out.runs.extend(r);
    }
    out.elapsed = start
        .elapsed()
        .min(o.duration())
        .max(Duration::from_millis(1));
    ticker.abort();
    out.answered = counters.answered.load(Ordering::Relaxed);
    out.errors = counters.errors.load(Ordering::Relaxed);
    if let Some(e) = counters.first_error.lock().expect("lock").take() {
        eprintln!("first error ({} in all): {e}", out.errors);
    }
    Ok(out)
}

/// For up to 2 000 of the runs started, the time from the request's send to the run's `run.started`
/// event (server timestamp, ms resolution). Waits for each run's first event.
pub async fn run_started_latency(o: &LoadOpts, r: &LoadResult) -> Result<Histogram<u64>> {
    let http = client(8)?;
    let mut hist = histogram();
    let step = (r.runs.len() / 2000).max(1);
    for (run_id, sent_us) in r.runs.iter().step_by(step) {
        let url = format!(
            "{}/v1/runs/{run_id}/events/poll?timeout=10&limit=1",
            o.first_server()
        );
        let v: Value = http.get(&url).send().await?.json().await?;
        let Some(ts) = v["events"][0]["timestamp"].as_str() else {
            continue;
        };
        let started_us = chrono::DateTime::parse_from_rfc3339(ts)?.timestamp_micros() as u64;
        let _ = hist.record(started_us.saturating_sub(*sent_us).max(1));
    }
    Ok(hist)
}
