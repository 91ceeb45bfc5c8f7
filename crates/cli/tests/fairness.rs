//! Per-client fairness at the front door (docs/limits.md "Per-client limits") against the real
//! binary, in a test binary of its own so its load does not meet the timing-sensitive edge tests:
//! one address (`127.0.0.2`) holding ~1 000 half-open connections and 64 trickled bodies on one
//! subscription cannot take `/health`, `/ready` or signed ingest from another address (`127.0.0.1`);
//! behind a trusted proxy the forwarded client address is the one that is counted.

mod edge_support;

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use edge_support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;

const ATTACKER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const PROBER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);

/// Raises this process's soft open-files limit to `want` (at most the hard limit): the attack holds
/// over a thousand sockets.
fn raise_open_files(want: u64) -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on this process with a valid rlimit struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        let soft = want.min(r.rlim_max as u64).max(r.rlim_cur as u64);
        r.rlim_cur = soft as libc::rlim_t;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
        soft
    }
}

/// A connection to the server on loopback `port` from source address `from`.
async fn connect_from(from: Ipv4Addr, port: u16) -> std::io::Result<TcpStream> {
    let s = TcpSocket::new_v4()?;
    // Reconnects reuse ports whose earlier connection is in TIME_WAIT.
    s.set_reuseaddr(true)?;
    s.bind(SocketAddr::new(from.into(), 0))?;
    s.connect(SocketAddr::new(PROBER.into(), port)).await
}

