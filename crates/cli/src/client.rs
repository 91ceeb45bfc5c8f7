//! Client commands over the HTTP API: `receipts`, `deliveries`, `runs`, `subscriptions`.
//!
//! Responses are read as `serde_json::Value` so extra fields are tolerated; `--json` prints the server's
//! body as sent (re-indented, key order kept).

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use reqwest::Method;
use serde_json::Value;

/// Printed with connection errors.
pub const SERVE_HINT: &str =
    "is the server running? (trigger-bridge serve --config examples/quickstart.toml)";

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

/// `--state` values of `receipts list`: the states a stored receipt can be in (from the core enum).
fn receipt_states() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(
        tb_core::receipt::ReceiptState::STORED
            .iter()
            .map(|s| s.as_str()),
    )
}

// `trigger-bridge receipts ...`
#[derive(clap::Subcommand, Debug)]
pub enum ReceiptsCmd {
    /// List receipts, newest first
    List {
        /// Only receipts in this state (a receipt's own state, not a timeline entry)
        #[arg(long, value_parser = receipt_states())]
        state: Option<String>,
        /// Only receipts of this trigger subscription
        #[arg(long)]
        subscription: Option<String>,
        /// Most receipts to show
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Page cursor: show receipts older than this (printed as `more: --before ...`)
        #[arg(long)]
        before: Option<String>,
    },
    /// Show one receipt with its deliveries
    Show {
        /// Receipt id (rcpt_...)
        id: String,
    },
}

// `trigger-bridge deliveries ...`
#[derive(clap::Subcommand, Debug)]
pub enum DeliveriesCmd {
    /// List deliveries, newest first
    List {
        /// Only deliveries in this state: pending, retrying, delivered or dead-lettered
        #[arg(long)]
        state: Option<String>,
        /// Only deliveries of this trigger subscription
        #[arg(long)]
        subscription: Option<String>,
        /// Most deliveries to show
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Page cursor: show deliveries older than this (printed as `more: --before ...`)
        #[arg(long)]
        before: Option<String>,
    },
    /// Show one delivery with its attempts
    Show {
        /// Delivery id
        id: String,
    },
    /// Put a dead-lettered delivery back in the queue for one more attempt (attempt numbers continue)
    Replay {
        /// Delivery id
        id: String,
    },
    /// Replay the dead letters of a subscription (optionally by time range and error class): previews
    /// the count and asks first
    ReplayAll(crate::replay_client::ReplayAllArgs),
}

// `trigger-bridge runs ...`
#[derive(clap::Subcommand, Debug)]
pub enum RunsCmd {
    /// List workflow runs, newest first
    List {
        /// Only runs with this status (pending, running, completed, failed, ...)
        #[arg(long)]
        status: Option<String>,
        /// Most runs to show
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Page cursor: show runs older than this (printed as `more: --before ...`)
        #[arg(long)]
        before: Option<String>,
    },
    /// Show one run with its events
    Show {
        /// Run id
        id: String,
    },
    /// List a run's waits (armed, resolved with their winner, cancelled)
    Waits {
        /// Run id
        id: String,
    },
    /// Arm a wait on a run: resolves at once from a buffered signal, else waits (durably)
    Wait(crate::sessions_client::WaitArgs),
    /// Queue user input on a run (interrupts a signal wait for one turn; wins an --any race)
    Prompt {
        /// Run id
        id: String,
        /// The text
        text: String,
    },
    /// Cancel an armed wait
    CancelWait {
        /// Run id
        id: String,
        /// Wait id (wait_...)
        wait: String,
    },
    /// List a run's turns (start, prompts, wake-ups, wait resolutions) and their state
    Turns {
        /// Run id
        id: String,
    },
    /// Claim the run's next turn as its driver (prints it as JSON; exit code 3 when none came in time)
    Claim {
        /// Run id
        id: String,
        /// How long the turn stays yours before it is handed out again, in ms (1000 to 3600000)
        #[arg(long, default_value_t = 60_000)]
        lease_ms: u64,
        /// Wait up to this many seconds for a turn (at most 60)
        #[arg(long, default_value_t = 30)]
        timeout: u64,
    },
    /// Acknowledge a claimed turn
    Ack {
        /// Run id
        id: String,
        /// Turn id (turn_...)
        turn: String,
        /// The turn's claims count printed by `runs claim`
        #[arg(long)]
        claim: u32,
    },
    /// Cancel a run (its armed wait resolves `stop`; what is still queued on it expires)
    Cancel {
        /// Run id
        id: String,
    },
}

