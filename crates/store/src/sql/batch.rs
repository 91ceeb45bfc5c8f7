//! Folds concurrent commits of one kind into one transaction. Callers hand an item to a
//! `Batcher` and await its answer; a driver task takes the first waiting item, then every item queued
//! behind it (up to [`Batching::max_items`]), and runs them as ONE backend write through a batch
//! function (`crate::sql::attempt_batch::commit_attempts`), at most [`Batching::in_flight`] batches at
//! a time. Under light load a batch is one item, committed at once; under load the items that queue
//! while the in-flight batches run form the next batch, so the cost per item falls as load rises.
//!
//! Failure rules:
//! - the batch function answers each item (an item's own refusal is its answer);
//! - a batch that fails as a whole with a statement error (`Database`, `Retryable` after the backend's
//!   own retries) is rolled back and its items are committed again one per transaction, so a bad item
//!   cannot fail the others;
//! - a batch refused for load or availability (`Busy`, `Unavailable`) gives that error to every item
//!   (running them one by one would only add load);
//! - at most [`Batching::max_waiting`] items wait; one more is refused with `Busy` at once;
//! - the driver lives on the runtime of the first caller; if that runtime is gone, the next caller
//!   starts a new driver (a batch that was running on the runtime that went away may have committed
//!   while its callers on other runtimes get `Unavailable`: one store shared by several runtimes, as
//!   in some tests, should not outlive the first).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::{Backend, Db};
use crate::{StoreError, StoreResult};

/// Most items a backend should put in one batch: with 11-19 parameters per row, a batch's statements
/// stay far below PostgreSQL's 65 535 parameters.
pub const MAX_BATCH: usize = 64;

/// How a backend wants its commits batched (each kind of commit, attempts and receipts, separately).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batching {
    /// Most items in one transaction (1: no batching, each item is its own transaction).
    pub max_items: usize,
    /// Batches running at once (each holds one connection, or one writer job, while it runs).
    pub in_flight: usize,
    /// Items that may wait for a batch; one more is refused at once with [`StoreError::Busy`] (the
    /// API answers 503 `unavailable` with `Retry-After: 1`), as a full job queue refuses a write.
    pub max_waiting: usize,
}

/// A batch function: runs `items` in the open transaction and answers each (same length, same
/// order); an `Err` rolls the whole transaction back.
pub(crate) type BatchFn<I, O> = fn(&dyn Db, &[I]) -> StoreResult<Vec<StoreResult<O>>>;

/// An item waiting for a batch: its input, where its answer goes, and its place in the count of
/// waiting items (given back when the driver takes it, or when it is dropped untaken).
type Waiting<I, O> = (I, oneshot::Sender<StoreResult<O>>, Ticket);

