//! The triggers.v2 orchestrator side (first part) against a private nats-server:
//! register (accepted, refused on a bad hash or a reserved name), fetch, heartbeats and liveness.
//! Skips with a printed reason without `/usr/sbin/nats-server`, unless `CI` is set.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tb_core::service::{liveness, Liveness};
use tb_store::sqlite::SqliteStore;
use tb_store::Store;
use tb_wire::manifest::{hash, Manifest};
use tb_wire::time::WireTime;
use tb_wire::{json, subjects, Heartbeat, RegisterReply};
use trigger_bridge_engine::{orchestrator, Catalog, Engine};

fn manifest(service: &str) -> Manifest {
    let mut m: Manifest = serde_json::from_value(serde_json::json!({
        "protocol_version": "1.0.0", "service": service, "service_version": "dev",
        "actions": [{"name": "send_inapp", "input_schema": {"type": "object"}, "result_schema": null,
                     "timeout_ms": 30000, "dlq": format!("triggers.v2.dlq.{service}.send_inapp")}],
        "service_sources": [{"name": "nats", "transport": "nats", "default": "triggers.v2.svc.inbound"}],
        "supports_nodes": ["mapping"]
    }))
    .unwrap();
    m.manifest_hash = hash(&m);
    m
}

async fn request(client: &async_nats::Client, subject: &str, body: Vec<u8>) -> serde_json::Value {
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        client.request(subject.to_string(), body.into()),
    )
    .await
    .expect("a reply within 10 s")
    .expect("a reply");
    serde_json::from_slice(&r.payload).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_fetch_and_heartbeats_go_through_the_store() {
    let Some(n) = trigger_bridge_engine::testing::NatsServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    let engine = Engine::start(store.clone(), Catalog::new(vec![], vec![], vec![]))
        .await
        .unwrap();
    let url = n.url();
    let (stop, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(orchestrator::run(
        engine.clone(),
        async_nats::connect(&url).await.unwrap(),
        rx,
    ));
    let svc = async_nats::connect(&url).await.unwrap();
    // Wait until the orchestrator listens (no responders until then).
    let deadline = Instant::now() + Duration::from_secs(10);
    let m = manifest("svc");
    let body = json::to_vec(&m, false).unwrap();
    let reply = loop {
        match svc
            .request(subjects::MANIFEST_REGISTER, body.clone().into())
            .await
        {
            Ok(r) => break r,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("no orchestrator: {e}"),
        }
    };
    // Accepted: the reply's bytes are Go's `{"flows":null}`.
    assert_eq!(
        std::str::from_utf8(&reply.payload).unwrap(),
        r#"{"flows":null}"#
    );
    let stored = store.get_service("svc").await.unwrap().unwrap();
    assert_eq!(stored.manifest_hash, m.manifest_hash);
    assert_eq!(
        liveness(stored.last_heartbeat_at, stored.shutting_down, 0),
        Liveness::Registered
    );

    // Refusals are replies with `error`, never silence.
    let mut bad = manifest("svc");
    bad.manifest_hash = "sha256:00".into();
    let r: RegisterReply = serde_json::from_value(
        request(
            &svc,
            subjects::MANIFEST_REGISTER,
            json::to_vec(&bad, false).unwrap(),
        )
        .await,
    )
    .unwrap();
    assert_eq!(r.error, "manifest_hash_mismatch");
    let reserved = manifest("source");
    let r = request(
        &svc,
        subjects::MANIFEST_REGISTER,
        json::to_vec(&reserved, false).unwrap(),
    )
    .await;
    assert!(r["error"].as_str().unwrap().contains("reserved"), "{r}");
    let r = request(&svc, subjects::MANIFEST_REGISTER, b"not json".to_vec()).await;
    assert!(
        r["error"].as_str().unwrap().contains("not valid JSON"),
        "{r}"
    );

    // Fetch returns what was stored.
    let f = request(
        &svc,
        subjects::MANIFEST_FETCH,
        br#"{"service":"svc"}"#.to_vec(),
    )
    .await;
    assert_eq!(f["manifest_hash"], m.manifest_hash.as_str());
    let f = request(
        &svc,
        subjects::MANIFEST_FETCH,
        br#"{"service":"nope"}"#.to_vec(),
    )
    .await;
    assert!(f["error"].as_str().unwrap().contains("not registered"));

    // A heartbeat is recorded; liveness follows it (down after 3 missed beats, 15 s).
    let hb = Heartbeat {
        service: "svc".into(),
        service_version: "dev".into(),
        manifest_hash: m.manifest_hash.clone(),
        started_at: WireTime::now(),
        now: WireTime::now(),
        shutting_down: false,
    };
    svc.publish(
        subjects::HEARTBEAT,
        json::to_vec(&hb, false).unwrap().into(),
    )
    .await
    .unwrap();
    svc.flush().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let at = loop {
        let s = store.get_service("svc").await.unwrap().unwrap();
        if let Some(t) = s.last_heartbeat_at {
            assert_eq!(s.heartbeat_hash.as_deref(), Some(m.manifest_hash.as_str()));
            break t;
        }
        assert!(Instant::now() < deadline, "the heartbeat was not recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(liveness(Some(at), false, at + 14_999), Liveness::Up);
    assert_eq!(liveness(Some(at), false, at + 15_000), Liveness::Down);

    // A second replica (another start time, another build) that says it is shutting down: the
    // service stays up on the first; each replica is kept with its own hash.
    let second = Heartbeat {
        started_at: WireTime::from_unix_nanos(hb.started_at.unix_nanos() + 1_000),
        manifest_hash: format!("sha256:{}", "0".repeat(64)),
        shutting_down: true,
        ..hb.clone()
    };
    // Arrives at least a few ms after the first.
    tokio::time::sleep(Duration::from_millis(5)).await;
    svc.publish(
        subjects::HEARTBEAT,
        json::to_vec(&second, false).unwrap().into(),
    )
    .await
    .unwrap();
    svc.flush().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let s = loop {
        let s = store.get_service("svc").await.unwrap().unwrap();
        if s.replicas.len() == 2 {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the second replica was not recorded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let now = trigger_bridge_engine::clock::now_ms();
    assert_eq!(orchestrator::summary_of(&s, now).liveness, Liveness::Up);
    assert!(s.shutting_down, "the service row holds the last heartbeat");
    let hashes: Vec<&str> = s
        .replicas
        .iter()
        .map(|r| r.manifest_hash.as_str())
        .collect();
    assert_eq!(
        hashes,
        [m.manifest_hash.as_str(), second.manifest_hash.as_str()]
    );
    // Once the first is silent for 15 s only the draining one counts; then both are down.
    let last = s
        .replicas
        .iter()
        .map(|r| r.last_heartbeat_at)
        .max()
        .unwrap();
    assert!(last > at, "the second beat arrived after the first");
    assert_eq!(
        orchestrator::summary_of(&s, at + 15_000).liveness,
        Liveness::Draining
    );
    assert_eq!(
        orchestrator::summary_of(&s, last + 15_000).liveness,
        Liveness::Down
    );
    stop.send(true).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_register_reply_carries_the_flows_and_holds_back_timer_lineages_the_manifest_fails() {
    let Some(n) = trigger_bridge_engine::testing::NatsServer::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    let wf = |id: &str, durable_timer: bool| tb_core::workflow::Workflow {
        id: id.into(),
        executor: tb_core::workflow::Executor::Nats {
            service: "svc".into(),
            action: "send_inapp".into(),
            durable_timer,
        },
    };
    let engine = Engine::start(
        store,
        Catalog::new(vec![], vec![], vec![wf("plain", false), wf("timer", true)]),
    )
    .await
    .unwrap();
    let (_stop, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(orchestrator::run(
        engine.clone(),
        async_nats::connect(n.url()).await.unwrap(),
        rx,
    ));
    let svc = async_nats::connect(n.url()).await.unwrap();
    let register = |m: Manifest| {
        let svc = svc.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match svc
                    .request(
                        subjects::MANIFEST_REGISTER,
                        json::to_vec(&m, false).unwrap().into(),
                    )
                    .await
                {
                    Ok(r) => break serde_json::from_slice::<RegisterReply>(&r.payload).unwrap(),
                    Err(_) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    Err(e) => panic!("no orchestrator: {e}"),
                }
            }
        }
    };
    // Without durable_timer.v1 only the plain flow is released.
    let reply = register(manifest("svc")).await;
    let ids: Vec<String> = reply.flows.unwrap().into_iter().map(|f| f.id).collect();
    assert_eq!(ids, ["plain"]);
    // With the capability (and the node's target one of its nats sources) both are.
    let mut m = manifest("svc");
    m.runtime_capabilities = Some(vec![tb_wire::durable_timer::CAPABILITY.into()]);
    m.manifest_hash = hash(&m);
    let flows = register(m).await.flows.unwrap();
    assert_eq!(
        flows.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(),
        ["plain", "timer"]
    );
    let body: serde_json::Value = serde_json::from_str(flows[1].body.get()).unwrap();
    assert_eq!(body["durable_timer"], true);
    assert_eq!(
        body["nodes"][0]["config"]["target"],
        "triggers.v2.svc.inbound"
    );
}
