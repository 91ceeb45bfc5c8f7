//! Subscriptions: health at a glance (state, receipts per minute and failures over the last hour,
//! last error), pause / resume after a confirmation; one subscription's binding policy and recent
//! receipts.

use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode};
use axum::{Extension, Form};
use maud::{html, Markup};
use serde::Deserialize;

use crate::html::{self, Page};
use crate::login::Operator;
use crate::Console;

fn actions(op: &Operator, id: &str, state: &str, quarantined: bool) -> Markup {
    html! {
        @if op.may_act() {
            @if quarantined {
                form.inline method="post" action={ "/ui/subscriptions/" (html::seg(id)) "/release" } {
                    (html::csrf_field(op))
                    button type="submit" { "Release…" }
                }
                " "
            }
            @if state != "paused" {
                form.inline method="post" action={ "/ui/subscriptions/" (html::seg(id)) "/pause" } {
                    (html::csrf_field(op))
                    button type="submit" { "Pause…" }
                }
            }
            @if state != "active" {
                " "
                form.inline method="post" action={ "/ui/subscriptions/" (html::seg(id)) "/resume" } {
                    (html::csrf_field(op))
                    button type="submit" { "Resume…" }
                }
            }
        }
    }
}

/// `GET /ui/subscriptions`.
pub async fn list(State(c): State<Console>, Extension(op): Extension<Operator>) -> Page {
    let subs = crate::read(tb_api::inspect::list_subscriptions(State(c.api.clone()))).await;
    let activity = c.activity().await.ok();
    let body = match subs {
        Err(e) => html::api_error(&e),
        Ok(v) => {
            let details = &v["stateDetails"];
            html! {
                div.scroll { table {
                    thead { tr {
                        th scope="col" { "Subscription" } th scope="col" { "Source" } th scope="col" { "Connector" }
                        th scope="col" { "State" } th scope="col" { "Last hour" } th scope="col" .hide-narrow { "Last error" }
                        @if op.may_act() { th scope="col" { "Actions" } }
                    } }
                    tbody {
                        @for s in v["subscriptions"].as_array().into_iter().flatten() {
                            @let id = s["subscriptionId"].as_str().unwrap_or_default();
                            @let d = &details[id];
                            @let state = s["state"].as_str().unwrap_or_default();
                            @let act = activity.as_ref().and_then(|a| a.subscriptions.iter().find(|x| x.subscription_id == id));
                            tr data-subscription=(id) {
                                td { a href={ "/ui/subscriptions/" (html::seg(id)) } { (id) } }
                                td { (s["source"].as_str().unwrap_or_default()) }
                                td { (d["connector"].as_str().unwrap_or_default()) }
                                td {
                                    (html::state(state))
                                    @if d["quarantine"].is_object() { " " (html::state("quarantined")) }
                                    br; small.muted { "since " (html::time_of(&d["stateSince"])) }
                                }
                                td {
                                    @if let Some(a) = act {
                                        @let label = format!("{} receipts in the last hour, {} of {} attempts failed ({:.0} %)", a.receipts, a.failed_attempts, a.attempts, a.failure_rate * 100.0);
                                        (html::sparkline(&a.receipts_per_minute, &a.failures_per_minute, &label))
                                        br; small { (a.receipts) @if a.receipts == 1 { " receipt · " } @else { " receipts · " } (a.failed_attempts) " of " (a.attempts) @if a.attempts == 1 { " attempt failed" } @else { " attempts failed" } }
                                    }
                                }
                                td.hide-narrow { small { (d["lastError"].as_str().unwrap_or("")) } }
                                @if op.may_act() { td { (actions(&op, id, state, d["quarantine"].is_object())) } }
                            }
                        }
                    }
                } }
            }
        }
    };
    html::page(
        "Subscriptions",
        "/ui/subscriptions",
        &op,
        html::live_region("/ui/subscriptions", body),
    )
}

/// `GET /ui/subscriptions/{id}`: state, the binding policy (read-only) and the newest receipts.
pub async fn show(
    State(c): State<Console>,
    Extension(op): Extension<Operator>,
    Path(id): Path<String>,
) -> Page {
    let (body, status) = subscription_body(&c, &op, &id).await;
    html::page(
        &format!("Subscription {id}"),
        "/ui/subscriptions",
        &op,
        html::live_region(&format!("/ui/subscriptions/{}", html::seg(&id)), body),
    )
    .status(status)
}

