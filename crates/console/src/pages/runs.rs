//! Runs and sessions: runs by status and workflow; one run's trigger (linked back to its receipt),
//! its mailbox (buffered, consumed, dropped, expired signals), its waits with their deadlines counting
//! down and their winners, its turns; raising a signal by hand after a confirmation.

use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode};
use axum::{Extension, Form, Json};
use maud::{html, Markup};
use serde::Deserialize;
use serde_json::Value;

use super::{opt, Filters, Pager};
use crate::html::{self, Page};
use crate::login::Operator;
use crate::Console;

const STATUSES: &[&str] = &[
    "pending",
    "running",
    "paused",
    "waiting-approval",
    "waiting-input",
    "waiting-external",
    "completed",
    "failed",
    "cancelling",
    "cancelled",
];

/// `GET /ui/runs?status&workflow&before`.
pub async fn list(
    State(c): State<Console>,
    Extension(op): Extension<Operator>,
    Query(f): Query<Filters>,
) -> Page {
    let (status, workflow, before) = (opt(&f.status), opt(&f.workflow), opt(&f.before));
    let params = tb_api::inspect::ListParams {
        limit: Some(50),
        before: before.clone(),
        status: status.clone(),
        workflow: workflow.clone(),
        ..Default::default()
    };
    let answer = crate::read(tb_api::runs::list_runs(
        State(c.api.clone()),
        Ok(Query(params)),
    ))
    .await;
    let pager = Pager::new(
        "/ui/runs",
        vec![("status", status.clone()), ("workflow", workflow.clone())],
        &before,
    );
    let url = pager.here.clone();
    let rows = match answer {
        Err(e) => html::api_error(&e),
        Ok(v) => {
            let next = pager.older(v["nextCursor"].as_str());
            html! {
                div.scroll { table {
                    thead { tr { th { "Created" } th { "Run" } th { "Workflow" } th { "Status" } th { "Started by" } th.hide-narrow { "causationId" } } }
                    tbody {
                        @for r in v["runs"].as_array().into_iter().flatten() {
                            @let id = r["runId"].as_str().unwrap_or_default();
                            tr {
                                td { (html::time_of(&r["createdAt"])) }
                                td { (html::id(id, Some(&format!("/ui/runs/{}", html::seg(id))))) }
                                td { (r["workflowId"].as_str().unwrap_or_default()) }
                                td { (html::state(r["status"].as_str().unwrap_or_default())) }
                                td { @if let Some(rc) = r["trigger"]["receiptId"].as_str() { a href={ "/ui/receipts/" (html::seg(rc)) } { "receipt" } " of " (r["trigger"]["subscriptionId"].as_str().unwrap_or_default()) } @else { span.muted { "API" } } }
                                td.hide-narrow { code { (r["causationId"].as_str().unwrap_or("")) } }
                            }
                        }
                    }
                } }
                @if v["runs"].as_array().is_some_and(|a| a.is_empty()) { p.muted { "No runs match." } }
                @if let Some(n) = next { p { a href=(n) { "Older →" } } }
            }
        }
    };
    let form = html! {
        form.filters method="get" action="/ui/runs" {
            label { "Status" select name="status" {
                option value="" { "any" }
                @for s in STATUSES { option value=(s) selected[status.as_deref() == Some(s)] { (s) } }
            } }
            label { "Workflow" input name="workflow" value=(workflow.clone().unwrap_or_default()) size="16"; }
            button type="submit" { "Show" }
        }
    };
    html::page(
        "Runs & sessions",
        "/ui/runs",
        &op,
        html! { (form) (html::live_region(&url, rows)) },
    )
}

/// `GET /ui/runs/{id}`.
pub async fn show(
    State(c): State<Console>,
    Extension(op): Extension<Operator>,
    Path(id): Path<String>,
) -> Page {
    run_page(&c, &op, &id, None, None).await
}

/// A run's page; `notice` (an action's outcome) above it, outside the live region. 404 without the
/// raise form for an unknown run.
async fn run_page(
    c: &Console,
    op: &Operator,
    id: &str,
    notice: Option<(Markup, StatusCode)>,
    form_state: Option<(&str, &str, &str)>,
) -> Page {
    let here = format!("/ui/runs/{}", html::seg(id));
    let (live, found) = match run_body(c, id).await {
        Ok(m) => (m, StatusCode::OK),
        Err((m, status)) => (m, status),
    };
    let raise = if op.may_act() && found.is_success() {
        raise_form(op, id, form_state)
    } else {
        html! {}
    };
    let status = match (&notice, form_state) {
        (Some((_, s)), _) => *s,
        (None, Some(_)) => StatusCode::BAD_REQUEST,
        (None, None) => found,
    };
    let replace = notice.is_some().then_some(here.as_str());
    html::page_after(
        &format!("Run {id}"),
        "/ui/runs",
        op,
        notice.map(|(n, _)| n),
        replace,
        html! { (html::live_region(&here, live)) (raise) },
    )
    .status(status)
}

