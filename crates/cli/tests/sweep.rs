//! `trigger-bridge sweep`: one retention pass over a stopped SQLite store removes exactly the bodies of
//! its settled receipts older than the retention given, says so, and a second pass finds nothing; a
//! data dir a server holds is refused, and so is one without a store; the config names the store and
//! the retention.

mod common;
use common::*;

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn config(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("c.toml");
    std::fs::write(
        &p,
        "[[subscriptions]]\nid = \"sw\"\nconnector = \"standard-webhooks\"\n\
         secret = \"env:STANDARD_WEBHOOK_SECRET\"\n\n\
         [[workflows]]\nid = \"noop\"\nexecutor = \"noop\"\n\n\
         [[bindings]]\nid = \"sw-all\"\nsubscription = \"sw\"\nevent_types = [\"*\"]\n\
         action = \"start_run\"\nworkflow = \"noop\"\n",
    )
    .unwrap();
    p
}

fn sweep(data: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["sweep", "--data-dir"])
        .arg(data)
        .args(args)
        .env_remove("TRIGGER_BRIDGE_DATABASE_URL")
        .env_remove("TRIGGER_BRIDGE_CONFIG")
        .output()
        .expect("run sweep")
}

/// Posts `payload` signed to subscription `sw` of the server at `base` as webhook-id `id`; asserts 202.
fn send(base: &str, payload: &Path, id: &str) {
    let out = Command::new(BIN)
        .args([
            "send",
            "--url",
            &format!("{base}/v1/trigger-subscriptions/sw/ingest"),
            "--connector",
            "standard-webhooks",
            "--secret",
            SW_SECRET,
            "--delivery-id",
            id,
            "--json",
            "--file",
        ])
        .arg(payload)
        .output()
        .expect("run send");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "send printed no JSON: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(v["status"], 202, "{v}");
}

fn counts(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "sweep failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "sweep printed no JSON: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn one_pass_removes_the_settled_bodies_past_the_retention_and_a_second_finds_none() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = config(dir.path());
    let mut server = Server::spawn(&cfg, &data, free_port());
    let payload = dir.path().join("event.json");
    std::fs::write(&payload, br#"{"type":"thing.happened","data":{"n":1}}"#).unwrap();
    for i in 0..3 {
        send(&server.base, &payload, &format!("msg_sweep_retention_{i}"));
    }
    // Every receipt settles (its noop run completes): only then is its body the sweep's.
    server.wait_for("/v1/receipts?limit=10", |v| {
        let r = v["receipts"].as_array().map(Vec::as_slice).unwrap_or(&[]);
        r.len() == 3 && r.iter().all(|x| x["state"] == "consumed")
    });
    // The server holds the data dir: the pass is refused, nothing is touched.
    let refused = sweep(&data, &["--body-retention-days", "0"]);
    assert_eq!(refused.status.code(), Some(2));
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("is in use by another process"), "{why}");
    server.kill9();

    // The default retention (7 days) keeps today's bodies.
    let kept = counts(&sweep(&data, &["--json"]));
    assert_eq!(kept["bodies"], 0, "{kept}");
    let swept = counts(&sweep(&data, &["--json", "--body-retention-days", "0"]));
    assert_eq!(swept["bodies"], 3, "{swept}");
    assert_eq!(swept["dead_letters"], 0, "{swept}");
    assert!(swept["elapsed_ms"].is_u64(), "{swept}");
    let again = counts(&sweep(&data, &["--json", "--body-retention-days", "0"]));
    assert_eq!(again["bodies"], 0, "{again}");

    // The receipts stay, without their bodies.
    let db = rusqlite::Connection::open(data.join("trigger-bridge.db")).unwrap();
    let (receipts, held): (i64, i64) = db
        .query_row("SELECT COUNT(*), COUNT(body) FROM receipts", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!((receipts, held), (3, 0));
    drop(db);
    let human = sweep(&data, &["--body-retention-days", "0"]);
    let text = String::from_utf8_lossy(&human.stdout);
    assert!(
        text.starts_with("retention pass over sqlite ") && text.contains("removed 0 bodies"),
        "{text}"
    );
}

#[test]
fn the_config_names_the_store_and_the_retention_and_a_missing_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = config(dir.path());
    let mut server = Server::spawn(&cfg, &data, free_port());
    let payload = dir.path().join("event.json");
    std::fs::write(&payload, br#"{"type":"thing.happened"}"#).unwrap();
    send(&server.base, &payload, "msg_sweep_config_0000");
    server.wait_for("/v1/receipts?limit=10", |v| {
        v["receipts"][0]["state"] == "consumed"
    });
    server.kill9();
    // `[server]` names the data dir and a body retention of 0 days.
    let with_server = dir.path().join("server.toml");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &with_server,
        format!(
            "[server]\ndata_dir = \"{}\"\nbody_retention_days = 0\n\n{text}",
            data.display()
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["sweep", "--json", "--config"])
        .arg(&with_server)
        .env_remove("TRIGGER_BRIDGE_DATA_DIR")
        .env_remove("TRIGGER_BRIDGE_DATABASE_URL")
        .output()
        .expect("run sweep");
    assert_eq!(counts(&out)["bodies"], 1);
    // A data dir without a store (a typo) is refused, and nothing is created there.
    let typo = dir.path().join("dta");
    let refused = sweep(&typo, &["--body-retention-days", "0"]);
    assert_eq!(refused.status.code(), Some(2));
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(why.contains("no store to sweep"), "{why}");
    assert!(!typo.exists(), "the mistyped data dir was created");
}
