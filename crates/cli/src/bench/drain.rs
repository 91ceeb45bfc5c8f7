//! Backlog drain: queue `count` deliveries on a server started without its worker, restart it with the
//! worker, and time the drain; report the server's peak RSS (`VmHWM`).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::load;

fn spawn(
    config: &Path,
    data: &Path,
    database_url: Option<&str>,
    port: u16,
    worker: bool,
) -> Result<Child> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.args(["serve", "--config"])
        .arg(config)
        .args(["--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(data);
    if let Some(url) = database_url {
        cmd.args(["--database-url", url]);
    }
    if !worker {
        cmd.args(["--role", "api"]);
    }
    cmd.env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    Ok(cmd.spawn()?)
}

async fn wait_healthy(http: &reqwest::Client, base: &str) -> Result<()> {
    for _ in 0..400 {
        if http.get(format!("{base}/health")).send().await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    bail!("server did not become healthy on {base}")
}

fn peak_rss_mb(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

async fn open_count(http: &reqwest::Client, base: &str) -> Result<u64> {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    let mut n = 0.0;
    for l in text.lines() {
        if l.starts_with("tb_queue_depth{state=\"pending\"}")
            || l.starts_with("tb_queue_depth{state=\"retrying\"}")
        {
            n += l
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0);
        }
    }
    Ok(n as u64)
}

/// Runs the drain benchmark.
pub async fn run(
    config: &Path,
    count: u64,
    connections: usize,
    data: &Path,
    database_url: Option<&str>,
    port: u16,
    secret: &str,
) -> Result<()> {
    let key = tb_ingress::parse_whsec(secret).map_err(|e| anyhow::anyhow!("--secret: {e}"))?;
    if data.exists() {
        std::fs::remove_dir_all(data).with_context(|| format!("wiping {}", data.display()))?;
    }
    let base = format!("http://127.0.0.1:{port}");
    let http = load::client(connections)?;

    let mut server = spawn(config, data, database_url, port, false)?;
    wait_healthy(&http, &base).await?;
    eprintln!("queueing {count} deliveries with the worker stopped ...");
    let url = load::ingest_url(&base, "standard");
    let body = load::body_of(1024);
    let next = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let (http, url, key, body, next) = (
            http.clone(),
            url.clone(),
            key.clone(),
            body.clone(),
            next.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return Ok::<(), anyhow::Error>(());
                }
                let id = format!("msg_drain_{i:012}");
                let (st, v) = load::post(&http, &url, &key, &id, &body).await?;
                if st != 202 {
                    bail!("queueing answered {st}: {v}");
                }
                if i % 10_000 == 0 && i > 0 {
                    eprintln!("  queued {i}");
                }
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    eprintln!("queued {count} in {:.1} s", t0.elapsed().as_secs_f64());
    let pending = open_count(&http, &base).await?;
    Command::new("kill")
        .args(["-TERM", &server.id().to_string()])
        .status()?;
    server.wait()?;

    let mut server = spawn(config, data, database_url, port, true)?;
    let pid = server.id();
    let start = Instant::now();
    wait_healthy(&http, &base).await?;
    let mut last = Instant::now();
    loop {
        let open = open_count(&http, &base).await?;
        if last.elapsed() >= Duration::from_secs(1) {
            eprintln!("  {:>5.1}s  {open} open", start.elapsed().as_secs_f64());
            last = Instant::now();
        }
        if open == 0 {
            break;
        }
        if start.elapsed() > Duration::from_secs(600) {
            bail!("drain did not finish in 600 s ({open} still open)");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = start.elapsed().as_secs_f64();
    let rss = peak_rss_mb(pid);
    let runs: Value = http
        .get(format!("{base}/v1/runs?limit=1"))
        .send()
        .await?
        .json()
        .await?;
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    server.wait()?;
    println!(
        "drain: {pending} deliveries in {secs:.2} s = {:.0} deliveries/s, peak RSS {} (last run {})",
        pending as f64 / secs,
        rss.map(|m| format!("{m:.0} MB")).unwrap_or_else(|| "unknown".into()),
        runs["runs"][0]["status"].as_str().unwrap_or("?")
    );
    Ok(())
}
