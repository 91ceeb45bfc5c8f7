//! `GET /.well-known/openwop`: the OpenWOP discovery document (OpenWOP trigger-bridge §5). It advertises
//! only what this host serves: core fields, `triggerBridge` (webhook ingest with Standard Webhooks
//! signing, dedup, retry policy, the RFC 0232 dead-letter read), the ancestry endpoint, and the
//! fixtures: `conformance-noop` and the workflows the configuration marks `fixture = true`
//! ([`tb_engine::Catalog::fixtures`]). Unauthenticated; `Cache-Control` and a strong `ETag`
//! (`If-None-Match` -> 304).

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::AppState;

/// Host facts the discovery document and the OpenWOP endpoints need.
#[derive(Debug, Clone)]
pub struct HostInfo {
    /// This host's id (`crossHostCausation.hostId`, ancestry `hostId`).
    pub host_id: String,
    /// Days a trigger dead letter is kept (RFC 0232 `retentionDays`).
    pub dead_letter_retention_days: u32,
    /// Largest dead-letter page (RFC 0232 `maxPageSize`, 1..=1000).
    pub dead_letter_max_page: u32,
}

impl Default for HostInfo {
    fn default() -> Self {
        HostInfo {
            host_id: "trigger-bridge".into(),
            dead_letter_retention_days: 14,
            dead_letter_max_page: 100,
        }
    }
}

/// Builds the discovery document from the engine's catalog and the host facts.
pub fn document(st: &AppState) -> Value {
    let max_body = st
        .engine
        .catalog()
        .subscriptions()
        .map(|s| s.max_body_bytes)
        .max()
        .unwrap_or(1 << 20);
    let default_retry = tb_core::retry::RetryPolicy::default();
    let queue_bus = st
        .engine
        .queue_bus
        .load(std::sync::atomic::Ordering::Relaxed);
    let sources = if queue_bus {
        json!(["webhook", "schedule", "queue"])
    } else {
        json!(["webhook", "schedule"])
    };
    let mut doc = json!({
        "protocolVersion": "1.0",
        "supportedEnvelopes": [],
        "schemaVersions": {},
        "limits": {
            "clarificationRounds": 0,
            "schemaRounds": 0,
            "envelopesPerTurn": 0,
            "maxRequestBodyBytes": max_body,
        },
        "implementation": {"name": "trigger-bridge", "version": env!("CARGO_PKG_VERSION"), "vendor": "trigger-bridge"},
        "supportedTransports": ["rest"],
        "fixtures": st.engine.catalog().fixtures(),
        "triggerBridge": {
            "supported": true,
            "subscriptionStates": ["active", "paused", "failed", "dead-lettered"],
            "dedup": true,
            "retryPolicy": {"maxAttempts": default_retry.max_attempts, "backoff": default_retry.backoff},
            // Schedules are built in (every worker replica runs the scheduler); queues
            // only with a queue bus wired (`serve --nats-url`).
            "sources": sources,
            "ingestion": {
                "externalSources": ["webhook"],
                "maxBodyBytes": max_body,
                "verification": ["webhook-signature"],
                "registrationEndpoint": st.secrets.is_some(),
                "inboundSigning": ["standard-webhooks-1"],
            },
            "deadLetter": {
                "retentionDays": st.host.dead_letter_retention_days,
                "maxPageSize": st.host.dead_letter_max_page,
            },
        },
        "webhooks": {"supported": true, "signatureAlgorithms": ["v1", "standard-webhooks-1"],
            "durable": st.engine.webhooks_durable.load(std::sync::atomic::Ordering::Relaxed)},
        "deadLetter": {"supported": true, "retentionDays": st.host.dead_letter_retention_days},
        // RFC 0052 as the profile composes it: durable cron, one run per tick, paused schedules skip;
        // no delayed one-shot runs, no calendars.
        "scheduling": {"supported": true, "cron": true, "delayed": false, "calendar": false},
        "multiAgent": {"executionModel": {"crossHostCausation": {
            "supported": false,
            "hostId": st.host.host_id,
            "ancestryEndpointSupported": true,
        }}},
    });
    if queue_bus {
        doc["queueBus"] =
            json!({"supported": true, "backends": ["nats"], "deadLetterSupported": true});
    }
    doc
}

/// `GET /.well-known/openwop`.
#[utoipa::path(get, path = "/.well-known/openwop", tag = "discovery", responses((status = 200, description = "Discovery document"), (status = 304, description = "Not modified")))]
pub async fn discovery(State(st): State<AppState>, headers: HeaderMap) -> Response {
    let body = document(&st).to_string();
    let etag = format!("\"{}\"", &hex_sha(&body)[..32]);
    let cache = [
        (header::CACHE_CONTROL, "public, max-age=60".to_string()),
        (header::ETAG, etag.clone()),
    ];
    let matches = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        // Weak comparison (RFC 9110 §13.1.2): `W/"x"` matches `"x"`.
        .is_some_and(|v| {
            v.split(',')
                .map(|t| t.trim().trim_start_matches("W/"))
                .any(|t| t == etag || t == "*")
        });
    if matches {
        return (StatusCode::NOT_MODIFIED, cache).into_response();
    }
    (
        StatusCode::OK,
        cache,
        [(header::CONTENT_TYPE, "application/json".to_string())],
        body,
    )
        .into_response()
}

fn hex_sha(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
