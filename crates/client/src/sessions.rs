//! Sessions (signals-and-connectors §5): signals, waits, prompts and turns on a run.

use std::time::{Duration, Instant};

use futures_util::stream::{self, Stream};
use futures_util::TryStreamExt;
use serde_json::Value;

use crate::call::{seg, Call};
use crate::error::{Error, Result};
use crate::{
    ArmWait, Client, Prompt, RaiseSignal, RunCreated, SignalEntry, SignalPage, SignalRaised, Turn,
    TurnList, Wait, WaitAction, WaitList, LONG_POLL_MARGIN, LONG_POLL_MAX_S,
};

fn run_path(run: &str, rest: &str) -> String {
    format!("/v1/runs/{}{rest}", seg(run))
}

impl Client {
    /// `POST /v1/runs/{run}/signals`: raises a signal (FIFO mailbox; a wait armed on its name resolves
    /// at once). A repeated `signalId` answers `status: duplicate` with the first signal's fields.
    /// Errors: 404 `not_found`, 409 `target_terminal`, 429 `signal_buffer_full`, 400
    /// `validation_error`, 413 `payload_too_large` (data over 512 KiB).
    pub async fn raise_signal(&self, run: &str, signal: &RaiseSignal) -> Result<SignalRaised> {
        self.json(Call::post(run_path(run, "/signals")).json(signal)?)
            .await
    }

    /// `GET /v1/runs/{run}/signals`: one page of the mailbox, newest first (`limit` 1..=500, default
    /// 50; `before` = a previous page's `nextCursor`).
    pub async fn list_signals(
        &self,
        run: &str,
        limit: Option<u32>,
        before: Option<&str>,
    ) -> Result<SignalPage> {
        let call = Call::get(run_path(run, "/signals"))
            .query_opt("limit", limit)
            .query_opt("before", before);
        self.json(call).await
    }

