//! Operator calls (scope `webhooks:manage`): receipts, deliveries, dead-letter replay, subscriptions.

use serde_json::Value;

use crate::call::{seg, Call};
use crate::error::Result;
use crate::{Client, DeliveryDetail, ReceiptDetail, ReplayOutcome, ReplayRequest};

/// The filters of the list endpoints (`/v1/receipts`, `/v1/deliveries`, `/v1/runs`); each is sent
/// only when set. `limit` 1..=500 (default 50); `before` is a previous page's `nextCursor`; `from`/`to`
/// are RFC 3339 times.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListQuery {
    pub limit: Option<u32>,
    pub before: Option<String>,
    /// Deliveries: `pending`, `retrying`, `delivered`, `dead-lettered`; receipts: their state.
    pub state: Option<String>,
    /// Runs: their status.
    pub status: Option<String>,
    pub subscription: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
    pub provider_event_id: Option<String>,
    /// Runs only.
    pub workflow: Option<String>,
}

impl ListQuery {
    /// Adds the set filters to `call`.
    pub fn apply(&self, call: Call) -> Call {
        call.query_opt("limit", self.limit)
            .query_opt("before", self.before.as_ref())
            .query_opt("state", self.state.as_ref())
            .query_opt("status", self.status.as_ref())
            .query_opt("subscription", self.subscription.as_ref())
            .query_opt("from", self.from.as_ref())
            .query_opt("to", self.to.as_ref())
            .query_opt("providerEventId", self.provider_event_id.as_ref())
            .query_opt("workflow", self.workflow.as_ref())
    }
}

impl Client {
    /// `GET /v1/receipts/{id}`: the receipt, its deliveries and its timeline (never the body).
    pub async fn receipt(&self, id: &str) -> Result<ReceiptDetail> {
        self.json(Call::get(format!("/v1/receipts/{}", seg(id))))
            .await
    }

    /// `GET /v1/receipts`: `{receipts, nextCursor?}`, newest first.
    pub async fn receipts(&self, q: &ListQuery) -> Result<Value> {
        self.json(q.apply(Call::get("/v1/receipts"))).await
    }

    /// `GET /v1/deliveries/{id}`: the delivery and its attempts.
    pub async fn delivery(&self, id: &str) -> Result<DeliveryDetail> {
        self.json(Call::get(format!("/v1/deliveries/{}", seg(id))))
            .await
    }

    /// `GET /v1/deliveries`: `{deliveries, nextCursor?}`, newest first. Errors: 400 for an unknown
    /// `state`.
    pub async fn deliveries(&self, q: &ListQuery) -> Result<Value> {
        self.json(q.apply(Call::get("/v1/deliveries"))).await
    }

    /// `POST /v1/trigger-subscriptions/{sub}/dead-letters:replay`: with `dryRun` the count and a
    /// sample that a replay would take; without it, replays (send the previewed count as `expect`:
    /// a changed count is 409 `replay_count_changed` and replays nothing).
    pub async fn replay_dead_letters(
        &self,
        subscription: &str,
        req: &ReplayRequest,
    ) -> Result<ReplayOutcome> {
        let path = format!(
            "/v1/trigger-subscriptions/{}/dead-letters:replay",
            seg(subscription)
        );
        self.json(Call::post(path).json(req)?).await
    }

    /// `GET /v1/trigger-subscriptions/{id}`: `{subscription}`.
    pub async fn subscription(&self, id: &str) -> Result<Value> {
        self.json(Call::get(format!("/v1/trigger-subscriptions/{}", seg(id))))
            .await
    }

    /// `POST /v1/trigger-subscriptions/{id}/pause`: `{subscription}`; a paused subscription refuses
    /// new requests (503 `subscription_not_active`) and holds its queued deliveries.
    pub async fn pause_subscription(&self, id: &str) -> Result<Value> {
        self.json(Call::post(format!(
            "/v1/trigger-subscriptions/{}/pause",
            seg(id)
        )))
        .await
    }

    /// `POST /v1/trigger-subscriptions/{id}/resume`: `{subscription}`.
    pub async fn resume_subscription(&self, id: &str) -> Result<Value> {
        self.json(Call::post(format!(
            "/v1/trigger-subscriptions/{}/resume",
            seg(id)
        )))
        .await
    }
}
