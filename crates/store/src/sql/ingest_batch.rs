//! Several receipt commits in one transaction, with one multi-row statement per table,
//! through the same plan as one receipt ([`write::ReceiptPlan`]). Nothing is decided here: a taken
//! dedup key is found by the receipts' insert, as for one receipt.
//!
//! Per batch of N receipts:
//! 1. ONE `INSERT INTO receipts ... SELECT ... FROM <rows> ON CONFLICT (subscription_id, dedup_key) DO
//!    NOTHING RETURNING id` ([`write::insert_receipts_sql`]; the rows are a `VALUES` list on SQLite,
//!    arrays expanded by `unnest` on PostgreSQL: [`super::Rows`]), rows ordered by (subscription, dedup key), so two batches that wait on
//!    each other's in-flight keys wait in one global order and cannot deadlock. A second receipt for
//!    one key in the same batch conflicts with the first, as it would in a later transaction.
//!    Each receipt row carries its raw body (`NULL` when empty).
//! 2. ONE insert of all the new receipts' deliveries.
//! 3. A receipt whose key was taken (a duplicate, or a key whose window lapsed), one that uses a
//!    capability, and one with a delivery created dead-lettered take the single path
//!    ([`write::commit_receipt`]) inside a savepoint.

use std::collections::HashSet;

use super::batch::in_savepoint;
use super::write::{self, ReceiptPlan};
use super::{Db, Param, Rows};
use crate::model::{IngestOutcome, NewReceipt};
use crate::{StoreError, StoreResult};

/// Deliveries above which a receipt takes the single path, so one statement's parameters stay bounded
/// on SQLite ([`write::RECEIPT_PARAMS`] per receipt and 19 per delivery, at most
/// [`super::batch::MAX_BATCH`] receipts: far below its 32 766; PostgreSQL binds one array per column).
const MAX_BATCHED_DELIVERIES: usize = 16;

/// A receipt to commit, with its JSON texts serialized by the caller (`normalized`, and `inputs`, one
/// per delivery).
pub(crate) struct ReceiptCommit {
    pub receipt: NewReceipt,
    pub normalized: String,
    pub inputs: Vec<String>,
}

/// Commits `items` in the open transaction and answers each (as [`write::commit_receipt`] would). An
/// item's own refusal (a capability refused) is its answer; an error of the transaction is the
/// batch's. One item is [`write::commit_receipt`] itself.
pub(crate) fn commit_receipts(
    c: &dyn Db,
    items: &[ReceiptCommit],
) -> StoreResult<Vec<StoreResult<IngestOutcome>>> {
    let single = |c: &dyn Db, it: &ReceiptCommit| {
        write::commit_receipt(c, &it.receipt, &it.normalized, &it.inputs)
    };
    if let [one] = items {
        return single(c, one).map(|o| vec![Ok(o)]);
    }
    let mut answers: Vec<Option<StoreResult<IngestOutcome>>> = items.iter().map(|_| None).collect();
    let mut alone: Vec<usize> = Vec::new();
    let mut batched: Vec<usize> = Vec::new();
    for (i, it) in items.iter().enumerate() {
        let r = &it.receipt;
        let plain = r.capability.is_none()
            && r.deliveries.len() <= MAX_BATCHED_DELIVERIES
            && r.deliveries
                .iter()
                .all(|d| d.state != tb_core::delivery::DeliveryState::DeadLettered);
        if plain {
            batched.push(i);
        } else {
            alone.push(i);
        }
    }
    batched.sort_by(|a, b| {
        let (x, y) = (&items[*a].receipt, &items[*b].receipt);
        (&x.subscription_id, &x.dedup_key).cmp(&(&y.subscription_id, &y.dedup_key))
    });
    if !batched.is_empty() {
        let params: Vec<Vec<Param<'_>>> = batched
            .iter()
            .map(|i| write::receipt_params(&items[*i].receipt, &items[*i].normalized))
            .collect();
        let mut rows = Rows::new(c.dialect(), write::RECEIPT_COLS);
        for row in &params {
            rows.push(row);
        }
        let sql = write::insert_receipts_sql(&rows);
        let inserted: HashSet<String> = c
            .query(&sql, &rows.params()?)?
            .iter()
            .map(|r| r.get::<String>(0))
            .collect::<StoreResult<_>>()?;
        let mut plans: Vec<(usize, ReceiptPlan<'_>)> = Vec::with_capacity(inserted.len());
        for i in batched {
            let it = &items[i];
            if inserted.contains(&it.receipt.id) {
                plans.push((i, ReceiptPlan::new(&it.receipt, &it.inputs)));
            } else {
                alone.push(i);
            }
        }
        write_rows(c, &plans)?;
        for (i, plan) in &plans {
            answers[*i] = Some(plan.finish(c));
        }
    }
    alone.sort_unstable();
    for i in alone {
        answers[i] = Some(in_savepoint(c, |c| single(c, &items[i]))?);
    }
    Ok(answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err(StoreError::Database("receipt left unanswered".into()))))
        .collect())
}

/// The inserted receipts' deliveries, one statement (their bodies went in with the receipts' rows).
fn write_rows(c: &dyn Db, plans: &[(usize, ReceiptPlan<'_>)]) -> StoreResult<()> {
    let per_plan: Vec<Vec<[Param<'_>; 19]>> =
        plans.iter().map(|(_, p)| p.delivery_params()).collect();
    let mut rows = Rows::new(c.dialect(), write::DELIVERY_COLS);
    for row in per_plan.iter().flatten() {
        rows.push(row);
    }
    if rows.is_empty() {
        return Ok(());
    }
    c.exec(&write::insert_deliveries_sql(&rows), &rows.params()?)?;
    Ok(())
}