    /// The whole mailbox, newest first, as a stream fetching `page` signals at a time. It ends after
    /// the last page or the first error (yielded).
    pub fn signals<'a>(
        &'a self,
        run: &'a str,
        page: u32,
    ) -> impl Stream<Item = Result<SignalEntry>> + 'a {
        let pages = stream::try_unfold(Some(None::<String>), move |cursor| async move {
            let Some(before) = cursor else {
                return Ok(None);
            };
            let p = self
                .list_signals(run, Some(page), before.as_deref())
                .await?;
            Ok(Some((p.signals, p.next_cursor.map(Some))))
        });
        pages
            .map_ok(|v| stream::iter(v.into_iter().map(Ok)))
            .try_flatten()
    }

    /// `POST /v1/runs/{run}/waits`: arms `wait_for_signal` (`kind: signal`) or `wait_for_any`. A
    /// buffered signal of a named kind resolves it at once (the answer is then `resolved`). One wait
    /// is armed per run: a new one replaces (cancels) the armed one. Errors: 404, 409
    /// `target_terminal` (the run has ended), 400 `validation_error`.
    pub async fn arm_wait(&self, run: &str, wait: &ArmWait) -> Result<Wait> {
        self.json(Call::post(run_path(run, "/waits")).json(wait)?)
            .await
    }

    /// `GET /v1/runs/{run}/waits/{wait}?timeout=S`: the wait, answered as soon as it leaves `armed` or
    /// after `timeout_s` seconds (clamped to [`LONG_POLL_MAX_S`]; 0 answers at once).
    pub async fn get_wait(&self, run: &str, wait: &str, timeout_s: u64) -> Result<Wait> {
        let t = timeout_s.min(LONG_POLL_MAX_S);
        let call = Call::get(run_path(run, &format!("/waits/{}", seg(wait))))
            .query("timeout", t)
            .timeout(Duration::from_secs(t) + LONG_POLL_MARGIN);
        self.json(call).await
    }

    /// Long-polls the wait until it is no longer `armed` or `budget` has passed, and returns it as it
    /// then is (check [`Wait::is_armed`]: still armed means the budget ran out first). One deadline
    /// covers every long-poll and retry: a server that stops answering is [`Error::Unreachable`]
    /// once the budget and a margin (the client's timeout, at most 10 s) are spent, never later.
    pub async fn wait_for(&self, run: &str, wait: &str, budget: Duration) -> Result<Wait> {
        let polls = self.poll_until(run, wait, budget);
        let margin = self.timeout.min(LONG_POLL_MARGIN);
        match tokio::time::timeout(budget + margin, polls).await {
            Ok(r) => r,
            Err(_) => Err(Error::Unreachable {
                url: self.base.clone(),
                detail: format!("no answer about wait {wait} within {} s", budget.as_secs()),
            }),
        }
    }

    async fn poll_until(&self, run: &str, wait: &str, budget: Duration) -> Result<Wait> {
        let start = Instant::now();
        loop {
            // Whole seconds (the server's unit), rounded: a 2 s budget polls 2 s, not 1.
            let left = (budget.saturating_sub(start.elapsed()).as_millis() as u64 + 500) / 1000;
            let w = self.get_wait(run, wait, left).await?;
            if !w.is_armed() || left == 0 {
                return Ok(w);
            }
        }
    }

    /// `POST /v1/runs/{run}/waits/{wait}` `{action: cancel}`: cancels an armed wait (the run goes on
    /// running). Errors: 404, 409 `conflict` when it is no longer armed.
    pub async fn cancel_wait(&self, run: &str, wait: &str) -> Result<Wait> {
        let body = WaitAction {
            action: "cancel".into(),
        };
        let call = Call::post(run_path(run, &format!("/waits/{}", seg(wait)))).json(&body)?;
        self.json(call).await
    }

    /// `GET /v1/runs/{run}/waits`: every wait of the run, oldest first.
    pub async fn list_waits(&self, run: &str) -> Result<WaitList> {
        self.json(Call::get(run_path(run, "/waits"))).await
    }

    /// `POST /v1/runs/{run}/prompts`: queues user input as a turn (and interrupts an armed
    /// `wait_for_any` that races user input).
    pub async fn prompt(&self, run: &str, text: &str) -> Result<Turn> {
        let body = Prompt { text: text.into() };
        self.json(Call::post(run_path(run, "/prompts")).json(&body)?)
            .await
    }

    /// `POST /v1/runs/{run}/turns:claim`: leases the run's next turn for `lease_ms`, long-polling up to
    /// `timeout_s` (clamped to 60) for one; `None` when none came in time. A lapsed lease hands the
    /// turn out again with `claims` + 1.
    pub async fn claim_turn(
        &self,
        run: &str,
        lease_ms: u64,
        timeout_s: u64,
    ) -> Result<Option<Turn>> {
        let t = timeout_s.min(LONG_POLL_MAX_S);
        let call = Call::post(run_path(run, "/turns:claim"))
            .query("leaseMs", lease_ms)
            .query("timeout", t)
            .timeout(Duration::from_secs(t) + LONG_POLL_MARGIN);
        let reply = self.send(call).await?;
        if reply.status == 204 {
            return Ok(None);
        }
        reply.json().map(Some)
    }

    /// The run's turns as a stream: each item is a claimed turn (leased for `lease_ms`), long-polling
    /// 30 s at a time between them. It ends at the first error (yielded). Ack each with
    /// [`Client::ack_turn`] before its lease lapses.
    pub fn turns<'a>(
        &'a self,
        run: &'a str,
        lease_ms: u64,
    ) -> impl Stream<Item = Result<Turn>> + 'a {
        stream::unfold(false, move |failed| async move {
            if failed {
                return None;
            }
            loop {
                match self.claim_turn(run, lease_ms, 30).await {
                    Ok(Some(t)) => return Some((Ok(t), false)),
                    Ok(None) => continue,
                    Err(e) => return Some((Err(e), true)),
                }
            }
        })
    }

    /// `POST /v1/runs/{run}/turns/{turn}/ack?claim=N`: acknowledges claim `N` of a leased turn.
    /// Errors: 409 `conflict` for a lapsed or superseded claim.
    pub async fn ack_turn(&self, run: &str, turn: &str, claim: u32) -> Result<Turn> {
        let call =
            Call::post(run_path(run, &format!("/turns/{}/ack", seg(turn)))).query("claim", claim);
        self.json(call).await
    }

    /// `GET /v1/runs/{run}/turns`: every turn of the run in order.
    pub async fn list_turns(&self, run: &str) -> Result<TurnList> {
        self.json(Call::get(run_path(run, "/turns"))).await
    }

    /// `POST /v1/runs {workflowId, inputs}`: starts a run of an approved workflow (a session, for a
    /// `session` workflow). `inputs` must be a JSON object (`{}` for none). Answers 201 with the new
    /// run, `pending` until the delivery engine starts it. Errors: `not_found` (no such workflow),
    /// `validation_error` (inputs not an object), `forbidden` (the key lacks `runs:create`).
    pub async fn start_run(&self, workflow_id: &str, inputs: Value) -> Result<RunCreated> {
        let body = serde_json::json!({"workflowId": workflow_id, "inputs": inputs});
        self.json(Call::post("/v1/runs").body(body)).await
    }

    /// `GET /v1/runs/{run}`: the run (OpenWOP run document).
    pub async fn run(&self, run: &str) -> Result<Value> {
        self.json(Call::get(run_path(run, ""))).await
    }

    /// `POST /v1/runs/{run}/cancel`: cancels the run (stop beats every other wait candidate).
    pub async fn cancel_run(&self, run: &str) -> Result<Value> {
        self.json(Call::post(run_path(run, "/cancel"))).await
    }
}
