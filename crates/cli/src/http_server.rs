//! The HTTP/1.1 accept loop of `serve` (issue #9 defect 1): a header-read timeout, an idle keep-alive
//! timeout, a cap on open connections (503 + `Retry-After` beyond it), accept errors that back off
//! instead of spinning (EMFILE), and a graceful shutdown that waits for open connections at most
//! `shutdown_grace` before closing them.
//!
//! Metrics: `tb_http_connections_open` (gauge), `tb_http_refused_total{reason="connection_cap"}`
//! (the body reasons are counted by `tb_api::body`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
/// Longest read of an over-cap request's head, and of what follows the 503.
const REFUSE_READ: Duration = Duration::from_millis(250);
/// Longest pause after an accept error that is not about one connection (EMFILE, ENFILE, ENOBUFS...).
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

const BUSY_BODY: &str =
    r#"{"error":"unavailable","message":"too many open connections; retry shortly"}"#;

/// Serves `app` on `listener` until `stop` becomes true; then stops accepting, asks every connection to
/// close after its current request, waits at most `cfg.shutdown_grace` and closes the rest.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    cfg: EdgeConfig,
    open: Arc<OpenConnections>,
    mut stop: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(cfg.max_connections));
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
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
                    match slots.clone().try_acquire_owned() {
                        Ok(slot) => {
                            let app = app.clone();
                            let open = open.clone();
                            let close = close_rx.clone();
                            conns.spawn(async move {
                                open.0.fetch_add(1, Ordering::Relaxed);
                                metrics::gauge!("tb_http_connections_open").increment(1.0);
                                connection(sock, peer, app, cfg, close).await;
                                metrics::gauge!("tb_http_connections_open").decrement(1.0);
                                open.0.fetch_sub(1, Ordering::Relaxed);
                                drop(slot);
                            });
                        }
                        Err(_) => {
                            metrics::counter!("tb_http_refused_total", "reason" => "connection_cap").increment(1);
                            if let Ok(p) = refusing.clone().try_acquire_owned() {
                                tokio::spawn(async move {
                                    refuse(sock).await;
                                    drop(p);
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

/// Answers 503 `unavailable` with `Retry-After: 1` on a connection over the cap and closes it. It
/// first reads the request head (at most 8 KiB, at most [`REFUSE_READ`]), since HTTP clients refuse
/// an answer that comes before their request, and after answering reads what else comes for a moment,
/// so the client reads the answer instead of a reset.
async fn refuse(mut sock: TcpStream) {
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

/// Requests of one connection in progress and when the last one ended (for the idle timeout).
struct Activity {
    active: AtomicUsize,
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
/// `idle_timeout` (no request in progress) or, gracefully, when `close` becomes true.
async fn connection(
    sock: TcpStream,
    peer: std::net::SocketAddr,
    app: axum::Router,
    cfg: EdgeConfig,
    mut close: watch::Receiver<bool>,
) {
    let _ = sock.set_nodelay(true);
    let activity = Arc::new(Activity {
        active: AtomicUsize::new(0),
        last_done: Mutex::new(Instant::now()),
    });
    let tower = TowerToHyperService::new(app);
    let act = activity.clone();
    let svc = hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
        act.active.fetch_add(1, Ordering::Relaxed);
        // The peer address, for the per-source rate limit (`[rate_limits]`).
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
    let tick = (cfg.idle_timeout / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
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
            _ = ticks.tick(), if !closing => {
                let idle = activity.active.load(Ordering::Relaxed) == 0
                    && activity.last_done.lock().expect("activity lock").elapsed() >= cfg.idle_timeout;
                if idle {
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
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
