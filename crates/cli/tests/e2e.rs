//! End-to-end tests of the `trigger-bridge` binary: the server as a child process, the real GitHub
//! payloads posted through `trigger-bridge send`, and SIGKILL crashes with restarts.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

mod common;

use common::*;

/// `trigger-bridge send ... --json`: (HTTP status, response body).
fn send(
    base: &str,
    sub: &str,
    event: &str,
    file: &Path,
    secret: &str,
    delivery_id: Option<&str>,
) -> (u16, Value) {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "send",
        "--url",
        &format!("{base}/v1/trigger-subscriptions/{sub}/ingest"),
        "--connector",
        "github",
    ])
    .args(["--secret", secret, "--event", event, "--json", "--file"])
    .arg(file);
    if let Some(id) = delivery_id {
        cmd.args(["--delivery-id", id]);
    }
    let out = cmd.output().expect("run send");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "send printed no JSON: {} / {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (v["status"].as_u64().unwrap() as u16, v["response"].clone())
}

fn github_fixtures() -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    for dir in std::fs::read_dir(fixtures().join("github")).unwrap() {
        let dir = dir.unwrap().path();
        let event = dir.file_name().unwrap().to_string_lossy().to_string();
        for f in std::fs::read_dir(&dir).unwrap() {
            out.push((event.clone(), f.unwrap().path()));
        }
    }
    out.sort();
    out
}

#[test]
fn every_github_fixture_through_send_with_the_quickstart() {
    let data = tempfile::tempdir().unwrap();
    let s = Server::spawn(
        &repo().join("examples/quickstart.toml"),
        data.path(),
        free_port(),
    );
    let files = github_fixtures();
    assert!(
        files.len() >= 80,
        "expected the GitHub fixture set, found {}",
        files.len()
    );

    // Wrong secret first: every post is 401 and nothing is committed or routed.
    for (event, file) in &files {
        let (status, body) = send(&s.base, "github", event, file, "not-the-secret", None);
        assert_eq!(status, 401, "{}: {body}", file.display());
        assert_eq!(body["error"], "signature_invalid");
    }
    assert!(s
        .get("/v1/receipts")
        .get("receipts")
        .unwrap()
        .as_array()
        .unwrap()
        .is_empty());

    let mut expected_runs = 0;
    for (event, file) in &files {
        let payload: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
        let bound = event == "pull_request" && payload["action"] == "opened";
        let (status, body) = send(&s.base, "github", event, file, GH_SECRET, None);
        assert_eq!(status, 202, "{}: {body}", file.display());
        if bound {
            expected_runs += 1;
            assert_eq!(body["outcome"], "accepted", "{}", file.display());
            assert!(body["runId"].as_str().unwrap().starts_with("run_"));
        } else {
            assert_eq!(body["outcome"], "unmatched", "{}", file.display());
        }
    }
    assert!(
        expected_runs >= 3,
        "the fixtures hold several pull_request.opened payloads"
    );
    let runs = s.wait_for("/v1/runs?limit=500", |v| {
        v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["status"] == "completed")
            .count()
            == expected_runs
    });
    assert_eq!(
        runs["runs"].as_array().unwrap().len(),
        expected_runs,
        "exactly one run per bound payload"
    );
    let receipts = s.get("/v1/receipts?limit=500");
    assert_eq!(receipts["receipts"].as_array().unwrap().len(), files.len());

    // A duplicate delivery id is answered 200 with the first receipt and run.
    let opened = fixtures().join("github/pull_request/00-opened.json");
    let (st, first) = send(
        &s.base,
        "github",
        "pull_request",
        &opened,
        GH_SECRET,
        Some("e2e-dup-1"),
    );
    assert_eq!(st, 202);
    let (st, dup) = send(
        &s.base,
        "github",
        "pull_request",
        &opened,
        GH_SECRET,
        Some("e2e-dup-1"),
    );
    assert_eq!(st, 200);
    assert_eq!(dup["outcome"], "duplicate");
    assert_eq!(dup["receiptId"], first["receiptId"]);
    assert_eq!(dup["runId"], first["runId"]);
}

/// A worker for the `http` executor: answers each request with the next behaviour, recording the
/// idempotency keys it saw. `Hang` never answers (until the server side gives up or dies).
#[derive(Clone, Copy, Debug)]
enum Reply {
    Ok,
    Hang,
}

