//! PostgreSQL keeps a parsed statement and its plans per prepared statement and connection, so the
//! store's batched writes must not prepare one statement text per batch size: their rows go as one
//! array per column (`unnest`), their key lists as one array (`= ANY`). This test commits receipts and
//! attempts in batches of many sizes on a pool of ONE connection (so every statement lands on it) and
//! then counts that connection's prepared statements (`pg_prepared_statements`). Skips, with a printed
//! reason, only when PostgreSQL cannot be reached and `CI` is unset. Every race is bounded (`support::race`, 60 s).

mod support;
use support::race;

use std::collections::BTreeSet;
use std::sync::Arc;

use trigger_bridge_store::postgres::testing::TestDatabase;
use trigger_bridge_store::postgres::{PgStore, PoolOptions};
use trigger_bridge_store::*;

/// The batch sizes the rounds aim at (each round races this many commits of each kind).
const SIZES: std::ops::RangeInclusive<usize> = 2..=40;

/// The texts of the statements prepared on the pool's (one) connection.
async fn prepared(pg: &PgStore) -> Vec<String> {
    pg.pool()
        .write(|db| {
            db.rows("SELECT statement FROM pg_prepared_statements", &[], |r| {
                r.get::<String>(0)
            })
        })
        .await
        .expect("read pg_prepared_statements")
}

/// How many prepared statements write `table` (`INSERT INTO table` or `UPDATE table`).
fn writing(statements: &[String], table: &str) -> usize {
    let (ins, upd) = (format!("INSERT INTO {table} "), format!("UPDATE {table} "));
    statements
        .iter()
        .filter(|s| s.starts_with(&ins) || s.starts_with(&upd))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn batches_of_every_size_share_one_prepared_statement_per_kind() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let opts = PoolOptions {
        connections: 1,
        queue_capacity: 10_000,
    };
    let pg = Arc::new(
        PgStore::connect(db.url(), opts)
            .await
            .expect("open postgres"),
    );
    support::webhook_subscription(&*pg, "hooks").await;
    let mut runs = BTreeSet::new();
    for n in SIZES {
        let leases = race(n, |i| {
            let s = pg.clone();
            async move {
                s.commit_receipt(support::receipt(&format!("k{n}-{i}"), true, false))
                    .await
            }
        })
        .await;
        let leases: Arc<Vec<Lease>> = Arc::new(
            leases
                .into_iter()
                .map(|out| match out.expect("receipt committed") {
                    IngestOutcome::Accepted { mut leased, .. } => leased.remove(0),
                    other => panic!("a new key: {other:?}"),
                })
                .collect(),
        );
        let done = race(n, |i| {
            let (s, leases) = (pg.clone(), leases.clone());
            async move {
                s.commit_attempt(support::delivered(&leases[i], &leases[i].token))
                    .await
            }
        })
        .await;
        for out in done {
            runs.insert(out.expect("attempt committed").run_id.expect("a run"));
        }
    }
    let total: usize = SIZES.sum();
    assert_eq!(runs.len(), total, "every attempt started its own run");
    let (receipts, attempts) = pg.largest_batches();
    eprintln!("largest batches: {receipts} receipts, {attempts} attempts");
    assert!(
        receipts >= 8 && attempts >= 8,
        "batches of many sizes formed: largest {receipts} receipts, {attempts} attempts"
    );
    let statements = prepared(&pg).await;
    for table in [
        "receipts",
        "deliveries",
        "runs",
        "attempts",
        "run_events",
        "subscription_events",
    ] {
        eprintln!("{table}: {} statements", writing(&statements, table));
    }
    eprintln!(
        "prepared statements on the connection: {}",
        statements.len()
    );
    for s in &statements {
        eprintln!("  {}", s.chars().take(110).collect::<String>());
    }
    // One text per statement kind, whatever the batch sizes: the batch path's inserts and updates,
    // plus the single paths' own (a receipt: its insert and its state's update, single and batched;
    // deliveries: insert and fenced update, single and batched). With a text per batch size this
    // connection held 95 (41 receipts inserts, 41 deliveries inserts).
    let short: Vec<String> = statements
        .iter()
        .map(|s| s.chars().take(120).collect())
        .collect();
    for (table, most) in [
        ("runs", 2),
        ("attempts", 2),
        ("run_events", 2),
        ("subscription_events", 2),
        ("deliveries", 4),
        ("receipts", 4),
    ] {
        let n = writing(&statements, table);
        assert!(n <= most, "{n} statements write {table}: {short:#?}");
    }
    assert!(
        statements.len() <= 30,
        "{} statements prepared: {short:#?}",
        statements.len()
    );
}

/// The round trips of one event when nothing queues (one connection, one commit at a time): the
/// receipt's insert and its delivery's go together with the `BEGIN` (1), then the `COMMIT` (2); the
/// attempt's locked load goes with the live outbound webhooks (1), the run row alone (2), every write
/// after it together (3), then the `COMMIT` (4). Counted by the pool ([`PgPool::round_trips`]) on a
/// second event, so statement preparation (once per connection) is not in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_event_takes_two_round_trips_to_commit_and_four_to_start_its_run() {
    let Some(db) = TestDatabase::create() else {
        return;
    };
    let opts = PoolOptions {
        connections: 1,
        queue_capacity: 100,
    };
    let pg = PgStore::connect(db.url(), opts)
        .await
        .expect("open postgres");
    support::webhook_subscription(&pg, "hooks").await;
    // `support::delivered` attempts at a fixed time whose subscription needs no write (no streak, a
    // fresh `last_success_at`): the attempt's path without the subscription's lock and update.
    let mut trips = Vec::new();
    for key in ["warm", "measured"] {
        let before = pg.pool().round_trips();
        let lease = match pg
            .commit_receipt(support::receipt(key, true, false))
            .await
            .expect("receipt committed")
        {
            IngestOutcome::Accepted { mut leased, .. } => leased.remove(0),
            other => panic!("a new key: {other:?}"),
        };
        let committed = pg.pool().round_trips();
        let done = pg
            .commit_attempt(support::delivered(&lease, &lease.token))
            .await
            .expect("attempt committed");
        assert!(done.run_id.is_some(), "the attempt started its run");
        trips.push((committed - before, pg.pool().round_trips() - committed));
    }
    eprintln!(
        "round trips (receipt, attempt): warm-up {:?}, then {:?}",
        trips[0], trips[1]
    );
    assert_eq!(trips[1], (2, 4), "round trips of the second event");
    // The run's first events and the attempt are all there (the pipeline wrote every statement).
    let run = pg
        .pool()
        .write(|db| {
            db.rows(
                "SELECT (SELECT COUNT(*) FROM runs), (SELECT COUNT(*) FROM attempts), \
                 (SELECT COUNT(*) FROM deliveries WHERE state = 'delivered' AND lease_token IS NULL), \
                 (SELECT COUNT(*) FROM receipts WHERE state = 'consumed')",
                &[],
                |r| Ok((r.get::<i64>(0)?, r.get::<i64>(1)?, r.get::<i64>(2)?, r.get::<i64>(3)?)),
            )
        })
        .await
        .unwrap();
    assert_eq!(run, vec![(2, 2, 2, 2)]);
}
