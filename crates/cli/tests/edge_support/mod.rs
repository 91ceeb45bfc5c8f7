//! The real binary for the edge tests (`edge.rs`, `flood.rs`): its config with small timeouts and caps,
//! spawned with an open-files limit, and its resident set.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_trigger-bridge");
pub const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Header timeout 600 ms, body timeout 800 ms (min rate 1 KiB/s), idle 1.5 s, 48 connections, 8
/// bodies, 6 MiB budget, 2 MiB per body. One client may hold every connection: these tests attack
/// from one address and test the server-wide caps (the per-client shares: `fairness.rs`).
pub fn config(dir: &Path, max_connections: usize, body_timeout_ms: u64) -> std::path::PathBuf {
    config_with(dir, max_connections, body_timeout_ms, 600, 1500)
}

pub fn config_with(
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
max_connections_per_client = {max_connections}
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

pub struct Srv {
    pub child: Child,
    pub port: u16,
}

impl Drop for Srv {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Spawns `serve` with the open-files limit set to `nofile` (like `ulimit -n`) and waits until healthy.
pub fn spawn(cfg: &Path, data: &Path, nofile: u64, stderr: Stdio) -> Srv {
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
pub fn vm_rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}
