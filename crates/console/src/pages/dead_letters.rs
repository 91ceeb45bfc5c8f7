//! Dead letters (and the deliveries waiting: `state=pending|retrying`): per subscription or across
//! all, newest first, paged. Replay one, a selection, or every dead letter of a subscription that
//! matches a filter, after a confirmation that states the count and what stays the same; each
//! replay's outcome is shown.

use axum::extract::{Query, State};
use axum::http::Method;
use axum::{Extension, Form, Json};
use maud::{html, Markup};
use serde_json::{json, Value};

use super::{opt, rfc3339, Filters, Pager};
use crate::html::{self, Page};
use crate::login::Operator;
use crate::Console;

/// Most ids one "replay selected" takes.
const MAX_SELECTED: usize = 200;

/// `GET /ui/dead-letters?subscription&state&before`.
pub async fn list(
    State(c): State<Console>,
    Extension(op): Extension<Operator>,
    Query(f): Query<Filters>,
) -> Page {
    let subscription = opt(&f.subscription);
    let state = opt(&f.state).unwrap_or_else(|| "dead-lettered".into());
    let before = opt(&f.before);
    let params = tb_api::inspect::ListParams {
        limit: Some(50),
        before: before.clone(),
        state: Some(state.clone()),
        subscription: subscription.clone(),
        ..Default::default()
    };
    let answer = crate::read(tb_api::inspect::list_deliveries(
        State(c.api.clone()),
        Ok(Query(params)),
    ))
    .await;
    let pager = Pager::new(
        "/ui/dead-letters",
        vec![
            ("subscription", subscription.clone()),
            ("state", Some(state.clone())),
        ],
        &before,
    );
    let url = pager.here.clone();
    let dead = state == "dead-lettered";
    let rows = match answer {
        Err(e) => html::api_error(&e),
        Ok(v) => {
            let next = pager.older(v["nextCursor"].as_str());
            let act = dead && op.may_act();
            let table = html! {
                    div.scroll { table {
                        thead { tr {
                            @if dead && op.may_act() { th scope="col" { input type="checkbox" data-select-all aria-label="Select every row"; } }
                            th scope="col" { "Updated" } th scope="col" { "Delivery" } th scope="col" { "Subscription" } th scope="col" { "Binding" }
                            th scope="col" { "Last error" } th scope="col" { "Attempts" } th scope="col" .hide-narrow { "Replays" } th scope="col" { "Receipt" }
                            @if act { th scope="col" { "Replay" } }
                        } }
                        tbody {
                            @for d in v["deliveries"].as_array().into_iter().flatten() {
                                @let id = d["deliveryId"].as_str().unwrap_or_default();
                                @let rid = d["receiptId"].as_str().unwrap_or_default();
                                tr {
                                    @if dead && op.may_act() { td { input type="checkbox" name="ids" value=(id) aria-label={ "Select " (id) }; } }
                                    td { (html::time_of(&d["updatedAt"])) }
                                    td { (html::id(id, Some(&format!("/ui/receipts/{}#{}", html::seg(rid), html::seg(id))))) }
                                    td { (d["subscriptionId"].as_str().unwrap_or_default()) }
                                    td { code { (d["bindingId"].as_str().unwrap_or_default()) } }
                                    td { code { (d["lastError"].as_str().unwrap_or("—")) } }
                                    td { (d["attempts"]) }
                                    td.hide-narrow { (d["replays"]) }
                                    td { a href={ "/ui/receipts/" (html::seg(rid)) } { "receipt" } }
                                    @if act { td { button type="submit" name="only" value=(id) aria-label={ "Replay " (id) } { "Replay…" } } }
                                }
                            }
                        }
                    } }
            };
            let empty = v["deliveries"].as_array().is_some_and(|a| a.is_empty());
            html! {
                @if act {
                    form #selected method="post" action="/ui/dead-letters/replay" {
                        (html::csrf_field(&op))
                        input type="hidden" name="mode" value="selected";
                        (table)
                        @if !empty { p { button type="submit" { "Replay selected…" } } }
                    }
                } @else { (table) }
                @if empty { p.muted { "Nothing " (state) "." } }
                @if let Some(n) = next { p { a href=(n) { "Older →" } } }
            }
        }
    };
    let filters = html! {
        form.filters method="get" action="/ui/dead-letters" {
            label { "Subscription" input name="subscription" value=(subscription.clone().unwrap_or_default()) size="14"; }
            label { "Deliveries" select name="state" {
                @for s in ["dead-lettered", "retrying", "pending"] { option value=(s) selected[state == s] { (s) } }
            } }
            button type="submit" { "Show" }
        }
    };
    let bulk = html! {
        @if dead && op.may_act() {
            details {
                summary { "Replay every dead letter of a subscription that matches a filter…" }
                form.filters method="post" action="/ui/dead-letters/replay" {
                    (html::csrf_field(&op))
                    input type="hidden" name="mode" value="filter";
                    label { "Subscription (required)" input name="subscription" value=(subscription.clone().unwrap_or_default()) required size="14"; }
                    label { "Error class" input name="errorClass" placeholder="e.g. http_500" size="12"; }
                    label { "Dead-lettered from (UTC)" input type="datetime-local" name="from"; }
                    label { "to (UTC)" input type="datetime-local" name="to"; }
                    button type="submit" { "Preview…" }
                }
            }
        }
    };
    let title = if dead {
        "Dead letters".to_string()
    } else {
        format!("Deliveries {state}")
    };
    html::page(
        &title,
        "/ui/dead-letters",
        &op,
        html! { (filters) (bulk) (html::live_region(&url, rows)) },
    )
}

