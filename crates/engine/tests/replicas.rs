//! Several replicas on one PostgreSQL database: two engines, each with its own store
//! handle (its own connection pool) on one throwaway schema, each running its own sync task on a
//! multi-thread runtime. A change made through A must take effect on B within 1 s: measured from the
//! moment A's call returned (committed) to B's first answer that shows it, with a bounded wait.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::HeaderMap;
use tb_core::binding::{Binding, BindingAction};
use tb_core::connector::ConnectorSpec;
use tb_core::run::RunStatus;
use tb_core::subscription::{SubscriptionInput, SubscriptionState};
use tb_core::wait::{WaitKind, WaitSpec};
use tb_core::workflow::{Executor, Workflow};
use tb_core::ErrorCode;
use tb_store::postgres::testing::TestDatabase;
use tb_store::postgres::{PgStore, PoolOptions};
use tb_store::Store;
use trigger_bridge_engine::ingest::{ingest, IngestAnswer};
use trigger_bridge_engine::registration::{register, RegistrationRequest, SecretStore};
use trigger_bridge_engine::sealing::SecretKey;
use trigger_bridge_engine::{
    capability, catalog::Verification, runs, sessions, sync, wake, worker, Catalog, Engine,
    SubscriptionConfig,
};

const SECRET: &str = "replicas-secret";
/// The most a change may take to reach the other replica.
const BUDGET: Duration = Duration::from_secs(1);
/// How long the bounded waits look before giving up (longer than the budget, so a slow run fails on
/// the figure, not on a timeout).
const GIVE_UP: Duration = Duration::from_secs(5);

fn catalog() -> Catalog {
    let sub = SubscriptionConfig::webhook("github", ConnectorSpec::Github, SECRET.as_bytes());
    let binding = Binding {
        rate_limit_per_min: 0,
        id: "on-push".into(),
        subscription: "github".into(),
        event_types: vec!["push".into()],
        filter: Default::default(),
        action: BindingAction::start_run("noop"),
        inputs: Default::default(),
    };
    let wf = Workflow {
        id: "noop".into(),
        executor: Executor::Noop,
    };
    // A session workflow for the wake-up tests.
    let chat = Workflow {
        id: "chat".into(),
        executor: Executor::Session {
            config: serde_json::json!({}),
            mailbox: Default::default(),
        },
    };
    Catalog::new(vec![sub], vec![binding], vec![wf, chat])
}

struct Replica {
    engine: Arc<Engine>,
    secrets: SecretStore,
    _dir: tempfile::TempDir,
}

/// One replica: its own pool on the shared schema, its own secrets dir, the shared sealing key, and
/// its sync task (stopped when `stop` is dropped).
async fn replica(
    db: &TestDatabase,
    key: &SecretKey,
    stop: &tokio::sync::watch::Sender<bool>,
) -> Replica {
    replica_of(db, key, stop, catalog()).await
}

/// [`replica`] over `catalog`.
async fn replica_of(
    db: &TestDatabase,
    key: &SecretKey,
    stop: &tokio::sync::watch::Sender<bool>,
    catalog: Catalog,
) -> Replica {
    let opts = PoolOptions {
        connections: 2,
        ..Default::default()
    };
    let store: Arc<dyn Store> = Arc::new(PgStore::connect(db.url(), opts).await.unwrap());
    let engine = Engine::start(store, catalog).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let secrets = SecretStore::with_key(dir.path(), Some(key.clone())).unwrap();
    tokio::spawn(sync::run(
        engine.clone(),
        Some(secrets.clone()),
        stop.subscribe(),
    ));
    Replica {
        engine,
        secrets,
        _dir: dir,
    }
}

fn github_headers(delivery: &str, body: &[u8]) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("content-type", "application/json".parse().unwrap());
    h.insert("x-github-event", "push".parse().unwrap());
    h.insert("x-github-delivery", delivery.parse().unwrap());
    h.insert(
        "x-hub-signature-256",
        tb_ingress::github::sign(SECRET.as_bytes(), body)
            .parse()
            .unwrap(),
    );
    h
}

const PUSH: &[u8] = br#"{"ref":"refs/heads/main","repository":{"full_name":"o/r","id":1}}"#;

async fn push(engine: &Engine, delivery: &str) -> Result<IngestAnswer, tb_core::TbError> {
    ingest(
        engine,
        "github",
        &github_headers(delivery, PUSH),
        Bytes::from_static(PUSH),
    )
    .await
}

