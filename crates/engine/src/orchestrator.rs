//! The orchestrator side of `triggers.v2`: answers `triggers.v2.manifest.register` and
//! `.fetch`, and records heartbeats, all against the store, so every replica answers from the same
//! record (each subscribes in one queue group: one replica handles each request). A register reply
//! carries the service's flows ([`crate::flows`]); at start every replica broadcasts the flows of the
//! registered services it runs workflows for, and consumes CompletionEvents
//! ([`crate::completions`]). Rules are `tb_wire::manifest::validate`,
//! `tb_wire::durable_timer::check_release` and `tb_core::service::liveness`.

use std::sync::Arc;

use futures_util::StreamExt;
use tb_wire::manifest::{validate, Manifest};
use tb_wire::{json, subjects, Heartbeat, RegisterReply};

use crate::{clock, store_err, Engine};

/// The queue group every replica's orchestrator subscriptions share.
pub const QUEUE_GROUP: &str = "trigger-bridge-orchestrator";

/// Register, fetch and heartbeat requests handled at once per replica.
const MAX_IN_FLIGHT: usize = 64;

/// The largest manifest a register accepts, in bytes (256 KiB; the NATS server's own limit is
/// usually 1 MiB).
pub const MAX_MANIFEST_BYTES: usize = 256 * 1024;

#[derive(Clone, Copy)]
enum Kind {
    Register,
    Fetch,
    Heartbeat,
}

/// What a service's replicas say about it (`tb_core::service::summarize`). A record without replica
/// rows is `registered` (before its first heartbeat).
pub fn summary_of(s: &tb_store::ServiceRecord, now_ms: i64) -> tb_core::service::Summary {
    let beats: Vec<tb_core::service::Beat> = s
        .replicas
        .iter()
        .map(|r| tb_core::service::Beat {
            at_ms: r.last_heartbeat_at,
            shutting_down: r.shutting_down,
            same_build: r.manifest_hash == s.manifest_hash,
        })
        .collect();
    tb_core::service::summarize(&beats, now_ms)
}

/// The answer to a register request body: validated, stored, replied with the service's flows
/// (`null` when none; Durable Timer flows its manifest does not pass are held back and logged).
/// Errors are replies with `error` set, never silence.
pub async fn register(engine: &Engine, body: &[u8]) -> RegisterReply {
    let refuse = |e: String| RegisterReply {
        error: e,
        flows: None,
    };
    if body.len() > MAX_MANIFEST_BYTES {
        return refuse(format!(
            "manifest_too_large: {} bytes, at most {MAX_MANIFEST_BYTES}",
            body.len()
        ));
    }
    let manifest: Manifest = match serde_json::from_slice(body) {
        Ok(m) => m,
        Err(e) => {
            return refuse(format!(
                "manifest is not valid JSON of the manifest shape: {e}"
            ))
        }
    };
    if let Err(e) = validate(&manifest) {
        return refuse(e);
    }
    let stored = serde_json::from_slice::<serde_json::Value>(body).unwrap_or_default();
    match engine
        .store
        .register_service(
            &manifest.service,
            &manifest.service_version,
            stored,
            &manifest.manifest_hash,
            clock::now_ms(),
        )
        .await
    {
        Ok(_) => {
            let catalog = engine.catalog();
            let (flows, refused) = crate::flows::for_service(catalog.workflows(), &manifest);
            for (w, why) in &refused {
                tracing::warn!(service = %manifest.service, workflow = %w, why = %why, "flow not released to the service");
            }
            tracing::info!(service = %manifest.service, hash = %manifest.manifest_hash, flows = flows.len(), "triggers.v2 service registered");
            RegisterReply {
                error: String::new(),
                flows: (!flows.is_empty()).then_some(flows),
            }
        }
        Err(e) => refuse(format!("unavailable: {}", store_err(e).message)),
    }
}

/// The answer to a fetch (`{"service": NAME}`): the stored manifest, or `{"error": ...}`.
pub async fn fetch(engine: &Engine, body: &[u8]) -> serde_json::Value {
    let name = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["service"].as_str().map(str::to_string));
    let Some(name) = name else {
        return serde_json::json!({"error": "fetch takes {\"service\": NAME}"});
    };
    match engine.store.get_service(&name).await {
        Ok(Some(s)) => s.manifest,
        Ok(None) => serde_json::json!({"error": format!("service {name:?} is not registered")}),
        Err(e) => serde_json::json!({"error": format!("unavailable: {}", store_err(e).message)}),
    }
}

