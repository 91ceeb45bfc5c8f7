//! Several attempt commits in one transaction, with one multi-row statement per table (the
//! PostgreSQL end-to-end path spent its time in per-statement work, ~11 statements per attempt). The
//! rule is the single attempt's (`tb_core::attempt::after_attempt`); only the loading and the writing
//! are shared between the batch's items. Nothing is decided here.
//!
//! Per batch of N attempts without a local effect:
//! 1. ONE statement loads and locks every delivery and its receipt ([`super::attempt::JOINED`] with
//!    `id IN (...)` on SQLite, `id = ANY(?1::text[])` on PostgreSQL, `ORDER BY r.id, d.id`, `FOR UPDATE OF d, r` on PostgreSQL). The order is global,
//!    so two batches on two replicas take their receipt locks in the same order and cannot deadlock
//!    each other.
//! 2. Each item is checked and decided on its own snapshot: a lease the item no longer holds, or a
//!    completion the rule refuses, is that item's `LeaseLost` (nothing of it is written). An item the
//!    batch does not write itself takes the single path ([`super::attempt::commit_attempt`]) inside a
//!    savepoint after the batch's writes, in subscription order, so its failure rolls back only its
//!    own writes: one with a local effect, a delivery named twice, one without a receipt row, one whose
//!    receipt has other deliveries (the single path reads them after their writes, so the receipt
//!    settles), one whose rule writes its subscription.
//! 3. The rest are written with one statement each for: the run rows (`ON CONFLICT (id) DO NOTHING
//!    RETURNING id`; an item whose run existed is decided again with `run_exists`), the fenced delivery
//!    updates (`UPDATE ... FROM (VALUES ...)` on SQLite, `FROM unnest(...)` on PostgreSQL: `super::Rows`,
//!    under the lock every fence holds, and a fence that does not, by its row count, is an error for
//!    the whole batch), the attempt rows, the subscription events, the run events with their outbox
//!    rows ([`super::log::RunLog::queue_first_events`]: one packed row per new run) and the receipts'
//!    states, all sent as one [`Pipeline`] (one round trip on PostgreSQL). On PostgreSQL the live
//!    outbound webhooks the outbox fans out to are read with step 1's load.
//!
//! A batch that fails as a whole (a statement error) is rolled back; the caller then commits its items
//! one by one (`crate::sql::batch`), so every item still gets its own answer.

use std::collections::{HashMap, HashSet};

use tb_core::attempt::{after_attempt, AttemptSnapshot, AttemptWrites};

use super::attempt::{
    commit_attempt, first_events, insert_run_rows, joined_many_sql, snapshot_from_joined,
    with_live_webhooks,
};
use super::batch::in_savepoint;
use super::lease::lost;
use super::log::{queue_attempts, queue_events, NewRunEvent, RunLog};
use super::{Col, Db, IdList, Pipeline, Rows, ToParam};
use crate::model::{AttemptCommit, AttemptCommitted};
use crate::{StoreError, StoreResult};
use tb_core::outbox::LiveWebhook;

