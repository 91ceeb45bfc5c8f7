//! The HTTP side of the client commands: the options every command takes (`--server`, `--json`,
//! `--api-key`), one request helper ([`Api`]) that maps transport failures and the API's error envelope
//! to messages, and the table / key-value printers. The commands themselves live in `client`,
//! `sessions_client` and `replay_client`, which all use this module and nothing of each other's.

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use reqwest::Method;
use serde_json::Value;
/// Printed with connection errors.
pub const SERVE_HINT: &str =
    "is the server running? (trigger-bridge serve --config examples/quickstart.toml); \
     a server elsewhere: --server URL or TRIGGER_BRIDGE_SERVER";

// Options shared by the client commands (plain comments on these types: a doc comment would replace
// the help text main.rs gives the subcommand).
#[derive(clap::Args, Debug, Clone)]
pub struct ClientOpts {
    /// Base URL of the trigger-bridge HTTP API
    #[arg(
        long,
        global = true,
        env = "TRIGGER_BRIDGE_SERVER",
        default_value = "http://127.0.0.1:8080"
    )]
    pub server: String,
    /// Print the server's JSON response instead of a table
    #[arg(long, global = true)]
    pub json: bool,
    /// API key sent as `Authorization: Bearer ...` (needed when the server has keys configured)
    #[arg(
        long,
        global = true,
        env = "TRIGGER_BRIDGE_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
}

/// Parses a column spec into (label, JSON pointer) pairs.
fn cols(spec: &str) -> Vec<(String, String)> {
    let pair = |c: &str| {
        c.split_once('=')
            .map(|(l, p)| (l.replace('_', " "), format!("/{p}")))
    };
    spec.split_whitespace().filter_map(pair).collect()
}

/// The HTTP client used by every command (also `send`).
pub(crate) fn http_client() -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .user_agent(concat!("trigger-bridge/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(60))
        .build()
        .context("cannot build the HTTP client")
}

/// A transport error as a message naming `url`, with the serve hint when nothing answered.
pub(crate) fn request_error(url: &str, e: reqwest::Error) -> anyhow::Error {
    let mut cause: &dyn std::error::Error = &e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    if e.is_connect() || e.is_timeout() {
        anyhow!("cannot reach {url}: {cause}; {SERVE_HINT}")
    } else {
        anyhow!("request to {url} failed: {cause}")
    }
}

/// What to do about a refused key: a 401 without `--api-key` names the flag and the variable; a 401 or
/// 403 with one says the key is unknown or lacks the scope. Empty for other statuses.
fn key_hint(status: u16, sent_key: bool) -> &'static str {
    match (status, sent_key) {
        (401, false) => " (pass --api-key KEY or set TRIGGER_BRIDGE_API_KEY)",
        (401, true) => {
            " (the --api-key / TRIGGER_BRIDGE_API_KEY value is not a key of this server)"
        }
        (403, _) => " (use a key with that scope)",
        _ => "",
    }
}

/// Aligned text table: columns separated by two spaces, no trailing blanks.
pub fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut s = String::new();
        for (c, w) in cells.zip(&widths) {
            s.push_str(&format!("{c:<w$}  "));
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(&mut headers.iter().copied());
    for row in &rows {
        out += &line(&mut row.iter().map(String::as_str));
    }
    out
}