fn start_worker(
    port: u16,
    plan: Vec<Reply>,
) -> (Arc<Mutex<Vec<String>>>, std::thread::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let h = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = axum::Router::new().route(
                "/run",
                axum::routing::post(move |headers: axum::http::HeaderMap| {
                    let seen = s2.clone();
                    let plan = plan.clone();
                    async move {
                        let n = {
                            let mut g = seen.lock().unwrap();
                            g.push(headers["idempotency-key"].to_str().unwrap().to_string());
                            g.len() - 1
                        };
                        if let Some(Reply::Hang) = plan.get(n) {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                        }
                        axum::http::StatusCode::OK
                    }
                }),
            );
            let l = tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await
                .unwrap();
            axum::serve(l, app).await.unwrap();
        });
    });
    (seen, h)
}

fn http_config(dir: &Path, worker_port: u16) -> PathBuf {
    let path = dir.join("crash.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[server]
lease_ms = 1500

[[subscriptions]]
id = "github"
connector = "github"
secret = "env:GITHUB_WEBHOOK_SECRET"
[subscriptions.retry]
max_attempts = 50
backoff = "fixed"
initial_ms = 200
max_ms = 200
jitter = 0.0

[[workflows]]
id = "worker"
executor = "http"
url = "http://127.0.0.1:{worker_port}/run"
allow_private = true
secret = "env:STANDARD_WEBHOOK_SECRET"
timeout_ms = 500

[[bindings]]
id = "pr-opened"
subscription = "github"
event_types = ["pull_request.opened"]
action = "start_run"
workflow = "worker"
"#
        ),
    )
    .unwrap();
    path
}

#[test]
fn sigkill_right_after_202_keeps_the_receipt_and_completes_the_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let worker_port = free_port();
    // The worker is down at first: attempts fail with `connect` and are retried.
    let mut s = Server::spawn(
        &http_config(dir.path(), worker_port),
        &dir.path().join("data"),
        free_port(),
    );
    let opened = fixtures().join("github/pull_request/00-opened.json");
    let (st, a) = send(
        &s.base,
        "github",
        "pull_request",
        &opened,
        GH_SECRET,
        Some("crash-after-202"),
    );
    assert_eq!(st, 202);
    s.kill9();
    let (seen, _w) = start_worker(worker_port, vec![Reply::Ok]);
    s.restart();
    let receipt = s.get(&format!(
        "/v1/receipts/{}",
        a["receiptId"].as_str().unwrap()
    ));
    assert_eq!(
        receipt["receipt"]["receiptId"], a["receiptId"],
        "the receipt survived SIGKILL"
    );
    let run_id = a["runId"].as_str().unwrap();
    s.wait_for(&format!("/v1/runs/{run_id}"), |v| {
        v["status"] == "completed"
    });
    let d = s.get(&format!(
        "/v1/deliveries/{}",
        a["deliveries"][0]["deliveryId"].as_str().unwrap()
    ));
    assert_eq!(d["delivery"]["state"], "delivered");
    assert_eq!(seen.lock().unwrap().len(), 1, "the worker got the run once");
    assert_eq!(s.get("/v1/runs")["runs"].as_array().unwrap().len(), 1);
}

