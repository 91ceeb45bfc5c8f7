//! Waits, signal buffers, signal dedup and winner selection survive SIGKILL at the points the sessions seed
//! names: right after a signal commit, right after a wait commit, and between a timer coming due and
//! its resolution (the deadline passes while the server is down). Runs the real binary on the
//! quickstart config.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn quickstart_server() -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let config =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/quickstart.toml");
    let s = Server::spawn(&config, &dir.path().join("data"), free_port());
    (dir, s)
}

fn session(s: &Server) -> String {
    let (st, r) = s.post("/v1/runs", json!({"workflowId": "pr-session"}));
    assert_eq!(st, 201, "{r}");
    let id = r["runId"].as_str().unwrap().to_string();
    s.wait_for(&format!("/v1/runs/{id}"), |v| v["status"] == "running");
    id
}

fn wait_view(s: &Server, run: &str, wait: &Value) -> Value {
    s.get(&format!(
        "/v1/runs/{run}/waits/{}",
        wait["waitId"].as_str().unwrap()
    ))
}

#[test]
fn waits_buffers_dedup_and_winners_survive_sigkill() {
    let (_dir, mut s) = quickstart_server();
    let run = session(&s);

    // 1. SIGKILL right after a signal commit: the buffered signal and its dedup identity survive.
    let (st, r) = s.post(
        &format!("/v1/runs/{run}/signals"),
        json!({"name": "ci.done", "signalId": "ci-1", "data": {"ok": true}}),
    );
    assert_eq!(st, 202, "{r}");
    s.kill9();
    s.restart();
    let (st, dup) = s.post(
        &format!("/v1/runs/{run}/signals"),
        json!({"name": "ci.done", "signalId": "ci-1", "data": {"ok": true}}),
    );
    assert_eq!((st, dup["status"].as_str()), (200, Some("duplicate")));
    let (st, w1) = s.post(
        &format!("/v1/runs/{run}/waits"),
        json!({"kind": "signal", "names": ["ci.done"], "reason": "CI"}),
    );
    assert_eq!(st, 200, "resolved at once from the surviving buffer: {w1}");
    assert_eq!(w1["winner"]["signal"]["signalId"], "ci-1");
    assert_eq!(w1["winner"]["signal"]["data"], json!({"ok": true}));

    // 2. SIGKILL right after a wait commit: the armed wait and its absolute deadline survive.
    let (st, w2) = s.post(
        &format!("/v1/runs/{run}/waits"),
        json!({"kind": "signal", "names": ["review.done"], "timeoutMs": 600000, "reason": "review"}),
    );
    assert_eq!(st, 201, "{w2}");
    s.kill9();
    s.restart();
    let again = wait_view(&s, &run, &w2);
    assert_eq!(again["state"], "armed");
    assert_eq!(again["deadline"], w2["deadline"]);
    assert_eq!(
        s.get(&format!("/v1/runs/{run}"))["status"],
        "waiting-external"
    );
    let (st, _) = s.post(
        &format!("/v1/runs/{run}/signals"),
        json!({"name": "review.done", "signalId": "rv-1"}),
    );
    assert_eq!(st, 202);
    let w2 = wait_view(&s, &run, &w2);
    assert_eq!(w2["winner"]["kind"], "signal", "{w2}");
    assert_eq!(w2["winner"]["signal"]["signalId"], "rv-1");

    // 3. Between timer due and resolution: the deadline passes while the server is down; after the
    //    restart the durable timer resolves the wait by `timer`, with its original deadline.
    let (st, w3) = s.post(
        &format!("/v1/runs/{run}/waits"),
        json!({"kind": "any", "names": ["never"], "timeoutMs": 1000, "reason": "short"}),
    );
    assert_eq!(st, 201, "{w3}");
    s.kill9();
    std::thread::sleep(Duration::from_millis(1500));
    s.restart();
    let done = s.get(&format!(
        "/v1/runs/{run}/waits/{}?timeout=10",
        w3["waitId"].as_str().unwrap()
    ));
    assert_eq!(done["state"], "resolved", "{done}");
    assert_eq!(done["winner"]["kind"], "timer");
    assert_eq!(done["winner"]["deadline"], w3["deadline"]);

    // Winners recorded before the crashes read the same afterwards.
    s.kill9();
    s.restart();
    let waits = s.get(&format!("/v1/runs/{run}/waits"));
    let winners: Vec<(String, String)> = waits["waits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["winner"]["kind"].as_str().unwrap_or("").to_string(),
                w["winner"]["signal"]["signalId"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(
        winners,
        [
            ("signal".to_string(), "ci-1".to_string()),
            ("signal".to_string(), "rv-1".to_string()),
            ("timer".to_string(), String::new())
        ]
    );
    let sigs = s.get(&format!("/v1/runs/{run}/signals"));
    assert_eq!(sigs["buffered"], 0);
    assert_eq!(
        sigs["signals"].as_array().unwrap().len(),
        2,
        "the duplicate was suppressed"
    );
}
