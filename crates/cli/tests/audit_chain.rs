//! The keyed audit chain through the real binary (docs/operations.md, "The audit log"): `serve` logs
//! signed head checkpoints (`audit checkpoint seq=.. head=.. mac=..`, gauge `tb_audit_checkpoint_seq`);
//! a row planted past the head by someone with the database file does not stop later appends (a
//! recorded break, `tb_audit_breaks_total`, `/ready` says `broken`); `audit list --verify` reports the
//! break, and with `--checkpoint` catches the newest rows deleted with the head moved back; an entry
//! forged with a correct plain SHA-256 is caught without any checkpoint.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sha2::{Digest, Sha256};

mod common;

use common::*;

const OPS_KEY: &str = "ops-key-0123456789";

fn config(dir: &Path) -> PathBuf {
    let cfg = format!(
        r#"
[server]
audit_checkpoint_secs = 1

[[api_keys]]
name = "ops"
sha256 = "{}"
scopes = ["*"]

[[subscriptions]]
id = "github"
source = "webhook"
connector = "github"
secret = "env:GITHUB_WEBHOOK_SECRET"

[[workflows]]
id = "noop"
executor = "noop"

[[bindings]]
id = "pr-opened"
subscription = "github"
event_types = ["pull_request.opened"]
action = "start_run"
workflow = "noop"
"#,
        hex::encode(Sha256::digest(OPS_KEY.as_bytes()))
    );
    let p = dir.join("audit.toml");
    std::fs::write(&p, cfg).unwrap();
    p
}

