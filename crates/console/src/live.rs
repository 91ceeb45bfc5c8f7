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

/// The feed: a counter bumped once per coalesced change.
#[derive(Clone)]
pub struct Hub {
    rx: watch::Receiver<u64>,
    slots: Arc<Semaphore>,
    per_login: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
}

/// A login's share of the open streams, given back when its stream ends.
struct LoginSlot {
    per_login: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    login: String,
}

impl LoginSlot {
    fn take(hub: &Hub, login: &str) -> Option<LoginSlot> {
        let mut m = hub.per_login.lock().unwrap_or_else(|e| e.into_inner());
        let n = m.entry(login.to_string()).or_default();
        if *n >= MAX_STREAMS_PER_LOGIN {
            return None;
        }
        *n += 1;
        Some(LoginSlot {
            per_login: hub.per_login.clone(),
            login: login.to_string(),
        })
    }
}

impl Drop for LoginSlot {
    fn drop(&mut self) {
        let mut m = self.per_login.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.login) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.login);
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
/// 15 s. 429 beyond [`MAX_STREAMS_PER_LOGIN`] streams of one login, 503 beyond [`MAX_STREAMS`] in all.
pub async fn events(
    State(c): State<Console>,
    axum::Extension(op): axum::Extension<crate::operator::Operator>,
) -> Response {
    let Some(mine) = LoginSlot::take(&c.hub, &op.token_sha256) else {
        return (
            StatusCode::TOO_MANY_REQUESTS,
            "too many open live pages for this login",
        )
            .into_response();
    };
    let Ok(all) = c.hub.slots.clone().try_acquire_owned() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "too many open live pages").into_response();
    };
    let slot = (mine, all);
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
