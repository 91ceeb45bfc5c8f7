//! `trigger-bridge migrate --from sqlite:DIR --to postgres://...` (`src/migrate_copy.rs`), driven
//! through its `run` entry and its flags as `migrate` flattens them: a copy into a fresh PostgreSQL
//! schema, the refusal of a second copy and `--force`, the refusal of a source a running server holds
//! (a real `trigger-bridge serve` process), progress on a terminal and off it, the counts table and
//! the failure on a mismatch. PostgreSQL tests skip, with a printed reason, only when the server cannot
//! be reached and `CI` is unset.

#[path = "../src/data_lock.rs"]
mod data_lock;
#[path = "../src/migrate_copy.rs"]
mod migrate_copy;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use migrate_copy::{check, counts_table, redact, source_paths, target_url, CopyArgs, ProgressView};
use serde_json::json;
use tb_core::delivery::DeliveryState;
use tb_core::ids::{new_id, IdKind};
use tb_core::receipt::ReceiptState;
use tb_core::subscription::Source;
use tb_store::copy::{CopyReport, Progress, TableCount};
use tb_store::postgres::testing::TestDatabase;
use tb_store::postgres::{PgStore, PoolOptions};
use tb_store::sqlite::SqliteStore;
use tb_store::*;

const BIN: &str = env!("CARGO_BIN_EXE_trigger-bridge");

/// `migrate`'s flags as the integrator wires them: its own plus the copy's, flattened.
#[derive(Parser, Debug)]
#[command(name = "trigger-bridge")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Subcommand, Debug)]
enum Cmd {
    Migrate(MigrateArgs),
}

#[derive(clap::Args, Debug)]
struct MigrateArgs {
    #[arg(long)]
    data_dir: Option<PathBuf>,
    #[command(flatten)]
    copy: CopyArgs,
}

fn parse(args: &[&str]) -> Result<CopyArgs, clap::Error> {
    let mut all = vec!["trigger-bridge", "migrate"];
    all.extend_from_slice(args);
    Cli::try_parse_from(all).map(|c| match c.cmd {
        Cmd::Migrate(m) => m.copy,
    })
}

#[test]
fn the_flags_parse_as_migrate_flags() {
    let a = parse(&["--from", "sqlite:/d", "--to", "postgres://h/db", "--force"]).unwrap();
    assert!(a.requested());
    assert_eq!(
        a,
        CopyArgs {
            from: Some("sqlite:/d".into()),
            to: Some("postgres://h/db".into()),
            force: true,
            batch_rows: 1_000,
        }
    );
    let plain = parse(&["--data-dir", "/d"]).unwrap();
    assert!(!plain.requested(), "plain migrate is unchanged");
    for bad in [
        &["--force"][..],
        &["--from", "sqlite:/d"],
        &["--to", "postgres://h/db"],
        &[
            "--from",
            "sqlite:/d",
            "--to",
            "postgres://h/db",
            "--batch-rows",
            "0",
        ],
    ] {
        assert!(parse(bad).is_err(), "{bad:?} must be refused");
    }
}

#[test]
fn the_two_ends_are_checked_and_passwords_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    let e = source_paths(&format!("sqlite:{}", dir.path().display()))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no SQLite store at") && e.contains("trigger-bridge.db"),
        "{e}"
    );
    assert!(source_paths("/data")
        .unwrap_err()
        .to_string()
        .contains("expected sqlite:PATH"));
    std::fs::write(dir.path().join("trigger-bridge.db"), b"").unwrap();
    let by_dir = source_paths(&format!("sqlite:{}", dir.path().display())).unwrap();
    let by_file = source_paths(&format!(
        "sqlite://{}",
        dir.path().join("trigger-bridge.db").display()
    ))
    .unwrap();
    assert_eq!(by_dir, by_file);
    assert_eq!(by_dir.0, dir.path());
    assert!(target_url("postgresql://h/db").is_ok());
    let e = target_url("mysql://u:hunter2@h/db")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("mysql://u:***@h/db") && !e.contains("hunter2"),
        "{e}"
    );
    assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
}