// `trigger-bridge subscriptions ...`
#[derive(clap::Subcommand, Debug)]
pub enum SubscriptionsCmd {
    /// List trigger subscriptions and their state
    List,
    /// Pause a subscription: new requests are refused (409) until resumed
    Pause {
        /// Subscription id
        id: String,
    },
    /// Resume a subscription that is paused, failed or dead-lettered: it goes back to active and its
    /// deliveries are attempted again (replay dead-lettered deliveries with `deliveries replay`)
    Resume {
        /// Subscription id
        id: String,
    },
}

/// Column specs: `LABEL=pointer` pairs; `_` in a label prints as a space; the pointer is a `/`-path into
/// the item.
const RECEIPTS: &str = "RECEIPT=receiptId SUBSCRIPTION=subscriptionId EVENT=eventType STATE=state \
    BYTES=bodyBytes RECEIVED=receivedAt";
const DELIVERIES: &str = "DELIVERY=deliveryId SUBSCRIPTION=subscriptionId BINDING=bindingId \
    STATE=state ATTEMPTS=attempts RUN=runId NEXT_ATTEMPT=nextAttemptAt LEASE_OWNER=leaseOwner \
    LEASE_EXPIRES=leaseExpiresAt";
const ATTEMPTS: &str = "ATTEMPT=attempt OUTCOME=outcome ERROR=errorClass STARTED=startedAt \
    DURATION_MS=durationMs NEXT_ATTEMPT=nextAttemptAt MESSAGE=message";
const RUNS: &str =
    "RUN=runId WORKFLOW=workflowId STATUS=status CAUSATION=causationId CREATED=createdAt";
const EVENTS: &str = "SEQ=sequence TYPE=type EVENT=eventId TIMESTAMP=timestamp";
const SUBSCRIPTIONS: &str = "SUBSCRIPTION=subscriptionId SOURCE=source STATE=state \
    SINCE=stateDetail/stateSince FAILURES=stateDetail/failuresSinceSuccess \
    MAX_ATTEMPTS=retryPolicy/maxAttempts BACKOFF=retryPolicy/backoff LAST_ERROR=stateDetail/lastError";
const TIMELINE: &str = "STATE=state AT=at DELIVERY=deliveryId ATTEMPT=attempt OUTCOME=outcome \
    ERROR=errorClass";
const RECEIPT_KV: &str =
    "receipt=receiptId subscription=subscriptionId state=state event=eventType \
    provider_event_id=providerEventId dedup_key=dedupKey content_type=contentType bytes=bodyBytes \
    received=receivedAt updated=updatedAt";
const DELIVERY_KV: &str = "delivery=deliveryId receipt=receiptId subscription=subscriptionId \
    binding=bindingId dedup_key=dedupKey action=action workflow=workflowId run=runId state=state \
    attempts=attempts next_attempt=nextAttemptAt lease_owner=leaseOwner \
    lease_expires=leaseExpiresAt last_error=lastError \
    dead-letter_reason=deadLetterReason created=createdAt updated=updatedAt";
const RUN_KV: &str = "run=runId workflow=workflowId status=status wait_reason=waitReason causation=causationId \
    trigger_subscription=trigger/subscriptionId trigger_receipt=trigger/receiptId \
    trigger_delivery=trigger/deliveryId created=createdAt updated=updatedAt inputs=inputs output=output";

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
                    "{} {code}: {}",
                    status.as_u16(),
                    field("message").unwrap_or("")
                ),
                None => bail!(
                    "{status} from {url}: {}",
                    raw.trim().chars().take(200).collect::<String>()
                ),
            }
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

