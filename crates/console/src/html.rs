//! The page shell and the small pieces every page uses: times (shown in the viewer's zone, UTC on
//! hover), copyable ids, state badges, sparklines, the CSRF field, confirmation pages. All text is
//! escaped by `maud`; nothing inbound is ever inserted unescaped.

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde_json::Value;

use crate::operator::Operator;

/// A rendered page and its status (200 unless set: a missing record is 404, a refused form 400).
pub struct Page(pub Markup, pub StatusCode);

impl Page {
    /// The same page answered with `status`.
    pub fn status(mut self, status: StatusCode) -> Page {
        self.1 = status;
        self
    }
}

/// The status an API error is answered with.
pub fn status_of(e: &tb_api::error::ApiError) -> StatusCode {
    StatusCode::from_u16(e.0.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

impl IntoResponse for Page {
    /// The page's HTML with every bidirectional control shown ([`visible_controls`]) and the console's
    /// security headers: the content security policy (no `<base>` may move relative links:
    /// `base-uri 'none'`), `X-Content-Type-Options: nosniff`, no framing, no caching.
    fn into_response(self) -> Response {
        let html = self.0.into_string();
        let html = match visible_controls(&html) {
            std::borrow::Cow::Borrowed(_) => html,
            std::borrow::Cow::Owned(shown) => shown,
        };
        let mut r = (self.1, Html(html)).into_response();
        let h = r.headers_mut();
        h.insert(
            "content-security-policy",
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
                .parse()
                .expect("static header"),
        );
        h.insert(
            "x-content-type-options",
            "nosniff".parse().expect("static header"),
        );
        h.insert("x-frame-options", "DENY".parse().expect("static header"));
        h.insert(
            "referrer-policy",
            "same-origin".parse().expect("static header"),
        );
        h.insert("cache-control", "no-store".parse().expect("static header"));
        r
    }
}

/// Whether `c` is a Unicode bidirectional control: the embeddings, overrides and isolates
/// (U+202A-U+202E, U+2066-U+2069) and the marks (U+200E, U+200F, U+061C). In free text (an id, a
/// reason, a payload) they reorder what the operator reads ("Trojan Source", CVE-2021-42574).
pub fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}')
}

/// `s` with every bidirectional control ([`is_bidi_control`]) replaced by its visible name,
/// `⟨U+202E⟩`, so it reorders nothing and the operator sees it is there. Applied to every console
/// page as a whole after rendering ([`Page`]): every inbound text a page shows, in text or in an
/// attribute, passes through it, and the console's own markup holds none. Borrowed when there is none.
pub fn visible_controls(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(is_bidi_control) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if is_bidi_control(c) {
            out.push_str(&format!("⟨U+{:04X}⟩", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The pages of the navigation: (path, label).
const NAV: &[(&str, &str)] = &[
    ("/ui", "Overview"),
    ("/ui/subscriptions", "Subscriptions"),
    ("/ui/receipts", "Receipts"),
    ("/ui/dead-letters", "Dead letters"),
    ("/ui/runs", "Runs & sessions"),
    ("/ui/operations", "Schedules & services"),
    ("/ui/audit", "Audit log"),
];

fn head(title: &str) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            // htmx would add an inline <style>, which the content security policy refuses.
            meta name="htmx-config" content=r#"{"includeIndicatorStyles":false}"#;
            title { (title) " · trigger-bridge" }
            link rel="stylesheet" href="/ui/assets/console.css";
            link rel="icon" href="data:,";
            script src="/ui/assets/htmx.min.js" defer {}
            script src="/ui/assets/console.js" defer {}
        }
    }
}

/// A whole page: navigation (the current entry marked), the viewer and logout, and `body`, whose
/// `#live` region re-reads itself on every change (see [`live_region`]).
pub fn page(title: &str, current: &str, op: &Operator, body: Markup) -> Page {
    page_after(title, current, op, None, None, body)
}

/// The page an action answers with: `notice` (the outcome) above the body, outside the live region
/// so a refresh keeps it, and `url` (the page's own address) put in the address bar by the script,
/// so a reload reads the page instead of repeating the action.
pub fn page_after(
    title: &str,
    current: &str,
    op: &Operator,
    notice: Option<Markup>,
    url: Option<&str>,
    body: Markup,
) -> Page {
    Page(
        html! {
            (DOCTYPE)
            html lang="en" {
                (head(title))
                body data-csrf=(op.csrf) data-replace-url=[url] {
                    a.skip href="#main" { "Skip to content" }
                    header.top {
                        a.brand href="/ui" { "trigger-bridge" }
                        nav aria-label="Console" {
                            ul {
                                @for (path, label) in NAV {
                                    li {
                                        @if *path == current {
                                            a href=(path) aria-current="page" { (label) }
                                        } @else {
                                            a href=(path) { (label) }
                                        }
                                    }
                                }
                            }
                        }
                        div.who {
                            span #live-state .live-off title="live updates" { "live" }
                            " "
                            span { (op.name) @if !op.may_act() { " (read-only)" } }
                            form method="post" action="/ui/logout" {
                                (csrf_field(op))
                                button.link type="submit" { "Log out" }
                            }
                        }
                    }
                    main #main tabindex="-1" {
                        h1 { (title) }
                        @if let Some(n) = notice { div #notice { (n) } }
                        (body)
                    }
                }
            }
        },
        StatusCode::OK,
    )
}

/// A region that re-reads itself from `url` (the page's own URL) when the live feed says something
/// changed, keeping whatever is outside it (forms being filled in) untouched.
pub fn live_region(url: &str, body: Markup) -> Markup {
    html! {
        div #live hx-get=(url) hx-trigger="tb-change from:body" hx-select="#live" hx-swap="outerHTML" {
            (body)
        }
    }
}