/// A writer the test can read back.
#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buf {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

fn feed(view: &mut ProgressView) {
    for done in [0, 100, 200, 300, 950, 1_000] {
        view.show(Progress {
            table: "receipts",
            done,
            total: 1_000,
        });
    }
    view.show(Progress {
        table: "waits",
        done: 0,
        total: 0,
    });
}

#[test]
fn progress_is_a_bar_on_a_terminal_and_lines_otherwise() {
    let buf = Buf::default();
    feed(&mut ProgressView::new(Box::new(buf.clone()), false));
    assert_eq!(
        buf.text(),
        "receipts: 0/1000 rows\nreceipts: 100/1000 rows\nreceipts: 200/1000 rows\n\
         receipts: 300/1000 rows\nreceipts: 950/1000 rows\nreceipts: 1000/1000 rows, done\n\
         waits: 0/0 rows, done\n"
    );
    let buf = Buf::default();
    feed(&mut ProgressView::new(Box::new(buf.clone()), true));
    let t = buf.text();
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 2, "one line per table: {t:?}");
    let last_redraw = lines[0].rsplit('\r').next().unwrap();
    assert_eq!(
        last_redraw,
        format!("{:<22} [{}] 1000/1000 rows", "receipts", "#".repeat(30))
    );
    assert!(lines[0].contains(&format!(
        "[{}{}] 300/1000 rows",
        "#".repeat(9),
        " ".repeat(21)
    )));
    assert_eq!(
        lines[1].trim_start_matches('\r'),
        format!("{:<22} [{}] 0/0 rows", "waits", "#".repeat(30))
    );
}

#[test]
fn counts_are_printed_as_a_table_and_a_mismatch_fails() {
    let mut report = CopyReport {
        tables: vec![
            TableCount {
                table: "receipts".into(),
                source: 12,
                target: 12,
            },
            TableCount {
                table: "runs".into(),
                source: 3,
                target: 3,
            },
        ],
        values: vec![TableCount {
            table: "receipts.body".into(),
            source: 10,
            target: 10,
        }],
        truncated: false,
        sequences: vec![],
    };
    // The bodies travel in the receipts' rows: counted after the rows' total, not in it.
    assert_eq!(
        counts_table(&report),
        format!(
            "{:<22} {:>12} {:>12}\n{:<22} {:>12} {:>12}\n{:<22} {:>12} {:>12}\n{:<22} {:>12} {:>12}\n\
             {:<22} {:>12} {:>12}\n",
            "table", "source", "target", "receipts", 12, 12, "runs", 3, 3, "total", 15, 15,
            "receipts.body", 10, 10
        )
    );
    check(&report).unwrap();
    report.tables[1].target = 2;
    assert!(counts_table(&report).contains("  MISMATCH\n"));
    assert_eq!(
        check(&report).unwrap_err().to_string(),
        "the copy is incomplete: 1 table(s) differ: runs (source 3, target 2)"
    );
    // A body lost on the way fails the copy although every row arrived.
    report.tables[1].target = 3;
    report.values[0].target = 9;
    assert!(counts_table(&report).ends_with("  MISMATCH\n"));
    assert_eq!(
        check(&report).unwrap_err().to_string(),
        "the copy is incomplete: 1 table(s) differ: receipts.body (source 10, target 9)"
    );
}