/// The page's live part, and its status (404 for an unknown subscription).
async fn subscription_body(c: &Console, op: &Operator, id: &str) -> (Markup, StatusCode) {
    let sub = crate::read(tb_api::inspect::get_subscription(
        State(c.api.clone()),
        Path(id.to_string()),
    ))
    .await;
    let bindings = crate::outcome(tb_api::bindings::list(State(c.api.clone())).await)
        .await
        .body;
    let receipts = crate::read(tb_api::inspect::list_receipts(
        State(c.api.clone()),
        Ok(Query(tb_api::inspect::ListParams {
            subscription: Some(id.to_string()),
            limit: Some(20),
            ..Default::default()
        })),
    ))
    .await;
    let s = match sub {
        Err(e) => return (html::api_error(&e), html::status_of(&e)),
        Ok(v) => v,
    };
    let d = s["stateDetail"].clone();
    let s = if s["subscription"].is_object() {
        s["subscription"].clone()
    } else {
        s
    };
    let state = s["state"].as_str().unwrap_or_default().to_string();
    let page = html! {
        dl.facts {
            dt { "State" } dd { (html::state(&state)) " since " (html::time_of(&d["stateSince"])) }
            @if d["quarantine"].is_object() {
                dt { "Quarantine" }
                dd {
                    (html::state("quarantined")) " since " (html::time_of(&d["quarantine"]["since"])) ": "
                    (d["quarantine"]["reason"].as_str().unwrap_or(""))
                    " (by " (d["quarantine"]["quarantinedBy"].as_str().unwrap_or("the automatic rule")) "). Every request is refused with "
                    code { "403 subscription_quarantined" } " until released."
                }
            }
            dt { "Source" } dd { (s["source"].as_str().unwrap_or_default()) }
            dt { "Connector" } dd { (d["connector"].as_str().unwrap_or_default()) }
            dt { "Failures since last success" } dd { (d["failuresSinceSuccess"]) " (the breaker turns it failed at " (d["failureThreshold"]) " in a row)" }
            dt { "Last success" } dd { (html::time_of(&d["lastSuccessAt"])) }
            dt { "Last error" } dd { (d["lastError"].as_str().unwrap_or("—")) }
            dt { "Retry policy" } dd { (s["retryPolicy"]["maxAttempts"]) " attempts, " (s["retryPolicy"]["backoff"].as_str().unwrap_or("")) }
            dt { "Secret" } dd { code { (s["secretFingerprint"].as_str().unwrap_or("—")) } " (fingerprint only)" }
        }
        p { (actions(op, id, &state, d["quarantine"].is_object())) " " a href={ "/ui/dead-letters?subscription=" (html::seg(id)) } { "Dead letters of " (id) } }
        h2 { "Bindings (the policy: read-only, set in the configuration)" }
        div.scroll { table {
            thead { tr { th { "Binding" } th { "Event types" } th { "Filter" } th { "Action" } th { "Target" } th { "State" } } }
            tbody {
                @for b in bindings["bindings"].as_array().into_iter().flatten().filter(|b| b["subscriptionId"] == id) {
                    tr {
                        td { code { (b["bindingId"].as_str().unwrap_or_default()) } }
                        td { (b["eventTypes"].as_array().map(|a| a.iter().map(html::json_text).collect::<Vec<_>>().join(", ")).unwrap_or_default()) }
                        td { code { (if b["filter"].as_object().is_some_and(|o| !o.is_empty()) { b["filter"].to_string() } else { "—".into() }) } }
                        td { (b["action"].as_str().unwrap_or_default()) }
                        td {
                            (b["workflowId"].as_str().unwrap_or("—"))
                            @if let Some(sig) = b["actionConfig"]["signal"].as_str() { " · signal " code { (sig) } }
                        }
                        td { (html::state(b["state"].as_str().unwrap_or_default())) }
                    }
                }
            }
        } }
        h2 { "Newest receipts" }
        @match receipts {
            Err(e) => (html::api_error(&e)),
            Ok(r) => (super::receipts::table(&r)),
        }
        p { a href={ "/ui/receipts?subscription=" (html::seg(id)) } { "All receipts of " (id) } }
    };
    (page, StatusCode::OK)
}

/// The form of pause / resume: empty until confirmed.
#[derive(Debug, Default, Deserialize)]
pub struct Confirm {
    #[serde(default)]
    confirmed: String,
}