/// `receipts list|show`.
pub async fn receipts(o: &ClientOpts, c: ReceiptsCmd) -> Result<()> {
    let api = Api::new(o)?;
    match c {
        ReceiptsCmd::List {
            state,
            subscription,
            limit,
            before,
        } => {
            let q = [
                ("limit", Some(limit.to_string())),
                ("state", state),
                ("subscription", subscription),
                ("before", before),
            ];
            if let Some(v) = api.get("/v1/receipts", &q).await? {
                print_list(&v, "receipts", RECEIPTS, "no receipts match");
            }
        }
        ReceiptsCmd::Show { id } => {
            if let Some(v) = api.get(&format!("/v1/receipts/{}", seg(&id)), &[]).await? {
                print_kv(&v["receipt"], RECEIPT_KV);
                println!();
                print_list(&v, "timeline", TIMELINE, "no timeline");
                println!();
                print_list(
                    &v,
                    "deliveries",
                    DELIVERIES,
                    "no deliveries (no binding matched)",
                );
            }
        }
    }
    Ok(())
}

/// `deliveries list|show`.
pub async fn deliveries(o: &ClientOpts, c: DeliveriesCmd) -> Result<()> {
    let api = Api::new(o)?;
    match c {
        DeliveriesCmd::List {
            state,
            subscription,
            limit,
            before,
        } => {
            if let Some(s) = state
                .as_deref()
                .filter(|s| tb_core::delivery::DeliveryState::parse(s).is_none())
            {
                bail!("--state {s:?} is not a delivery state; use one of: pending, retrying, delivered, dead-lettered");
            }
            let q = [
                ("state", state),
                ("subscription", subscription),
                ("limit", Some(limit.to_string())),
                ("before", before),
            ];
            if let Some(v) = api.get("/v1/deliveries", &q).await? {
                print_list(&v, "deliveries", DELIVERIES, "no deliveries match");
            }
        }
        DeliveriesCmd::Show { id } => {
            if let Some(v) = api
                .get(&format!("/v1/deliveries/{}", seg(&id)), &[])
                .await?
            {
                print_kv(&v["delivery"], DELIVERY_KV);
                println!();
                print_list(&v, "attempts", ATTEMPTS, "no attempts yet");
            }
        }
        DeliveriesCmd::ReplayAll(a) => crate::replay_client::replay_all(&api, o.json, a).await?,
        DeliveriesCmd::Replay { id } => {
            let reply = api
                .call(
                    Method::POST,
                    &format!("/v1/deliveries/{}/replay", seg(&id)),
                    &[],
                    None,
                )
                .await?;
            if let Some(v) = api.show(reply)? {
                println!(
                    "replayed: delivery {} is {} (attempt {} next)",
                    id,
                    v["delivery"]["state"].as_str().unwrap_or("?"),
                    v["delivery"]["attempts"].as_u64().unwrap_or(0) + 1
                );
            }
        }
    }
    Ok(())
}

/// `runs list|show`; `show` also fetches the run's events.
pub async fn runs(o: &ClientOpts, c: RunsCmd) -> Result<()> {
    let api = Api::new(o)?;
    match c {
        RunsCmd::List {
            status,
            limit,
            before,
        } => {
            let q = [
                ("status", status),
                ("limit", Some(limit.to_string())),
                ("before", before),
            ];
            if let Some(v) = api.get("/v1/runs", &q).await? {
                print_list(&v, "runs", RUNS, "no runs match");
            }
        }
        RunsCmd::Waits { id } => return crate::sessions_client::waits(&api, &id).await,
        RunsCmd::Wait(a) => return crate::sessions_client::wait(&api, a).await,
        RunsCmd::Prompt { id, text } => {
            return crate::sessions_client::prompt(&api, &id, text).await
        }
        RunsCmd::CancelWait { id, wait } => {
            return crate::sessions_client::cancel_wait(&api, &id, &wait).await
        }
        RunsCmd::Turns { id } => return crate::sessions_client::turns(&api, &id).await,
        RunsCmd::Claim {
            id,
            lease_ms,
            timeout,
        } => return crate::sessions_client::claim(&api, &id, lease_ms, timeout).await,
        RunsCmd::Ack { id, turn, claim } => {
            return crate::sessions_client::ack(&api, &id, &turn, claim).await
        }
        RunsCmd::Cancel { id } => return crate::sessions_client::cancel(&api, &id).await,
        RunsCmd::Show { id } => {
            let (run, _) = api
                .call(Method::GET, &format!("/v1/runs/{}", seg(&id)), &[], None)
                .await?;
            let (events, _) = api
                .call(
                    Method::GET,
                    &format!("/v1/runs/{}/events/poll", seg(&id)),
                    &[],
                    None,
                )
                .await?;
            if o.json {
                // The run and its event log, as one object.
                let both = serde_json::json!({"run": run, "events": events["events"]});
                println!("{}", serde_json::to_string_pretty(&both)?);
            } else {
                print_kv(&run, RUN_KV);
                println!();
                print_list(&events, "events", EVENTS, "no events yet");
            }
        }
    }
    Ok(())
}

