//! A flood of forged requests against the real binary, in a test binary of its own so
//! its load does not meet the timing-sensitive edge tests of `edge.rs`.

mod edge_support;

use std::process::Stdio;
use std::time::Duration;

use edge_support::*;

/// A flood of forged requests from 12 000 client addresses (behind a trusted proxy) costs
/// bounded memory and a bounded number of rows: every one is answered 401, none is stored, each is
/// counted, and the counts are one row per minute and outcome, not one per request or address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_forged_requests_from_many_addresses_keeps_memory_and_writes_bounded() {
    const N: usize = 12_000;
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 64, 800);
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(
        "\n[rate_limits]\nsource_per_min = 1000000\ntrusted_proxies = [\"127.0.0.1/32\"]\n",
    );
    std::fs::write(&cfg, text).unwrap();
    let srv = spawn(&cfg, &dir.path().join("data"), 1024, Stdio::null());
    let port = srv.port;
    let http = reqwest::Client::new();
    let forged = |i: usize| {
        let http = http.clone();
        async move {
            let ts = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs();
            let r = http
                .post(format!(
                    "http://127.0.0.1:{port}/v1/trigger-subscriptions/sw/ingest"
                ))
                .header("content-type", "application/json")
                .header("webhook-id", format!("msg_flood_{i:010}"))
                .header("webhook-timestamp", ts.to_string())
                .header(
                    "webhook-signature",
                    "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
                )
                .header(
                    "x-forwarded-for",
                    format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255),
                )
                .body(r#"{"type":"edge.test","data":{}}"#)
                .send()
                .await
                .unwrap();
            r.status().as_u16()
        }
    };
    // Warm up (connection pool, allocator), then measure.
    for i in 0..200 {
        assert_eq!(forged(i).await, 401);
    }
    let rss0 = vm_rss_kib(srv.child.id());
    let mut statuses = std::collections::BTreeMap::new();
    for chunk in (200..N).collect::<Vec<_>>().chunks(32) {
        let answers = futures_util::future::join_all(chunk.iter().map(|&i| forged(i))).await;
        for s in answers {
            *statuses.entry(s).or_insert(0usize) += 1;
        }
    }
    let rss = vm_rss_kib(srv.child.id());
    assert_eq!(
        statuses,
        [(401, N - 200)].into_iter().collect(),
        "every forged request is 401"
    );
    assert!(
        rss < rss0 + 24 * 1024,
        "VmRSS {rss0} -> {rss} KiB over {N} forged requests"
    );
    // Nothing stored, everything counted, in a handful of rows (the flush runs once a second).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let get = |path: String| {
        let http = http.clone();
        async move {
            http.get(format!("http://127.0.0.1:{port}{path}"))
                .send()
                .await
                .unwrap()
                .json::<serde_json::Value>()
                .await
                .unwrap()
        }
    };
    let receipts = get("/v1/receipts".into()).await;
    assert_eq!(
        receipts["receipts"].as_array().unwrap().len(),
        0,
        "{receipts}"
    );
    let counts = get("/v1/trigger-subscriptions/sw/ingress-counts?minutes=10".into()).await;
    let rows = counts["counts"].as_array().unwrap();
    let refused: u64 = rows
        .iter()
        .filter(|r| r["outcome"] == "signature_invalid")
        .map(|r| r["n"].as_u64().unwrap())
        .sum();
    assert_eq!(refused, N as u64, "{counts}");
    assert!(rows.len() <= 3, "one row per minute and outcome: {counts}");
    eprintln!(
        "flood: {N} forged requests from {N} addresses, VmRSS {rss0} -> {rss} KiB, {} count rows",
        rows.len()
    );
}
