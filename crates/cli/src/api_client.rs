//! The HTTP side of the client commands: the options every command takes (`--server`, `--json`,
//! `--api-key`), [`Api`] (the typed client, `tb_client`, with its errors turned into messages that say
//! what to do), and the table / key-value printers. The commands themselves live in `client`,
//! `sessions_client` and `replay_client`, which all use this module and nothing of each other's.

use anyhow::{anyhow, Result};
use serde::Serialize;
use serde_json::Value;
use tb_client::{Call, Client, Method};
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
    /// Client commands: print the server's JSON response instead of a table
    #[arg(long, global = true)]
    pub json: bool,
    /// API key. Client commands and `mcp` send it as `Authorization: Bearer ...` (needed when the
    /// server has keys configured); `serve` accepts it as one more key with every scope
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

pub(crate) use tb_client::seg;

/// The client commands' handle on the API: [`tb_client::Client`] (every request of a client command
/// goes through it: retries, `Idempotency-Key`, typed errors) plus the `--json` choice.
pub(crate) struct Api<'a> {
    o: &'a ClientOpts,
    /// The typed client.
    pub(crate) client: Client,
}

impl ClientOpts {
    /// The typed client of `--server` with `--api-key`. Errors: a `--server` that is not an http(s) URL.
    pub(crate) fn client(&self) -> Result<Client> {
        let client = Client::new(&self.server).map_err(|e| anyhow!("--server: {e}"))?;
        Ok(match self.key() {
            Some(k) => client.with_api_key(k),
            None => client,
        })
    }

    /// The API key, if one is set: an empty `--api-key ""` or `TRIGGER_BRIDGE_API_KEY=` is none, as
    /// `serve` reads it.
    pub(crate) fn key(&self) -> Option<&str> {
        self.api_key.as_deref().filter(|k| !k.is_empty())
    }
}

impl Api<'_> {
    pub(crate) fn new(o: &ClientOpts) -> Result<Api<'_>> {
        Ok(Api {
            o,
            client: o.client()?,
        })
    }

    /// A client error as the message a person needs: the status, code and message, and what to do
    /// about a refused key or a server that does not answer.
    pub(crate) fn explain(&self, e: tb_client::Error) -> anyhow::Error {
        match e {
            tb_client::Error::Api {
                status,
                code,
                message,
                ..
            } => anyhow!(
                "{status} {code}: {message}{}",
                key_hint(status, self.client.has_api_key())
            ),
            e @ tb_client::Error::Unreachable { .. } => anyhow!("{e}; {SERVE_HINT}"),
            e => anyhow!(e),
        }
    }

    /// A typed call's result with its error explained.
    pub(crate) fn check<T>(&self, r: tb_client::Result<T>) -> Result<T> {
        r.map_err(|e| self.explain(e))
    }

    /// Calls the API; returns the parsed body (`Null` for 204) and its raw text. Non-2xx →
    /// `"<status> <error>: <message>"`.
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, Option<String>)],
        body: Option<&Value>,
    ) -> Result<(Value, String)> {
        let mut call = Call::new(method, path);
        for (k, v) in query {
            call = call.query_opt(k, v.as_ref());
        }
        if let Some(b) = body {
            call = call.body(b.clone());
        }
        let reply = self.check(self.client.send(call).await)?;
        let body = self.check(reply.value())?;
        Ok((body, reply.text))
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

    /// [`Api::show`] for a typed answer (its fields in the server's order: it is the struct the
    /// server serialized).
    pub(crate) fn show_typed<T: Serialize>(&self, v: &T) -> Result<Option<Value>> {
        if self.o.json {
            println!("{}", serde_json::to_string_pretty(v)?);
            return Ok(None);
        }
        Ok(Some(serde_json::to_value(v)?))
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
    }
}
