//! One module per console page; each reads through the API's handlers and renders with `crate::html`.

pub mod audit;
pub mod dead_letters;
pub mod operations;
pub mod overview;
pub mod receipts;
pub mod runs;
pub mod subscriptions;

use serde::Deserialize;

/// Query of the list pages (every field optional; empty strings count as absent).
#[derive(Debug, Default, Deserialize)]
pub struct Filters {
    pub q: Option<String>,
    pub subscription: Option<String>,
    pub state: Option<String>,
    pub status: Option<String>,
    pub workflow: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
    pub before: Option<String>,
    pub actor: Option<String>,
    pub action: Option<String>,
    pub target: Option<String>,
    pub verify: Option<String>,
}

/// A filter value, `None` when absent or blank.
pub fn opt(v: &Option<String>) -> Option<String> {
    v.as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// A time field of a filter form: RFC 3339 as typed, or a `datetime-local` value (no zone: UTC).
pub fn rfc3339(v: &Option<String>) -> Option<String> {
    let v = opt(v)?;
    if chrono::DateTime::parse_from_rfc3339(&v).is_ok() {
        return Some(v);
    }
    let fmt = if v.len() == 16 {
        "%Y-%m-%dT%H:%M"
    } else {
        "%Y-%m-%dT%H:%M:%S"
    };
    chrono::NaiveDateTime::parse_from_str(&v, fmt)
        .ok()
        .map(|t| {
            t.and_utc()
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        })
        .or(Some(v))
}

/// The current URL of a list page with its query, for the live region and paging links.
pub fn url_with(path: &str, pairs: &[(&str, Option<String>)]) -> String {
    let q: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| {
            v.as_ref()
                .map(|v| format!("{k}={}", crate::html::url_encode(v)))
        })
        .collect();
    if q.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{}", q.join("&"))
    }
}

/// A list page's own URL (its filters and cursor) and the URL of the page after a `nextCursor`.
pub struct Pager {
    path: &'static str,
    base: Vec<(&'static str, Option<String>)>,
    /// This page's URL, for its live region.
    pub here: String,
}

impl Pager {
    /// The pager of `path` with the filters `base` and the cursor `before`.
    pub fn new(
        path: &'static str,
        base: Vec<(&'static str, Option<String>)>,
        before: &Option<String>,
    ) -> Pager {
        let mut here = base.clone();
        here.push(("before", before.clone()));
        let here = url_with(path, &here);
        Pager { path, base, here }
    }

    /// The URL of the next (older) page, from the answer's `nextCursor`.
    pub fn older(&self, next: Option<&str>) -> Option<String> {
        next.map(|n| {
            let mut older = self.base.clone();
            older.push(("before", Some(n.to_string())));
            url_with(self.path, &older)
        })
    }
}
