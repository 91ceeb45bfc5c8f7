//! The HTTP edge under attack: slow-header clients, never-ending bodies, descriptor
//! exhaustion and shutdown with a stuck body, each against the real binary with small configured
//! timeouts and caps. Every case asserts that `/health` and ingest keep answering and that the server's
//! VmRSS stays bounded.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod edge_support;
use edge_support::*;

/// GET /health: the status and its Retry-After, or `None` when no answer came within 2 s.
async fn health(http: &reqwest::Client, port: u16) -> Option<(u16, Option<String>)> {
    let r = http
        .get(format!("http://127.0.0.1:{port}/health"))
        .timeout(Duration::from_secs(2))
        .send()
        .await
        .map_err(|e| eprintln!("GET /health: {e:?}"))
        .ok()?;
    let ra = r
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    Some((r.status().as_u16(), ra))
}

/// A signed Standard Webhooks ingest; its status.
async fn ingest(http: &reqwest::Client, port: u16, id: &str) -> u16 {
    let body = br#"{"type":"edge.test","data":{}}"#;
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let key = tb_ingress::parse_whsec(SECRET).unwrap();
    let sig = tb_ingress::standard_webhooks::sign(&key, id, ts, body);
    http.post(format!(
        "http://127.0.0.1:{port}/v1/trigger-subscriptions/sw/ingest"
    ))
    .header("content-type", "application/json")
    .header("webhook-id", id)
    .header("webhook-timestamp", ts.to_string())
    .header("webhook-signature", sig)
    .body(body.to_vec())
    .timeout(Duration::from_secs(3))
    .send()
    .await
    .map(|r| r.status().as_u16())
    .unwrap_or(0)
}

/// How a connection ended, seen from the client.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum End {
    /// An HTTP answer with this status; `true` when it carried `Retry-After`.
    Answer(u16, bool),
    /// Closed (EOF or reset) without an answer.
    Closed,
    /// Still open at the deadline.
    Open,
}

