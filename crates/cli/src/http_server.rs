//! The HTTP/1.1 accept loop of `serve`: a header-read timeout, an idle keep-alive
//! timeout, a cap on open connections (503 + `Retry-After` beyond it), accept errors that back off
//! instead of spinning (EMFILE), and a graceful shutdown that waits for open connections at most
//! `shutdown_grace` before closing them.
//!
//! Per-client fairness (docs/limits.md "Per-client limits", rules in [`tb_core::front_door`]): one
//! client address (IPv6: its /64) holds at most `max_connections_per_client` of the connections (a
//! trusted proxy's connections are exempt); a connection over its client's share or over the cap is
//! read for its request line only, `GET`/`HEAD` `/health` and `/ready` are answered on it (the probe
//! reservation), anything else gets 503 with `Retry-After`; near the cap a connection that has not
//! sent a request is cut after [`tb_core::front_door::PRESSURE_HEADER_TIMEOUT_MS`].
//!
//! Metrics: `tb_http_connections_open` (gauge), `tb_http_refused_total{reason}` with
//! `connection_cap`, `client_connections` and `header_pressure` (the body reasons are counted by
//! `tb_api::body`), `tb_http_probes_reserved_total` (probes answered over the cap).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tb_core::front_door;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

/// Settings of the accept loop (from `[server]`).
#[derive(Debug, Clone, Copy)]
pub struct EdgeConfig {
    /// Time a client has for a request's headers; then the connection is closed.
    pub header_timeout: Duration,
    /// Time an idle keep-alive connection (no request in progress) stays open.
    pub idle_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
    /// Of those, connections one client address (IPv6: its /64) holds at once; a trusted proxy's
    /// are not counted ([`tb_core::front_door`]).
    pub max_connections_per_client: usize,
    /// On shutdown: the longest wait for open connections before they are closed.
    pub shutdown_grace: Duration,
}

/// Open connections, for the shutdown log.
#[derive(Debug, Default)]
pub struct OpenConnections(AtomicUsize);

impl OpenConnections {
    /// Connections open now.
    pub fn get(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

/// Connections answered 503 at once (over the cap) that may be in their short write at the same time;
/// beyond this an over-cap connection is closed without an answer.
const MAX_REFUSING: usize = 256;
/// Of those, the most one client may have: the other half stays for everybody else (a prober
/// among them).
const MAX_REFUSING_PER_CLIENT: usize = MAX_REFUSING / 2;
/// Longest time a probe answered over the cap may take, its head included (`/ready` asks the store).
const PROBE_DEADLINE: Duration = Duration::from_secs(5);
/// Least time between two log lines about a client at its connection share.
const CLIENT_WARN_EVERY_MS: i64 = 60_000;
/// Longest read of an over-cap request's head, and of what follows the 503.
const REFUSE_READ: Duration = Duration::from_millis(250);
/// Longest pause after an accept error that is not about one connection (EMFILE, ENFILE, ENOBUFS...).
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

const BUSY_BODY: &str =
    r#"{"error":"unavailable","message":"too many open connections; retry shortly"}"#;

/// Connections held and being refused per client key ([`front_door::client_key`]); an entry is
/// removed when both fall to 0, so the map holds at most one entry per open connection.
#[derive(Default)]
struct Clients(Mutex<HashMap<IpAddr, PerClient>>);

#[derive(Default, Clone, Copy)]
struct PerClient {
    open: usize,
    refusing: usize,
}

/// What a [`ClientGuard`] counts.
#[derive(Clone, Copy)]
enum Held {
    Open,
    Refusing,
}

impl Clients {
    /// Counts one more `what` for `key` when it holds fewer than `share`; `None` otherwise.
    fn take(self: &Arc<Self>, key: IpAddr, what: Held, share: usize) -> Option<ClientGuard> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let e = m.entry(key).or_default();
        let n = match what {
            Held::Open => &mut e.open,
            Held::Refusing => &mut e.refusing,
        };
        if !front_door::client_admits(*n, share) {
            if e.open == 0 && e.refusing == 0 {
                m.remove(&key);
            }
            return None;
        }
        *n += 1;
        Some(ClientGuard {
            clients: self.clone(),
            key,
            what,
        })
    }
}

/// One connection of a client, given back on drop.
struct ClientGuard {
    clients: Arc<Clients>,
    key: IpAddr,
    what: Held,
}

impl Drop for ClientGuard {
    fn drop(&mut self) {
        let mut m = self.clients.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = m.get_mut(&self.key) {
            match self.what {
                Held::Open => e.open = e.open.saturating_sub(1),
                Held::Refusing => e.refusing = e.refusing.saturating_sub(1),
            }
            if e.open == 0 && e.refusing == 0 {
                m.remove(&self.key);
            }
        }
    }
}

/// Says, at most once a minute, that a client reached its connection share (a load balancer that is
/// not in `trusted_proxies` reaches it for everybody behind it).
fn warn_client_at_share(key: IpAddr, share: usize) {
    static LAST: AtomicI64 = AtomicI64::new(i64::MIN);
    let now = tb_engine::clock::now_ms();
    let last = LAST.load(Ordering::Relaxed);
    if now.saturating_sub(last) >= CLIENT_WARN_EVERY_MS
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(
            client = %key,
            max_connections_per_client = share,
            "a client holds its share of the connections; its further connections are refused (503) until some close. If this is a load balancer or reverse proxy, add it to [server].trusted_proxies"
        );
    }
}