/// Calls `probe` every 5 ms until it answers true or [`GIVE_UP`] passed; the time it took, or `None`.
async fn time_until<F, Fut>(mut probe: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < GIVE_UP {
        if probe().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

fn seq() -> impl FnMut() -> String {
    let mut n = 0;
    move || {
        n += 1;
        format!("d-{n}")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pause_through_a_stops_ingest_on_b_within_1s_and_a_resume_reopens_it() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let key = SecretKey::generate();
    let (stop, _keep) = tokio::sync::watch::channel(false);
    let a = replica(&db, &key, &stop).await;
    let b = replica(&db, &key, &stop).await;
    let mut next = seq();
    assert!(matches!(
        push(&b.engine, &next()).await.unwrap(),
        IngestAnswer::Accepted { .. }
    ));

    let t = a
        .engine
        .operate("github", SubscriptionInput::OperatorPause)
        .await
        .unwrap()
        .expect("paused");
    assert_eq!(t.to, SubscriptionState::Paused);
    let took = time_until(|| {
        let id = next();
        let e = b.engine.clone();
        async move {
            matches!(push(&e, &id).await, Err(err) if err.code == ErrorCode::SubscriptionNotActive)
        }
    })
    .await
    .expect("B never refused ingest after the pause");
    println!("pause reached B in {took:?}");
    assert!(took < BUDGET, "pause took {took:?} to reach B");
    assert_eq!(
        b.engine.subscription_state("github"),
        Some(SubscriptionState::Paused)
    );

    a.engine
        .operate("github", SubscriptionInput::OperatorResume)
        .await
        .unwrap()
        .expect("resumed");
    let took = time_until(|| {
        let id = next();
        let e = b.engine.clone();
        async move { matches!(push(&e, &id).await, Ok(IngestAnswer::Accepted { .. })) }
    })
    .await
    .expect("B never accepted again after the resume");
    println!("resume reached B in {took:?}");
    assert!(took < BUDGET, "resume took {took:?} to reach B");
    let _ = stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_binding_revoked_through_a_stops_routing_on_b_within_1s() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let key = SecretKey::generate();
    let (stop, _keep) = tokio::sync::watch::channel(false);
    let a = replica(&db, &key, &stop).await;
    let b = replica(&db, &key, &stop).await;
    let mut next = seq();
    assert!(matches!(
        push(&b.engine, &next()).await.unwrap(),
        IngestAnswer::Accepted { .. }
    ));

    assert!(a
        .engine
        .set_binding_revoked("on-push", true, Some("ops".into()))
        .await
        .unwrap());
    let took = time_until(|| {
        let id = next();
        let e = b.engine.clone();
        async move { matches!(push(&e, &id).await, Ok(IngestAnswer::Unmatched { .. })) }
    })
    .await
    .expect("B kept routing to the revoked binding");
    println!("revocation reached B in {took:?}");
    assert!(took < BUDGET, "revocation took {took:?} to reach B");
    assert!(!b.engine.catalog().binding_live("on-push"));

    assert!(a
        .engine
        .set_binding_revoked("on-push", false, None)
        .await
        .unwrap());
    let took = time_until(|| {
        let id = next();
        let e = b.engine.clone();
        async move { matches!(push(&e, &id).await, Ok(IngestAnswer::Accepted { .. })) }
    })
    .await
    .expect("B never routed again after the restore");
    assert!(took < BUDGET, "restore took {took:?} to reach B");
    let _ = stop.send(true);
}

fn standard_headers(key: &[u8], id: &str, body: &[u8]) -> HeaderMap {
    let ts = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut h = HeaderMap::new();
    h.insert("content-type", "application/json".parse().unwrap());
    h.insert("webhook-id", id.parse().unwrap());
    h.insert("webhook-timestamp", ts.to_string().parse().unwrap());
    h.insert(
        "webhook-signature",
        tb_ingress::standard_webhooks::sign(key, id, ts, body)
            .parse()
            .unwrap(),
    );
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_registration_through_a_verifies_webhooks_on_b_within_1s() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let key = SecretKey::generate();
    let (stop, _keep) = tokio::sync::watch::channel(false);
    let a = replica(&db, &key, &stop).await;
    let b = replica(&db, &key, &stop).await;

    let reg = register(
        &a.engine,
        &a.secrets,
        RegistrationRequest {
            workflow_id: "noop".into(),
            dedup_enabled: true,
            retry: None,
            verification: Verification::Required,
        },
    )
    .await
    .unwrap();
    let whsec = tb_ingress::parse_whsec(&reg.signing_secret).unwrap();
    let body = br#"{"type":"order.created","data":{"id":7}}"#;
    let mut n = 0;
    let took = time_until(|| {
        n += 1;
        let id = format!("msg_replicas_{n:08}");
        let h = standard_headers(&whsec, &id, body);
        let (e, sub) = (b.engine.clone(), reg.subscription_id.clone());
        async move {
            matches!(
                ingest(&e, &sub, &h, Bytes::from_static(body)).await,
                Ok(IngestAnswer::Accepted { .. })
            )
        }
    })
    .await
    .expect("B never accepted a webhook signed with the registered secret");
    println!("registration reached B in {took:?}");
    assert!(took < BUDGET, "registration took {took:?} to reach B");
    // Same fingerprint on both replicas (derived from the shared key), and a wrong signature is refused.
    let fp_b = b
        .engine
        .catalog()
        .subscription(&reg.subscription_id)
        .unwrap()
        .fingerprint
        .clone();
    assert_eq!(fp_b.as_deref(), Some(reg.fingerprint.as_str()));
    let forged = standard_headers(
        b"another key, not the registered one",
        "msg_replicas_forged",
        body,
    );
    let e = ingest(
        &b.engine,
        &reg.subscription_id,
        &forged,
        Bytes::from_static(body),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::SignatureInvalid);
    // The secret is at rest only sealed.
    let sealed = b
        .engine
        .store
        .sealed_secret(&reg.subscription_id)
        .await
        .unwrap()
        .unwrap();
    assert!(!sealed
        .windows(reg.signing_secret.len())
        .any(|w| w == reg.signing_secret.as_bytes()));
    let _ = stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_outbound_webhook_created_and_deleted_through_a_reaches_b_within_1s() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let key = SecretKey::generate();
    let (stop, _keep) = tokio::sync::watch::channel(false);
    let a = replica(&db, &key, &stop).await;
    let b = replica(&db, &key, &stop).await;
    let created = trigger_bridge_engine::webhooks::register(
        &a.engine,
        &a.secrets,
        "http://127.0.0.1:9/hook",
        vec!["*".into()],
        "t1".into(),
        true,
        None,
    )
    .await
    .unwrap();
    let id = created.webhook_id.clone();
    let took = time_until(|| {
        let (e, id) = (b.engine.clone(), id.clone());
        async move { e.webhooks.ids() == vec![id] }
    })
    .await
    .expect("B never loaded the webhook");
    assert!(took < BUDGET, "webhook took {took:?} to reach B");
    trigger_bridge_engine::webhooks::delete(&a.engine, &id, "t1")
        .await
        .unwrap();
    let took = time_until(|| {
        let e = b.engine.clone();
        async move { e.webhooks.ids().is_empty() }
    })
    .await
    .expect("B kept the deleted webhook");
    assert!(took < BUDGET, "webhook deletion took {took:?} to reach B");
    let _ = stop.send(true);
}

#[tokio::test]
async fn without_a_shared_key_registration_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(tb_store::sqlite::SqliteStore::open_dir(dir.path()).unwrap());
    let engine = Engine::start(store, catalog()).await.unwrap();
    let secrets = SecretStore::with_key(&dir.path().join("secrets"), None).unwrap();
    let e = register(
        &engine,
        &secrets,
        RegistrationRequest {
            workflow_id: "noop".into(),
            dedup_enabled: true,
            retry: None,
            verification: Verification::Required,
        },
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable);
    assert!(
        e.message.contains("TRIGGER_BRIDGE_SECRET_KEY is not set"),
        "{}",
        e.message
    );
    assert!(engine
        .store
        .list_subscriptions()
        .await
        .unwrap()
        .iter()
        .all(|s| s.id == "github"));
}

/// Runs a worker on `engine` and starts a `chat` session through it; its run id once it is running.
async fn started_session(engine: &Arc<Engine>, stop: &tokio::sync::watch::Sender<bool>) -> String {
    tokio::spawn(worker::run(
        engine.clone(),
        Default::default(),
        stop.subscribe(),
    ));
    let run = runs::start(engine, "chat", serde_json::json!({}))
        .await
        .unwrap();
    time_until(|| {
        let (e, id) = (engine.clone(), run.clone());
        async move { matches!(e.store.get_run(&id).await, Ok(r) if r.status == RunStatus::Running) }
    })
    .await
    .expect("the session never started");
    run
}

/// Starts a worker on `engine` whose own poll is far longer than the test's budget, so only a wake-up
/// can make it lease in time.
fn slow_polling_worker(engine: &Arc<Engine>, stop: &tokio::sync::watch::Sender<bool>) {
    let cfg = worker::WorkerConfig {
        idle_poll: Duration::from_secs(30),
        ..Default::default()
    };
    tokio::spawn(worker::run(engine.clone(), cfg, stop.subscribe()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_delivery_committed_through_a_is_leased_by_bs_idle_worker_within_1s() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let key = SecretKey::generate();
    let (stop, _keep) = tokio::sync::watch::channel(false);
    let a = replica(&db, &key, &stop).await; // an API replica: no worker
    let b = replica(&db, &key, &stop).await;
    tokio::spawn(wake::run(b.engine.clone(), stop.subscribe()));
    slow_polling_worker(&b.engine, &stop);
    // Let B's worker go idle (its first lease finds nothing; it then sleeps up to 30 s).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut next = seq();
    let IngestAnswer::Accepted { run_id, .. } = push(&a.engine, &next()).await.unwrap() else {
        panic!("not accepted");
    };
    let run_id = run_id.expect("one run");
    let took = time_until(|| {
        let (e, id) = (b.engine.clone(), run_id.clone());
        async move { e.store.get_run(&id).await.is_ok() }
    })
    .await
    .expect("B's worker never started the run A committed");
    println!("a delivery committed on A was started by B's idle worker in {took:?}");
    assert!(took < BUDGET, "took {took:?}");
    let _ = stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_signal_raised_through_a_resolves_a_wait_long_polled_on_b_within_1s() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let key = SecretKey::generate();
    let (stop, _keep) = tokio::sync::watch::channel(false);
    let a = replica(&db, &key, &stop).await;
    let b = replica(&db, &key, &stop).await;
    tokio::spawn(wake::run(b.engine.clone(), stop.subscribe()));
    let run = started_session(&a.engine, &stop).await;
    let spec = WaitSpec {
        kind: WaitKind::Signal,
        names: vec!["go".into()],
        timeout_ms: None,
        user_input: false,
        reason: "waiting for go".into(),
    };
    let wait = sessions::create_wait(&a.engine, &run, spec).await.unwrap();
    // B long-polls the wait for far longer than the budget; only a wake-up can end it early.
    let poll = {
        let (e, run, id) = (b.engine.clone(), run.clone(), wait.id.clone());
        tokio::spawn(
            async move { sessions::poll_wait(&e, &run, &id, Duration::from_secs(20)).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let raised = Instant::now();
    sessions::raise(
        &a.engine,
        &run,
        sessions::RaiseRequest {
            name: "go".into(),
            data: None,
            signal_id: None,
            wake: true,
        },
        None,
    )
    .await
    .unwrap();
    let w = tokio::time::timeout(GIVE_UP, poll)
        .await
        .expect("B's long-poll did not answer")
        .unwrap()
        .unwrap();
    let took = raised.elapsed();
    println!("a signal raised on A ended B's long-poll in {took:?}");
    assert_eq!(w.state, tb_core::wait::WaitState::Resolved, "{w:?}");
    assert!(took < BUDGET, "took {took:?}");
    let _ = stop.send(true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_hmac_capability_minted_through_a_verifies_requests_on_b() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let key = SecretKey::generate();
    let (stop, _keep) = tokio::sync::watch::channel(false);
    let a = replica(&db, &key, &stop).await;
    let b = replica(&db, &key, &stop).await;
    let run = started_session(&a.engine, &stop).await;
    let minted = capability::mint(
        &a.engine,
        Some(&a.secrets),
        capability::MintRequest {
            run_id: run.clone(),
            signal: "ci.done".into(),
            hmac: true,
            ..Default::default()
        },
        None,
    )
    .await
    .unwrap();
    let secret = minted
        .hmac_secret
        .clone()
        .expect("an HMAC key is shown once");
    assert_eq!(
        minted.record.hmac_file.as_deref(),
        Some(format!("store:{}", minted.record.id).as_str()),
        "the key is sealed in the store, not a file of A's"
    );
    let body = br#"{"ok":true}"#;
    let headers = |sig: &str| {
        let mut h = HeaderMap::new();
        h.insert("content-type", "application/json".parse().unwrap());
        h.insert("x-signature-256", sig.parse().unwrap());
        h
    };
    // B has its own secrets dir (nothing of A's on disk) and the shared sealing key.
    let on_b = capability::find(&b.engine, &minted.token).await.unwrap();
    let bad = capability::ingest(
        &b.engine,
        Some(&b.secrets),
        &on_b,
        &headers(&tb_ingress::capability::sign(b"wrong key", body)),
        Bytes::from_static(body),
    )
    .await
    .unwrap_err();
    assert_eq!(bad.code, ErrorCode::SignatureInvalid, "{bad:?}");
    let ok = capability::ingest(
        &b.engine,
        Some(&b.secrets),
        &on_b,
        &headers(&tb_ingress::capability::sign(secret.as_bytes(), body)),
        Bytes::from_static(body),
    )
    .await
    .unwrap();
    assert!(matches!(ok, IngestAnswer::Accepted { .. }), "{ok:?}");
    // A replica with another sealing key cannot read it: 503 naming the key, never a 401.
    let other = replica(&db, &SecretKey::generate(), &stop).await;
    let e = capability::ingest(
        &other.engine,
        Some(&other.secrets),
        &on_b,
        &headers(&tb_ingress::capability::sign(secret.as_bytes(), body)),
        Bytes::from_static(body),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code, ErrorCode::Unavailable, "{e:?}");
    assert!(
        e.message.contains("TRIGGER_BRIDGE_SECRET_KEY"),
        "{}",
        e.message
    );
    let _ = stop.send(true);
}

/// A subscription's rate limit holds over both replicas together (each learns the other's
/// admissions from the shared `ingress_counts` at its flush), and a quarantine made through A is in
/// force on B within 1 s, and so is its release.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rate_limit_holds_over_both_replicas_and_a_quarantine_through_a_reaches_b() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    // Early in a minute, so the counts below stay in one.
    let into = trigger_bridge_engine::clock::now_ms().rem_euclid(60_000);
    if into > 50_000 {
        tokio::time::sleep(Duration::from_millis((60_000 - into + 100) as u64)).await;
    }
    let key = SecretKey::generate();
    let (stop, _keep) = tokio::sync::watch::channel(false);
    let limited = || {
        let mut c = catalog();
        let mut sub = (**c.subscription("github").unwrap()).clone();
        sub.rate_limit_per_min = 10;
        c = Catalog::new(
            vec![sub],
            c.bindings_of("github").cloned().collect(),
            c.workflows().cloned().collect(),
        );
        c
    };
    let a = replica_of(&db, &key, &stop, limited()).await;
    let b = replica_of(&db, &key, &stop, limited()).await;
    let mut next = seq();
    for _ in 0..6 {
        assert!(matches!(
            push(&a.engine, &next()).await,
            Ok(IngestAnswer::Accepted { .. })
        ));
    }
    a.engine.flush_ingress_counts().await;
    b.engine.flush_ingress_counts().await;
    let mut admitted = 0;
    let mut refused = 0;
    for _ in 0..10 {
        match push(&b.engine, &next()).await {
            Ok(IngestAnswer::Accepted { .. }) => admitted += 1,
            Err(e) if e.code == ErrorCode::RateLimited => refused += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        (admitted, refused),
        (4, 6),
        "B took only what A had left of the 10"
    );
    b.engine.flush_ingress_counts().await;
    a.engine.flush_ingress_counts().await;
    assert!(
        matches!(push(&a.engine, &next()).await, Err(e) if e.code == ErrorCode::RateLimited),
        "and A learns B's share back"
    );

    a.engine
        .quarantine("github", "forged flood", Some("ops".into()))
        .await
        .unwrap();
    let took = time_until(|| {
        let e = b.engine.clone();
        async move { e.quarantined("github").is_some() }
    })
    .await
    .expect("B never saw the quarantine");
    println!("quarantine reached B in {took:?}");
    assert!(took < BUDGET, "quarantine took {took:?} to reach B");
    let err = b
        .engine
        .admit_request(Some("github"), None, &HeaderMap::new())
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::SubscriptionQuarantined);
    assert!(a.engine.release("github").await.unwrap());
    let took = time_until(|| {
        let e = b.engine.clone();
        async move { e.quarantined("github").is_none() }
    })
    .await
    .expect("B never saw the release");
    assert!(took < BUDGET, "release took {took:?} to reach B");
    let _ = stop.send(true);
}
