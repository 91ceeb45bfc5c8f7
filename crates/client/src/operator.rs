//! Operator calls (scope `webhooks:manage`): receipts, deliveries, dead-letter replay, subscriptions.

use serde_json::Value;

use crate::call::{seg, Call};
use crate::error::Result;
use crate::{Client, DeliveryDetail, ListQuery, ReceiptDetail, ReplayOutcome, ReplayRequest};

/// Adds the set filters of `q` to `call`.
fn with_list_query(call: Call, q: &ListQuery) -> Call {
    let pairs = match serde_json::to_value(q) {
        Ok(Value::Object(m)) => m,
        _ => return call,
    };
    pairs.into_iter().fold(call, |c, (k, v)| match v {
        Value::String(s) => c.query(&k, s),
        other => c.query(&k, other),
    })
}

impl Client {
    /// `GET /v1/receipts/{id}`: the receipt, its deliveries and its timeline (never the body).
    pub async fn receipt(&self, id: &str) -> Result<ReceiptDetail> {
        self.json(Call::get(format!("/v1/receipts/{}", seg(id))))
            .await
    }

    /// `GET /v1/receipts`: `{receipts, nextCursor?}`, newest first.
    pub async fn receipts(&self, q: &ListQuery) -> Result<Value> {
        self.json(with_list_query(Call::get("/v1/receipts"), q))
            .await
    }

    /// `GET /v1/deliveries/{id}`: the delivery and its attempts.
    pub async fn delivery(&self, id: &str) -> Result<DeliveryDetail> {
        self.json(Call::get(format!("/v1/deliveries/{}", seg(id))))
            .await
    }

    /// `GET /v1/deliveries`: `{deliveries, nextCursor?}`, newest first. Errors: 400 for an unknown
    /// `state`.
    pub async fn deliveries(&self, q: &ListQuery) -> Result<Value> {
        self.json(with_list_query(Call::get("/v1/deliveries"), q))
            .await
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
