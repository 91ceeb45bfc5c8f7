//! The "dead letters and replay" walkthrough of the quickstart with the real binary: `test-worker
//! --fail`, an event that retries and dead-letters, the worker restarted healthy, `deliveries
//! replay-all` (refused without a terminal and without `--yes`, asking on a terminal, filtered by
//! error class, then the rest), and a second `replay-all` that finds nothing. Also `test-worker`'s `/control` switch and
//! signature check, and `completions`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

mod common;

use common::*;

/// A `trigger-bridge test-worker` child; its stdout lines (one per request) are collected.
struct TestWorker {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    base: String,
}

impl TestWorker {
    fn spawn(port: u16, extra: &[&str]) -> TestWorker {
        let mut child = Command::new(BIN)
            .args(["test-worker", "--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn test-worker");
        let lines: Arc<Mutex<Vec<String>>> = Default::default();
        let (out, l) = (child.stdout.take().unwrap(), lines.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                l.lock().unwrap().push(line);
            }
        });
        let w = TestWorker {
            child,
            lines,
            base: format!("http://127.0.0.1:{port}"),
        };
        for _ in 0..200 {
            if ureq_get(&format!("{}/control", w.base)).is_some() {
                return w;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("test-worker did not come up on {}", w.base);
    }

    /// Waits (at most 15 s) until `n` logged requests contain `needle`.
    fn wait_lines(&self, needle: &str, n: usize) -> Vec<String> {
        for _ in 0..600 {
            let hits: Vec<String> = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.contains(needle))
                .cloned()
                .collect();
            if hits.len() >= n {
                return hits;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!(
            "fewer than {n} test-worker lines contain {needle:?}: {:?}",
            self.lines.lock().unwrap()
        );
    }
}

impl Drop for TestWorker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The quickstart config with the flaky workflow pointed at `worker_port` instead of 9090.
fn quickstart_with_worker(dir: &Path, worker_port: u16) -> PathBuf {
    let q = std::fs::read_to_string(repo().join("examples/quickstart.toml")).unwrap();
    assert!(q.contains("url = \"http://127.0.0.1:9090/run\""));
    let path = dir.join("quickstart.toml");
    std::fs::write(
        &path,
        q.replace("127.0.0.1:9090", &format!("127.0.0.1:{worker_port}")),
    )
    .unwrap();
    path
}

fn cli(server: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .args(["--server", server])
        .stdin(Stdio::null())
        .output()
        .expect("run the CLI")
}

/// Runs the CLI on a pseudo-terminal (util-linux `script`), typing `answer` on its stdin.
fn cli_on_tty(server: &str, args: &str, answer: &str) -> Output {
    use std::io::Write;
    let cmd = format!("'{BIN}' {args} --server {server}");
    let mut child = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("util-linux script runs the CLI on a pty");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(answer.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `send` to the `flaky` subscription (Standard Webhooks) --json: (status, response).
fn send_flaky(base: &str, file: &Path) -> (u64, Value) {
    let out = Command::new(BIN)
        .args([
            "send",
            "--url",
            &format!("{base}/v1/trigger-subscriptions/flaky/ingest"),
            "--connector",
            "standard-webhooks",
            "--secret",
            SW_SECRET,
            "--json",
            "--file",
        ])
        .arg(file)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{}", text(&out)));
    (v["status"].as_u64().unwrap(), v["response"].clone())
}

#[test]
fn quickstart_dead_letters_with_the_failing_test_worker_and_replay_all_after_it_is_healthy() {
    let dir = tempfile::tempdir().unwrap();
    let wp = free_port();
    let worker = TestWorker::spawn(wp, &["--fail", "--secret", SW_SECRET]);
    let s = Server::spawn(
        &quickstart_with_worker(dir.path(), wp),
        &dir.path().join("data"),
        free_port(),
    );
    let push = fixtures().join("github/push/00.json");
    let (st, a) = send_flaky(&s.base, &push);
    assert_eq!(st, 202, "{a}");
    let d1 = a["deliveries"][0]["deliveryId"]
        .as_str()
        .unwrap()
        .to_string();
    // Three attempts 200 ms apart, each answered 500 by the worker, then a dead letter.
    let d = s.wait_for(&format!("/v1/deliveries/{d1}"), |v| {
        v["delivery"]["state"] == "dead-lettered"
    });
    let classes: Vec<&str> = d["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["errorClass"].as_str().unwrap())
        .collect();
    assert_eq!(classes, vec!["http_500"; 3], "{d}");
    let logged = worker.wait_lines(&format!("webhook-id={d1}"), 3);
    assert!(
        logged
            .iter()
            .all(|l| l.contains("workflow=flaky") && l.contains("-> 500")),
        "{logged:?}"
    );
    // One exhausted delivery is not continuous failure: the subscription stays active.
    // With the worker down, the next event fails differently (connect) and is dead-lettered
    // after its own three attempts.
    let sub = s.get("/v1/trigger-subscriptions/flaky");
    assert_eq!(sub["subscription"]["state"], "active", "{sub}");
    drop(worker);
    let (st, b) = send_flaky(&s.base, &fixtures().join("github/push/01.json"));
    assert_eq!((st, b["outcome"].as_str()), (202, Some("accepted")), "{b}");
    let d2 = b["deliveries"][0]["deliveryId"]
        .as_str()
        .unwrap()
        .to_string();
    let d = s.wait_for(&format!("/v1/deliveries/{d2}"), |v| {
        v["delivery"]["state"] == "dead-lettered"
    });
    let classes: Vec<&str> = d["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["errorClass"].as_str().unwrap())
        .collect();
    assert_eq!(classes, vec!["connect"; 3], "{d}");
    assert_eq!(
        s.get("/v1/trigger-subscriptions/flaky")["subscription"]["state"],
        "active"
    );

    // Start the worker again, healthy.
    let worker = TestWorker::spawn(wp, &["--secret", SW_SECRET]);

    // No terminal and no --yes: refused (exit 2), nothing replayed.
    let o = cli(
        &s.base,
        &["deliveries", "replay-all", "--subscription", "flaky"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("2 dead-lettered deliveries of flaky match; refusing to replay without confirmation: stdin is not a terminal, pass --yes"),
        "{}",
        text(&o)
    );
    for id in [&d1, &d2] {
        assert_eq!(
            s.get(&format!("/v1/deliveries/{id}"))["delivery"]["state"],
            "dead-lettered"
        );
    }
    // A filter that selects nothing.
    let o = cli(
        &s.base,
        &[
            "deliveries",
            "replay-all",
            "--subscription",
            "flaky",
            "--error-class",
            "timeout",
            "--yes",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("no dead-lettered deliveries of flaky match; nothing to replay"));
    // On a terminal it asks; anything but y/yes aborts with nothing replayed.
    let o = cli_on_tty(&s.base, "deliveries replay-all --subscription flaky", "n\n");
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("Replay 2 dead-lettered deliveries of flaky? [y/N]")
            && out.contains("aborted; nothing replayed"),
        "{out}"
    );
    assert_eq!(
        s.get(&format!("/v1/deliveries/{d1}"))["delivery"]["state"],
        "dead-lettered"
    );
    // By error class, confirmed with y on the terminal: only the delivery the worker failed.
    let o = cli_on_tty(
        &s.base,
        "deliveries replay-all --subscription flaky --error-class http_500",
        "y\n",
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(
        out.contains("Replay 1 dead-lettered delivery of flaky? [y/N]")
            && out.contains("replayed 1 of 1 dead-lettered delivery of flaky")
            && out.contains(&d1),
        "{out}"
    );
    // The rest (the one the worker was down for), as JSON.
    let o = cli(
        &s.base,
        &[
            "deliveries",
            "replay-all",
            "--subscription",
            "flaky",
            "--yes",
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v,
        json!({"count": 1, "replayed": 1, "deliveryIds": [d2], "skipped": []})
    );
    // One more attempt each, answered 200: delivered, and their runs completed.
    for (id, attempts) in [(&d1, 4), (&d2, 4)] {
        let d = s.wait_for(&format!("/v1/deliveries/{id}"), |v| {
            v["delivery"]["state"] == "delivered"
        });
        assert_eq!(d["attempts"].as_array().unwrap().len(), attempts, "{d}");
        assert_eq!(d["delivery"]["replays"], 1);
        let run = d["delivery"]["runId"].as_str().unwrap().to_string();
        s.wait_for(&format!("/v1/runs/{run}"), |v| v["status"] == "completed");
        let ok = worker.wait_lines(&format!("webhook-id={id}"), 1);
        assert!(ok[0].contains("-> 200") && ok[0].contains(&run), "{ok:?}");
    }
    // Counted on /metrics: two deliveries replayed in bulk (one call each).
    let m = get_text(&format!("{}/metrics", s.base));
    assert!(
        m.contains("tb_dead_letter_replays_total{mode=\"bulk\"} 2"),
        "{}",
        m.lines()
            .filter(|l| l.contains("replays"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // A second replay-all finds nothing.
    let o = cli(
        &s.base,
        &[
            "deliveries",
            "replay-all",
            "--subscription",
            "flaky",
            "--yes",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("nothing to replay"), "{}", text(&o));
    // The quickstart's other subscriptions still work.
    let o = Command::new(BIN)
        .args([
            "send",
            "--url",
            &format!("{}/v1/trigger-subscriptions/standard/ingest", s.base),
            "--connector",
            "standard-webhooks",
            "--secret",
            SW_SECRET,
            "--json",
            "--file",
        ])
        .arg(&push)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["status"], 202, "{v}");
}

/// A run request as the http executor sends it (unsigned).
fn run_request(base: &str) -> (u16, Value) {
    post(
        &format!("{base}/run"),
        &json!({"runId": "run_x", "workflowId": "flaky", "inputs": {}, "causationId": "evt_x",
                "trigger": {"subscriptionId": "flaky", "eventType": "push", "receiptId": "rcpt_x"}}),
    )
}

#[test]
fn test_worker_switches_to_healthy_through_control_and_checks_signatures_when_given_the_secret() {
    let w = TestWorker::spawn(free_port(), &["--fail"]);
    assert_eq!(run_request(&w.base).0, 500);
    let (st, v) = post(&format!("{}/control", w.base), &json!({"failRate": 0}));
    assert_eq!((st, v["failRate"].as_f64()), (200, Some(0.0)), "{v}");
    assert_eq!(run_request(&w.base), (200, json!({"ok": true})));
    let (st, v) = post(&format!("{}/control", w.base), &json!({"failRate": 1.5}));
    assert_eq!((st, v["error"].as_str()), (400, Some("validation_error")));
    let c = ureq_get(&format!("{}/control", w.base)).unwrap();
    assert_eq!(c, json!({"failRate": 0.0, "requests": 2, "failed": 1}));
    let logged = w.wait_lines("run=run_x workflow=flaky subscription=flaky event=push", 2);
    assert!(logged[0].ends_with("-> 500 (fail-rate 1)"), "{logged:?}");
    assert!(logged[1].ends_with("-> 200 (fail-rate 0)"), "{logged:?}");
    // With the secret an unsigned request is refused.
    let w = TestWorker::spawn(free_port(), &["--secret", SW_SECRET]);
    assert_eq!(run_request(&w.base).0, 401);
}

#[test]
fn completions_print_a_script_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let o = Command::new(BIN)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(o.status.success(), "{shell}: {}", text(&o));
        let script = String::from_utf8(o.stdout).unwrap();
        assert!(!script.is_empty(), "{shell}");
        for word in [
            "trigger-bridge",
            "replay-all",
            "test-worker",
            "check-config",
        ] {
            assert!(script.contains(word), "{shell} script lacks {word}");
        }
    }
    let o = Command::new(BIN)
        .args(["completions", "powershell"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}