/// The hidden CSRF field of a form.
pub fn csrf_field(op: &Operator) -> Markup {
    html! { input type="hidden" name="csrf" value=(op.csrf); }
}

/// A time as `<time>`: the viewer's zone by the script, UTC in the text until then and on hover.
pub fn time(rfc3339: Option<&str>) -> Markup {
    match rfc3339 {
        Some(t) if !t.is_empty() => html! { time datetime=(t) title=(t) { (t) } },
        _ => html! { span.muted { "—" } },
    }
}

/// A time from a JSON field.
pub fn time_of(v: &Value) -> Markup {
    time(v.as_str())
}

/// An id with a copy button; linked to `href` when given.
pub fn id(value: &str, href: Option<&str>) -> Markup {
    html! {
        span.id {
            @if let Some(h) = href { a href=(h) { code { (value) } } } @else { code { (value) } }
            button.copy type="button" data-copy=(value) aria-label={ "Copy " (value) } title="Copy to the clipboard" { "copy" }
        }
    }
}

/// A state, coloured and worded (the word carries the meaning; the colour only repeats it).
pub fn state(s: &str) -> Markup {
    let class =
        match s {
            "active" | "delivered" | "consumed" | "completed" | "resolved" | "up" | "ok"
            | "acked" => "good",
            "paused" | "pending" | "registered" | "queued" | "buffered" | "routed" | "draining"
            | "armed" | "running" | "leased" => "neutral",
            "retrying" | "failed" | "unmatched" | "waiting-input" | "waiting-external"
            | "expired" | "dropped" | "lost" => "warn",
            "dead-lettered" | "dead_lettered" | "rejected" | "down" | "cancelled"
            | "quarantined" => "bad",
            _ => "neutral",
        };
    html! { span class={ "badge " (class) } { (s) } }
}