/// Folds the list's `stateDetails` (by id) into each subscription as `stateDetail`, for the table.
fn with_state_details(v: &mut Value) {
    let details = v["stateDetails"].take();
    if let Some(items) = v["subscriptions"].as_array_mut() {
        for it in items {
            let id = it["subscriptionId"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if let Some(d) = details.get(&id) {
                it["stateDetail"] = d.clone();
            }
        }
    }
}

/// `subscriptions list|pause|resume`.
pub async fn subscriptions(o: &ClientOpts, c: SubscriptionsCmd) -> Result<()> {
    let api = Api::new(o)?;
    let (id, verb) = match c {
        SubscriptionsCmd::List => {
            if let Some(mut v) = api.get("/v1/trigger-subscriptions", &[]).await? {
                with_state_details(&mut v);
                print_list(
                    &v,
                    "subscriptions",
                    SUBSCRIPTIONS,
                    "no trigger subscriptions configured",
                );
            }
            return Ok(());
        }
        SubscriptionsCmd::Pause { id } => (id, "pause"),
        SubscriptionsCmd::Resume { id } => (id, "resume"),
    };
    let path = format!("/v1/trigger-subscriptions/{}/{verb}", seg(&id));
    if let Some(v) = api.show(api.call(Method::POST, &path, &[], None).await?)? {
        print!(
            "{}",
            render(std::slice::from_ref(&v["subscription"]), SUBSCRIPTIONS)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #9 defect 5: `subscriptions list` shows state, since when, failures and the last error.
    #[test]
    fn subscriptions_list_shows_since_failures_and_last_error() {
        let mut v = serde_json::json!({
            "subscriptions": [
                {"subscriptionId": "gh", "source": "webhook", "state": "dead-lettered",
                 "retryPolicy": {"maxAttempts": 8, "backoff": "schedule"}},
                {"subscriptionId": "ok", "source": "webhook", "state": "active",
                 "retryPolicy": {"maxAttempts": 8, "backoff": "schedule"}}
            ],
            "stateDetails": {
                "gh": {"stateSince": "2026-12-01T09:00:00.000Z", "failuresSinceSuccess": 12,
                       "lastError": "http_500: HTTP 500: db down"},
                "ok": {"stateSince": "2026-11-30T09:00:00.000Z", "failuresSinceSuccess": 0}
            }
        });
        with_state_details(&mut v);
        let out = render(v["subscriptions"].as_array().unwrap(), SUBSCRIPTIONS);
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].starts_with("SUBSCRIPTION  SOURCE   STATE          SINCE"),
            "{out}"
        );
        assert!(lines[0].ends_with("LAST ERROR"), "{out}");
        assert!(
            lines[1].contains("dead-lettered  2026-12-01T09:00:00.000Z  12"),
            "{out}"
        );
        assert!(lines[1].ends_with("http_500: HTTP 500: db down"), "{out}");
        assert!(
            lines[2].contains("active         2026-11-30T09:00:00.000Z  0"),
            "{out}"
        );
        let attempts = [
            serde_json::json!({"attempt": 1, "outcome": "retrying", "errorClass": "connect",
            "message": "could not connect to the worker"}),
        ];
        assert!(render(&attempts, ATTEMPTS)
            .lines()
            .nth(1)
            .unwrap()
            .ends_with("could not connect to the worker"));
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