async fn operate(c: Console, op: Operator, id: String, f: Confirm, pause: bool) -> Page {
    let verb = if pause { "pause" } else { "resume" };
    let here = format!("/ui/subscriptions/{}", html::seg(&id));
    if f.confirmed != "yes" {
        let what = if pause {
            html! {
                p { "Pause " strong { (id) } "?" }
                ul {
                    li { "Its ingest endpoint answers " code { "409 subscription_not_active" } " to every new webhook until it is resumed: senders see a refusal and retry on their own schedule (some, like GitHub, do not retry)." }
                    li { "Deliveries already accepted keep being attempted; nothing stored is lost." }
                    li { "Recorded in the audit log as you." }
                }
            }
        } else {
            html! {
                p { "Resume " strong { (id) } "?" }
                ul {
                    li { "Its state becomes " (html::state("active")) ": new webhooks are accepted and routed again." }
                    li { "Dead letters stay dead-lettered until you replay them." }
                    li { "Recorded in the audit log as you." }
                }
            }
        };
        let body = html::confirm(
            &op,
            &format!("{here}/{verb}"),
            what,
            &[],
            &format!("Yes, {verb} {id}"),
            &here,
        );
        return html::page(
            &format!("{} {id}", if pause { "Pause" } else { "Resume" }),
            "/ui/subscriptions",
            &op,
            body,
        );
    }
    let route = if pause {
        "/v1/trigger-subscriptions/{id}/pause"
    } else {
        "/v1/trigger-subscriptions/{id}/resume"
    };
    let answer = if pause {
        tb_api::inspect::pause_subscription(State(c.api.clone()), Path(id.clone())).await
    } else {
        tb_api::inspect::resume_subscription(State(c.api.clone()), Path(id.clone())).await
    };
    let out = crate::act(&c, &op, Method::POST, route, &id, answer).await;
    let notice = if out.ok() {
        html! { p.ok role="status" { (id) " is now " (out.body["subscription"]["state"].as_str().or(out.body["state"].as_str()).unwrap_or(if pause { "paused" } else { "active" })) "." } }
    } else {
        html! { p.error role="alert" { (out.error_text()) } }
    };
    after_action(&c, &op, &id, notice, out.status).await
}

/// The subscription's page after an action, with its `notice` and the action's status.
async fn after_action(
    c: &Console,
    op: &Operator,
    id: &str,
    notice: Markup,
    status: StatusCode,
) -> Page {
    let here = format!("/ui/subscriptions/{}", html::seg(id));
    let (body, _) = subscription_body(c, op, id).await;
    html::page_after(
        &format!("Subscription {id}"),
        "/ui/subscriptions",
        op,
        Some(notice),
        Some(&here),
        html::live_region(&here, body),
    )
    .status(status)
}

/// `POST /ui/subscriptions/{id}/pause`: the confirmation, then the pause.
pub async fn pause(
    State(c): State<Console>,
    Extension(op): Extension<Operator>,
    Path(id): Path<String>,
    Form(f): Form<Confirm>,
) -> Page {
    operate(c, op, id, f, true).await
}

/// `POST /ui/subscriptions/{id}/resume`: the confirmation, then the resume.
pub async fn resume(
    State(c): State<Console>,
    Extension(op): Extension<Operator>,
    Path(id): Path<String>,
    Form(f): Form<Confirm>,
) -> Page {
    operate(c, op, id, f, false).await
}

/// `POST /ui/subscriptions/{id}/release`: the confirmation, then the release from quarantine.
pub async fn release(
    State(c): State<Console>,
    Extension(op): Extension<Operator>,
    Path(id): Path<String>,
    Form(f): Form<Confirm>,
) -> Page {
    let here = format!("/ui/subscriptions/{}", html::seg(&id));
    if c.api.engine.catalog().subscription(&id).is_none() {
        let e = tb_api::error::ApiError::new(
            tb_core::ErrorCode::NotFound,
            "no such trigger subscription",
        );
        return html::page("Release", "/ui/subscriptions", &op, html::api_error(&e))
            .status(StatusCode::NOT_FOUND);
    }
    if f.confirmed != "yes" && c.api.engine.quarantined(&id).is_none() {
        let notice =
            html! { p.ok role="status" { (id) " is not quarantined: nothing to release." } };
        return after_action(&c, &op, &id, notice, StatusCode::OK).await;
    }
    if f.confirmed != "yes" {
        let what = html! {
            p { "Release " strong { (id) } " from quarantine?" }
            ul {
                li { "Its ingest endpoint takes requests again: here at once, on the other replicas within one configuration poll." }
                li { "If the flood or the forged signatures go on, the automatic rule (when configured) quarantines it again after its minutes." }
                li { "Recorded in the audit log as you." }
            }
        };
        let body = html::confirm(
            &op,
            &format!("{here}/release"),
            what,
            &[],
            &format!("Yes, release {id}"),
            &here,
        );
        return html::page(&format!("Release {id}"), "/ui/subscriptions", &op, body);
    }
    let answer = tb_api::quarantine::release(State(c.api.clone()), Path(id.clone())).await;
    let out = crate::act(
        &c,
        &op,
        Method::POST,
        "/v1/trigger-subscriptions/{id}/release",
        &id,
        answer,
    )
    .await;
    let notice = if out.ok() && out.body["released"] == true {
        html! { p.ok role="status" { (id) " is released: requests are taken again." } }
    } else if out.ok() {
        html! { p.ok role="status" { (id) " was not quarantined." } }
    } else {
        html! { p.error role="alert" { (out.error_text()) } }
    };
    after_action(&c, &op, &id, notice, out.status).await
}
