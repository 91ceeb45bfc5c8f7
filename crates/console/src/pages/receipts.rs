//! Receipts: search (receipt id, the sender's delivery id, subscription, state, time range); one
//! receipt's timeline, the bindings it matched, its deliveries with every attempt, and the runs it
//! reached (each linked, and each run links back). Bodies are never shown here; a viewer with
//! `operator:bodies` may open the redacted view.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Extension;
use axum::Json;
use maud::{html, Markup};
use serde_json::Value;
use tb_api::wire::{AttemptView, DeliveryView, ReceiptDetail};

use super::{opt, rfc3339, Filters, Pager};
use crate::html::{self, Page};
use crate::login::Operator;
use crate::Console;

const STATES: &[&str] = &[
    "routed",
    "queued",
    "consumed",
    "rejected",
    "unmatched",
    "rate_limited",
    "disabled",
    "expired",
    "target_terminal",
    "routing_failed",
    "dead_lettered",
];

/// A table of receipts (`{receipts: [...]}` as the API lists them).
pub fn table(v: &Value) -> Markup {
    html! {
        div.scroll { table {
            thead { tr {
                th scope="col" { "Received" } th scope="col" { "Receipt" } th scope="col" { "Subscription" }
                th scope="col" { "Event" } th scope="col" .hide-narrow { "Sender's delivery id" } th scope="col" { "State" }
                th scope="col" .hide-narrow { "Duplicates" }
            } }
            tbody {
                @for r in v["receipts"].as_array().into_iter().flatten() {
                    @let id = r["receiptId"].as_str().unwrap_or_default();
                    tr {
                        td { (html::time_of(&r["receivedAt"])) }
                        td { (html::id(id, Some(&format!("/ui/receipts/{}", html::seg(id))))) }
                        td { a href={ "/ui/subscriptions/" (html::seg(r["subscriptionId"].as_str().unwrap_or_default())) } { (r["subscriptionId"].as_str().unwrap_or_default()) } }
                        td { (r["eventType"].as_str().unwrap_or_default()) }
                        td.hide-narrow { code { (r["providerEventId"].as_str().unwrap_or_default()) } }
                        td { (html::state(r["state"].as_str().unwrap_or_default())) }
                        td.hide-narrow { (r["duplicates"]) }
                    }
                }
            }
        } }
        @if v["receipts"].as_array().is_some_and(|a| a.is_empty()) { p.muted { "No receipts match." } }
    }
}

/// `GET /ui/receipts?q&subscription&state&from&to&before`: `q` is a receipt id (opens it) or the
/// sender's delivery id.
pub async fn list(
    State(c): State<Console>,
    Extension(op): Extension<Operator>,
    Query(f): Query<Filters>,
) -> Response {
    let q = opt(&f.q);
    if let Some(id) = q.as_deref().filter(|q| q.starts_with("rcpt_")) {
        return Redirect::to(&format!("/ui/receipts/{}", html::seg(id))).into_response();
    }
    let (subscription, state, from, to, before) = (
        opt(&f.subscription),
        opt(&f.state),
        rfc3339(&f.from),
        rfc3339(&f.to),
        opt(&f.before),
    );
    let params = tb_api::inspect::ListParams {
        limit: Some(50),
        before: before.clone(),
        state: state.clone(),
        subscription: subscription.clone(),
        from: from.clone(),
        to: to.clone(),
        provider_event_id: q.clone(),
        ..Default::default()
    };
    let answer = crate::read(tb_api::inspect::list_receipts(
        State(c.api.clone()),
        Ok(Query(params)),
    ))
    .await;
    let pager = Pager::new(
        "/ui/receipts",
        vec![
            ("q", q.clone()),
            ("subscription", subscription.clone()),
            ("state", state.clone()),
            ("from", from.clone()),
            ("to", to.clone()),
        ],
        &before,
    );
    let url = pager.here.clone();
    let results = match answer {
        Err(e) => html::api_error(&e),
        Ok(v) => html! {
            (table(&v))
            @if let Some(older) = pager.older(v["nextCursor"].as_str()) {
                p { a href=(older) { "Older receipts →" } }
            }
        },
    };
    let form = html! {
        form.filters method="get" action="/ui/receipts" role="search" {
            label { "Receipt id or sender's delivery id" input type="search" name="q" value=(q.clone().unwrap_or_default()) size="38"; }
            label { "Subscription" input name="subscription" value=(subscription.clone().unwrap_or_default()) size="14"; }
            label { "State" select name="state" {
                option value="" { "any" }
                @for s in STATES { option value=(s) selected[state.as_deref() == Some(s)] { (s) } }
            } }
            label { "From (UTC)" input type="datetime-local" name="from" value=(f.from.clone().unwrap_or_default()); }
            label { "To (UTC)" input type="datetime-local" name="to" value=(f.to.clone().unwrap_or_default()); }
            button type="submit" { "Search" }
        }
    };
    html::page(
        "Receipts",
        "/ui/receipts",
        &op,
        html! { (form) (html::live_region(&url, results)) },
    )
    .into_response()
}