/// Records one heartbeat; a heartbeat of an unregistered service, or a malformed one, is logged and
/// dropped (a heartbeat has no reply).
pub async fn heartbeat(engine: &Engine, body: &[u8]) {
    let Ok(hb) = serde_json::from_slice::<Heartbeat>(body) else {
        tracing::debug!("malformed heartbeat dropped");
        return;
    };
    match engine
        .store
        .service_heartbeat(
            &hb.service,
            &hb.started_at.format(),
            &hb.manifest_hash,
            hb.shutting_down,
            clock::now_ms(),
        )
        .await
    {
        Ok(true) => {}
        Ok(false) => tracing::debug!(service = %hb.service, "heartbeat of an unregistered service"),
        Err(e) => tracing::warn!(service = %hb.service, error = %e, "heartbeat not recorded"),
    }
}

/// Publishes the flows of every registered service that this catalog's nats workflows name, on
/// `triggers.v2.flow.broadcast.<service>` (one FlowEnvelope per message; receivers apply by id and
/// version, so a repeat from another replica changes nothing). Returns how many were sent.
pub async fn broadcast(engine: &Engine, client: &async_nats::Client) -> usize {
    let catalog = engine.catalog();
    let mut services: Vec<&str> = catalog
        .workflows()
        .filter_map(|w| match &w.executor {
            tb_core::workflow::Executor::Nats { service, .. } => Some(service.as_str()),
            _ => None,
        })
        .collect();
    services.sort();
    services.dedup();
    let mut sent = 0;
    for name in services {
        let Ok(Some(svc)) = engine.store.get_service(name).await else {
            continue;
        };
        let manifest: Manifest = serde_json::from_value(svc.manifest).unwrap_or_default();
        let (flows, _) = crate::flows::for_service(catalog.workflows(), &manifest);
        for f in flows {
            let bytes = json::to_vec(&f, false).unwrap_or_default();
            if client
                .publish(subjects::broadcast(name), bytes.into())
                .await
                .is_ok()
            {
                sent += 1;
            }
        }
    }
    let _ = client.flush().await;
    sent
}

/// The orchestrator task: serves register, fetch and heartbeats, broadcasts flows once at start and
/// consumes CompletionEvents, until `stop`. Errors: a subscribe that failed (logged; the task ends).
pub async fn run(
    engine: Arc<Engine>,
    client: async_nats::Client,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let subs = async {
        Ok::<_, async_nats::SubscribeError>((
            client
                .queue_subscribe(subjects::MANIFEST_REGISTER, QUEUE_GROUP.into())
                .await?,
            client
                .queue_subscribe(subjects::MANIFEST_FETCH, QUEUE_GROUP.into())
                .await?,
            client
                .queue_subscribe(subjects::HEARTBEAT, QUEUE_GROUP.into())
                .await?,
        ))
    };
    let (mut reg, mut fet, mut hb) = match subs.await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "triggers.v2 orchestrator not started: subscribe failed");
            return;
        }
    };
    let completions = tokio::spawn(crate::completions::run(
        engine.clone(),
        client.clone(),
        stop.clone(),
    ));
    let sent = broadcast(&engine, &client).await;
    if sent > 0 {
        tracing::info!(flows = sent, "flows broadcast to registered services");
    }
    // Requests are answered concurrently (at most MAX_IN_FLIGHT at once per replica), so a flood of
    // heartbeats cannot hold a register reply past the service's 10 s; beyond that, requests wait
    // in the subscription (NATS drops what a slow subscriber cannot take).
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
    loop {
        let (kind, m) = tokio::select! {
            Some(m) = reg.next() => (Kind::Register, m),
            Some(m) = fet.next() => (Kind::Fetch, m),
            Some(m) = hb.next() => (Kind::Heartbeat, m),
            r = stop.changed() => if r.is_err() || *stop.borrow() { break } else { continue },
            else => break,
        };
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let (engine, client) = (engine.clone(), client.clone());
        tokio::spawn(async move {
            let reply = match kind {
                Kind::Register => Some(json::to_vec(&register(&engine, &m.payload).await, false)),
                Kind::Fetch => Some(json::to_vec(&fetch(&engine, &m.payload).await, false)),
                Kind::Heartbeat => {
                    heartbeat(&engine, &m.payload).await;
                    None
                }
            };
            if let (Some(Ok(bytes)), Some(to)) = (reply, m.reply) {
                let _ = client.publish(to, bytes.into()).await;
            }
            drop(permit);
        });
    }
    let _ = completions.await;
}
