//! Reading the services' dead letters: the DLQ entries kept in the stream
//! `triggers-dlq` ([`crate::completions::DLQ_STREAM`]), newest first, for the API and CLI. Read with
//! an ordered ephemeral consumer, bounded: at most [`MAX_SCAN`] entries are looked at per request.

use std::collections::VecDeque;
use std::time::Duration;

use async_nats::jetstream::context::GetStreamErrorKind;
use async_nats::jetstream::{self, consumer::pull::OrderedConfig, consumer::DeliverPolicy};
use futures_util::StreamExt;
use tb_wire::DlqEntry;

use crate::Engine;

/// Most entries one listing looks at (the stream keeps 14 days).
pub const MAX_SCAN: usize = 10_000;
/// How long a listing waits for the next entry before it takes the stream as read.
const NEXT_WAIT: Duration = Duration::from_millis(500);

/// One DLQ entry as stored: its subject, stream sequence and the entry.
#[derive(Debug, Clone)]
pub struct Stored {
    pub subject: String,
    pub sequence: u64,
    pub entry: DlqEntry,
}

/// A listing: the newest entries first, how many were looked at, and whether the scan stopped at
/// [`MAX_SCAN`] before the end.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub entries: Vec<Stored>,
    pub scanned: usize,
    pub truncated: bool,
}

/// The newest `limit` DLQ entries of `service` (its `triggers.v2.dlq.<service>.>` subjects), or of
/// every service and source when `None`. Errors: no NATS server is configured, or JetStream failed.
/// A stream that does not exist yet lists nothing.
pub async fn list(engine: &Engine, service: Option<&str>, limit: usize) -> Result<Listing, String> {
    let Some(client) = engine.nats() else {
        return Err("no NATS server is configured (serve --nats-url)".into());
    };
    let js = jetstream::new(client);
    let stream = match js.get_stream(crate::completions::DLQ_STREAM).await {
        Ok(s) => s,
        // Not created yet (no bridge with NATS has run): nothing to list.
        Err(e)
            if matches!(e.kind(), GetStreamErrorKind::JetStream(j)
                if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
        {
            return Ok(Listing::default())
        }
        Err(e) => return Err(format!("reading {}: {e}", crate::completions::DLQ_STREAM)),
    };
    let filter = match service {
        Some(s) => tb_wire::subjects::dlq(s, ">"),
        None => "triggers.v2.dlq.>".to_string(),
    };
    let consumer = stream
        .create_consumer(OrderedConfig {
            filter_subject: filter,
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(|e| format!("reading {}: {e}", crate::completions::DLQ_STREAM))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| format!("reading {}: {e}", crate::completions::DLQ_STREAM))?;
    let limit = limit.max(1);
    let mut out = Listing::default();
    let mut newest: VecDeque<Stored> = VecDeque::with_capacity(limit);
    while let Ok(Some(Ok(m))) = tokio::time::timeout(NEXT_WAIT, messages.next()).await {
        out.scanned += 1;
        let (sequence, pending) = m.info().map_or((0, 0), |i| (i.stream_sequence, i.pending));
        if let Ok(entry) = serde_json::from_slice::<DlqEntry>(&m.payload) {
            if newest.len() == limit {
                newest.pop_front();
            }
            newest.push_back(Stored {
                subject: m.subject.to_string(),
                sequence,
                entry,
            });
        }
        if pending == 0 {
            break;
        }
        if out.scanned >= MAX_SCAN {
            out.truncated = true;
            break;
        }
    }
    out.entries = newest.into_iter().rev().collect();
    Ok(out)
}