/// Reads what the server sends on `s` until it closes or `deadline`.
async fn outcome(mut s: TcpStream, deadline: Instant) -> End {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Err(_) => return End::Open,
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
    match text
        .strip_prefix("http/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
    {
        Some(code) => End::Answer(code, text.contains("\r\nretry-after: ")),
        None => End::Closed,
    }
}

/// Probes /health every 100 ms for `for_`; every probe must be answered (200, or 503 with
/// Retry-After) within 2 s. Returns the statuses with their offsets.
async fn probe_health(port: u16, for_: Duration) -> Vec<(Duration, u16)> {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let t0 = Instant::now();
    let mut seen = Vec::new();
    while t0.elapsed() < for_ {
        let at = t0.elapsed();
        let (code, ra) = health(&http, port)
            .await
            .unwrap_or_else(|| panic!("/health did not answer within 2 s at {at:?}"));
        assert!(
            code == 200 || (code == 503 && ra.as_deref() == Some("1")),
            "/health answered {code} (Retry-After {ra:?}) at {at:?}"
        );
        seen.push((at, code));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_header_clients_are_cut_off_and_health_and_ingest_keep_answering() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 48, 800);
    let srv = spawn(&cfg, &dir.path().join("data"), 256, Stdio::null());
    let rss0 = vm_rss_kib(srv.child.id());
    // 150 clients that send a request line and part of the headers, then one header line per 100 ms,
    // never finishing (slowloris).
    let mut conns = Vec::new();
    for _ in 0..150 {
        let mut s = TcpStream::connect(("127.0.0.1", srv.port)).await.unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        conns.push(s);
    }
    let started = Instant::now();
    let deadline = started + Duration::from_millis(600 + 2000);
    let ends: Vec<_> = conns
        .into_iter()
        .map(|s| {
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let trickle = tokio::spawn(async move {
                    while w.write_all(b"X-Slow: 1\r\n").await.is_ok() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                });
                let mut buf = [0u8; 4096];
                let mut got = Vec::new();
                let end = loop {
                    let left = deadline.saturating_duration_since(Instant::now());
                    match tokio::time::timeout(left, r.read(&mut buf)).await {
                        Err(_) => break End::Open,
                        Ok(Ok(0)) | Ok(Err(_)) => {
                            let t = String::from_utf8_lossy(&got).to_ascii_lowercase();
                            break if t.starts_with("http/1.1 503") {
                                End::Answer(503, t.contains("\r\nretry-after: 1\r\n"))
                            } else {
                                End::Closed
                            };
                        }
                        Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
                    }
                };
                trickle.abort();
                end
            })
        })
        .collect();
    let probes = probe_health(srv.port, Duration::from_millis(2500)).await;
    let mut refused = 0;
    let mut closed = 0;
    for e in ends {
        match e.await.unwrap() {
            End::Answer(503, true) => refused += 1,
            End::Closed => closed += 1,
            other => panic!("a slow-header connection ended {other:?}"),
        }
    }
    // At most 48 held a slot (then closed by the 600 ms header timeout); the rest got 503 at once.
    assert_eq!(refused + closed, 150);
    assert!(refused >= 150 - 48, "refused {refused}, closed {closed}");
    // Once the header timeout has passed, the slots are free and /health is 200 again.
    let late: Vec<_> = probes
        .iter()
        .filter(|(at, _)| *at > Duration::from_millis(1500))
        .collect();
    assert!(
        !late.is_empty() && late.iter().all(|(_, c)| *c == 200),
        "{probes:?}"
    );
    let http = reqwest::Client::new();
    assert_eq!(ingest(&http, srv.port, "msg_slow_headers").await, 202);
    let rss = vm_rss_kib(srv.child.id());
    // Bound: under 32 MiB of growth (the unprotected server grew by ~100 KiB per slow connection and
    // never released it).
    assert!(rss < rss0 + 32 * 1024, "VmRSS {rss0} -> {rss} KiB");
    eprintln!("slow headers: refused {refused}, closed {closed}, VmRSS {rss0} -> {rss} KiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_backs_off_when_descriptors_run_out_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    // The connection cap (400) is over the open-files limit (128): accept hits EMFILE.
    let cfg = config(dir.path(), 400, 800);
    let srv = spawn(&cfg, &dir.path().join("data"), 128, Stdio::null());
    let pid = srv.child.id();
    let mut conns = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(("127.0.0.1", srv.port)).await.unwrap();
        let _ = s.write_all(b"GET /health HTTP/1.1\r\n").await;
        conns.push(s);
    }
    let cpu = |pid: u32| -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let f: Vec<&str> = s.rsplit_once(')').unwrap().1.split_whitespace().collect();
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    let c0 = cpu(pid);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let spent = cpu(pid) - c0;
    // Clock ticks are 1/100 s: a spinning accept loop burns ~50 in 0.5 s.
    assert!(spent < 25, "accept loop spent {spent} ticks in 0.5 s");
    // The header timeout frees descriptors; queued connections are then served and /health answers.
    let http = reqwest::Client::new();
    let t0 = Instant::now();
    let mut ok = false;
    while t0.elapsed() < Duration::from_secs(6) {
        if let Some((200, _)) = health(&http, srv.port).await {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "/health did not recover");
    drop(conns);
    assert_eq!(ingest(&http, srv.port, "msg_emfile_recovered").await, 202);
}