/// A store with one subscription and `n` receipts (binary bodies), each with one pending delivery.
async fn fill(dir: &Path, n: usize) -> Vec<(String, Vec<u8>)> {
    let s = SqliteStore::open_dir(dir).unwrap();
    s.upsert_subscription(
        SubscriptionDef {
            id: "gh".into(),
            source: Source::Webhook,
            connector: "github".into(),
            config: json!({}),
            failure_threshold: 0,
        },
        1_000,
    )
    .await
    .unwrap();
    let mut bodies = Vec::new();
    for i in 0..n {
        let body: Vec<u8> = (0..=255u8).rev().chain([i as u8]).collect();
        let r = NewReceipt {
            id: new_id(IdKind::Receipt),
            source: tb_core::receipt::ReceiptSource::Webhook,
            subscription_id: "gh".into(),
            dedup_key: format!("dk{i}"),
            provider_event_id: format!("pe{i}"),
            event_type: "push".into(),
            normalized: json!({"event": "push"}),
            state: ReceiptState::Routed,
            content_type: None,
            body: Bytes::from(body.clone()),
            received_at: 2_000,
            dedup_until: 90_000_000,
            deliveries: vec![NewDelivery {
                id: new_id(IdKind::Delivery),
                kind: tb_core::delivery::DeliveryKind::Binding,
                binding_id: "b".into(),
                action: "start_run".into(),
                workflow_id: Some("noop".into()),
                run_id: Some(new_id(IdKind::Run)),
                inputs: json!({}),
                params: None,
                state: DeliveryState::Pending,
                dead_letter_reason: None,
            }],
            capability: None,
            lease: None,
            trace_context: None,
        };
        bodies.push((r.id.clone(), body));
        s.commit_receipt(r).await.unwrap();
    }
    s.close().await;
    bodies
}

fn args(dir: &Path, url: &str, force: bool) -> CopyArgs {
    CopyArgs {
        from: Some(format!("sqlite:{}", dir.display())),
        to: Some(url.to_string()),
        force,
        batch_rows: 2,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_a_store_then_refuses_a_second_copy_unless_forced() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let bodies = fill(dir.path(), 5).await;
    migrate_copy::run(args(dir.path(), db.url(), false))
        .await
        .unwrap();
    let target = PgStore::connect(db.url(), PoolOptions::default())
        .await
        .unwrap();
    for (id, body) in &bodies {
        assert_eq!(&target.get_body(id).await.unwrap()[..], &body[..]);
    }
    assert_eq!(target.queue_depth().await.unwrap().pending, 5);

    let e = migrate_copy::run(args(dir.path(), db.url(), false))
        .await
        .unwrap_err();
    let e = format!("{e:#}");
    assert!(
        e.contains("table deliveries has rows") && e.contains("--force"),
        "{e}"
    );
    // The second copy got past the lock (the first released it) and was refused by the target.
    migrate_copy::run(args(dir.path(), db.url(), true))
        .await
        .unwrap();
    assert_eq!(
        target.queue_depth().await.unwrap().pending,
        5,
        "replaced, not doubled"
    );
    target.close().await;
}

/// Kills the child when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_held_by_a_running_server_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    fill(&data, 1).await;
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        "[[subscriptions]]\nid = \"sw\"\nconnector = \"standard-webhooks\"\n\
         secret = \"env:STANDARD_WEBHOOK_SECRET\"\n",
    )
    .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = Killed(
        Command::new(BIN)
            .args(["serve", "--config"])
            .arg(&cfg)
            .args(["--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
            .arg(&data)
            .env(
                "STANDARD_WEBHOOK_SECRET",
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            )
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // The server holds the lock once it wrote its pid into the lock file (bounded wait).
    let pid = server.0.id().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_to_string(data.join("lock"))
        .unwrap_or_default()
        .trim()
        != pid
    {
        assert!(
            Instant::now() < deadline,
            "the server did not take the data dir lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let e = migrate_copy::run(args(&data, "postgres://127.0.0.1:9/none", false))
        .await
        .unwrap_err();
    let e = format!("{e:#}");
    assert!(e.contains("the source store must not be in use"), "{e}");
    assert!(
        e.contains(&format!("in use by another process (pid {pid})")),
        "{e}"
    );
    drop(server);
}