/// A value as one table cell: strings as given, null/missing as `-`, others as compact JSON.
fn cell(v: Option<&Value>) -> String {
    let s = match v {
        None | Some(Value::Null) => return "-".into(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

pub(crate) fn render(items: &[Value], spec: &str) -> String {
    let cols = cols(spec);
    let headers: Vec<&str> = cols.iter().map(|c| c.0.as_str()).collect();
    let rows = items
        .iter()
        .map(|it| cols.iter().map(|(_, p)| cell(it.pointer(p))).collect())
        .collect();
    table(&headers, rows)
}

/// Prints `v[key]` as a table (or `empty` when there are none) and the next page's cursor.
pub(crate) fn print_list(v: &Value, key: &str, spec: &str, empty: &str) {
    match v[key].as_array() {
        Some(items) if !items.is_empty() => print!("{}", render(items, spec)),
        _ => println!("{empty}"),
    }
    if let Some(cursor) = v["nextCursor"].as_str() {
        println!("more: --before {cursor}");
    }
}

/// Prints `label: value` lines, labels aligned.
pub(crate) fn print_kv(obj: &Value, spec: &str) {
    let cols = cols(spec);
    let w = cols.iter().map(|c| c.0.len()).max().unwrap_or(0) + 1;
    for (label, p) in cols {
        println!("{:w$} {}", format!("{label}:"), cell(obj.pointer(&p)));
    }
}

/// Pretty-prints JSON text keeping the server's key order (a `Value` would sort keys).
fn pretty(raw: &str) -> String {
    let (mut out, mut depth, mut in_str, mut esc) = (String::new(), 0usize, false, false);
    let newline = |out: &mut String, depth: usize| *out += &format!("\n{}", "  ".repeat(depth));
    let mut chars = raw.trim().chars().peekable();
    while let Some(c) = chars.next() {
        if in_str {
            out.push(c);
            (esc, in_str) = (!esc && c == '\\', esc || c != '"');
            continue;
        }
        match c {
            '"' => {
                in_str = true;
                out.push(c);
            }
            '{' | '[' => {
                while chars.next_if(|c| c.is_whitespace()).is_some() {}
                out.push(c);
                match chars.next_if(|n| matches!(n, '}' | ']')) {
                    Some(close) => out.push(close),
                    None => {
                        depth += 1;
                        newline(&mut out, depth);
                    }
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    out
}

pub(crate) fn seg(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub(crate) struct Api<'a> {
    o: &'a ClientOpts,
    http: reqwest::Client,
}

impl Api<'_> {
    pub(crate) fn new(o: &ClientOpts) -> Result<Api<'_>> {
        Ok(Api {
            o,
            http: http_client()?,
        })
    }

    /// Calls the API; returns the parsed body and its raw text. Non-2xx → `"<status> <error>: <message>"`.
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, Option<String>)],
        body: Option<&Value>,
    ) -> Result<(Value, String)> {
        let url = format!("{}{path}", self.o.server.trim_end_matches('/'));
        let query: Vec<_> = query
            .iter()
            .filter_map(|(k, v)| Some((*k, v.clone()?)))
            .collect();
        let mut req = self.http.request(method, &url).query(&query);
        if let Some(b) = body {
            req = req.json(b);
        }
        if let Some(k) = &self.o.api_key {
            req = req.bearer_auth(k);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| request_error(&self.o.server, e))?;
        let status = resp.status();
        let raw = resp
            .text()
            .await
            .map_err(|e| request_error(&self.o.server, e))?;
        let body: Option<Value> = serde_json::from_str(&raw).ok();
        if !status.is_success() {
            let field = |k: &str| body.as_ref().and_then(|b| b[k].as_str());
            match field("error") {
                Some(code) => bail!(
                    "{} {code}: {}{}",
                    status.as_u16(),
                    field("message").unwrap_or(""),
                    key_hint(status.as_u16(), self.o.api_key.is_some())
                ),
                None => bail!(
                    "{status} from {url}: {}",
                    raw.trim().chars().take(200).collect::<String>()
                ),
            }
        }
        if raw.is_empty() && status == reqwest::StatusCode::NO_CONTENT {
            return Ok((Value::Null, raw));
        }
        let body =
            body.with_context(|| format!("{url} answered {status} with a body that is not JSON"))?;
        Ok((body, raw))
    }

    /// GETs `path`; under `--json` prints the body and returns `None`.
    pub(crate) async fn get(
        &self,
        path: &str,
        query: &[(&str, Option<String>)],
    ) -> Result<Option<Value>> {
        self.show(self.call(Method::GET, path, query, None).await?)
    }

    pub(crate) fn show(&self, (body, raw): (Value, String)) -> Result<Option<Value>> {
        if self.o.json {
            println!("{}", pretty(&raw));
            return Ok(None);
        }
        Ok(Some(body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_keys_say_what_to_do() {
        assert!(key_hint(401, false).contains("--api-key KEY or set TRIGGER_BRIDGE_API_KEY"));
        assert!(key_hint(401, true).contains("not a key of this server"));
        assert!(key_hint(403, true).contains("scope"));
        assert_eq!(key_hint(404, false), "");
    }

    #[test]
    fn table_aligns_columns() {
        let rows = vec![
            vec!["rcpt_1".into(), "-".into(), "x".into()],
            vec!["r".into(), "queued".into(), "".into()],
        ];
        assert_eq!(
            table(&["ID", "STATE", "N"], rows),
            "ID      STATE   N\nrcpt_1  -       x\nr       queued\n"
        );
        assert_eq!(table(&["A"], vec![]), "A\n");
    }

    #[test]
    fn pretty_keeps_order_and_strings() {
        let raw = r#"{"z":1,"a":[],"s":"x,{\"y\":[1]}","o":{"k":[1,2]}}"#;
        assert_eq!(
            serde_json::from_str::<Value>(&pretty(raw)).unwrap(),
            serde_json::from_str::<Value>(raw).unwrap()
        );
        assert!(
            pretty(raw)
                .starts_with("{\n  \"z\": 1,\n  \"a\": [],\n  \"s\": \"x,{\\\"y\\\":[1]}\","),
            "{}",
            pretty(raw)
        );
    }

    #[test]
    fn cells_and_segments() {
        assert_eq!(cell(None), "-");
        assert_eq!(cell(Some(&Value::from("a\nb"))), "a b");
        assert_eq!(cell(Some(&serde_json::json!({"k": 1}))), r#"{"k":1}"#);
        assert_eq!(seg("run_1/../x y"), "run_1%2F%2E%2E%2Fx%20y");
    }
}