fn field(pairs: &[(String, String)], k: &str) -> Option<String> {
    pairs
        .iter()
        .find(|(n, _)| n == k)
        .map(|(_, v)| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

fn same_text() -> Markup {
    html! {
        p { "What stays the same: each delivery keeps its delivery id, its dedup key and its receipt; nothing is received again. "
            "What changes: each gets one more attempt, recorded with a new attempt event id; a run it starts carries that event id as its causationId." }
    }
}

/// `POST /ui/dead-letters/replay`: `mode=selected` with `ids`, or `mode=filter` with `subscription`,
/// `errorClass`, `from`, `to`. Without `confirmed=yes` it only previews and asks.
pub async fn replay(
    State(c): State<Console>,
    Extension(op): Extension<Operator>,
    Form(pairs): Form<Vec<(String, String)>>,
) -> Page {
    let confirmed = field(&pairs, "confirmed").as_deref() == Some("yes");
    let back = "/ui/dead-letters";
    let mut status = axum::http::StatusCode::OK;
    let bad = axum::http::StatusCode::BAD_REQUEST;
    let body = match field(&pairs, "mode").as_deref() {
        Some("selected") => {
            let mut ids: Vec<String> = pairs
                .iter()
                .filter(|(k, _)| k == "ids")
                .map(|(_, v)| v.clone())
                .collect();
            // A row's own button replays that row only.
            if let Some(one) = field(&pairs, "only") {
                ids = vec![one];
            }
            let mut seen = std::collections::HashSet::new();
            ids.retain(|i| seen.insert(i.clone()));
            if ids.is_empty() {
                status = bad;
                html! { p.error role="alert" { "Select at least one dead letter." } p { a href=(back) { "Back" } } }
            } else if ids.len() > MAX_SELECTED {
                status = bad;
                html! { p.error role="alert" { "At most " (MAX_SELECTED) " at once; use the filter replay for more." } }
            } else if !confirmed {
                let fields: Vec<(&str, String)> = std::iter::once(("mode", "selected".to_string()))
                    .chain(ids.iter().map(|i| ("ids", i.clone())))
                    .collect();
                html::confirm(
                    &op,
                    "/ui/dead-letters/replay",
                    html! {
                        p { "Replay " strong { (ids.len()) " dead letter" @if ids.len() != 1 { "s" } } "?" }
                        ul { @for i in &ids { li { code { (i) } } } }
                        (same_text())
                    },
                    &fields,
                    &format!("Yes, replay {}", ids.len()),
                    back,
                )
            } else {
                let mut results = Vec::new();
                for id in &ids {
                    let answer = tb_api::inspect::replay_delivery(
                        State(c.api.clone()),
                        axum::extract::Path(id.clone()),
                    )
                    .await;
                    results.push((
                        id.clone(),
                        crate::act(
                            &c,
                            &op,
                            Method::POST,
                            "/v1/deliveries/{id}/replay",
                            id,
                            answer,
                        )
                        .await,
                    ));
                }
                let ok = results.iter().filter(|(_, o)| o.ok()).count();
                html! {
                    p.ok role="status" { (ok) " of " (results.len()) " replayed" @if ok > 0 { "; each replayed one is due for a new attempt now (its receipt page shows it)" } "." }
                    (results_table(&results))
                    p { a href=(back) { "Back to dead letters" } }
                }
            }
        }
        Some("filter") => bulk(&c, &op, &pairs, confirmed).await,
        _ => {
            status = bad;
            html! { p.error role="alert" { "Unknown replay form." } }
        }
    };
    html::page("Replay dead letters", "/ui/dead-letters", &op, body).status(status)
}

fn results_table(results: &[(String, crate::Outcome)]) -> Markup {
    html! {
        table {
            thead { tr { th { "Delivery" } th { "Outcome" } } }
            tbody {
                @for (id, o) in results {
                    tr data-replayed=(id) {
                        td { (html::id(id, None)) }
                        td {
                            @if o.ok() { (html::state(o.body["delivery"]["state"].as_str().or(o.body["state"].as_str()).unwrap_or("pending"))) " — replayed" }
                            @else { span.error { (o.error_text()) } }
                        }
                    }
                }
            }
        }
    }
}

async fn bulk(c: &Console, op: &Operator, pairs: &[(String, String)], confirmed: bool) -> Markup {
    let Some(sub) = field(pairs, "subscription") else {
        return html! { p.error role="alert" { "A filter replay needs a subscription." } };
    };
    let mut filter = json!({});
    if let Some(e) = field(pairs, "errorClass") {
        filter["errorClass"] = json!(e);
    }
    if let Some(t) = rfc3339(&field(pairs, "from")) {
        filter["from"] = json!(t);
    }
    if let Some(t) = rfc3339(&field(pairs, "to")) {
        filter["to"] = json!(t);
    }
    let call = |b: Value| {
        let st = c.api.clone();
        let sub = sub.clone();
        async move {
            let body: Result<tb_api_types::replay::ReplayRequest, _> = serde_json::from_value(b);
            match body {
                Ok(b) => {
                    crate::outcome(
                        tb_api::replay::replay_all(
                            State(st),
                            axum::extract::Path(sub),
                            Ok(Json(b)),
                        )
                        .await,
                    )
                    .await
                }
                Err(e) => crate::Outcome {
                    status: axum::http::StatusCode::BAD_REQUEST,
                    body: json!({"error": "validation_error", "message": e.to_string()}),
                },
            }
        }
    };
    let mut carried: Vec<(&str, String)> =
        vec![("mode", "filter".into()), ("subscription", sub.clone())];
    for k in ["errorClass", "from", "to"] {
        if let Some(v) = field(pairs, k) {
            carried.push((k, v));
        }
    }
    if !confirmed {
        let preview = call(json!({"filter": filter, "dryRun": true})).await;
        if !preview.ok() {
            return html! { p.error role="alert" { (preview.error_text()) } };
        }
        let count = preview.body["count"].as_u64().unwrap_or(0);
        if count == 0 {
            return html! { p { "No dead letter of " code { (sub) } " matches that filter: nothing to replay." } p { a href="/ui/dead-letters" { "Back" } } };
        }
        carried.push(("expect", count.to_string()));
        return html::confirm(
            op,
            "/ui/dead-letters/replay",
            html! {
                p { "Replay " strong { (count) " dead letter" @if count != 1 { "s" } } " of " code { (sub) } " matching " code { (filter.to_string()) } "?" }
                p.muted { "Oldest first: " @for i in preview.body["sample"].as_array().into_iter().flatten() { code { (html::json_text(i)) } " " } @if preview.body["more"] == true { "…" } }
                (same_text())
                p { "If the count changes before you confirm, nothing is replayed and you are asked again." }
            },
            &carried,
            &format!("Yes, replay {count}"),
            "/ui/dead-letters",
        );
    }
    let expect: u64 = field(pairs, "expect")
        .and_then(|e| e.parse().ok())
        .unwrap_or(0);
    let answer = call(json!({"filter": filter, "dryRun": false, "expect": expect})).await;
    tb_api::audit::record(
        &c.api,
        &op.name,
        "dead_letters.replay",
        sub.clone(),
        answer.status,
        &answer.body,
        Some(&json!({"via": "console"})),
    )
    .await;
    if !answer.ok() {
        return html! { p.error role="alert" { (answer.error_text()) } p { a href="/ui/dead-letters" { "Back" } } };
    }
    let ids: Vec<String> = answer.body["deliveryIds"]
        .as_array()
        .into_iter()
        .flatten()
        .map(html::json_text)
        .collect();
    html! {
        p.ok role="status" { (answer.body["replayed"]) " replayed; each has a new attempt." @if answer.body["more"] == true { " " (answer.body["remaining"]) " more match: replay again to continue." } }
        table { thead { tr { th { "Delivery" } th { "Outcome" } } } tbody {
            @for i in &ids { tr data-replayed=(i) { td { (html::id(i, None)) } td { "replayed" } } }
            @for s in answer.body["skipped"].as_array().into_iter().flatten() {
                tr { td { code { (html::json_text(&s["deliveryId"])) } } td { "skipped: " (html::json_text(&s["reason"])) } }
            }
        } }
        p { a href={ "/ui/dead-letters?subscription=" (html::url_encode(&sub)) } { "Back to dead letters of " (sub) } }
    }
}