/// One item's share of [`Batcher::waiting`], given back on drop.
struct Ticket(Arc<AtomicUsize>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The queue of one kind of commit; see the module documentation.
pub(crate) struct Batcher<I, O> {
    tx: Mutex<Option<mpsc::UnboundedSender<Waiting<I, O>>>>,
    /// Items sent and not yet taken into a batch (bounded by [`Batching::max_waiting`]).
    waiting: Arc<AtomicUsize>,
    run: BatchFn<I, O>,
    /// The most items one batch has held so far (inspection and tests).
    largest: Arc<AtomicUsize>,
}

impl<I, O> Batcher<I, O>
where
    I: Send + Sync + 'static,
    O: Send + 'static,
{
    /// A batcher that commits through `run`; its driver starts with the first item.
    pub(crate) fn new(run: BatchFn<I, O>) -> Self {
        Batcher {
            tx: Mutex::new(None),
            waiting: Arc::new(AtomicUsize::new(0)),
            run,
            largest: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The most items one batch has held so far (0 before the first).
    pub(crate) fn largest(&self) -> usize {
        self.largest.load(Ordering::Relaxed)
    }

    /// Commits `item` on `backend`, batched with whatever else is waiting, and returns its answer; on a
    /// backend that does not batch ([`Batching::max_items`] 1) in a write of its own, at once.
    /// Errors: the item's own, or the batch's (see the module documentation).
    pub(crate) async fn submit<B: Backend>(&self, backend: &Arc<B>, item: I) -> StoreResult<O> {
        let shape = backend.batching();
        let run = self.run;
        if shape.max_items <= 1 {
            return backend
                .write(move |c| run(c, std::slice::from_ref(&item)))
                .await
                .and_then(only_answer);
        }
        let limit = shape.max_waiting.max(1);
        let ticket = Ticket(self.waiting.clone());
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= limit {
            drop(ticket);
            metrics::counter!("tb_store_batch_busy_total").increment(1);
            return Err(StoreError::Busy(format!(
                "{limit} commits are waiting for the store; retry shortly"
            )));
        }
        let (reply, answer) = oneshot::channel();
        let mut waiting = (item, reply, ticket);
        for _ in 0..2 {
            let tx = {
                let mut guard = self.tx.lock().unwrap_or_else(PoisonError::into_inner);
                match guard.as_ref() {
                    Some(tx) if !tx.is_closed() => tx.clone(),
                    _ => {
                        let tx = spawn_driver(backend.clone(), self.run, self.largest.clone());
                        *guard = Some(tx.clone());
                        tx
                    }
                }
            };
            match tx.send(waiting) {
                Ok(()) => {
                    return answer.await.unwrap_or_else(|_| {
                        Err(StoreError::Unavailable(
                            "the commit batcher stopped before answering".into(),
                        ))
                    })
                }
                // The driver's runtime is gone: start another on this one.
                Err(mpsc::error::SendError(back)) => waiting = back,
            }
        }
        Err(StoreError::Unavailable(
            "the commit batcher cannot start".into(),
        ))
    }
}

fn spawn_driver<B: Backend, I, O>(
    backend: Arc<B>,
    run: BatchFn<I, O>,
    largest: Arc<AtomicUsize>,
) -> mpsc::UnboundedSender<Waiting<I, O>>
where
    I: Send + Sync + 'static,
    O: Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<Waiting<I, O>>();
    let shape = backend.batching();
    let slots = Arc::new(Semaphore::new(
        shape.in_flight.clamp(1, Semaphore::MAX_PERMITS),
    ));
    tokio::spawn(async move {
        while let Some(first) = rx.recv().await {
            // The slot is taken before the batch is gathered: while every slot is busy, items queue
            // and form the next batch.
            let Ok(slot) = slots.clone().acquire_owned().await else {
                return;
            };
            let mut batch = vec![first];
            while batch.len() < shape.max_items.max(1) {
                match rx.try_recv() {
                    Ok(w) => batch.push(w),
                    Err(_) => break,
                }
            }
            largest.fetch_max(batch.len(), Ordering::Relaxed);
            let backend = backend.clone();
            tokio::spawn(async move {
                let _slot = slot;
                commit(&backend, batch, run).await;
            });
        }
    });
    tx
}

async fn commit<B: Backend, I, O>(backend: &Arc<B>, batch: Vec<Waiting<I, O>>, run: BatchFn<I, O>)
where
    I: Send + Sync + 'static,
    O: Send + 'static,
{
    // Taken into a batch: the items wait no more (their tickets are given back).
    let (items, replies): (Vec<I>, Vec<_>) = batch.into_iter().map(|(i, r, _)| (i, r)).unzip();
    let items = Arc::new(items);
    let n = items.len();
    metrics::histogram!("tb_store_batch_items").record(n as f64);
    let all = items.clone();
    match backend.write(move |c| run(c, &all)).await {
        Ok(answers) if answers.len() == n => {
            for (reply, a) in replies.into_iter().zip(answers) {
                let _ = reply.send(a);
            }
        }
        Ok(answers) => {
            let e = StoreError::Database(format!(
                "a batch of {n} commits answered {} of them",
                answers.len()
            ));
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
        Err(e) if n == 1 || matches!(e, StoreError::Busy(_) | StoreError::Unavailable(_)) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
        }
        Err(e) => {
            // One item may have failed the statement: each again, in its own transaction.
            tracing::debug!(error = %e, items = n, "batched commit failed; committing one by one");
            metrics::counter!("tb_store_batch_splits_total").increment(1);
            for (k, reply) in replies.into_iter().enumerate() {
                let all = items.clone();
                let one = backend
                    .write(move |c| run(c, &all[k..k + 1]))
                    .await
                    .and_then(only_answer);
                let _ = reply.send(one);
            }
        }
    }
}

/// The answer of a batch of one item.
fn only_answer<O>(mut answers: Vec<StoreResult<O>>) -> StoreResult<O> {
    match (answers.pop(), answers.is_empty()) {
        (Some(a), true) => a,
        _ => Err(StoreError::Database(
            "a batch of one commit did not give exactly one answer".into(),
        )),
    }
}

/// Runs `f` inside a savepoint of the batch's transaction: its own refusal (`LeaseLost`, `NotFound`,
/// `Rejected`) rolls back its writes only and is its answer; any other error is a failure of the
/// transaction, returned as the batch's.
pub(crate) fn in_savepoint<T>(
    c: &dyn Db,
    f: impl FnOnce(&dyn Db) -> StoreResult<T>,
) -> StoreResult<StoreResult<T>> {
    c.exec("SAVEPOINT tb_item", &[])?;
    match f(c) {
        Ok(v) => {
            c.exec("RELEASE SAVEPOINT tb_item", &[])?;
            Ok(Ok(v))
        }
        Err(e) if is_own(&e) => {
            c.exec("ROLLBACK TO SAVEPOINT tb_item", &[])?;
            c.exec("RELEASE SAVEPOINT tb_item", &[])?;
            Ok(Err(e))
        }
        Err(e) => Err(e),
    }
}

/// Whether `e` is an item's own refusal rather than a failure of the transaction.
fn is_own(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::LeaseLost(_) | StoreError::NotFound { .. } | StoreError::Rejected { .. }
    )
}