/// Commits `items` in the open transaction and answers each. An item's own refusal (`LeaseLost`,
/// `NotFound`, `Rejected`) is its answer; an error that says the transaction itself failed
/// (`Database`, `Retryable`, `Unavailable`, `Busy`) is returned for the whole batch, which the caller
/// rolls back. One item is [`commit_attempt`] itself: its error is the batch's.
pub(crate) fn commit_attempts(
    c: &dyn Db,
    items: &[AttemptCommit],
) -> StoreResult<Vec<StoreResult<AttemptCommitted>>> {
    if let [one] = items {
        return commit_attempt(c, one).map(|v| vec![Ok(v)]);
    }
    let mut answers: Vec<Option<StoreResult<AttemptCommitted>>> =
        items.iter().map(|_| None).collect();
    let mut single: Vec<usize> = Vec::new();
    // Items with a local effect, and a delivery named twice, take the single path.
    let mut seen = HashSet::new();
    let mut batched_ids: Vec<&str> = Vec::new();
    for (i, a) in items.iter().enumerate() {
        if a.effect.is_some() || !seen.insert(a.delivery_id.as_str()) {
            single.push(i);
        } else {
            batched_ids.push(a.delivery_id.as_str());
        }
    }
    let mut snapshots: HashMap<String, AttemptSnapshot> = HashMap::new();
    let mut hooks = None;
    if !batched_ids.is_empty() {
        let ids = IdList::new(c.dialect(), &batched_ids);
        let sql = joined_many_sql(c.dialect(), &ids);
        let (rows, read) = with_live_webhooks(c, &sql, &ids.params())?;
        hooks = read;
        for row in rows {
            let s = snapshot_from_joined(c, row)?;
            snapshots.insert(s.delivery.id.clone(), s);
        }
    }
    // Decide each batched item on its own snapshot.
    let mut sub_of: HashMap<usize, String> = HashMap::new();
    let mut decided: Vec<(usize, AttemptSnapshot, AttemptWrites)> = Vec::new();
    for (i, a) in items.iter().enumerate() {
        if single.contains(&i) {
            continue;
        }
        let Some(snapshot) = snapshots.remove(&a.delivery_id) else {
            // No such delivery, or one without a receipt row: the single path tells them apart.
            single.push(i);
            continue;
        };
        let id = a.delivery_id.as_str();
        sub_of.insert(i, snapshot.delivery.subscription_id.clone());
        // A receipt with other deliveries is settled on what its siblings hold after their own
        // writes: its items take the single path, which reads them after the batch's writes (two
        // siblings decided here on one snapshot would each see the other open, and neither settle).
        if snapshot
            .receipt
            .as_ref()
            .is_some_and(|r| !r.others.is_empty())
        {
            single.push(i);
            continue;
        }
        // The rule checks the lease first (`lease::accepts_completion`).
        match after_attempt(&snapshot, &a.report, a.now) {
            Err(e) => answers[i] = Some(Err(lost(id)(e))),
            Ok(w) if w.subscription.is_some() => single.push(i),
            Ok(w) => decided.push((i, snapshot, w)),
        }
    }
    // The run rows; an item whose run exists is decided again (it then writes no run).
    let runs: Vec<&tb_core::attempt::RunCreate> = decided
        .iter()
        .filter_map(|(_, _, w)| w.run.as_ref())
        .collect();
    if !runs.is_empty() {
        let inserted = insert_run_rows(c, &runs)?;
        let mut redo = Vec::new();
        for (k, (i, snapshot, w)) in decided.iter_mut().enumerate() {
            if let Some(run) = &w.run {
                if !inserted.iter().any(|id| id == &run.id) {
                    snapshot.run_exists = true;
                    let a = &items[*i];
                    match after_attempt(snapshot, &a.report, a.now) {
                        Ok(again) if again.subscription.is_none() => *w = again,
                        Ok(_) => redo.push(k),
                        Err(e) => {
                            answers[*i] = Some(Err(lost(&a.delivery_id)(e)));
                            redo.push(k);
                        }
                    }
                }
            }
        }
        // Those the second decision sends elsewhere wrote nothing yet (their run existed).
        for k in redo.into_iter().rev() {
            let (i, _, _) = decided.remove(k);
            if answers[i].is_none() {
                single.push(i);
            }
        }
    }
    if !decided.is_empty() {
        write_decided(c, items, &decided, hooks)?;
        for (i, _, w) in &decided {
            answers[*i] = Some(Ok(AttemptCommitted {
                subscription_transition: w.transition,
                run_id: w.run_id.clone(),
            }));
        }
    }
    // In subscription order: an item whose rule writes its subscription locks it, and two batches
    // then take those locks in one global order (after their delivery and receipt locks, as a single
    // attempt does).
    single.sort_unstable_by(|a, b| {
        let sub = |i: &usize| sub_of.get(i).map_or("", String::as_str);
        (sub(a), a).cmp(&(sub(b), b))
    });
    for i in single {
        answers[i] = Some(in_savepoint(c, |c| commit_attempt(c, &items[i]))?);
    }
    Ok(answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err(StoreError::Database("attempt left unanswered".into()))))
        .collect())
}

