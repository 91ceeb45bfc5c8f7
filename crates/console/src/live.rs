//! Live pages: one change feed per replica, fanned out to every open page over SSE
//! (`GET /ui/events`, `event: change`). A page's live region re-reads itself when told (htmx), so the
//! store is read once per change per open page, never polled per viewer.
//!
//! The feed wakes on this replica's commits (receipts, attempts: [`tb_engine::Engine::changes`]; session
//! changes; run ends) and on the store's cross-replica hints (PostgreSQL `NOTIFY` of due work, session
//! changes and configuration changes). Changes are coalesced for [`COALESCE`], so a burst of a thousand
//! webhooks is one refresh. Another replica's attempts raise no hint: while a page is open the feed
//! also ticks every [`IDLE_TICK`].

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::{watch, Semaphore};

use crate::Console;

/// Changes closer together than this are one refresh.
pub const COALESCE: Duration = Duration::from_millis(400);
/// While a page is open, a refresh at least this often (other replicas' attempts raise no hint).
pub const IDLE_TICK: Duration = Duration::from_secs(15);
/// Open event streams per replica; more are answered 503.
pub const MAX_STREAMS: usize = 256;
/// Open event streams per login (one per open tab); more are answered 429, so one login cannot take
/// every stream of the replica.
pub const MAX_STREAMS_PER_LOGIN: usize = 8;
/// Open event streams per API key, over all its logins: a quarter of [`MAX_STREAMS`]. A key can log
/// in as often as it likes, so the per-login cap alone let one read-only key hold every stream of the
/// replica; with this share at least four keys are needed. More are answered 429.
pub const MAX_STREAMS_PER_KEY: usize = MAX_STREAMS / 4;

/// Open streams per holder (a login, or an API key by its name).
type Counts = Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>;

/// The feed: a counter bumped once per coalesced change.
#[derive(Clone)]
pub struct Hub {
    rx: watch::Receiver<u64>,
    slots: Arc<Semaphore>,
    per_login: Counts,
    per_key: Counts,
}

/// A holder's share of the open streams, given back when its stream ends.
struct Share {
    counts: Counts,
    holder: String,
}

impl Share {
    /// One more stream of `holder` when it holds fewer than `max`.
    fn take(counts: &Counts, holder: &str, max: usize) -> Option<Share> {
        let mut m = counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(holder.to_string()).or_default();
        if *n >= max {
            if *n == 0 {
                m.remove(holder);
            }
            return None;
        }
        *n += 1;
        Some(Share {
            counts: counts.clone(),
            holder: holder.to_string(),
        })
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let mut m = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.holder) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.holder);
            }
        }
    }
}

impl Hub {
    /// The feed's counter now (bumped once per coalesced change).
    pub fn current(&self) -> u64 {
        *self.rx.borrow()
    }

    /// Starts the feed over `engine`'s change sources.
    pub fn start(engine: Arc<tb_engine::Engine>) -> Hub {
        let (tx, rx) = watch::channel(0u64);
        tokio::spawn(feed(engine, tx));
        Hub {
            rx,
            slots: Arc::new(Semaphore::new(MAX_STREAMS)),
            per_login: Default::default(),
            per_key: Default::default(),
        }
    }
}

async fn changed(rx: &mut Option<watch::Receiver<u64>>) {
    match rx {
        Some(r) => {
            if r.changed().await.is_err() {
                *rx = None;
                std::future::pending::<()>().await
            }
        }
        None => std::future::pending::<()>().await,
    }
}

async fn feed(engine: Arc<tb_engine::Engine>, tx: watch::Sender<u64>) {
    let mut local = Some(engine.changes.subscribe());
    let mut sessions = Some(engine.sessions.subscribe());
    let mut work = engine.store.wake_hints(tb_store::Wake::Work);
    let mut session_hints = engine.store.wake_hints(tb_store::Wake::Sessions);
    let mut config = engine.store.config_change_hints();
    let mut ends = engine.run_ends.subscribe();
    loop {
        tokio::select! {
            _ = changed(&mut local) => {}
            _ = changed(&mut sessions) => {}
            _ = changed(&mut work) => {}
            _ = changed(&mut session_hints) => {}
            _ = changed(&mut config) => {}
            r = ends.recv() => {
                if matches!(r, Err(tokio::sync::broadcast::error::RecvError::Closed)) {
                    ends = engine.run_ends.subscribe();
                }
            }
            _ = tokio::time::sleep(IDLE_TICK), if tx.receiver_count() > 1 => {}
        }
        if tx.is_closed() {
            return;
        }
        if !engine.is_closing() {
            tokio::time::sleep(COALESCE).await;
        }
        tx.send_modify(|n| *n += 1);
    }
}

/// `GET /ui/events`: `event: change` whenever something changed (coalesced), keep-alive comments every
/// 15 s. 429 beyond [`MAX_STREAMS_PER_LOGIN`] streams of one login or [`MAX_STREAMS_PER_KEY`] of one
/// API key (all its logins together), 503 beyond [`MAX_STREAMS`] in all.
pub async fn events(
    State(c): State<Console>,
    axum::Extension(op): axum::Extension<crate::operator::Operator>,
) -> Response {
    let Some(mine) = Share::take(&c.hub.per_login, &op.token_sha256, MAX_STREAMS_PER_LOGIN) else {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            "too many open live pages for this login",
        )
            .into_response();
    };
    let Some(key) = Share::take(&c.hub.per_key, &op.name, MAX_STREAMS_PER_KEY) else {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            "too many open live pages for this API key",
        )
            .into_response();
    };
    let Ok(all) = c.hub.slots.clone().try_acquire_owned() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "too many open live pages").into_response();
    };
    let slot = (mine, key, all);
    let mut rx = c.hub.rx.clone();
    rx.mark_unchanged();
    let engine = c.api.engine.clone();
    // On shutdown the stream ends (the feed wakes on the engine's close), so an open page neither
    // holds the server's shutdown for its grace period nor shows "live" against a closed server.
    let stream =
        futures_util::stream::unfold((rx, slot, engine), |(mut rx, slot, engine)| async move {
            rx.changed().await.ok()?;
            if engine.is_closing() {
                return None;
            }
            let n = *rx.borrow_and_update();
            let ev: Result<Event, Infallible> =
                Ok(Event::default().event("change").data(n.to_string()));
            Some((ev, (rx, slot, engine)))
        });
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}