/// Serves `app` on `listener` until `stop` becomes true; then stops accepting, asks every connection to
/// close after its current request, waits at most `cfg.shutdown_grace` and closes the rest.
/// Connections from a peer within `trusted_proxies` are not held to the per-client share (they carry
/// many clients; the API reads the client from their forwarded header).
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    cfg: EdgeConfig,
    trusted_proxies: Vec<ipnet::IpNet>,
    open: Arc<OpenConnections>,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(cfg.max_connections));
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    let clients = Arc::new(Clients::default());
    let (close_tx, close_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut backoff = Duration::from_millis(10);
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            r = listener.accept() => match r {
                Ok((sock, peer)) => {
                    backoff = Duration::from_millis(10);
                    let key = front_door::client_key(peer.ip());
                    let proxy = trusted_proxies
                        .iter()
                        .any(|n| n.contains(&peer.ip().to_canonical()));
                    // The client's share first, then the cap: a client at its share is refused
                    // even while the cap has room, so no one address can fill it.
                    let share = if proxy {
                        Ok(None)
                    } else {
                        clients
                            .take(key, Held::Open, cfg.max_connections_per_client)
                            .map(Some)
                            .ok_or("client_connections")
                    };
                    let admitted = share.and_then(|guard| {
                        slots
                            .clone()
                            .try_acquire_owned()
                            .map(|slot| (slot, guard))
                            .map_err(|_| "connection_cap")
                    });
                    match admitted {
                        Ok((slot, guard)) => {
                            let app = app.clone();
                            let open = open.clone();
                            let close = close_rx.clone();
                            conns.spawn(async move {
                                open.0.fetch_add(1, Ordering::Relaxed);
                                metrics::gauge!("tb_http_connections_open").increment(1.0);
                                connection(sock, peer, app, cfg, &open, close).await;
                                metrics::gauge!("tb_http_connections_open").decrement(1.0);
                                open.0.fetch_sub(1, Ordering::Relaxed);
                                drop((slot, guard));
                            });
                        }
                        Err(reason) => {
                            metrics::counter!("tb_http_refused_total", "reason" => reason).increment(1);
                            if reason == "client_connections" {
                                warn_client_at_share(key, cfg.max_connections_per_client);
                            }
                            // At most half of the refusals in progress for one client; past that
                            // (or a full pool) the connection is closed at once, which costs nothing.
                            let guard = clients.take(key, Held::Refusing, MAX_REFUSING_PER_CLIENT);
                            let permit = guard.and_then(|g| {
                                refusing.clone().try_acquire_owned().ok().map(|p| (p, g))
                            });
                            if let Some(held) = permit {
                                let app = app.clone();
                                tokio::spawn(async move {
                                    overflow(sock, peer, app).await;
                                    drop(held);
                                });
                            }
                        }
                    }
                }
                Err(e) if per_connection(&e) => {}
                Err(e) => {
                    // Out of descriptors or buffers: pause so the loop neither spins nor starves
                    // the connections that are being served (they free descriptors as they close).
                    tracing::warn!(error = %e, pause_ms = backoff.as_millis() as u64, "accept failed; pausing before the next accept");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_ACCEPT_BACKOFF);
                }
            },
        }
    }
    drop(listener);
    let _ = close_tx.send(true);
    let n = conns.len();
    if n > 0 {
        tracing::info!(
            connections = n,
            grace_ms = cfg.shutdown_grace.as_millis() as u64,
            "shutting down: waiting for open connections to finish their request"
        );
    }
    let drained = tokio::time::timeout(cfg.shutdown_grace, async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            connections = conns.len(),
            "connections still open after the shutdown grace; closing them"
        );
        conns.shutdown().await;
    }
}