/// Opens a chunked ingest and sends `mib` MiB in 64 KiB chunks, never the last chunk.
async fn never_ending_body(port: u16, mib: usize) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(
        b"POST /v1/trigger-subscriptions/sw/ingest HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\nwebhook-id: msg_x\r\nwebhook-timestamp: 1\r\nwebhook-signature: v1,x\r\ntransfer-encoding: chunked\r\n\r\n",
    )
    .await
    .unwrap();
    let chunk = vec![b'a'; 64 * 1024];
    for _ in 0..mib * 16 {
        let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
        frame.extend_from_slice(&chunk);
        frame.extend_from_slice(b"\r\n");
        if s.write_all(&frame).await.is_err() {
            break; // refused early (503) and closed
        }
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn never_ending_bodies_get_408_or_503_and_memory_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 48, 800);
    let srv = spawn(&cfg, &dir.path().join("data"), 1024, Stdio::null());
    let rss0 = vm_rss_kib(srv.child.id());
    let bodies: Vec<_> = (0..12)
        .map(|_| tokio::spawn(never_ending_body(srv.port, 1)))
        .collect();
    let probes = tokio::spawn(probe_health(srv.port, Duration::from_millis(2000)));
    let mut streams = Vec::new();
    for b in bodies {
        streams.push(b.await.unwrap());
    }
    let rss_peak = vm_rss_kib(srv.child.id());
    let deadline = Instant::now() + Duration::from_millis(800 + 2000);
    let mut ends = Vec::new();
    for s in streams {
        ends.push(outcome(s, deadline).await);
    }
    let timed_out = ends
        .iter()
        .filter(|e| **e == End::Answer(408, false))
        .count();
    let busy = ends
        .iter()
        .filter(|e| **e == End::Answer(503, true))
        .count();
    // 8 body slots and a 6 MiB budget for 12 bodies of 1 MiB: at least 6 are refused, at most 6 wait
    // for the 800 ms body timeout.
    assert_eq!(timed_out + busy, 12, "{ends:?}");
    assert!(busy >= 6 && timed_out >= 1, "{ends:?}");
    probes.await.unwrap();
    let http = reqwest::Client::new();
    assert_eq!(ingest(&http, srv.port, "msg_after_bodies").await, 202);
    let rss = vm_rss_kib(srv.child.id());
    // Bound: the 6 MiB budget plus 32 MiB of slack.
    assert!(
        rss_peak < rss0 + 38 * 1024 && rss < rss0 + 38 * 1024,
        "VmRSS {rss0} -> peak {rss_peak} -> {rss} KiB"
    );
    eprintln!("bodies: 408 x{timed_out}, 503 x{busy}, VmRSS {rss0} -> {rss_peak} -> {rss} KiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_for_a_never_ending_body() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 48, 800);
    let mut srv = spawn(&cfg, &dir.path().join("data"), 1024, Stdio::null());
    // A body that trickles one chunk per 300 ms forever: within the gap rule, never finished.
    let mut s = never_ending_body(srv.port, 0).await;
    let trickle = tokio::spawn(async move {
        while s.write_all(b"1\r\na\r\n").await.is_ok() {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t0 = Instant::now();
    // SAFETY: kill(2) signals a server process this test started; no memory is shared.
    unsafe { libc::kill(srv.child.id() as i32, libc::SIGTERM) };
    let mut status = None;
    while t0.elapsed() < Duration::from_secs(5) {
        if let Some(st) = srv.child.try_wait().unwrap() {
            status = Some(st);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = t0.elapsed();
    trickle.abort();
    let status = status.expect("server still running 5 s after SIGTERM");
    assert_eq!(status.code(), Some(0));
    // The body timeout (800 ms) bounds the wait, plus the store's close.
    assert!(
        took < Duration::from_millis(800 + 1500),
        "shutdown took {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once_and_shutdown_says_what_it_waits_for() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    // A long body timeout: the first SIGTERM would wait 30 s for the stuck body.
    let cfg = config(dir.path(), 48, 30_000);
    let mut srv = spawn(&cfg, &dir.path().join("data"), 1024, Stdio::piped());
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let err = srv.child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(err).lines() {
            if tx.send(l.unwrap_or_default()).is_err() {
                break;
            }
        }
    });
    let _stuck = never_ending_body(srv.port, 0).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pid = srv.child.id() as i32;
    // SAFETY: kill(2) signals a server process this test started; no memory is shared.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let wait_line = |what: &str| -> String {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if let Ok(l) = rx.recv_timeout(Duration::from_millis(100)) {
                if l.contains(what) {
                    return l;
                }
            }
        }
        panic!("no log line with {what:?}");
    };
    let l = wait_line("shutting down: no new connections");
    assert!(l.contains("attempts_in_flight=0"), "{l}");
    assert!(l.contains("connections_open=1"), "{l}");
    assert!(l.contains("grace_ms=30000"), "{l}");
    // Still waiting for the stuck body.
    assert!(srv.child.try_wait().unwrap().is_none());
    let t0 = Instant::now();
    // SAFETY: kill(2) signals a server process this test started; no memory is shared.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let mut status = None;
    while t0.elapsed() < Duration::from_secs(2) {
        if let Some(st) = srv.child.try_wait().unwrap() {
            status = Some(st);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let status = status.expect("a second SIGTERM did not exit within 2 s");
    assert_eq!(status.code(), Some(130));
    wait_line("second signal: exiting now");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() {
    let dir = tempfile::tempdir().unwrap();
    // Idle 300 ms, well under the 5 s header timeout: the idle rule closes it.
    let cfg = config_with(dir.path(), 48, 800, 5000, 300);
    let srv = spawn(&cfg, &dir.path().join("data"), 1024, Stdio::null());
    let mut s = TcpStream::connect(("127.0.0.1", srv.port)).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = s.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    let t0 = Instant::now();
    let end = tokio::time::timeout(Duration::from_secs(4), s.read(&mut buf)).await;
    let took = t0.elapsed();
    assert!(
        matches!(end, Ok(Ok(0)) | Ok(Err(_))),
        "the idle connection was not closed: {end:?}"
    );
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(2500),
        "closed after {took:?}"
    );
}

/// Requests hyper refuses while parsing, before the service runs, are answered by hyper itself: the
/// right status with an empty body (`content-length: 0`) and the connection closed. hyper 1.x offers
/// no hook to give them a body, so this is the documented exception to the flat envelope
/// (docs/http-api.md "Errors"); the server keeps answering afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_hyper_refuses_while_parsing_get_the_status_with_an_empty_body() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 48, 800);
    let srv = spawn(&cfg, &dir.path().join("data"), 1024, Stdio::null());
    let big = "a".repeat(1 << 20);
    // Past the server's own cap (tb_core::limits::MAX_HEADERS_CAP = 256).
    let many: String = (0..257).map(|i| format!("x-h{i}: v\r\n")).collect();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "1 MiB header",
            format!("GET /health HTTP/1.1\r\nhost: x\r\nx-big: {big}\r\n\r\n").into_bytes(),
            "HTTP/1.1 431",
        ),
        (
            "257 headers",
            format!("GET /health HTTP/1.1\r\nhost: x\r\n{many}\r\n").into_bytes(),
            "HTTP/1.1 431",
        ),
        (
            "two Content-Length",
            b"POST /v1/runs HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n{}"
                .to_vec(),
            "HTTP/1.1 400",
        ),
        (
            "Content-Length over u64",
            b"POST /v1/runs HTTP/1.1\r\nhost: x\r\ncontent-length: 99999999999999999999999\r\n\r\n"
                .to_vec(),
            "HTTP/1.1 400",
        ),
        (
            "Transfer-Encoding: identity",
            b"POST /v1/runs HTTP/1.1\r\nhost: x\r\ntransfer-encoding: identity\r\n\r\n{}".to_vec(),
            "HTTP/1.1 400",
        ),
        (
            "NUL in Authorization",
            b"GET /v1/runs HTTP/1.1\r\nhost: x\r\nauthorization: Bearer a\0b\r\n\r\n".to_vec(),
            "HTTP/1.1 400",
        ),
    ];
    for (name, req, status) in cases {
        let mut s = TcpStream::connect(("127.0.0.1", srv.port)).await.unwrap();
        // The server may answer and close before it read everything.
        let _ = s.write_all(&req).await;
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut got)).await;
        let got = String::from_utf8_lossy(&got).to_string();
        assert!(got.starts_with(status), "{name}: {got}");
        let (head, body) = got.split_once("\r\n\r\n").expect("a whole answer");
        assert!(
            head.to_ascii_lowercase().contains("content-length: 0"),
            "{name}: {head}"
        );
        assert_eq!(body, "", "{name}: hyper's own answer has no body");
    }
    let http = reqwest::Client::new();
    assert_eq!(health(&http, srv.port).await.map(|h| h.0), Some(200));
}

