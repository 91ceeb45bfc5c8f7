//! Crash under load: the server as a child process, concurrent senders that retry until they
//! get an answer (as real senders do), SIGKILL at random moments several times with restarts, then a
//! drain. Asserts from the store and the API that nothing was lost or doubled, and prints the counts.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_trigger-bridge");
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const SENDERS: usize = 8;
const KILLS: usize = 4;

/// A server process that is killed when dropped, so a failing assertion leaves no server running.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(config: &Path, data: &Path, port: u16) -> Killed {
    Killed(
        Command::new(BIN)
            .args(["serve", "--config"])
            .arg(config)
            .args(["--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
            .arg(data)
            .env("STANDARD_WEBHOOK_SECRET", SECRET)
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn server"),
    )
}

/// Posts `id` until the server answers 202 or 200; returns (status, receiptId).
async fn send_until_answered(
    http: &reqwest::Client,
    url: &str,
    key: &[u8],
    id: &str,
    body: &[u8],
) -> (u16, String) {
    loop {
        let ts = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let sig = tb_ingress::standard_webhooks::sign(key, id, ts, body);
        let r = http
            .post(url)
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", sig)
            .body(body.to_vec())
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        if let Ok(r) = r {
            let status = r.status().as_u16();
            if let (200 | 202, Ok(v)) = (status, r.json::<Value>().await) {
                return (status, v["receiptId"].as_str().unwrap().to_string());
            }
            assert!(
                status >= 500 || status == 200 || status == 202,
                "unexpected answer {status}"
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_loses_nothing_and_doubles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config: PathBuf = dir.path().join("crash.toml");
    std::fs::write(
        &config,
        r#"
[server]
lease_ms = 1000
[[subscriptions]]
id = "standard"
connector = "standard-webhooks"
secret = "env:STANDARD_WEBHOOK_SECRET"
[[workflows]]
id = "noop"
executor = "noop"
[[bindings]]
id = "all"
subscription = "standard"
event_types = ["*"]
action = "start_run"
workflow = "noop"
"#,
    )
    .unwrap();
    let data = dir.path().join("data");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let mut server = spawn(&config, &data, port);

    let key = tb_ingress::parse_whsec(SECRET).unwrap();
    let url = format!("{base}/v1/trigger-subscriptions/standard/ingest");
    let answered: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let http = reqwest::Client::new();
    let started = Instant::now();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut senders = Vec::new();
    for s in 0..SENDERS {
        let (http, url, key, answered, stop) = (
            http.clone(),
            url.clone(),
            key.clone(),
            answered.clone(),
            stop.clone(),
        );
        senders.push(tokio::spawn(async move {
            let mut duplicates = 0;
            let mut n = 0;
            // Send until told to stop; the id in hand is always sent until it is answered.
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let id = format!("msg_crash_{s:02}_{n:06}");
                let body = format!(r#"{{"type":"crash.test","data":{{"n":{n}}}}}"#);
                let (_, receipt) =
                    send_until_answered(&http, &url, &key, &id, body.as_bytes()).await;
                let first = answered
                    .lock()
                    .unwrap()
                    .entry(id.clone())
                    .or_insert(receipt.clone())
                    .clone();
                assert_eq!(first, receipt, "one id, one receipt");
                // Every tenth id is sent again at once: the answer must be the same receipt.
                if n % 10 == 0 {
                    let (status, again) =
                        send_until_answered(&http, &url, &key, &id, body.as_bytes()).await;
                    assert_eq!(
                        (status, again),
                        (200, receipt),
                        "a redelivery is a duplicate of the first receipt"
                    );
                    duplicates += 1;
                }
            }
            duplicates
        }));
    }
    // Kill the server at random moments while the senders run, restarting it each time. Each kill
    // comes only after the (re)started server answered new ids, so every kill lands under load however
    // slow the machine is (bounded: 30 s per restart).
    let answered_after = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(30);
        let answered = answered.clone();
        async move {
            while answered.lock().unwrap().len() <= n {
                assert!(Instant::now() < deadline, "no id answered after a restart");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let mut at_kill = vec![0];
    for k in 0..KILLS {
        answered_after(*at_kill.last().unwrap()).await;
        let wait = rand::rng().random_range(300..900);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        server.0.kill().unwrap(); // SIGKILL
        server.0.wait().unwrap();
        let n = answered.lock().unwrap().len();
        at_kill.push(n);
        eprintln!(
            "kill {} at {:.1}s with {n} ids answered",
            k + 1,
            started.elapsed().as_secs_f64()
        );
        server = spawn(&config, &data, port);
    }
    answered_after(*at_kill.last().unwrap()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut duplicates = 0;
    for s in senders {
        duplicates += s.await.unwrap();
    }
    // Drain: every delivery reaches a terminal state (leases of killed attempts lapse after 1 s).
    let db = rusqlite::Connection::open_with_flags(
        data.join("trigger-bridge.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let count = |sql: &str| -> i64 { db.query_row(sql, [], |r| r.get(0)).unwrap() };
    let deadline = Instant::now() + Duration::from_secs(30);
    while count("SELECT COUNT(*) FROM deliveries WHERE state IN ('pending','retrying')") > 0 {
        assert!(Instant::now() < deadline, "the backlog did not drain");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let answered = answered.lock().unwrap().clone();
    let receipts = count("SELECT COUNT(*) FROM receipts");
    let runs = count("SELECT COUNT(*) FROM runs");
    let delivered = count("SELECT COUNT(*) FROM deliveries WHERE state = 'delivered'");
    let doubled = count("SELECT COUNT(*) FROM (SELECT r.dedup_key FROM runs x JOIN receipts r ON r.id = x.receipt_id GROUP BY r.dedup_key HAVING COUNT(*) > 1)");
    let open_receipts = count("SELECT COUNT(*) FROM receipts WHERE state NOT IN ('consumed','rejected','duplicate','unmatched','rate_limited','disabled','expired','target_terminal','routing_failed','dead_lettered')");
    eprintln!(
        "crash test: {} ids answered 2xx, {duplicates} duplicates re-sent, {KILLS} SIGKILLs in {:.1}s; store: {receipts} receipts, {delivered} deliveries delivered, {runs} runs, {doubled} dedup keys with two runs, {open_receipts} receipts not final",
        answered.len(),
        started.elapsed().as_secs_f64()
    );
    // The load ran through every kill: ids were answered before the first kill, between every two
    // kills (the restarted server took traffic) and after the last. A count floor would measure the
    // machine, not the server (a busy CI machine answers fewer).
    at_kill.push(answered.len());
    assert!(
        at_kill.windows(2).all(|w| w[1] > w[0]),
        "ids answered (0, at each kill, at the end): {at_kill:?}"
    );
    assert_eq!(
        receipts as usize,
        answered.len(),
        "the generator's accepted count equals the store's"
    );
    for (id, receipt) in &answered {
        let key = tb_core::dedup::dedup_key("standard", id);
        let found: Vec<String> = db
            .prepare(
                "SELECT id FROM receipts WHERE subscription_id = 'standard' AND dedup_key = ?1",
            )
            .unwrap()
            .query_map([&key], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(found, vec![receipt.clone()], "exactly one receipt for {id}");
    }
    assert_eq!(doubled, 0, "no dedup key has two runs");
    assert_eq!(runs, receipts, "one run per receipt (one binding)");
    assert_eq!(delivered, receipts);
    assert_eq!(open_receipts, 0, "every receipt is terminal or consumed");
    // The API agrees with the store.
    let some = answered.values().next().unwrap();
    let v: Value = http
        .get(format!("{base}/v1/receipts/{some}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["receipt"]["state"], "consumed");
    assert_eq!(v["deliveries"][0]["state"], "delivered");
    server.0.kill().unwrap();
    server.0.wait().unwrap();
}
