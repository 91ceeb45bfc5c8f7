//! The audit log: who did what and when, filterable, newest first; and the check of its hash chain.

use axum::extract::{Query, State};
use axum::Extension;
use maud::html;

use super::{opt, Filters, Pager};
use crate::html::{self, Page};
use crate::login::Operator;
use crate::Console;

/// `GET /ui/audit?actor&action&target&before&verify=1`.
pub async fn page(
    State(c): State<Console>,
    Extension(op): Extension<Operator>,
    Query(f): Query<Filters>,
) -> Page {
    let (actor, action, target) = (opt(&f.actor), opt(&f.action), opt(&f.target));
    let before = opt(&f.before).and_then(|b| b.parse::<i64>().ok());
    let params = tb_api::audit::ListParams {
        before_seq: before,
        actor: actor.clone(),
        action: action.clone(),
        target: target.clone(),
        limit: Some(100),
        ..Default::default()
    };
    let verification = if f.verify.is_some() {
        Some(tb_api::audit::verify_chain(&c.api).await)
    } else {
        None
    };
    let page = tb_api::audit::page(&c.api, params).await;
    let pager = Pager::new(
        "/ui/audit",
        vec![
            ("actor", actor.clone()),
            ("action", action.clone()),
            ("target", target.clone()),
        ],
        &before.map(|b| b.to_string()),
    );
    let url = pager.here.clone();
    let body = html! {
        @match verification {
            Some(Ok(v)) if v.ok => p.ok role="status" {
                "The chain holds: " (v.checked) " entries verified up to seq " (v.head_seq) "."
                @if let Some(cp) = &v.checkpoint { " Checkpoint of this head (keep it outside the database): " code { (cp) } }
                @if !v.keyed { " This server has no audit key: entries are not keyed." }
            },
            Some(Ok(v)) => p.error role="alert" { "The chain is broken: " (v.message.unwrap_or_default()) },
            Some(Err(e)) => (html::api_error(&e)),
            None => {},
        }
        @match page {
            Err(e) => (html::api_error(&e)),
            Ok(p) => {
                div.scroll { table {
                    thead { tr { th { "#" } th { "When" } th { "Actor" } th { "Action" } th { "Target" } th { "Outcome" } th.hide-narrow { "Detail" } } }
                    tbody {
                        @for e in &p.entries {
                            tr {
                                td { (e.seq) }
                                td { (html::time(Some(&e.at))) }
                                td { (e.actor) }
                                td { code { (e.action) } }
                                td { code { (e.target) } }
                                td { (html::state(&e.outcome)) }
                                td.hide-narrow { small { code { (e.detail.to_string()) } } }
                            }
                        }
                    }
                } }
                @if p.entries.is_empty() { p.muted { "No entries match." } }
                @if let Some(n) = p.next {
                    @if let Some(older) = pager.older(Some(&n.to_string())) { p { a href=(older) { "Older →" } } }
                }
            }
        }
    };
    let form = html! {
        form.filters method="get" action="/ui/audit" {
            label { "Actor" input name="actor" value=(actor.clone().unwrap_or_default()) size="12"; }
            label { "Action, or the actions under it" input name="action" value=(action.clone().unwrap_or_default()) size="18" placeholder="dead_letters"; }
            label { "Target" input name="target" value=(target.clone().unwrap_or_default()) size="18"; }
            button type="submit" { "Filter" }
            a href="/ui/audit?verify=1" { "Verify the chain" }
        }
    };
    html::page(
        "Audit log",
        "/ui/audit",
        &op,
        html! { (form) (html::live_region(&url, body)) },
    )
}