/// `[server]` defaults (256 MiB budget, 64 body slots, 16 per subscription) and one Standard Webhooks
/// subscription with the default 25 MiB body limit. The bodies all come from one address, so that
/// address may hold the subscription's 16 slots (by default a quarter of them).
fn large_body_config(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("large.toml");
    std::fs::write(
        &p,
        r#"
[server]
max_inflight_bodies_per_client = 16

[[subscriptions]]
id = "sw"
connector = "standard-webhooks"
secret = "env:STANDARD_WEBHOOK_SECRET"

# One 25 MiB string: over the default max_json_string_bytes (1 MiB).
[subscriptions.limits]
max_json_string_bytes = 26214400

[[workflows]]
id = "noop"
executor = "noop"

[[bindings]]
id = "sw-all"
subscription = "sw"
event_types = ["*"]
action = "start_run"
workflow = "noop"
"#,
    )
    .unwrap();
    p
}

/// The server's peak resident set in KiB (/proc/<pid>/status VmHWM).
fn vm_hwm_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// One signed Standard Webhooks ingest of `body` over a raw connection, with `Content-Length` or
/// chunked (256 KiB chunks); the answer's status (0 when none came within 60 s).
async fn raw_signed_ingest(
    port: u16,
    id: String,
    body: std::sync::Arc<Vec<u8>>,
    chunked: bool,
) -> u16 {
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let key = tb_ingress::parse_whsec(SECRET).unwrap();
    let sig = tb_ingress::standard_webhooks::sign(&key, &id, ts, &body);
    let framing = if chunked {
        "transfer-encoding: chunked".to_string()
    } else {
        format!("content-length: {}", body.len())
    };
    let head = format!(
        "POST /v1/trigger-subscriptions/sw/ingest HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\nwebhook-id: {id}\r\nwebhook-timestamp: {ts}\r\nwebhook-signature: {sig}\r\n{framing}\r\n\r\n"
    );
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    if chunked {
        for c in body.chunks(256 * 1024) {
            s.write_all(format!("{:x}\r\n", c.len()).as_bytes())
                .await
                .unwrap();
            s.write_all(c).await.unwrap();
            s.write_all(b"\r\n").await.unwrap();
        }
        s.write_all(b"0\r\n\r\n").await.unwrap();
    } else {
        s.write_all(&body).await.unwrap();
    }
    match outcome(s, Instant::now() + Duration::from_secs(60)).await {
        End::Answer(code, _) => code,
        _ => 0,
    }
}