/// A server with the default `[server]` limits (512 connections, 64 per client, 64 body slots, 16 per
/// subscription, 4 per client of a subscription) and `extra` lines in `[server]`.
fn fair_config(dir: &std::path::Path, extra: &str) -> std::path::PathBuf {
    let p = dir.join("fair.toml");
    std::fs::write(
        &p,
        format!(
            r#"
[server]
{extra}

[[subscriptions]]
id = "sw"
connector = "standard-webhooks"
secret = "env:STANDARD_WEBHOOK_SECRET"

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

/// A signed Standard Webhooks ingest of a small body over a fresh connection from `127.0.0.1`, with
/// `x-forwarded-for` when given; its status (0 when no answer came within 3 s).
async fn signed_ingest(port: u16, id: &str, forwarded_for: Option<&str>) -> u16 {
    let body = br#"{"type":"fair.test","data":{}}"#;
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let key = tb_ingress::parse_whsec(SECRET).unwrap();
    let sig = tb_ingress::standard_webhooks::sign(&key, id, ts, body);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let mut req = http
        .post(format!(
            "http://127.0.0.1:{port}/v1/trigger-subscriptions/sw/ingest"
        ))
        .header("content-type", "application/json")
        .header("webhook-id", id)
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", sig)
        .body(body.to_vec())
        .timeout(Duration::from_secs(3));
    if let Some(f) = forwarded_for {
        req = req.header("x-forwarded-for", f);
    }
    match req.send().await {
        Ok(r) => {
            let status = r.status().as_u16();
            if status >= 300 {
                eprintln!(
                    "ingest {id}: {status} {}",
                    r.text().await.unwrap_or_default()
                );
            }
            status
        }
        Err(e) => {
            eprintln!("ingest {id}: {e}");
            0
        }
    }
}

/// GET `path` over a fresh connection from `127.0.0.1`; its status (0 when no answer within 3 s).
async fn get(port: u16, path: &str) -> u16 {
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    http.get(format!("http://127.0.0.1:{port}{path}"))
        .timeout(Duration::from_secs(3))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or_else(|e| {
            eprintln!("GET {path}: {e}");
            0
        })
}

/// Spawns the server of `cfg` and waits until its accept loop answers (`spawn` returns once the port
/// listens, which is before the accept loop runs), then a moment for that connection to be let go.
async fn serve(cfg: &std::path::Path, data: &std::path::Path, nofile: u64) -> Srv {
    let srv = spawn(cfg, data, nofile, Stdio::null());
    let t0 = Instant::now();
    while get(srv.port, "/health").await != 200 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "/health never answered 200"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    srv
}

/// The status of the HTTP answer in `got`, if any.
fn status_of(got: &[u8]) -> Option<u16> {
    std::str::from_utf8(got.get(9..12)?).ok()?.parse().ok()
}

/// What the attacker saw.
#[derive(Default)]
struct Seen {
    /// Connections it holds now (accepted, not yet closed by the server).
    holding: AtomicUsize,
    /// The most it held at once.
    peak: AtomicUsize,
    /// Connections the server closed or answered, and of those the 503s.
    ended: AtomicUsize,
    busy: AtomicUsize,
    /// Bodies answered 408 (they held a body slot until the minimum rate cut them).
    timed_out: AtomicUsize,
}

impl Seen {
    fn hold(&self) {
        let n = self.holding.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(n, Ordering::Relaxed);
    }
    fn end(&self, status: Option<u16>) {
        self.holding.fetch_sub(1, Ordering::Relaxed);
        self.ended.fetch_add(1, Ordering::Relaxed);
        match status {
            Some(503) => {
                self.busy.fetch_add(1, Ordering::Relaxed);
            }
            Some(408) => {
                self.timed_out.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }
}

/// One attacking connection from `from`, reopened 100 ms after the server ends it, until `stop`:
/// it sends `head` and then `trickle` every second (2 bytes/s for a body; nothing for a half-open
/// head) and never finishes.
async fn attacker(
    from: Ipv4Addr,
    port: u16,
    head: &'static [u8],
    trickle: &'static [u8],
    seen: Arc<Seen>,
    stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        let Ok(s) = connect_from(from, port).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        seen.hold();
        let (mut r, mut w) = s.into_split();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        let _ = w.write_all(head).await;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        let mut st = stop.clone();
        let stopping = async move {
            let _ = st.wait_for(|s| *s).await;
        };
        tokio::pin!(stopping);
        let stopped = loop {
            tokio::select! {
                _ = &mut stopping => break true,
                n = r.read(&mut buf) => match n {
                    Ok(0) | Err(_) => break false,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                },
                _ = tick.tick(), if !trickle.is_empty() => {
                    let _ = w.write_all(trickle).await;
                }
            }
        };
        seen.end(status_of(&got));
        if stopped {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const HALF_OPEN: &[u8] =
    b"POST /v1/trigger-subscriptions/sw/ingest HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n";
const TRICKLED: &[u8] = b"POST /v1/trigger-subscriptions/sw/ingest HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\nwebhook-id: msg_forged\r\nwebhook-timestamp: 1\r\nwebhook-signature: v1,AAAA\r\ncontent-length: 100000\r\n\r\n{";

/// The attack of docs/limits.md "Per-client limits": from 127.0.0.2, 64 bodies trickled at 2 bytes/s
/// to the one subscription and ~1 000 connections that send part of a request head, each reopened
/// when the server ends it. From 127.0.0.1, 20 probes of `/health`, `/ready` and a signed ingest must
/// all answer 200 / 200 / 202. Before per-client limits the attacker held all 512 connections and
/// the subscription's 16 body slots, and the probes were answered 503 (or not at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_health_ready_or_ingest_from_another() {
    let nofile = raise_open_files(8192);
    assert!(
        nofile >= 2048,
        "open-files limit {nofile}: the attack needs ~1 100 sockets"
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = fair_config(dir.path(), "");
    let srv = serve(&cfg, &dir.path().join("data"), 4096).await;
    let port = srv.port;
    let (stop_tx, stop) = watch::channel(false);
    let bodies = Arc::new(Seen::default());
    let half_open = Arc::new(Seen::default());
    let mut tasks = Vec::new();
    for _ in 0..64 {
        tasks.push(tokio::spawn(attacker(
            ATTACKER,
            port,
            TRICKLED,
            b"  ",
            bodies.clone(),
            stop.clone(),
        )));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..1000 {
        tasks.push(tokio::spawn(attacker(
            ATTACKER,
            port,
            HALF_OPEN,
            b"",
            half_open.clone(),
            stop.clone(),
        )));
    }
    // Let the attack take what it can.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let t0 = Instant::now();
    let mut probes = Vec::new();
    for i in 0..20 {
        let health = get(port, "/health").await;
        let ready = get(port, "/ready").await;
        let ingest = signed_ingest(port, &format!("msg_fair_probe_{i:02}"), None).await;
        probes.push((t0.elapsed(), health, ready, ingest));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let held_at_end =
        half_open.holding.load(Ordering::Relaxed) + bodies.holding.load(Ordering::Relaxed);
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    let answered =
        |f: fn(&(Duration, u16, u16, u16)) -> bool| probes.iter().filter(|p| f(p)).count();
    let health_ok = answered(|p| p.1 == 200);
    let ready_ok = answered(|p| p.2 == 200);
    let ingest_ok = answered(|p| p.3 == 202);
    eprintln!(
        "fairness: probes answered during the attack: /health 200 {health_ok}/20, /ready 200 {ready_ok}/20, ingest 202 {ingest_ok}/20 over {:?}; attacker: peak held {} half-open + {} body connections, {} held at the end, {} half-open ended ({} with 503), {} bodies ended ({} with 503, {} with 408)",
        t0.elapsed(),
        half_open.peak.load(Ordering::Relaxed),
        bodies.peak.load(Ordering::Relaxed),
        held_at_end,
        half_open.ended.load(Ordering::Relaxed),
        half_open.busy.load(Ordering::Relaxed),
        bodies.ended.load(Ordering::Relaxed),
        bodies.busy.load(Ordering::Relaxed),
        bodies.timed_out.load(Ordering::Relaxed),
    );
    // The attack was real: it opened past its share and past the cap, and it was turned away.
    assert!(
        half_open.peak.load(Ordering::Relaxed) >= 256,
        "the attacker never had 256 connections open at once (4 times its share)"
    );
    assert!(half_open.ended.load(Ordering::Relaxed) >= 1000);
    assert!(
        bodies.busy.load(Ordering::Relaxed) + bodies.timed_out.load(Ordering::Relaxed) >= 64,
        "the trickled bodies were not answered"
    );
    assert_eq!(
        (health_ok, ready_ok, ingest_ok),
        (20, 20, 20),
        "every probe from 127.0.0.1 answered during the attack: {probes:?}"
    );
}

/// The body half of the attack alone, as the issue of one public ingest URL: 64 bodies trickled at
/// 2 bytes/s from 127.0.0.2 to one subscription, each reopened after its answer, take at most that
/// address's share of the subscription's body slots (4 of 16), so 20 signed ingests from 127.0.0.1
/// racing them are all 202. Before per-client shares the trickled bodies held all 16 slots of the
/// subscription and genuine deliveries to it were 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickled_bodies_from_one_address_leave_the_subscription_to_other_senders() {
    raise_open_files(4096);
    let dir = tempfile::tempdir().unwrap();
    let cfg = fair_config(dir.path(), "");
    let srv = serve(&cfg, &dir.path().join("data"), 1024).await;
    let port = srv.port;
    let (stop_tx, stop) = watch::channel(false);
    let bodies = Arc::new(Seen::default());
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            tokio::spawn(attacker(
                ATTACKER,
                port,
                TRICKLED,
                b"  ",
                bodies.clone(),
                stop.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut codes = Vec::new();
    for i in 0..20 {
        codes.push(signed_ingest(port, &format!("msg_fair_body_{i:02}"), None).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
    }
    let accepted = codes.iter().filter(|&&c| c == 202).count();
    eprintln!(
        "fairness (bodies): signed ingests accepted during the attack {accepted}/20; attacker: {} bodies ended ({} with 503, {} with 408)",
        bodies.ended.load(Ordering::Relaxed),
        bodies.busy.load(Ordering::Relaxed),
        bodies.timed_out.load(Ordering::Relaxed),
    );
    assert!(
        bodies.busy.load(Ordering::Relaxed) >= 40,
        "the attacker's bodies past its share were refused"
    );
    assert_eq!(accepted, 20, "{codes:?}");
}

/// Every connection slot taken (8 of 8, by header-less connections from 127.0.0.2): `/health` and
/// `/ready` from 127.0.0.1 are still answered 200 (the probe reservation) while anything else is 503
/// with `Retry-After`, and header-less connections are cut after about 1 s (the pressure header
/// timeout) while three quarters of the slots or more are open, instead of after the 10 s
/// `header_timeout_ms`. Before: the probes were 503 and the connections stayed for 5 s (idle close)
/// or more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_slot_taken_probes_are_answered_and_header_less_connections_cut_sooner() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = fair_config(
        dir.path(),
        "max_connections = 8\nmax_connections_per_client = 8\nmax_inflight_bodies = 8",
    );
    let srv = serve(&cfg, &dir.path().join("data"), 1024).await;
    let port = srv.port;
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(3);
    // When the server closed each idle connection (`None`: still open at 3 s).
    let mut idle = Vec::new();
    for _ in 0..8 {
        let mut s = connect_from(ATTACKER, port).await.unwrap();
        idle.push(tokio::spawn(async move {
            let mut b = [0u8; 64];
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, s.read(&mut b)).await {
                Ok(Ok(0)) | Ok(Err(_)) => Some(t0.elapsed()),
                _ => None,
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let raw = |req: &'static str| async move {
        let mut s = connect_from(PROBER, port).await.unwrap();
        s.write_all(req.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut got)).await;
        String::from_utf8_lossy(&got).to_ascii_lowercase()
    };
    let health = raw("GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let ready = raw("GET /ready HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let other = raw("GET /v1/receipts HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let probed_at = t0.elapsed();
    let first = |t: &str| t.lines().next().unwrap_or("").to_string();
    eprintln!(
        "fairness (cap full): /health {:?}, /ready {:?}, /v1/receipts {:?} at {probed_at:?}",
        first(&health),
        first(&ready),
        first(&other)
    );
    // The idle connections: closed by the pressure timeout (1 s), not the header timeout (10 s),
    // while 6 or more (three quarters of 8) are open.
    let mut ends = Vec::new();
    for e in idle {
        ends.push(e.await.unwrap());
    }
    let cut: Vec<Duration> = ends.iter().flatten().copied().collect();
    eprintln!("fairness (cap full): idle connections closed at {ends:?}");
    assert!(health.starts_with("http/1.1 200"), "{health}");
    assert!(ready.starts_with("http/1.1 200"), "{ready}");
    assert!(
        other.starts_with("http/1.1 503") && other.contains("\r\nretry-after: 1\r\n"),
        "{other}"
    );
    assert!(
        probed_at < Duration::from_millis(900),
        "the probes took {probed_at:?}"
    );
    assert!(cut.len() >= 3, "{ends:?}");
    assert!(
        cut.iter()
            .all(|t| *t >= Duration::from_millis(900) && *t < Duration::from_millis(2500)),
        "{ends:?}"
    );
}

/// Behind a trusted proxy (here 127.0.0.1): its connections are not held to one client's share, and
/// the body-slot share is counted per forwarded client. A forwarded header from a peer that is not
/// trusted (127.0.0.2) is ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_the_forwarded_client_is_counted() {
    raise_open_files(4096);
    let dir = tempfile::tempdir().unwrap();
    let cfg = fair_config(
        dir.path(),
        "max_connections = 64\nmax_connections_per_client = 8\nmax_inflight_bodies_per_target = 8\nmax_inflight_bodies_per_client = 2\ntrusted_proxies = [\"127.0.0.1/32\"]",
    );
    let srv = serve(&cfg, &dir.path().join("data"), 1024).await;
    let port = srv.port;
    // 12 idle connections from the proxy: over one client's share (8), all held.
    let mut idle = Vec::new();
    for _ in 0..12 {
        idle.push(connect_from(PROBER, port).await.unwrap());
    }
    // From 127.0.0.2 (not trusted), its share of 8 and then a refusal.
    let mut direct = Vec::new();
    for _ in 0..8 {
        direct.push(connect_from(ATTACKER, port).await.unwrap());
    }
    let mut ninth = connect_from(ATTACKER, port).await.unwrap();
    ninth
        .write_all(b"GET /v1/receipts HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), ninth.read_to_end(&mut got)).await;
    let text = String::from_utf8_lossy(&got).to_ascii_lowercase();
    assert!(
        text.starts_with("http/1.1 503") && text.contains("\r\nretry-after: 1\r\n"),
        "the 9th connection from 127.0.0.2: {text:?}"
    );
    // A probe over the share is still answered.
    let mut probe = connect_from(ATTACKER, port).await.unwrap();
    probe
        .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), probe.read_to_end(&mut got)).await;
    assert_eq!(
        status_of(&got),
        Some(200),
        "{:?}",
        String::from_utf8_lossy(&got)
    );
    drop(direct);
    for s in &mut idle {
        let mut b = [0u8; 1];
        let r = tokio::time::timeout(Duration::from_millis(10), s.read(&mut b)).await;
        assert!(
            r.is_err(),
            "a proxy connection was closed or answered: {r:?}"
        );
    }
    drop(idle);

    // Two bodies trickled for forwarded client 198.51.100.7 take its share of "sw".
    let trickle = |xff: &'static str| {
        tokio::spawn(async move {
            let mut s = connect_from(PROBER, port).await.unwrap();
            let head = format!("POST /v1/trigger-subscriptions/sw/ingest HTTP/1.1\r\nHost: x\r\nx-forwarded-for: {xff}\r\ncontent-type: application/json\r\nwebhook-id: msg_forged\r\nwebhook-timestamp: 1\r\nwebhook-signature: v1,AAAA\r\ncontent-length: 1000\r\n\r\n{{");
            s.write_all(head.as_bytes()).await.unwrap();
            let (mut r, mut w) = s.into_split();
            let t = tokio::spawn(async move {
                while w.write_all(b" ").await.is_ok() {
                    tokio::time::sleep(Duration::from_millis(400)).await;
                }
            });
            let mut got = Vec::new();
            let _ = tokio::time::timeout(Duration::from_secs(6), r.read_to_end(&mut got)).await;
            t.abort();
            status_of(&got)
        })
    };
    let held: Vec<_> = (0..2).map(|_| trickle("198.51.100.7")).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // That client's next body is refused; another forwarded client's is taken.
    assert_eq!(
        signed_ingest(port, "msg_fwd_other_client", Some("203.0.113.1")).await,
        202
    );
    assert_eq!(
        signed_ingest(port, "msg_fwd_same_client", Some("198.51.100.7")).await,
        503,
        "198.51.100.7 holds its share of sw"
    );
    assert_eq!(
        signed_ingest(port, "msg_fwd_proxy_itself", None).await,
        202,
        "the proxy's own requests are another client"
    );
    for h in held {
        assert_eq!(
            h.await.unwrap(),
            Some(408),
            "the trickled body held its slot"
        );
    }
}