fn raise_form(op: &Operator, id: &str, state: Option<(&str, &str, &str)>) -> Markup {
    let (name, data, error) = state.unwrap_or(("", "", ""));
    html! {
        h2 { "Raise a signal" }
        @if !error.is_empty() { p.error role="alert" #raise-error { (error) } }
        form.stack method="post" action={ "/ui/runs/" (html::seg(id)) "/signals" } {
            (html::csrf_field(op))
            label { "Signal name (a-z 0-9 _ . -, at most 64)" input name="name" value=(name) required pattern="[a-z0-9_.\\-]{1,64}"; }
            label { "Data (JSON, optional)" textarea name="data" rows="4" { (data) } }
            div { button type="submit" { "Raise…" } }
        }
    }
}

async fn run_body(c: &Console, id: &str) -> Result<Markup, (Markup, StatusCode)> {
    let api = || State(c.api.clone());
    let run = match crate::read(tb_api::runs::get_run(api(), Path(id.to_string()))).await {
        Err(e) => return Err((html::api_error(&e), html::status_of(&e))),
        Ok(v) => v,
    };
    let signals = crate::read_json(tb_api::sessions::list_signals(
        api(),
        Path(id.to_string()),
        Ok(Query(Default::default())),
    ))
    .await;
    let waits = crate::read_json(tb_api::sessions::list_waits(api(), Path(id.to_string()))).await;
    let turns = crate::read_json(tb_api::sessions::list_turns(api(), Path(id.to_string()))).await;
    let t = &run["trigger"];
    Ok(html! {
        dl.facts {
            dt { "Run" } dd { (html::id(id, None)) }
            dt { "Status" } dd { (html::state(run["status"].as_str().unwrap_or_default())) }
            dt { "Workflow" } dd { (run["workflowId"].as_str().unwrap_or_default()) }
            dt { "Created" } dd { (html::time_of(&run["createdAt"])) " · updated " (html::time_of(&run["updatedAt"])) }
            dt { "Started by" } dd {
                @if let Some(rc) = t["receiptId"].as_str() {
                    "receipt " (html::id(rc, Some(&format!("/ui/receipts/{}", html::seg(rc))))) " of " a href={ "/ui/subscriptions/" (html::seg(t["subscriptionId"].as_str().unwrap_or_default())) } { (t["subscriptionId"].as_str().unwrap_or_default()) }
                    @if let Some(d) = t["deliveryId"].as_str() { ", delivery " a href={ "/ui/receipts/" (html::seg(rc)) "#" (d) } { code { (d) } } }
                } @else { "the API" }
            }
            dt { "causationId" } dd { code { (run["causationId"].as_str().unwrap_or("—")) } " (the delivered attempt's event id)" }
            dt { "Inputs" } dd { code { (run["inputs"].to_string()) } }
        }
        h2 { "Waits" }
        @if waits["waits"].as_array().is_none_or(|w| w.is_empty()) { p.muted { "No waits." } }
        @else {
            table {
                thead { tr { th { "Wait" } th { "State" } th { "On" } th { "Deadline" } th { "Winner" } } }
                tbody {
                    @for w in waits["waits"].as_array().into_iter().flatten() {
                        @let state = w["state"].as_str().unwrap_or_default();
                        tr data-wait=(w["waitId"].as_str().unwrap_or_default()) {
                            td { code { (w["waitId"].as_str().unwrap_or_default()) } }
                            td { (html::state(state)) }
                            td { (w["kind"].as_str().unwrap_or_default()) " " code { (w["names"].as_array().map(|n| n.iter().map(html::json_text).collect::<Vec<_>>().join(", ")).unwrap_or_default()) } br; small.muted { (w["reason"].as_str().unwrap_or_default()) } }
                            td {
                                @if let Some(d) = w["deadline"].as_str() {
                                    (html::time(Some(d)))
                                    @if state == "armed" { " · " span data-deadline=(d) { (d) } }
                                } @else { span.muted { "none" } }
                            }
                            td { (winner(&w["winner"])) }
                        }
                    }
                }
            }
        }
        h2 { "Mailbox" }
        p.muted { (signals["buffered"]) " buffered (newest first)" }
        @if signals["signals"].as_array().is_none_or(|s| s.is_empty()) { p.muted { "No signals." } }
        @else {
            table {
                thead { tr { th { "#" } th { "Name" } th { "State" } th { "Raised by" } th { "Signal id" } th { "Consumed by" } th { "Settled" } } }
                tbody {
                    @for s in signals["signals"].as_array().into_iter().flatten() {
                        tr {
                            td { (s["seq"]) }
                            td { code { (s["signal"]["name"].as_str().unwrap_or_default()) } }
                            td { (html::state(s["state"].as_str().unwrap_or_default())) }
                            td {
                                @let src = &s["signal"]["source"];
                                (src["kind"].as_str().unwrap_or_default())
                                @if let Some(rc) = src["receiptId"].as_str() { " " a href={ "/ui/receipts/" (html::seg(rc)) } { "receipt" } }
                                @if let Some(a) = src["actorId"].as_str() { " " (a) }
                            }
                            td { code { (s["signal"]["signalId"].as_str().unwrap_or_default()) } }
                            td { code { (s["consumedBy"].as_str().unwrap_or("")) } }
                            td { (html::time_of(&s["settledAt"])) }
                        }
                    }
                }
            }
        }
        h2 { "Turns" }
        @if turns["turns"].as_array().is_none_or(|t| t.is_empty()) { p.muted { "No turns." } }
        @else {
            table {
                thead { tr { th { "#" } th { "Kind" } th { "State" } th { "Created" } th { "Claims" } } }
                tbody {
                    @for t in turns["turns"].as_array().into_iter().flatten() {
                        tr { td { (t["seq"]) } td { (t["kind"].as_str().unwrap_or_default()) } td { (html::state(t["state"].as_str().unwrap_or_default())) } td { (html::time_of(&t["createdAt"])) } td { (t["claims"]) } }
                    }
                }
            }
        }
    })
}

/// A wait's winner without its data (signal data is content: never shown by default): its kind, and
/// the signal's name and id, the turn, or the deadline.
fn winner(w: &Value) -> Markup {
    if w.is_null() {
        return html! { span.muted { "—" } };
    }
    html! {
        (w["kind"].as_str().unwrap_or_default())
        @if let Some(n) = w["signal"]["name"].as_str() { " " code { (n) } " " small.muted { (w["signal"]["signalId"].as_str().unwrap_or_default()) } }
        @if let Some(t) = w["turnId"].as_str() { " " code { (t) } }
        @if let Some(d) = w["deadline"].as_str() { " at " (html::time(Some(d))) }
    }
}

/// The raise form.
#[derive(Debug, Default, Deserialize)]
pub struct RaiseForm {
    #[serde(default)]
    name: String,
    #[serde(default)]
    data: String,
    #[serde(default)]
    confirmed: String,
}

/// `POST /ui/runs/{id}/signals`: checks the name and the JSON first (a bad one is shown at the form,
/// nothing sent), then asks, then raises through the API's handler.
pub async fn raise(
    State(c): State<Console>,
    Extension(op): Extension<Operator>,
    Path(id): Path<String>,
    Form(f): Form<RaiseForm>,
) -> Page {
    let name = f.name.trim().to_string();
    let valid_name = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b));
    if !valid_name {
        return run_page(
            &c,
            &op,
            &id,
            None,
            Some((
                &name,
                &f.data,
                "The signal name must be 1 to 64 of a-z, 0-9, _ . -",
            )),
        )
        .await;
    }
    let data: Option<Value> = if f.data.trim().is_empty() {
        None
    } else {
        match serde_json::from_str(&f.data) {
            Ok(v) => Some(v),
            Err(e) => {
                return run_page(
                    &c,
                    &op,
                    &id,
                    None,
                    Some((&name, &f.data, &format!("The data is not JSON: {e}"))),
                )
                .await
            }
        }
    };
    if f.confirmed != "yes" {
        let shown = data
            .as_ref()
            .map(|d| d.to_string())
            .unwrap_or_else(|| "no data".into());
        let body = html::confirm(
            &op,
            &format!("/ui/runs/{}/signals", html::seg(&id)),
            html! {
                p { "Raise signal " code { (name) } " on run " code { (id) } " with " code { (shown) } "?" }
                ul {
                    li { "It goes to the run's mailbox (first in, first out); a wait armed on this name resolves at once, before any timer." }
                    li { "It cannot be taken back. Recorded in the audit log as you." }
                }
            },
            &[("name", name.clone()), ("data", f.data.clone())],
            &format!("Yes, raise {name}"),
            &format!("/ui/runs/{}", html::seg(&id)),
        );
        return html::page("Raise a signal", "/ui/runs", &op, body);
    }
    let body = tb_api_types::sessions::RaiseSignal {
        name: name.clone(),
        data,
        signal_id: None,
        wake: false,
    };
    let answer = tb_api::sessions::raise(
        State(c.api.clone()),
        Path(id.clone()),
        Some(Extension(op.principal())),
        Ok(Json(body)),
    )
    .await;
    let out = crate::act(&c, &op, Method::POST, "/v1/runs/{id}/signals", &id, answer).await;
    let notice = if out.ok() {
        html! { p.ok role="status" { "Signal " code { (name) } " raised (" (out.body["status"].as_str().unwrap_or("queued")) @if let Some(w) = out.body["consumedBy"].as_str() { "; it resolved wait " code { (w) } } ")." } }
    } else {
        html! { p.error role="alert" { (out.error_text()) } }
    };
    run_page(&c, &op, &id, Some((notice, out.status)), None).await
}