/// A sparkline of per-minute counts (oldest first) with failures drawn over it; the numbers are in
/// the label for screen readers.
pub fn sparkline(counts: &[u64], failures: &[u64], label: &str) -> Markup {
    let w = 120.0;
    let h = 24.0;
    let max = counts
        .iter()
        .chain(failures)
        .copied()
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let n = counts.len().max(2) as f64 - 1.0;
    let line = |xs: &[u64]| -> String {
        xs.iter()
            .enumerate()
            .map(|(i, c)| {
                format!(
                    "{:.1},{:.1}",
                    i as f64 * w / n,
                    h - (*c as f64 / max) * (h - 2.0) - 1.0
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    };
    html! {
        svg.spark width="120" height="24" viewBox="0 0 120 24" role="img" aria-label=(label) {
            title { (label) }
            polyline.count points=(line(counts)) {}
            @if failures.iter().any(|f| *f > 0) { polyline.fail points=(line(failures)) {} }
        }
    }
}

/// Percent-encodes one path segment (an id placed in a link or a form's action): everything but the
/// unreserved characters, `/` included, so an id can never change the path it is put in.
pub fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    if out == "." || out == ".." {
        out = out.replace('.', "%2E");
    }
    out
}

/// Percent-encodes a query value.
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A JSON value as compact text (for small facts: inputs, a winner).
pub fn json_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A page without the navigation (the viewer may not be logged in): the login form and error pages.
fn bare_page(title: &str, status: StatusCode, body: Markup) -> Page {
    Page(
        html! {
            (DOCTYPE)
            html lang="en" {
                (head(title))
                body { main #main .narrow { (body) } }
            }
        },
        status,
    )
}

/// An error page of its own (no navigation: the viewer may not be logged in).
pub fn error_page(status: StatusCode, code: &str, message: &str) -> Page {
    bare_page(
        "Error",
        status,
        html! {
            h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) }
            p.error role="alert" { code { (code) } ": " (message) }
            p { a href="/ui" { "Back to the console" } }
        },
    )
}

/// The login form.
pub fn login_page(next: &str, error: Option<&str>) -> Page {
    bare_page(
        "Log in",
        StatusCode::OK,
        html! {
            h1 { "trigger-bridge console" }
            p { "Log in with an API key of this server (one with the scope " code { "operator:read" } ", or " code { "*" } ")." }
            @if let Some(e) = error { p.error role="alert" { (e) } }
            form method="post" action="/ui/login" {
                input type="hidden" name="next" value=(next);
                label for="key" { "API key" }
                input #key type="password" name="key" autocomplete="current-password" required autofocus;
                button type="submit" { "Log in" }
            }
        },
    )
}

/// An API error shown inside a page.
pub fn api_error(e: &tb_api::error::ApiError) -> Markup {
    html! { p.error role="alert" { code { (e.0.code.as_str()) } ": " (e.0.message) } }
}

/// A confirmation: what will happen, in words, and the form that does it (`fields` are hidden inputs
/// carried over; `confirmed=yes` is added).
pub fn confirm(
    op: &Operator,
    action: &str,
    what: Markup,
    fields: &[(&str, String)],
    button: &str,
    cancel: &str,
) -> Markup {
    html! {
        section.confirm role="alertdialog" aria-labelledby="confirm-title" {
            h2 #confirm-title { "Confirm" }
            (what)
            form method="post" action=(action) {
                (csrf_field(op))
                @for (k, v) in fields { input type="hidden" name=(k) value=(v); }
                input type="hidden" name="confirmed" value="yes";
                button.danger type="submit" autofocus { (button) }
                " "
                a href=(cancel) { "Cancel" }
            }
        }
    }
}

/// Inline JSON-free rendering of preformatted text.
pub fn pre(text: &str) -> Markup {
    html! { pre { (text) } }
}

/// Marks text as already-safe HTML (only for our own static strings).
pub fn raw(s: &'static str) -> PreEscaped<&'static str> {
    PreEscaped(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bidi_controls_are_shown_by_name_and_nothing_else_changes() {
        let shown = visible_controls("a\u{202E}gnp.exe\u{2066}x\u{200F}\u{061C}ü");
        assert_eq!(shown, "a⟨U+202E⟩gnp.exe⟨U+2066⟩x⟨U+200F⟩⟨U+061C⟩ü");
        assert!(matches!(
            visible_controls("plain <b>ü</b>"),
            std::borrow::Cow::Borrowed(_)
        ));
        for c in [
            '\u{202A}', '\u{202B}', '\u{202C}', '\u{202D}', '\u{2067}', '\u{2068}', '\u{2069}',
            '\u{200E}',
        ] {
            assert!(is_bidi_control(c), "{c:?}");
        }
        assert!(!is_bidi_control('\u{200D}'));
    }

    #[test]
    fn a_page_shows_the_controls_of_its_text_and_forbids_a_base_element() {
        let r = Page(html! { p { "id: a\u{202E}b" } }, StatusCode::OK).into_response();
        let csp = r.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(csp.contains("base-uri 'none'"), "{csp}");
        assert_eq!(r.headers()["x-content-type-options"], "nosniff");
        let body =
            futures_util::FutureExt::now_or_never(axum::body::to_bytes(r.into_body(), 1 << 20))
                .unwrap()
                .unwrap();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(text.contains("id: a⟨U+202E⟩b"), "{text}");
        assert!(!text.contains('\u{202E}'));
    }
}