/// Writes every decided item as ONE [`Pipeline`] (one round trip on PostgreSQL): the fenced delivery
/// updates first (all must hold), then the attempts, the subscription events, the run events with
/// their outbox (to `hooks`, the live outbound webhooks read with the load; read here when `None`), and
/// the receipts' states.
fn write_decided(
    c: &dyn Db,
    items: &[AttemptCommit],
    decided: &[(usize, AttemptSnapshot, AttemptWrites)],
    hooks: Option<Vec<LiveWebhook>>,
) -> StoreResult<()> {
    // Deliveries, fenced on the token each item holds.
    use Col::{Int, Text};
    const D_COLS: &[Col] = &[Text, Text, Text, Int, Int, Int, Text, Text, Int, Text, Int];
    let mut rows = Rows::new(c.dialect(), D_COLS);
    for (i, _, w) in decided {
        let u = &w.delivery;
        rows.push(&[
            w.attempt.delivery_id.to_param(),
            items[*i].report.lease.token.to_param(),
            u.state.as_str().to_param(),
            u.attempts.to_param(),
            u.due_at.to_param(),
            u.first_attempt_at.to_param(),
            u.last_error.to_param(),
            u.dead_letter_reason.to_param(),
            u.updated_at.to_param(),
            u.run_id.to_param(),
            u.consumed_at.to_param(),
        ]);
    }
    let sql = format!(
        "UPDATE deliveries SET state = v.column3, attempts = v.column4, due_at = v.column5, \
         lease_owner = NULL, lease_token = NULL, lease_until = NULL, first_attempt_at = v.column6, \
         last_error = v.column7, dead_letter_reason = v.column8, updated_at = v.column9, \
         run_id = v.column10, consumed_at = v.column11 \
         FROM {} WHERE deliveries.id = v.column1 AND deliveries.lease_token = v.column2",
        rows.table()
    );
    let mut q = Pipeline::new();
    let fence = q.push(sql, &rows.params()?);
    let attempts: Vec<&tb_core::attempt::AttemptRow> =
        decided.iter().map(|(_, _, w)| &w.attempt).collect();
    queue_attempts(&mut q, c.dialect(), &attempts)?;
    let events: Vec<tb_core::attempt::SubscriptionEvent> = decided
        .iter()
        .flat_map(|(_, _, w)| w.events.iter().cloned())
        .collect();
    queue_events(&mut q, c.dialect(), &events)?;
    // Each new run's first events, as one packed row per run (`super::packed_events`).
    let run_events: Vec<Vec<NewRunEvent<'_>>> = decided
        .iter()
        .filter_map(|(_, _, w)| w.run.as_ref())
        .map(|r| first_events(r).collect())
        .collect();
    let groups: Vec<&[NewRunEvent<'_>]> = run_events.iter().map(Vec::as_slice).collect();
    let mut log = match hooks {
        Some(hooks) => RunLog::with_hooks(c, hooks),
        None => RunLog::new(c),
    };
    log.queue_first_events(&mut q, &groups)?;
    // Receipts whose state the rule changed.
    let states: Vec<(&str, &str, i64)> = decided
        .iter()
        .filter_map(|(i, s, w)| {
            w.receipt_state
                .map(|st| (s.delivery.receipt_id.as_str(), st.as_str(), items[*i].now))
        })
        .collect();
    if !states.is_empty() {
        const R_COLS: &[Col] = &[Text, Text, Int];
        let mut rows = Rows::new(c.dialect(), R_COLS);
        for (id, st, at) in &states {
            rows.push(&[id.to_param(), st.to_param(), at.to_param()]);
        }
        q.push(
            format!(
                "UPDATE receipts SET state = v.column2, updated_at = v.column3 \
                 FROM {} WHERE receipts.id = v.column1",
                rows.table()
            ),
            &rows.params()?,
        );
    }
    let updated = q.send(c)?[fence];
    if updated != decided.len() as u64 {
        // Every row is locked and its token was checked: a fence that fails here is a bug (the
        // writes sent after it are rolled back with the batch).
        return Err(StoreError::Database(format!(
            "batched attempt commit: {updated} of {} fenced delivery updates held under lock",
            decided.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! The batch paths' SQLite texts (the SQLite store commits one job at a time, so only these
    //! tests run them there; `tests/batches.rs` and `tests/statement_shapes.rs` run them on
    //! PostgreSQL).

    use bytes::Bytes;
    use serde_json::json;
    use tb_core::attempt::{AttemptReport, RunStart};
    use tb_core::delivery::{AttemptDecision, DeliveryKind, DeliveryState};
    use tb_core::ids::{new_id, IdKind};
    use tb_core::lease::Completion;
    use tb_core::receipt::{ReceiptSource, ReceiptState};
    use tb_core::run::RunStatus;
    use tb_core::subscription::FailurePolicy;

    use super::commit_attempts;
    use crate::model::*;
    use crate::p;
    use crate::sql::ingest_batch::{commit_receipts, ReceiptCommit};
    use crate::sql::Db;

    fn receipt(key: &str) -> ReceiptCommit {
        let receipt = NewReceipt {
            id: new_id(IdKind::Receipt),
            source: ReceiptSource::Webhook,
            subscription_id: "hooks".into(),
            dedup_key: key.into(),
            provider_event_id: key.into(),
            event_type: "thing.happened".into(),
            normalized: json!({"event": "thing.happened"}),
            state: ReceiptState::Routed,
            content_type: None,
            body: Bytes::from(format!("body {key}")),
            received_at: 2_000,
            dedup_until: 2_000 + 86_400_000,
            deliveries: vec![NewDelivery {
                id: new_id(IdKind::Delivery),
                kind: DeliveryKind::Binding,
                binding_id: "all".into(),
                action: "start_run".into(),
                workflow_id: Some("noop".into()),
                run_id: Some(new_id(IdKind::Run)),
                inputs: json!({"key": key}),
                params: None,
                state: DeliveryState::Pending,
                dead_letter_reason: None,
            }],
            capability: None,
            lease: Some(LeaseRequest {
                owner: "w".into(),
                lease_ms: 60_000,
                limit: 1,
            }),
            trace_context: None,
        };
        ReceiptCommit {
            normalized: receipt.normalized.to_string(),
            inputs: vec![json!({"key": key}).to_string()],
            receipt,
        }
    }

    fn delivered(lease: &Lease) -> AttemptCommit {
        AttemptCommit {
            delivery_id: lease.delivery.id.clone(),
            report: AttemptReport {
                lease: Completion {
                    token: lease.token.clone(),
                    attempt: 1,
                },
                event_id: new_id(IdKind::Event),
                decision: AttemptDecision::Delivered,
                failure: None,
                started_at: 3_000,
                duration_ms: 1,
                run: Some(RunStart {
                    id: lease.delivery.run_id.clone().expect("a run"),
                    workflow_id: "noop".into(),
                    inputs: lease.delivery.inputs.clone(),
                    status: RunStatus::Completed,
                    dead_letter: None,
                    session: false,
                }),
                effect: None,
                failure_policy: FailurePolicy {
                    failure_window_ms: 0,
                    dead_letter_after_ms: 0,
                    dead_letter_min_failures: 1,
                },
            },
            effect: None,
            now: 3_000,
        }
    }

    fn count(c: &dyn Db, sql: &str) -> i64 {
        c.value(sql, p![]).unwrap().unwrap()
    }

    #[test]
    fn the_same_receipt_committed_twice_is_a_duplicate_and_writes_nothing_more() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        crate::sqlite::migrate(&conn).unwrap();
        let c: &dyn Db = &conn;
        let one = receipt("again");
        let r = &one.receipt;
        let first = crate::sql::write::commit_receipt(c, r, &one.normalized, &one.inputs).unwrap();
        assert!(matches!(first, IngestOutcome::Accepted { .. }), "{first:?}");
        // A retry after an unknown commit outcome sends the very same receipt, ids and all.
        let second = crate::sql::write::commit_receipt(c, r, &one.normalized, &one.inputs).unwrap();
        match second {
            IngestOutcome::Duplicate { receipt_id, .. } => assert_eq!(receipt_id, r.id),
            other => panic!("a duplicate: {other:?}"),
        }
        assert_eq!(count(c, "SELECT COUNT(*) FROM receipts"), 1);
        assert_eq!(count(c, "SELECT COUNT(*) FROM deliveries"), 1);
        // Another receipt of the same key (new ids) is a duplicate that inserts no delivery either.
        let other = receipt("again");
        let third =
            crate::sql::write::commit_receipt(c, &other.receipt, &other.normalized, &other.inputs)
                .unwrap();
        assert!(
            matches!(third, IngestOutcome::Duplicate { .. }),
            "{third:?}"
        );
        assert_eq!(count(c, "SELECT COUNT(*) FROM deliveries"), 1);
        // A new receipt whose delivery id is taken is refused, never committed without it.
        let mut clash = receipt("clash");
        clash.receipt.deliveries[0].id = r.deliveries[0].id.clone();
        let refused =
            crate::sql::write::commit_receipt(c, &clash.receipt, &clash.normalized, &clash.inputs);
        match refused {
            Err(crate::StoreError::Database(m)) => assert!(m.contains("id is taken"), "{m}"),
            other => panic!("refused: {other:?}"),
        }
    }

    #[test]
    fn receipt_and_attempt_batches_commit_on_sqlite() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        crate::sqlite::migrate(&conn).unwrap();
        let c: &dyn Db = &conn;
        c.exec(
            "INSERT INTO subscriptions (id, source, connector, config, state, created_at, updated_at) \
             VALUES ('hooks', 'webhook', 'standard-webhooks', '{}', 'active', 1, 1)",
            p![],
        )
        .unwrap();
        // Two new keys and a second receipt for the first key (a duplicate of it).
        let items = vec![receipt("a"), receipt("b"), receipt("a")];
        let out = commit_receipts(c, &items).unwrap();
        let mut leases = Vec::new();
        for o in &out[..2] {
            match o.as_ref().unwrap() {
                IngestOutcome::Accepted { leased, .. } => leases.push(leased[0].clone()),
                other => panic!("a new key: {other:?}"),
            }
        }
        assert!(
            matches!(out[2], Ok(IngestOutcome::Duplicate { .. })),
            "{:?}",
            out[2]
        );
        assert_eq!(count(c, "SELECT COUNT(*) FROM receipts"), 2);
        assert_eq!(
            count(
                c,
                "SELECT COUNT(*) FROM deliveries WHERE lease_token IS NOT NULL"
            ),
            2
        );
        assert_eq!(
            count(
                c,
                "SELECT SUM(dedup_live) + SUM(updated_at = received_at) FROM receipts"
            ),
            4
        );
        let body: Vec<u8> = c
            .value("SELECT body FROM receipts WHERE dedup_key = 'b'", p![])
            .unwrap()
            .unwrap();
        assert_eq!(body, b"body b");
        let attempts: Vec<AttemptCommit> = leases.iter().map(delivered).collect();
        let done = commit_attempts(c, &attempts).unwrap();
        for (d, l) in done.iter().zip(&leases) {
            assert_eq!(d.as_ref().unwrap().run_id, l.delivery.run_id);
        }
        assert_eq!(
            count(
                c,
                "SELECT COUNT(*) FROM deliveries WHERE state = 'delivered' AND lease_token IS NULL"
            ),
            2
        );
        assert_eq!(count(c, "SELECT COUNT(*) FROM attempts"), 2);
        assert_eq!(count(c, "SELECT COUNT(*) FROM runs"), 2);
        assert_eq!(
            count(
                c,
                "SELECT COUNT(*) FROM receipts WHERE state = 'consumed' AND updated_at = 3000"
            ),
            2
        );
    }
}
