//! Overview: the last hour in counts, each linking to its list.

use axum::extract::State;
use axum::Extension;
use maud::{html, Markup};

use crate::html::{self, Page};
use crate::login::Operator;
use crate::Console;

fn card(n: impl std::fmt::Display, label: &str, href: &str, tone: &str) -> Markup {
    html! {
        a class={ "card " (tone) } href=(href) {
            div.n { (n) }
            div.l { (label) }
        }
    }
}

fn age(ms: i64) -> String {
    let s = ms / 1000;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min", s / 60),
        _ => format!("{} h {} min", s / 3600, (s % 3600) / 60),
    }
}

/// `GET /ui`.
pub async fn page(State(c): State<Console>, Extension(op): Extension<Operator>) -> Page {
    let body = match c.activity().await {
        Err(e) => html::api_error(&e),
        Ok(a) => {
            let services = crate::read(tb_api::services::list(axum::extract::State(c.api.clone())))
                .await
                .ok();
            let services = services
                .as_ref()
                .and_then(|v| v["services"].as_array())
                .cloned()
                .unwrap_or_default();
            let up = services.iter().filter(|s| s["liveness"] == "up").count();
            let r = |k: &str| a.receipts_by_state.get(k).copied().unwrap_or(0);
            let total: u64 = a.receipts_by_state.values().sum();
            let delivered = a.attempts_by_outcome.get("delivered").copied().unwrap_or(0);
            let failed: u64 = a
                .attempts_by_outcome
                .iter()
                .filter(|(k, _)| k.as_str() != "delivered")
                .map(|(_, v)| v)
                .sum();
            html! {
                h2 { "Receipts, last hour" }
                div.cards {
                    (card(total, "received", "/ui/receipts", ""))
                    (card(r("consumed"), "consumed", "/ui/receipts?state=consumed", ""))
                    (card(r("unmatched"), "unmatched (no binding)", "/ui/receipts?state=unmatched", ""))
                    (card(r("rejected"), "rejected (bad signature or body)", "/ui/receipts?state=rejected", if r("rejected") > 0 { "warn" } else { "" }))
                    (card(r("rate_limited"), "rate limited", "/ui/receipts?state=rate_limited", ""))
                    (card(r("dead_lettered"), "dead-lettered", "/ui/receipts?state=dead_lettered", if r("dead_lettered") > 0 { "bad" } else { "" }))
                }
                h2 { "Deliveries" }
                div.cards {
                    (card(delivered, "delivered, last hour", "/ui/receipts?state=consumed", ""))
                    (card(failed, "failed attempts, last hour (per subscription)", "/ui/subscriptions", if failed > 0 { "warn" } else { "" }))
                    (card(a.pending, "pending now", "/ui/dead-letters?state=pending", ""))
                    (card(a.retrying, "retrying now", "/ui/dead-letters?state=retrying", if a.retrying > 0 { "warn" } else { "" }))
                    (card(a.dead_lettered, "dead letters", "/ui/dead-letters", if a.dead_lettered > 0 { "bad" } else { "" }))
                    (card(a.oldest_undelivered_age_ms.map(age).unwrap_or_else(|| "—".into()), "oldest undelivered", "/ui/dead-letters?state=pending", if a.oldest_undelivered_age_ms.unwrap_or(0) > 60_000 { "warn" } else { "" }))
                }
                h2 { "Sessions and services" }
                div.cards {
                    (card(a.waits_armed, "waits armed", "/ui/runs?status=running", ""))
                    @if !services.is_empty() {
                        (card(format!("{up} / {}", services.len()), "services up", "/ui/operations", if up < services.len() { "warn" } else { "" }))
                    }
                }
                @if let Some(d) = &a.next_deadline {
                    p.muted { "Next wait deadline: " span data-deadline=(d) { (d) } " (" (html::time(Some(d))) ")" }
                }
                p.muted { "Window from " (html::time(Some(&a.since))) "; counts refresh live." }
            }
        }
    };
    html::page("Overview", "/ui", &op, html::live_region("/ui", body))
}