/// A Standard Webhooks payload of `n` bytes: `{"type":"big","data":{"blob":"aaa..."}}`.
fn payload_of(n: usize) -> Vec<u8> {
    let head = br#"{"type":"big","data":{"blob":""#;
    let tail = br#""}}"#;
    let mut v = Vec::with_capacity(n);
    v.extend_from_slice(head);
    v.resize(n - tail.len(), b'a');
    v.extend_from_slice(tail);
    v
}

/// Ten parallel signed 25 MiB ingests; returns the server's VmRSS before and its peak (VmHWM) in KiB.
async fn peak_rss_of_ten_large_bodies(chunked: bool) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = large_body_config(dir.path());
    let srv = spawn(&cfg, &dir.path().join("data"), 1024, Stdio::null());
    let rss0 = vm_rss_kib(srv.child.id());
    let body = std::sync::Arc::new(payload_of((25 << 20) - 1024));
    let sends: Vec<_> = (0..10)
        .map(|i| {
            let b = body.clone();
            tokio::spawn(raw_signed_ingest(
                srv.port,
                format!("msg_large_body_{chunked}_{i:02}"),
                b,
                chunked,
            ))
        })
        .collect();
    let mut codes = Vec::new();
    for s in sends {
        codes.push(s.await.unwrap());
    }
    assert_eq!(codes, vec![202; 10], "chunked={chunked}");
    (rss0, vm_hwm_kib(srv.child.id()))
}

