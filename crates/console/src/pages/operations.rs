//! Schedules and services: each schedule's next fire time and missed ticks; each registered
//! `triggers.v2` service's manifest hash, last heartbeat and liveness.

use axum::extract::State;
use axum::Extension;
use maud::html;

use crate::html::{self, Page};
use crate::login::Operator;
use crate::Console;

/// `GET /ui/operations`.
pub async fn page(State(c): State<Console>, Extension(op): Extension<Operator>) -> Page {
    let schedules = crate::read(tb_api::schedules::list(State(c.api.clone()))).await;
    let services = crate::read(tb_api::services::list(State(c.api.clone()))).await;
    let body = html! {
        h2 { "Schedules" }
        @match &schedules {
            Err(e) => (html::api_error(e)),
            Ok(v) if v["schedules"].as_array().is_none_or(|a| a.is_empty()) => p.muted { "No schedules." },
            Ok(v) => div.scroll { table {
                thead { tr { th { "Schedule" } th { "Cron" } th { "Zone" } th { "State" } th { "Next fire" } th { "Last tick" } th { "Missed ticks" } th.hide-narrow { "Origin" } } }
                tbody {
                    @for s in v["schedules"].as_array().into_iter().flatten() {
                        tr {
                            td { a href={ "/ui/subscriptions/" (html::seg(s["id"].as_str().unwrap_or_default())) } { (s["id"].as_str().unwrap_or_default()) } }
                            td { code { (s["cron"].as_str().unwrap_or_default()) } }
                            td { (s["timezone"].as_str().unwrap_or("UTC")) }
                            td { (html::state(s["state"].as_str().unwrap_or_default())) }
                            td { (html::time_of(&s["nextFireTime"])) @if let Some(n) = s["nextFireTime"].as_str() { br; small { span data-deadline=(n) { (n) } } } }
                            td { (html::time_of(&s["lastNominalTime"])) }
                            td { (s["missedTicks"]) }
                            td.hide-narrow { (s["origin"].as_str().unwrap_or_default()) }
                        }
                    }
                }
            } },
        }
        h2 { "Services (triggers.v2 over NATS)" }
        @match &services {
            Err(e) => (html::api_error(e)),
            Ok(v) if v["services"].as_array().is_none_or(|a| a.is_empty()) => p.muted { "No services registered (a service registers over NATS when it starts; the bridge needs serve --nats-url)." },
            Ok(v) => div.scroll { table {
                thead { tr { th { "Service" } th { "Version" } th { "Liveness" } th { "Replicas up" } th { "Last heartbeat" } th { "Manifest hash" } th.hide-narrow { "Actions" } } }
                tbody {
                    @for s in v["services"].as_array().into_iter().flatten() {
                        tr {
                            td { (s["name"].as_str().unwrap_or_default()) }
                            td { (s["serviceVersion"].as_str().unwrap_or_default()) }
                            td { (html::state(s["liveness"].as_str().unwrap_or_default())) @if s["otherBuild"] == true { " " span.badge.warn { "another build live" } } }
                            td { (s["replicasLive"]) " / " (s["replicas"].as_array().map(|r| r.len()).unwrap_or(0)) }
                            td { (html::time_of(&s["lastHeartbeatAt"])) }
                            td { (html::id(s["manifestHash"].as_str().unwrap_or_default(), None)) }
                            td.hide-narrow { (s["actions"].as_array().map(|a| a.iter().map(html::json_text).collect::<Vec<_>>().join(", ")).unwrap_or_default()) }
                        }
                    }
                }
            } },
        }
    };
    html::page(
        "Schedules & services",
        "/ui/operations",
        &op,
        html::live_region("/ui/operations", body),
    )
}