/// `GET /ui/receipts/{id}`.
pub async fn show(
    State(c): State<Console>,
    Extension(op): Extension<Operator>,
    Path(id): Path<String>,
) -> Page {
    // The API's typed answer, as `GET /v1/receipts/{id}` serializes it.
    let (body, status) =
        match tb_api::inspect::get_receipt(State(c.api.clone()), Path(id.clone())).await {
            Err(e) => (html::api_error(&e), html::status_of(&e)),
            Ok(Json(detail)) => (receipt_body(&c, &op, &detail).await, StatusCode::OK),
        };
    html::page(
        &format!("Receipt {id}"),
        "/ui/receipts",
        &op,
        html::live_region(&format!("/ui/receipts/{}", html::seg(&id)), body),
    )
    .status(status)
}

async fn receipt_body(c: &Console, op: &Operator, v: &ReceiptDetail) -> Markup {
    let r = &v.receipt;
    let id = r.receipt_id.as_str();
    let matched: Vec<String> = v
        .timeline
        .iter()
        .filter(|t| t["state"] == "matched")
        .flat_map(|t| t["bindings"].as_array().cloned().unwrap_or_default())
        .map(|b| html::json_text(&b))
        .collect();
    let mut deliveries: Vec<(&DeliveryView, Vec<AttemptView>)> = Vec::new();
    for d in &v.deliveries {
        let attempts =
            tb_api::inspect::get_delivery(State(c.api.clone()), Path(d.delivery_id.clone()))
                .await
                .map(|Json(full)| full.attempts)
                .unwrap_or_default();
        deliveries.push((d, attempts));
    }
    html! {
        dl.facts {
            dt { "Receipt" } dd { (html::id(id, None)) }
            dt { "State" } dd { (html::state(&r.state)) }
            dt { "Subscription" } dd { a href={ "/ui/subscriptions/" (html::seg(&r.subscription_id)) } { (r.subscription_id) } }
            dt { "Event type" } dd { (r.event_type) }
            dt { "Sender's delivery id" } dd { (html::id(&r.provider_event_id, None)) }
            dt { "Dedup key" } dd { code { (r.dedup_key) } }
            dt { "Duplicates answered" } dd { (r.duplicates) }
            dt { "Body" } dd {
                (r.body_bytes) " bytes, " (r.content_type.as_deref().unwrap_or("no content type")) " · "
                @if op.may_read_bodies() { a href={ "/ui/receipts/" (html::seg(id)) "/body" } { "Open the redacted body" } }
                @else { span.muted { "not shown (needs operator:bodies)" } }
            }
        }
        h2 { "Timeline" }
        ol.timeline {
            @for t in &v.timeline {
                li {
                    (html::time_of(&t["at"])) " — " strong { (t["state"].as_str().unwrap_or_default()) }
                    @if let Some(b) = t["bindings"].as_array() { " · bindings " (b.iter().map(html::json_text).collect::<Vec<_>>().join(", ")) }
                    @if let Some(a) = t["attempt"].as_u64() { " · attempt " (a) " of " code { (t["deliveryId"].as_str().unwrap_or_default()) } }
                    @if let Some(o) = t["outcome"].as_str() { " · " (html::state(o)) }
                    @if let Some(e) = t["errorClass"].as_str() { " · " code { (e) } }
                }
            }
        }
        h2 { "Bindings matched" }
        @if matched.is_empty() { p.muted { "None: the receipt was kept as " (r.state) "." } }
        @else { ul { @for b in &matched { li { code { (b) } } } } }
        h2 { "Deliveries" }
        @for (d, attempts) in &deliveries {
            @let did = d.delivery_id.as_str();
            section id=(did) {
                h3 { (html::id(did, None)) " " (html::state(&d.state)) }
                p {
                    "Binding " code { (d.binding_id) } " · " (d.action)
                    @if let Some(w) = &d.workflow_id { " · workflow " code { (w) } }
                    " · " (d.attempts) @if d.attempts == 1 { " attempt, " } @else { " attempts, " } (d.replays) @if d.replays == 1 { " replay" } @else { " replays" }
                    @if let Some(run) = &d.run_id { " · reached run " (html::id(run, Some(&format!("/ui/runs/{}", html::seg(run))))) }
                    @if let Some(reason) = &d.dead_letter_reason { " · dead-lettered: " code { (reason) } }
                    @if op.may_act() && d.state == "dead-lettered" {
                        " "
                        form.inline method="post" action="/ui/dead-letters/replay" {
                            (html::csrf_field(op))
                            input type="hidden" name="mode" value="selected";
                            input type="hidden" name="ids" value=(did);
                            button type="submit" aria-label={ "Replay " (did) } { "Replay…" }
                        }
                    }
                }
                div.scroll { table {
                    thead { tr { th { "#" } th { "Started" } th { "Outcome" } th { "Error class" } th { "Message (sanitized)" } th { "Duration" } th.hide-narrow { "Attempt event id" } } }
                    tbody {
                        @for a in attempts {
                            tr {
                                td { (a.attempt) }
                                td { (html::time(Some(&a.started_at))) }
                                td { (html::state(&a.outcome)) }
                                td { code { (a.error_class.as_deref().unwrap_or("—")) } }
                                td { small { (a.message.as_deref().unwrap_or("")) } }
                                td { (a.duration_ms) " ms" }
                                td.hide-narrow { code { (a.event_id) } }
                            }
                        }
                    }
                } }
            }
        }
        @if deliveries.is_empty() { p.muted { "No deliveries." } }
    }
}