/// Memory accounting of buffered bodies: ten parallel signed 25 MiB ingests (250 MiB, within the 256 MiB
/// budget) peak under 1.4 times their size over the idle server, with Content-Length and chunked.
/// Before the bodies were copied into one buffer as they arrive, the chunk list plus its concatenation
/// peaked at ~416 MB (Content-Length) and ~465 MB (chunked) over an 18 MB idle server; now ~305 MB and
/// ~310-330 MB (the rest is mostly SQLite's own copy of the blob being written, and for chunked bodies
/// the buffer's growth).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_parallel_large_bodies_peak_under_1_4_times_their_size() {
    let bodies_kib = 10 * 25 * 1024;
    for chunked in [false, true] {
        let (rss0, peak) = peak_rss_of_ten_large_bodies(chunked).await;
        eprintln!("10 x 25 MiB (chunked: {chunked}): VmRSS {rss0} -> peak {peak} KiB");
        assert!(
            peak < rss0 + bodies_kib * 14 / 10,
            "chunked {chunked}: VmRSS {rss0} -> peak {peak} KiB for {bodies_kib} KiB of bodies"
        );
    }
}

/// The slow-body attack (docs/limits.md), scaled to the test config (8 body
/// slots): 16 connections to made-up capability URLs `/v1/hooks/x{i}`, each declaring 100 000 bytes (under the 6 MiB budget together, so only the slots bind),
/// half trickling 2.5 KB every 0.5 s and half sending one byte and then nothing. Every one is answered
/// 404 at once (the token is looked up before the body), and signed ingests racing them all get 202.
/// Before: the bodies took every slot and the signed ingests got 503 until the body timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickled_bodies_to_made_up_capability_urls_do_not_block_signed_ingest() {
    let dir = tempfile::tempdir().unwrap();
    // A 5 s body timeout: longer than the whole attack, so only the token lookup can save ingest.
    let cfg = config(dir.path(), 48, 5000);
    let srv = spawn(&cfg, &dir.path().join("data"), 1024, Stdio::null());
    let port = srv.port;
    let t0 = Instant::now();
    let attackers: Vec<_> = (0..16)
        .map(|i| {
            tokio::spawn(async move {
                let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
                let head = format!("POST /v1/hooks/x{i} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n{{");
                s.write_all(head.as_bytes()).await.unwrap();
                let (mut r, mut w) = s.into_split();
                let trickle = tokio::spawn(async move {
                    if i % 2 == 0 {
                        while w.write_all(&[b' '; 2500]).await.is_ok() {
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                    } else {
                        // One byte, then nothing (kept open).
                        tokio::time::sleep(Duration::from_secs(4)).await;
                        drop(w);
                    }
                });
                let mut got = Vec::new();
                let mut buf = [0u8; 1024];
                let _ = tokio::time::timeout(Duration::from_secs(3), async {
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match r.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                })
                .await;
                trickle.abort();
                (String::from_utf8_lossy(&got).to_string(), t0.elapsed())
            })
        })
        .collect();
    let http = reqwest::Client::new();
    let mut codes = Vec::new();
    while t0.elapsed() < Duration::from_millis(2500) {
        codes.push(ingest(&http, port, &format!("msg_under_attack_{:04}", codes.len())).await);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        codes.len() >= 5 && codes.iter().all(|&c| c == 202),
        "{codes:?}"
    );
    for a in attackers {
        let (answer, at) = a.await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 404"), "{answer:?} at {at:?}");
        assert!(at < Duration::from_millis(1500), "404 only after {at:?}");
    }
}