/// Accept errors about one connection (it went away before we took it): accept the next at once.
fn per_connection(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted | WouldBlock
    )
}

/// A connection over its client's share or over the cap. It first reads the request head (at most
/// 8 KiB, at most [`REFUSE_READ`]), since HTTP clients refuse an answer that comes before their
/// request. A probe (`GET`/`HEAD` `/health` or `/ready`, [`front_door::is_probe`]) whose whole head
/// came in that time is then answered by `app` as on any connection, within [`PROBE_DEADLINE`], and
/// the connection closed: probes tell the truth while the slots are taken. Anything else (a head
/// still coming included) is answered 503 `unavailable` with
/// `Retry-After: 1`; after answering it reads what else comes for a moment, so the client reads the
/// answer instead of a reset.
async fn overflow(mut sock: TcpStream, peer: SocketAddr, app: axum::Router) {
    let mut buf = [0u8; 8192];
    let mut seen = 0usize;
    let _ = tokio::time::timeout(REFUSE_READ, async {
        while seen < buf.len() {
            match sock.read(&mut buf[seen..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen += n,
            }
            if buf[..seen].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    })
    .await;
    let whole_head = buf[..seen].windows(4).any(|w| w == b"\r\n\r\n");
    if whole_head
        && front_door::request_line(&buf[..seen]).is_some_and(|(m, t)| front_door::is_probe(m, t))
    {
        metrics::counter!("tb_http_probes_reserved_total").increment(1);
        let io = Rewind {
            head: buf[..seen].to_vec(),
            pos: 0,
            sock,
        };
        let _ = tokio::time::timeout(PROBE_DEADLINE, probe(io, peer, app)).await;
        return;
    }
    let _ = tokio::time::timeout(REFUSE_READ, async {
        let head = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: {}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
            tb_api::body::BUSY_RETRY_AFTER_S,
            BUSY_BODY.len()
        );
        sock.write_all(head.as_bytes()).await?;
        sock.write_all(BUSY_BODY.as_bytes()).await?;
        sock.shutdown().await?;
        let mut more = 0usize;
        while more < 64 * 1024 {
            match sock.read(&mut buf).await? {
                0 => break,
                n => more += n,
            }
        }
        Ok::<(), std::io::Error>(())
    })
    .await;
}

/// Requests of one connection in progress, how many ever started, and when the last one ended (or
/// the connection opened), for the idle timeout and the cut near the cap.
struct Activity {
    active: AtomicUsize,
    started: AtomicUsize,
    last_done: Mutex<Instant>,
}

struct InProgress(Arc<Activity>);

impl Drop for InProgress {
    fn drop(&mut self) {
        *self.0.last_done.lock().expect("activity lock") = Instant::now();
        self.0.active.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one connection from `peer`: HTTP/1.1 with the header-read timeout; closed once idle for
/// `idle_timeout` (no request in progress) or, gracefully, when `close` becomes true. While `open`
/// connections are near the cap ([`front_door::near_cap`]), one quiet for the pressure header timeout
/// ([`front_door::pressure_header_timeout_ms`]) is closed: at once when it never sent a whole request
/// head (counted as `tb_http_refused_total{reason="header_pressure"}`), after its response otherwise.
async fn connection(
    sock: TcpStream,
    peer: SocketAddr,
    app: axum::Router,
    cfg: EdgeConfig,
    open: &OpenConnections,
    mut close: watch::Receiver<bool>,
) {
    let _ = sock.set_nodelay(true);
    let activity = Arc::new(Activity {
        active: AtomicUsize::new(0),
        started: AtomicUsize::new(0),
        last_done: Mutex::new(Instant::now()),
    });
    let tower = TowerToHyperService::new(app);
    let act = activity.clone();
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        act.active.fetch_add(1, Ordering::Relaxed);
        act.started.fetch_add(1, Ordering::Relaxed);
        // The TCP peer; the API derives the client address from it (`Engine::client_addr`).
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(peer));
        let guard = InProgress(act.clone());
        let call = hyper::service::Service::call(&tower, req);
        async move {
            let r = call.await;
            drop(guard);
            r
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(cfg.header_timeout)
        .max_headers(tb_core::limits::MAX_HEADERS_CAP)
        .keep_alive(true);
    let conn = builder.serve_connection(TokioIo::new(sock), svc);
    tokio::pin!(conn);
    let pressure_timeout = Duration::from_millis(front_door::pressure_header_timeout_ms(
        cfg.header_timeout.as_millis() as u64,
    ));
    let tick = (cfg.idle_timeout.min(pressure_timeout) / 4)
        .clamp(Duration::from_millis(20), Duration::from_secs(1));
    let mut ticks = tokio::time::interval(tick);
    let mut closing = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            _ = close.wait_for(|c| *c), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = ticks.tick() => {
                let active = activity.active.load(Ordering::Relaxed);
                let quiet = activity.last_done.lock().expect("activity lock").elapsed();
                let pressed = active == 0
                    && quiet >= pressure_timeout
                    && front_door::near_cap(open.get(), cfg.max_connections);
                if pressed && activity.started.load(Ordering::Relaxed) == 0 {
                    // Nothing was asked: dropping the connection loses nothing (a graceful
                    // shutdown would wait for the first request's head).
                    metrics::counter!("tb_http_refused_total", "reason" => "header_pressure").increment(1);
                    return;
                }
                if !closing && active == 0 && (pressed || quiet >= cfg.idle_timeout) {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
}

/// Answers the one probe of a connection over the cap with `app` (keep-alive off, its head within
/// [`REFUSE_READ`]); a request that is not a probe (pipelined after it, say) gets the 503 `unavailable`
/// of a full server.
async fn probe(io: Rewind, peer: SocketAddr, app: axum::Router) {
    let tower = TowerToHyperService::new(app);
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        let call = front_door::is_probe(req.method().as_str(), req.uri().path()).then(|| {
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
            hyper::service::Service::call(&tower, req)
        });
        async move {
            match call {
                Some(c) => c.await,
                None => Ok(busy_response()),
            }
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(REFUSE_READ)
        .max_headers(tb_core::limits::MAX_HEADERS_CAP)
        .keep_alive(false);
    if let Err(e) = builder.serve_connection(TokioIo::new(io), svc).await {
        tracing::debug!(error = %e, "a probe over the cap ended with an error");
    }
}

/// The 503 `unavailable` (`Retry-After: 1`) of a full server, as a response.
fn busy_response() -> axum::response::Response {
    let mut r = axum::response::Response::new(axum::body::Body::from(BUSY_BODY));
    *r.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    let h = r.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    h.insert(
        http::header::RETRY_AFTER,
        tb_api::body::BUSY_RETRY_AFTER_S.into(),
    );
    r
}

/// A socket whose first bytes were read already: `head` is read again before the socket.
struct Rewind {
    head: Vec<u8>,
    pos: usize,
    sock: TcpStream,
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if self.pos < self.head.len() {
            let n = (self.head.len() - self.pos).min(buf.remaining());
            let from = self.pos;
            buf.put_slice(&self.head[from..from + n]);
            self.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.sock).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.sock).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.sock).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.sock).poll_shutdown(cx)
    }
}

/// Descriptors kept for the store, the listener, outbound calls and logs beyond the connection cap.
const FD_RESERVE: u64 = 128;

/// Raises the soft open-files limit to the hard one (Unix) and warns when `max_connections` plus a
/// reserve of [`FD_RESERVE`] does not fit under it: then accept runs into EMFILE (and backs off) before
/// the cap answers 503. Returns the soft limit in effect.
pub fn fit_open_files_limit(max_connections: usize) -> Option<u64> {
    #[cfg(unix)]
    {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit on this process with a valid rlimit struct.
        unsafe {
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
                return None;
            }
            if r.rlim_cur < r.rlim_max {
                let want = libc::rlimit {
                    rlim_cur: r.rlim_max,
                    rlim_max: r.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                    r.rlim_cur = r.rlim_max;
                }
            }
        }
        #[allow(clippy::unnecessary_cast)] // rlim_t is not u64 on every Unix
        let soft = r.rlim_cur as u64;
        if max_connections as u64 + FD_RESERVE > soft {
            tracing::warn!(
                max_connections,
                open_files_limit = soft,
                "[server].max_connections plus a reserve of {FD_RESERVE} is over the open-files limit: accept will pause on EMFILE before the cap answers 503; lower max_connections or raise the limit (ulimit -n)"
            );
        }
        Some(soft)
    }
    #[cfg(not(unix))]
    {
        let _ = max_connections;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server of `/health` under `cfg` on an ephemeral loopback port, on a runtime of its own (the
    /// accept loop is not `Send`); its address and stop switch.
    fn start(cfg: EdgeConfig) -> (SocketAddr, watch::Sender<bool>) {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std_listener.set_nonblocking(true).unwrap();
        let addr = std_listener.local_addr().unwrap();
        let (tx, rx) = watch::channel(false);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = TcpListener::from_std(std_listener).unwrap();
                let app =
                    axum::Router::new().route("/health", axum::routing::get(|| async { "ok" }));
                serve(
                    listener,
                    app,
                    cfg,
                    Vec::new(),
                    Arc::new(OpenConnections::default()),
                    rx,
                )
                .await;
            });
        });
        (addr, tx)
    }

    fn cfg(max_connections: usize) -> EdgeConfig {
        EdgeConfig {
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(5),
            max_connections,
            max_connections_per_client: max_connections,
            shutdown_grace: Duration::from_millis(100),
        }
    }

    /// When the server closed `s`, counted from `t0`; `None` when it is still open at `deadline`.
    async fn closed_at(mut s: TcpStream, t0: Instant, deadline: Instant) -> Option<Duration> {
        let mut b = [0u8; 16];
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut b)).await {
            Ok(Ok(0)) | Ok(Err(_)) => Some(t0.elapsed()),
            _ => None,
        }
    }

    /// Opens `n` connections that send nothing; when each was closed, within `within`.
    async fn header_less(addr: SocketAddr, n: usize, within: Duration) -> Vec<Option<Duration>> {
        let t0 = Instant::now();
        let deadline = t0 + within;
        let mut ends = Vec::new();
        for _ in 0..n {
            let s = TcpStream::connect(addr).await.unwrap();
            ends.push(tokio::spawn(closed_at(s, t0, deadline)));
        }
        let mut at = Vec::new();
        for e in ends {
            at.push(e.await.unwrap());
        }
        at
    }

    /// 8 of 8 slots held by connections that send nothing: after the pressure timeout (1 s, under the
    /// 10 s header timeout) they are cut while 6 or more (three quarters) are open: 3 of them (the
    /// accept loop runs on one thread here, so the count is exact), the other 5 stay. Only the lower
    /// bound is tight (the cut never comes before the pressure timeout); the upper one leaves a busy
    /// machine 4 s of slack over the 250 ms tick, and the idle timeout is out of the way (30 s).
    #[tokio::test]
    async fn near_the_cap_header_less_connections_are_cut_after_the_pressure_timeout() {
        let (addr, _stop) = start(EdgeConfig {
            idle_timeout: Duration::from_secs(30),
            ..cfg(8)
        });
        let at = header_less(addr, 8, Duration::from_secs(5)).await;
        let cut: Vec<_> = at.iter().flatten().collect();
        assert_eq!(cut.len(), 3, "{at:?}");
        assert!(
            cut.iter()
                .all(|t| **t >= Duration::from_millis(950) && **t < Duration::from_secs(5)),
            "{at:?}"
        );
    }

    /// Under three quarters of the cap (5 of 8) the header timeout (10 s) is the only limit.
    #[tokio::test]
    async fn far_from_the_cap_header_less_connections_keep_the_header_timeout() {
        let (addr, _stop) = start(cfg(8));
        let at = header_less(addr, 5, Duration::from_millis(2500)).await;
        assert_eq!(at, vec![None; 5]);
    }
}