/// `GET /ui/receipts/{id}/body` (needs `operator:bodies`): the redacted JSON body. Recorded in the
/// audit log like the API's `GET /v1/receipts/{id}/redacted-body`, with its outcome.
pub async fn body(
    State(c): State<Console>,
    Extension(op): Extension<Operator>,
    Path(id): Path<String>,
) -> Page {
    let answer = tb_api::inspect::redacted_body(State(c.api.clone()), Path(id.clone())).await;
    let out = crate::act(
        &c,
        &op,
        axum::http::Method::GET,
        "/v1/receipts/{id}/redacted-body",
        &id,
        answer,
    )
    .await;
    let v = out.body.clone();
    let body = if !out.ok() {
        html! { p.error role="alert" { (out.error_text()) } }
    } else {
        html! {
            p { a href={ "/ui/receipts/" (html::seg(&id)) } { "← Receipt " (id) } }
            p.muted { (v["bodyBytes"]) " bytes, " (v["contentType"].as_str().unwrap_or("no content type")) ". Values under credential- or contact-named keys, credentials in URLs, Bearer/Basic values and credentials of a known shape anywhere in a text (API keys, vendor tokens, JWTs, private keys) are replaced by [redacted]; long strings are cut. This view is recorded in the audit log." }
            @if v["json"] == true { (html::pre(&serde_json::to_string_pretty(&v["redacted"]).unwrap_or_default())) }
            @else { p { "This body is not JSON, so it is not shown." } }
        }
    };
    html::page(
        &format!("Body of {id} (redacted)"),
        "/ui/receipts",
        &op,
        body,
    )
    .status(out.status)
}