#[test]
fn sigkill_during_an_attempt_lets_the_lease_lapse_and_delivers_once() {
    let dir = tempfile::tempdir().unwrap();
    let worker_port = free_port();
    let (seen, _w) = start_worker(worker_port, vec![Reply::Hang, Reply::Ok]);
    let mut s = Server::spawn(
        &http_config(dir.path(), worker_port),
        &dir.path().join("data"),
        free_port(),
    );
    let opened = fixtures().join("github/pull_request/00-opened.json");
    let (st, a) = send(
        &s.base,
        "github",
        "pull_request",
        &opened,
        GH_SECRET,
        Some("crash-mid-attempt"),
    );
    assert_eq!(st, 202);
    for _ in 0..200 {
        if !seen.lock().unwrap().is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "attempt 1 reached the worker"
    );
    s.kill9();
    s.restart();
    let run_id = a["runId"].as_str().unwrap();
    s.wait_for(&format!("/v1/runs/{run_id}"), |v| {
        v["status"] == "completed"
    });
    let d = s.get(&format!(
        "/v1/deliveries/{}",
        a["deliveries"][0]["deliveryId"].as_str().unwrap()
    ));
    assert_eq!(d["delivery"]["state"], "delivered");
    // The crashed attempt's outcome never reached the store: when its lease is taken over it is recorded
    // `lost` (docs/operations.md, "Lost attempts"), so the log counts both attempts the worker saw.
    let outcomes: Vec<(u64, &str)> = d["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["attempt"].as_u64().unwrap(),
                a["outcome"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(outcomes, [(1, "lost"), (2, "delivered")], "{d}");
    let keys = seen.lock().unwrap().clone();
    assert_eq!(
        keys.len(),
        2,
        "the worker saw the crashed attempt and the retry"
    );
    assert_eq!(
        keys[0], keys[1],
        "both carried the delivery's stable idempotency key"
    );
    assert_eq!(
        s.get("/v1/runs")["runs"].as_array().unwrap().len(),
        1,
        "one run"
    );
}

#[test]
fn a_registered_subscription_survives_a_restart_and_its_secret_is_kept_sealed() {
    let data = tempfile::tempdir().unwrap();
    let mut s = Server::spawn(
        &repo().join("examples/quickstart.toml"),
        data.path(),
        free_port(),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let http = reqwest::Client::new();
    let reg: Value = rt.block_on(async {
        http.post(format!("{}/v1/trigger-subscriptions", s.base))
            .json(&serde_json::json!({"source": "webhook", "workflowId": "conformance-noop"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    });
    let secret = reg["binding"]["signingSecret"]
        .as_str()
        .unwrap()
        .to_string();
    let url = format!(
        "{}{}",
        s.base,
        reg["binding"]["ingestUrl"].as_str().unwrap()
    );
    // The database holds the secret only sealed, under the key file of the secrets
    // directory, readable by the owner only; no secret file is written.
    let db = std::fs::read(data.path().join("trigger-bridge.db")).unwrap();
    assert!(
        !String::from_utf8_lossy(&db).contains(&secret[6..]),
        "no plaintext secret in the database"
    );
    let id = reg["subscription"]["subscriptionId"].as_str().unwrap();
    assert!(!data
        .path()
        .join("secrets")
        .join(format!("{id}.whsec"))
        .exists());
    let file = data.path().join("secrets").join("secret.key");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    s.kill9();
    s.restart();
    let body = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(body.path(), br#"{"type":"after.restart"}"#).unwrap();
    let out = Command::new(BIN)
        .args([
            "send",
            "--url",
            &url,
            "--connector",
            "standard-webhooks",
            "--secret",
            &secret,
            "--json",
            "--file",
        ])
        .arg(body.path())
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], 202, "{v}");
    let run = v["response"]["runId"].as_str().unwrap().to_string();
    s.wait_for(&format!("/v1/runs/{run}"), |r| r["status"] == "completed");
    let sub = s.get(&format!("/v1/trigger-subscriptions/{id}"));
    assert_eq!(
        sub["subscription"]["secretFingerprint"], reg["binding"]["secretFingerprint"],
        "the fingerprint is stable across restarts"
    );
}

/// Runs the binary's client commands against `base`; returns stdout (panics on failure).
fn cli(base: &str, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .args(["--server", base])
        .output()
        .expect("run cli");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The session walkthrough of docs/sessions.md: every pull_request fixture (all one PR) through `send` to
/// `github-sessions` starts ONE `pr-session`; the later events become `pr.<action>` signals in arrival
/// order; `signals raise`, `runs wait` and `runs waits` drive it from the CLI.
#[test]
fn quickstart_session_walkthrough_with_send_and_the_cli() {
    let data = tempfile::tempdir().unwrap();
    let s = Server::spawn(
        &repo().join("examples/quickstart.toml"),
        data.path(),
        free_port(),
    );
    let mut files: Vec<(String, PathBuf)> = github_fixtures()
        .into_iter()
        .filter(|(e, _)| e == "pull_request")
        .collect();
    files.sort_by(|a, b| a.1.cmp(&b.1));
    for (event, file) in &files {
        let (status, body) = send(&s.base, "github-sessions", event, file, GH_SECRET, None);
        assert_eq!(status, 202, "{}: {body}", file.display());
    }
    // Redelivery of the first event (same delivery id) is a duplicate.
    let (_, first) = send(
        &s.base,
        "github-sessions",
        "pull_request",
        &files[0].1,
        GH_SECRET,
        Some("walkthrough-1"),
    );
    let (status, dup) = send(
        &s.base,
        "github-sessions",
        "pull_request",
        &files[0].1,
        GH_SECRET,
        Some("walkthrough-1"),
    );
    assert_eq!(status, 200);
    assert_eq!(dup["receiptId"], first["receiptId"]);

    let expected: Vec<String> = files
        .iter()
        .chain(std::iter::once(&files[0]))
        .filter_map(|(_, f)| {
            let action = f.file_stem()?.to_str()?.split_once('-')?.1.to_string();
            let signalled = [
                "opened",
                "synchronize",
                "closed",
                "reopened",
                "edited",
                "ready_for_review",
                "converted_to_draft",
            ];
            signalled
                .contains(&action.as_str())
                .then(|| format!("pr.{action}"))
        })
        .skip(1) // the first opened starts the session
        .collect();
    let runs = s.wait_for("/v1/runs", |v| {
        v["runs"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["workflowId"] == "pr-session"))
    });
    let sessions: Vec<&Value> = runs["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["workflowId"] == "pr-session")
        .collect();
    assert_eq!(sessions.len(), 1, "one session for one PR");
    let run = sessions[0]["runId"].as_str().unwrap().to_string();
    let sigs = s.wait_for(&format!("/v1/runs/{run}/signals"), |v| {
        v["buffered"].as_u64() == Some(expected.len() as u64)
    });
    let got: Vec<String> = sigs["signals"]
        .as_array()
        .unwrap()
        .iter()
        .rev() // the list is newest first
        .map(|x| x["signal"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(got, expected, "FIFO, in arrival order");
    // `signals list` pages: --limit 2 prints the cursor, --before it gives the next two.
    let first = cli(&s.base, &["signals", "list", &run, "--limit", "2"]);
    let n = expected.len();
    assert!(
        first.contains(&format!("more: --before {}", n - 1)),
        "{first}"
    );
    let next = cli(
        &s.base,
        &[
            "signals",
            "list",
            &run,
            "--limit",
            "2",
            "--before",
            &(n - 1).to_string(),
        ],
    );
    let seqs = |out: &str| -> Vec<String> {
        out.lines()
            .skip(1)
            .filter(|l| !l.starts_with("more:"))
            .filter_map(|l| l.split_whitespace().next().map(str::to_string))
            .collect()
    };
    assert_eq!(
        seqs(&first),
        vec![n.to_string(), (n - 1).to_string()],
        "{first}"
    );
    assert_eq!(
        seqs(&next),
        vec![(n - 2).to_string(), (n - 3).to_string()],
        "{next}"
    );

    // The CLI: a wait takes the oldest pr.closed; a raised signal wakes a second wait.
    let out = cli(
        &s.base,
        &[
            "runs",
            "wait",
            &run,
            "--name",
            "pr.closed",
            "--reason",
            "waiting for close",
        ],
    );
    assert!(out.contains("state:       resolved"), "{out}");
    assert!(out.contains("winner:      signal"), "{out}");
    let raise = [
        "signals",
        "raise",
        &run,
        "ci.green",
        "--data",
        "{\"checks\":12}",
        "--signal-id",
        "ci-1",
    ];
    let out = cli(&s.base, &raise);
    assert!(out.contains(": queued"), "{out}");
    let out = cli(&s.base, &raise);
    assert!(out.contains(": duplicate"), "the same signal again: {out}");
    let out = cli(
        &s.base,
        &[
            "runs", "wait", &run, "--name", "ci.green", "--reason", "ci", "--json",
        ],
    );
    let w: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        w["winner"]["signal"]["data"],
        serde_json::json!({"checks": 12})
    );
    let out = cli(&s.base, &["runs", "waits", &run]);
    assert_eq!(out.lines().count(), 3, "header + two waits: {out}");
    let metrics = get_text(&format!("{}/metrics", s.base));
    assert!(
        metrics.contains("tb_wait_resolutions_total{winner=\"signal\"} 2"),
        "{metrics}"
    );
    // tb_signals_total counts every path: webhook-raised signals as well as API ones.
    let signals_total = |outcome: &str, source: &str| -> u64 {
        metrics
            .lines()
            .filter(|l| l.starts_with("tb_signals_total{"))
            .filter(|l| {
                l.contains(&format!("outcome=\"{outcome}\""))
                    && l.contains(&format!("source=\"{source}\""))
            })
            .filter_map(|l| l.rsplit(" ").next()?.parse::<u64>().ok())
            .sum()
    };
    assert_eq!(signals_total("duplicate", "api"), 1, "{metrics}");
    assert_eq!(signals_total("queued", "api"), 1, "{metrics}");
    assert_eq!(signals_total("queued", "webhook"), n as u64, "{metrics}");

    // Driving the session from the CLI: claim the start turn, acknowledge it, then cancel the run.
    let t: Value = serde_json::from_str(&cli(&s.base, &["runs", "claim", &run, "--timeout", "5"]))
        .expect("claim prints the turn as JSON");
    assert_eq!(t["kind"], "start");
    assert_eq!(t["content"]["session"]["agent"], "pr-reviewer");
    let turn = t["turnId"].as_str().unwrap();
    let out = cli(&s.base, &["runs", "ack", &run, turn, "--claim", "1"]);
    assert!(out.contains("acknowledged turn"), "{out}");
    assert!(cli(&s.base, &["runs", "turns", &run]).contains("acked"));
    let out = cli(&s.base, &["runs", "cancel", &run]);
    assert!(out.contains("cancelled"), "{out}");
    let refused = Command::new(BIN)
        .args(["runs", "claim", &run, "--timeout", "1", "--server", &s.base])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("409 target_terminal"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}
