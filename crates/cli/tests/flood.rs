//! A flood of forged requests against the real binary (issue #14), in a test binary of its own so
//! its load does not meet the timing-sensitive edge tests of `edge.rs`.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_trigger-bridge");
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Header timeout 600 ms, body timeout 800 ms (min rate 1 KiB/s), idle 1.5 s, 48 connections, 8
/// bodies, 6 MiB budget, 2 MiB per body.
fn config(dir: &Path, max_connections: usize, body_timeout_ms: u64) -> std::path::PathBuf {
    config_with(dir, max_connections, body_timeout_ms, 600, 1500)
}

fn config_with(
    dir: &Path,
    max_connections: usize,
    body_timeout_ms: u64,
    header_timeout_ms: u64,
    idle_timeout_ms: u64,
) -> std::path::PathBuf {
    let p = dir.join("edge.toml");
    std::fs::write(
        &p,
        format!(
            r#"
[server]
header_timeout_ms = {header_timeout_ms}
body_timeout_ms = {body_timeout_ms}
body_min_rate_bytes_per_s = 1024
idle_timeout_ms = {idle_timeout_ms}
max_connections = {max_connections}
max_inflight_bodies = 8
body_budget_bytes = 6291456

[[subscriptions]]
id = "sw"
connector = "standard-webhooks"
secret = "env:STANDARD_WEBHOOK_SECRET"
max_body_bytes = 2097152

[[workflows]]
id = "noop"
executor = "noop"

[[bindings]]
id = "sw-all"
subscription = "sw"
event_types = ["*"]
action = "start_run"
workflow = "noop"
"#
        ),
    )
    .unwrap();
    p
}

struct Srv {
    child: Child,
    port: u16,
}

impl Drop for Srv {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Spawns `serve` with the open-files limit set to `nofile` (like `ulimit -n`) and waits until healthy.
fn spawn(cfg: &Path, data: &Path, nofile: u64, stderr: Stdio) -> Srv {
    use std::os::unix::process::CommandExt;
    let port = free_port();
    let mut cmd = Command::new(BIN);
    cmd.args(["serve", "--config"])
        .arg(cfg)
        .args(["--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(data)
        .env("STANDARD_WEBHOOK_SECRET", SECRET)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(stderr);
    // SAFETY: only setrlimit between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let r = libc::rlimit {
                rlim_cur: nofile,
                rlim_max: nofile,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().expect("spawn server");
    let s = Srv { child, port };
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(10) {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return s;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("server did not listen on {port}");
}

/// The server's resident set in KiB (/proc/<pid>/status VmRSS).
fn vm_rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Issue #14: a flood of forged requests from 12 000 client addresses (behind a trusted proxy) costs
/// bounded memory and a bounded number of rows: every one is answered 401, none is stored, each is
/// counted, and the counts are one row per minute and outcome, not one per request or address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_forged_requests_from_many_addresses_keeps_memory_and_writes_bounded() {
    const N: usize = 12_000;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 64, 800);
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(
        "\n[rate_limits]\nsource_per_min = 1000000\ntrusted_proxies = [\"127.0.0.1/32\"]\n",
    );
    std::fs::write(&cfg, text).unwrap();
    let srv = spawn(&cfg, &dir.path().join("data"), 1024, Stdio::null());
    let port = srv.port;
    let http = reqwest::Client::new();
    let forged = |i: usize| {
        let http = http.clone();
        async move {
            let ts = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs();
            let r = http
                .post(format!(
                    "http://127.0.0.1:{port}/v1/trigger-subscriptions/sw/ingest"
                ))
                .header("content-type", "application/json")
                .header("webhook-id", format!("msg_flood_{i:010}"))
                .header("webhook-timestamp", ts.to_string())
                .header(
                    "webhook-signature",
                    "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
                )
                .header(
                    "x-forwarded-for",
                    format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255),
                )
                .body(r#"{"type":"edge.test","data":{}}"#)
                .send()
                .await
                .unwrap();
            r.status().as_u16()
        }
    };
    // Warm up (connection pool, allocator), then measure.
    for i in 0..200 {
        assert_eq!(forged(i).await, 401);
    }
    let rss0 = vm_rss_kib(srv.child.id());
    let mut statuses = std::collections::BTreeMap::new();
    for chunk in (200..N).collect::<Vec<_>>().chunks(32) {
        let answers = futures_util::future::join_all(chunk.iter().map(|&i| forged(i))).await;
        for s in answers {
            *statuses.entry(s).or_insert(0usize) += 1;
        }
    }
    let rss = vm_rss_kib(srv.child.id());
    assert_eq!(
        statuses,
        [(401, N - 200)].into_iter().collect(),
        "every forged request is 401"
    );
    assert!(
        rss < rss0 + 24 * 1024,
        "VmRSS {rss0} -> {rss} KiB over {N} forged requests"
    );
    // Nothing stored, everything counted, in a handful of rows (the flush runs once a second).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let get = |path: String| {
        let http = http.clone();
        async move {
            http.get(format!("http://127.0.0.1:{port}{path}"))
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    };
    let receipts = get("/v1/receipts".into()).await;
    assert_eq!(
        receipts["receipts"].as_array().unwrap().len(),
        0,
        "{receipts}"
    );
    let counts = get("/v1/trigger-subscriptions/sw/ingress-counts?minutes=10".into()).await;
    let rows = counts["counts"].as_array().unwrap();
    let refused: u64 = rows
        .iter()
        .filter(|r| r["outcome"] == "signature_invalid")
        .map(|r| r["n"].as_u64().unwrap())
        .sum();
    assert_eq!(refused, N as u64, "{counts}");
    assert!(rows.len() <= 3, "one row per minute and outcome: {counts}");
    eprintln!(
        "flood: {N} forged requests from {N} addresses, VmRSS {rss0} -> {rss} KiB, {} count rows",
        rows.len()
    );
}
