//! `GET /v1/runs/{id}/events`: a run's event log as an async stream of Server-Sent Events.

use futures_util::{Stream, StreamExt};
use serde_json::Value;

use crate::call::{seg, Call};
use crate::error::{Error, Result};
use crate::Client;

/// One event of a run's log.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEvent {
    /// The event's sequence number in the run (resume after it with `after`).
    pub seq: Option<u64>,
    /// The event type, e.g. `run.started`, `run.completed`.
    pub kind: String,
    /// The RunEventDoc.
    pub data: Value,
}

impl Client {
    /// The run's events from the start (or after sequence `after`), as they happen. The stream ends
    /// after the run's terminal event, or at the first error (yielded). Connecting is retried like any
    /// call; a stream that breaks later is not: reconnect with the last `seq` seen.
    pub async fn run_events(
        &self,
        run: &str,
        after: Option<u64>,
    ) -> Result<impl Stream<Item = Result<RunEvent>> + use<>> {
        let path = format!("/v1/runs/{}/events", seg(run));
        let url = format!("{}{path}", self.base);
        let mut call = Call::get(path).header("accept", "text/event-stream");
        if let Some(n) = after {
            call = call.header("last-event-id", n.to_string());
        }
        let resp = self
            .retrying(|| self.start(&call, &url, None, false))
            .await?;
        let base = self.base.clone();
        let events = sse_stream::SseStream::from_bytes_stream(resp.bytes_stream());
        Ok(events.filter_map(move |item| {
            let base = base.clone();
            let url = url.clone();
            async move {
                match item {
                    Err(e) => Some(Err(Error::Transport {
                        url: base,
                        detail: e.to_string(),
                    })),
                    // Keep-alive comments and retry hints carry no data.
                    Ok(sse) => {
                        let data = sse.data?;
                        Some(
                            serde_json::from_str(&data)
                                .map(|data| RunEvent {
                                    seq: sse.id.and_then(|i| i.parse().ok()),
                                    kind: sse.event.unwrap_or_else(|| "message".into()),
                                    data,
                                })
                                .map_err(|e| Error::Decode {
                                    url,
                                    status: 200,
                                    detail: e.to_string(),
                                }),
                        )
                    }
                }
            }
        }))
    }
}