/// The server with its log (info) written to `log`.
struct Serve {
    child: Child,
    base: String,
    log: PathBuf,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    fn spawn(config: &Path, data: &Path, log: PathBuf) -> Serve {
        let port = free_port();
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(config)
            .args(["--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
            .arg(data)
            .env("GITHUB_WEBHOOK_SECRET", GH_SECRET)
            .env_remove("TRIGGER_BRIDGE_SECRET_KEY")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("spawn server");
        let s = Serve {
            child,
            base: format!("http://127.0.0.1:{port}"),
            log,
        };
        let until = Instant::now() + Duration::from_secs(20);
        while ureq_get(&format!("{}/health", s.base)).is_none() {
            assert!(Instant::now() < until, "server not healthy");
            std::thread::sleep(Duration::from_millis(25));
        }
        s
    }

    /// `method path` with the ops key: (status, body text).
    fn call(&self, method: reqwest::Method, path: &str) -> (u16, String) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let r = reqwest::Client::new()
                .request(method, format!("{}{path}", self.base))
                .bearer_auth(OPS_KEY)
                .timeout(Duration::from_secs(10))
                .send()
                .await
                .expect("request");
            (r.status().as_u16(), r.text().await.unwrap())
        })
    }

    fn post(&self, path: &str) -> u16 {
        self.call(reqwest::Method::POST, path).0
    }

    fn json(&self, path: &str) -> Value {
        let (st, body) = self.call(reqwest::Method::GET, path);
        assert_eq!(st, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    /// The `(seq, mac)` of the newest checkpoint line for `seq`, waiting for it (bounded).
    fn checkpoint(&self, seq: i64) -> String {
        let want = format!("audit checkpoint seq={seq} ");
        let until = Instant::now() + Duration::from_secs(15);
        loop {
            let mut text = String::new();
            std::fs::File::open(&self.log)
                .unwrap()
                .read_to_string(&mut text)
                .unwrap();
            if let Some(line) = text.lines().rev().find(|l| l.contains(&want)) {
                let mac = line
                    .split("mac=")
                    .nth(1)
                    .and_then(|m| m.get(..64))
                    .unwrap_or_else(|| panic!("no mac in {line}"));
                let head = line.split("head=").nth(1).unwrap().get(..64).unwrap();
                assert_eq!(head.len(), 64, "{line}");
                return mac.to_string();
            }
            assert!(
                Instant::now() < until,
                "no `{want}` line in the log:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn metric(&self, name: &str) -> Option<f64> {
        let (_, text) = self.call(reqwest::Method::GET, "/metrics");
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    }

    fn verify(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(BIN)
            .args(["audit", "list", "--verify", "--server", &self.base])
            .args(["--api-key", OPS_KEY])
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `/ready`'s `warnings.auditLog`, waiting (bounded) until `f` holds (it is read once a second).
    fn audit_ready(&self, f: impl Fn(&Value) -> bool) -> Value {
        let until = Instant::now() + Duration::from_secs(10);
        loop {
            let v = ureq_get(&format!("{}/ready", self.base)).expect("/ready");
            let a = v["warnings"]["auditLog"].clone();
            if f(&a) {
                return a;
            }
            assert!(Instant::now() < until, "/ready auditLog stays {a}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn checkpoints_breaks_truncation_and_forgery() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = Serve::spawn(&config(dir.path()), &data, dir.path().join("serve.log"));
    // 1 = config.load, 2 = the pause.
    assert_eq!(s.post("/v1/trigger-subscriptions/github/pause"), 200);
    let mac2 = s.checkpoint(2);
    assert_eq!(s.metric("tb_audit_checkpoint_seq"), Some(2.0));
    let (code, out, err) = s.verify(&[]);
    assert_eq!(code, 0, "{out} {err}");
    assert!(
        out.contains(&format!("checkpoint of this head: 2:{mac2}")),
        "the checkpoint --verify prints is the logged one: {out}"
    );
    assert_eq!(
        s.audit_ready(|a| a["status"] == "ok")["keyed"],
        true,
        "the SQLite host's key file keys the chain"
    );

    // Someone with the database file plants a row just past the head.
    let db = rusqlite::Connection::open(data.join("trigger-bridge.db")).unwrap();
    db.execute_batch("INSERT INTO audit_log VALUES (3, 1, 'x', 'y', 'z', 'ok', '{}', 'p', 'p')")
        .unwrap();
    let a = s.audit_ready(|a| a["status"] == "broken");
    assert_eq!(a["rowsPastHead"], 1, "{a}");
    // Later actions are still recorded: a break entry (4), then the resume (5).
    assert_eq!(s.post("/v1/trigger-subscriptions/github/resume"), 200);
    assert_eq!(s.post("/v1/trigger-subscriptions/github/pause"), 200);
    let page = s.json("/v1/audit?limit=10");
    let actions: Vec<(i64, &str)> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["seq"].as_i64().unwrap(), e["action"].as_str().unwrap()))
        .collect();
    assert_eq!(
        actions,
        vec![
            (6, "subscription.pause"),
            (5, "subscription.resume"),
            (4, "audit.break"),
            (3, "y"),
            (2, "subscription.pause"),
            (1, "config.load"),
        ]
    );
    assert_eq!(s.metric("tb_audit_breaks_total"), Some(1.0));
    let a = s.audit_ready(|a| a["breaks"] == 1);
    assert_eq!(
        (a["status"].as_str(), a["lastBreakSeq"].as_i64()),
        (Some("broken"), Some(4)),
        "{a}"
    );
    let (code, out, err) = s.verify(&[]);
    assert_eq!(code, 1, "{out} {err}");
    assert!(
        err.contains(
            "entry 4 records that entries 3..3 were written past the head (entry 2) by hand"
        ),
        "{err}"
    );
    let mac6 = s.checkpoint(6);

    // The newest row deleted and the head moved back: the chain alone cannot tell ...
    let hash5: String = db
        .query_row("SELECT hash FROM audit_log WHERE seq = 5", [], |r| r.get(0))
        .unwrap();
    db.execute_batch(&format!(
        "DROP TRIGGER audit_log_no_delete; DELETE FROM audit_log WHERE seq = 6; \
         UPDATE audit_head SET seq = 5, hash = '{hash5}' WHERE id = 1;"
    ))
    .unwrap();
    let (code, _, err) = s.verify(&[]);
    assert_eq!(code, 1);
    assert!(err.contains("entry 4 records"), "only the old break: {err}");
    // ... a checkpoint exported before can.
    let (code, out, err) = s.verify(&["--checkpoint", &format!("6:{mac6}")]);
    assert_eq!(code, 1, "{out} {err}");
    assert!(
        err.contains("the checkpoint names entry 6 but the chain ends at entry 5"),
        "{err}"
    );
    // An older checkpoint still holds; a made-up one does not.
    let (_, _, err) = s.verify(&["--checkpoint", &format!("2:{mac2}")]);
    assert!(err.contains("entry 4 records"), "{err}");
    let (code, _, err) = s.verify(&["--checkpoint", &format!("2:{}", "0".repeat(64))]);
    assert_eq!(code, 1);
    assert!(
        err.contains("entry 2 is not the entry the checkpoint"),
        "{err}"
    );
    // A malformed checkpoint is refused (400 validation_error): an error, exit 2.
    let (code, _, err) = s.verify(&["--checkpoint", "two:abc"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("SEQ must be an integer"), "{err}");

    // An entry forged with a correct plain SHA-256 after the head, and the head moved to it.
    let forged = tb_core::audit::next(
        5,
        &hash5,
        tb_core::audit::NewEntry {
            at: 1,
            actor: "ops".into(),
            action: "subscription.resume".into(),
            target: "github".into(),
            outcome: "ok".into(),
            detail: "{}".into(),
        },
        None,
    );
    db.execute_batch(&format!(
        "INSERT INTO audit_log VALUES (6, 1, 'ops', 'subscription.resume', 'github', 'ok', '{{}}', '{}', '{}'); \
         UPDATE audit_head SET seq = 6, hash = '{}' WHERE id = 1;",
        forged.prev_hash, forged.hash, forged.hash
    ))
    .unwrap();
    let (code, out, err) = s.verify(&[]);
    assert_eq!(code, 1, "{out} {err}");
    assert!(
        err.contains("entry 6 was written without the audit key"),
        "{err}"
    );
    // The server does not sign a head it did not write.
    let until = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&s.log)
        .unwrap()
        .contains("(entry 6) is missing or does not carry the audit key's MAC")
    {
        assert!(
            Instant::now() < until,
            "no refusal to checkpoint a forged head"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
