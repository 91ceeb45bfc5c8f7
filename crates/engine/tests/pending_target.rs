//! A run announced at 202 but not started yet is not "missing": raising a signal on it (or waiting on
//! it) answers `conflict` with `Retry-After: 1` so the caller retries; after the start it works.

use std::sync::Arc;

use tb_core::workflow::{Executor, Workflow};
use tb_core::ErrorCode;
use tb_store::sqlite::SqliteStore;
use tb_store::Store;
use trigger_bridge_engine::sessions::{raise, RaiseRequest};
use trigger_bridge_engine::{Catalog, Engine};

#[tokio::test]
async fn a_signal_to_a_run_not_started_yet_asks_to_retry() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    let wf = Workflow {
        id: "s".into(),
        executor: Executor::Session {
            config: serde_json::json!({}),
            mailbox: Default::default(),
        },
    };
    let engine = Engine::start(store.clone(), Catalog::new(vec![], vec![], vec![wf]))
        .await
        .unwrap();
    let run = trigger_bridge_engine::runs::start(&engine, "s", serde_json::json!({}))
        .await
        .unwrap();
    let req = || RaiseRequest {
        name: "ci.done".into(),
        ..Default::default()
    };
    let e = raise(&engine, &run, req(), None).await.unwrap_err();
    assert_eq!((e.code, e.retry_after_s), (ErrorCode::Conflict, Some(1)));
    let unknown = raise(&engine, "run_00000000000000000000000000000000", req(), None)
        .await
        .unwrap_err();
    assert_eq!(unknown.code, ErrorCode::NotFound);
    // The worker starts it; now the same raise is queued.
    let lease = store
        .lease_due("w", i64::MAX / 2, 60_000, 1)
        .await
        .unwrap()
        .remove(0);
    trigger_bridge_engine::worker::attempt(&engine, lease).await;
    let out = raise(&engine, &run, req(), None).await.unwrap();
    assert_eq!(out.status, "queued");
}
