//! Client commands for sessions: `signals raise|list`, `runs waits|wait|prompt`,
//! `capabilities mint|list|revoke`. Same conventions as `client.rs`: tables by default, `--json` prints
//! the server's answer.

use anyhow::{bail, Result};
use serde_json::{json, Value};
use tb_client::Method;

use tb_client::{ArmWait, RaiseSignal};

use crate::api_client::{print_kv, print_list, render, seg, Api, ClientOpts};

const SIGNALS: &str = "SEQ=seq STATE=state NAME=signal/name SIGNAL=signal/signalId \
    SOURCE=signal/source/kind RAISED=signal/raisedAt CONSUMED_BY=consumedBy";
const WAITS: &str = "WAIT=waitId KIND=kind NAMES=names STATE=state DEADLINE=deadline \
    WINNER=winner/kind REASON=reason";
const CAPABILITIES: &str = "ENDPOINT=endpointId RUN=runId SIGNAL=signal LABEL=label USES=useCount \
    MAX=maxUses EXPIRES=expiresAt REVOKED=revokedAt";

// `trigger-bridge signals ...`
#[derive(clap::Subcommand, Debug)]
pub enum SignalsCmd {
    /// Raise a named signal on a run (buffered FIFO until a wait consumes it)
    Raise {
        /// Run id
        run: String,
        /// Signal name: 1-64 of a-z 0-9 _ . -
        name: String,
        /// JSON data carried by the signal (inline up to 32 KiB; larger is stored by reference)
        #[arg(long, value_name = "JSON", value_parser = json_value)]
        data: Option<Value>,
        /// Idempotency identity; raising the same id again is a recorded duplicate
        #[arg(long)]
        signal_id: Option<String>,
        /// Also queue a turn so the session acts on it
        #[arg(long)]
        wake: bool,
    },
    /// Show a run's mailbox, newest first: buffered, consumed, dropped and expired signals
    List {
        /// Run id
        run: String,
        /// Most signals to show (the server clamps to 1..=500)
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Page cursor: show signals older than this (printed as `more: --before ...`)
        #[arg(long)]
        before: Option<String>,
    },
}

// `trigger-bridge runs wait ...`
#[derive(clap::Args, Debug)]
pub struct WaitArgs {
    /// Run id
    pub id: String,
    /// Signal name to wait for (repeat for any of several, at most 8)
    #[arg(long = "name", required = true)]
    pub names: Vec<String>,
    /// Resolve by timer after this many ms (default: no deadline)
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// wait_for_any: race the names, user input, the timer and stop
    #[arg(long)]
    pub any: bool,
    /// With --any: leave user input out of the race
    #[arg(long, requires = "any")]
    pub no_user_input: bool,
    /// Shown as the run's waitReason while it waits
    #[arg(long)]
    pub reason: String,
    /// Then block up to this many seconds (at most 60) for the wait to resolve
    #[arg(long, default_value_t = 0)]
    pub follow: u64,
}

// `trigger-bridge bindings ...`
#[derive(clap::Subcommand, Debug)]
pub enum BindingsCmd {
    /// List bindings with their state (active or revoked)
    List,
    /// Revoke a binding at once: it routes nothing more and its queued deliveries are refused
    Revoke {
        /// Binding id
        id: String,
    },
    /// Restore a revoked binding
    Restore {
        /// Binding id
        id: String,
    },
}

const BINDINGS: &str = "BINDING=bindingId SUBSCRIPTION=subscriptionId ACTION=action \
    WORKFLOW=workflowId EVENT_TYPES=eventTypes STATE=state";

/// `bindings list|revoke|restore`.
pub async fn bindings(o: &ClientOpts, c: BindingsCmd) -> Result<()> {
    let api = Api::new(o)?;
    let (id, verb) = match c {
        BindingsCmd::List => {
            if let Some(v) = api.get("/v1/bindings", &[]).await? {
                print_list(&v, "bindings", BINDINGS, "no bindings configured");
            }
            return Ok(());
        }
        BindingsCmd::Revoke { id } => (id, "revoke"),
        BindingsCmd::Restore { id } => (id, "restore"),
    };
    let path = format!("/v1/bindings/{}/{verb}", seg(&id));
    if let Some(v) = api.show(api.call(Method::POST, &path, &[], None).await?)? {
        let note = if v["changed"] == true {
            ""
        } else {
            " (unchanged)"
        };
        println!(
            "binding {id} is {}{note}",
            v["state"].as_str().unwrap_or("?")
        );
    }
    Ok(())
}

// `trigger-bridge capabilities ...`
#[derive(clap::Subcommand, Debug)]
pub enum CapabilitiesCmd {
    /// Mint a URL that raises one signal on one run (the token is printed once)
    Mint {
        /// Run id the endpoint signals
        #[arg(long)]
        run: String,
        /// Signal name raised per request
        #[arg(long)]
        signal: String,
        /// A label for operators
        #[arg(long)]
        label: Option<String>,
        /// Lifetime in seconds (default 30 days, at most 90 days)
        #[arg(long)]
        expires_in_s: Option<u64>,
        /// Requests accepted before the URL stops working (default 1000)
        #[arg(long)]
        max_uses: Option<u64>,
        /// Also queue a turn per signal
        #[arg(long)]
        wake: bool,
        /// Require X-Signature-256: sha256=<hex HMAC of the body> with a generated key (printed once)
        #[arg(long)]
        hmac: bool,
    },
    /// List minted endpoints (tokens are never shown again)
    List,
    /// Revoke an endpoint: its next request gets 404
    Revoke {
        /// Endpoint id (sgep_...)
        id: String,
    },
}

/// `signals raise|list`.
pub async fn signals(o: &ClientOpts, c: SignalsCmd) -> Result<()> {
    let api = Api::new(o)?;
    match c {
        SignalsCmd::Raise {
            run,
            name,
            data,
            signal_id,
            wake,
        } => {
            let body = RaiseSignal {
                name,
                data,
                signal_id,
                wake,
            };
            let raised = api.check(api.client.raise_signal(&run, &body).await)?;
            if let Some(v) = api.show_typed(&raised)? {
                let mut line = format!(
                    "signal {} {} on {run}: {}",
                    v["name"].as_str().unwrap_or(""),
                    v["signalId"].as_str().unwrap_or(""),
                    v["status"].as_str().unwrap_or("")
                );
                if let Some(w) = v["consumedBy"].as_str() {
                    line += &format!(" (consumed by {w})");
                }
                if let Some(d) = v["dropped"].as_array() {
                    line += &format!(" (dropped {} oldest: mailbox full)", d.len());
                }
                println!("{line}");
            }
        }
        SignalsCmd::List { run, limit, before } => {
            let page = api
                .client
                .list_signals(&run, Some(limit), before.as_deref());
            if let Some(v) = api.show_typed(&api.check(page.await)?)? {
                print_list(&v, "signals", SIGNALS, "no signals");
            }
        }
    }
    Ok(())
}

/// `runs waits RUN`.
pub async fn waits(api: &Api<'_>, run: &str) -> Result<()> {
    if let Some(v) = api.show_typed(&api.check(api.client.list_waits(run).await)?)? {
        print_list(&v, "waits", WAITS, "no waits");
    }
    Ok(())
}

/// `runs wait RUN --name N --reason R [--timeout-ms MS] [--any] [--follow S]`.
pub async fn wait(api: &Api<'_>, a: WaitArgs) -> Result<()> {
    if a.follow > 60 {
        bail!("--follow is at most 60 seconds");
    }
    let body = ArmWait {
        kind: if a.any { "any" } else { "signal" }.into(),
        names: a.names,
        timeout_ms: a.timeout_ms,
        user_input: a.any.then_some(!a.no_user_input),
        reason: a.reason,
    };
    let mut w = api.check(api.client.arm_wait(&a.id, &body).await)?;
    if a.follow > 0 && w.is_armed() {
        let budget = std::time::Duration::from_secs(a.follow);
        w = api.check(api.client.wait_for(&a.id, &w.wait_id, budget).await)?;
    }
    if let Some(w) = api.show_typed(&w)? {
        print_kv(&w, WAIT_KV);
    }
    Ok(())
}

/// A flag's JSON value, parsed when the arguments are (clap names the flag in the error).
pub fn json_value(text: &str) -> std::result::Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("not JSON ({e}); e.g. '{{\"ok\": true}}'"))
}

/// [`json_value`] that must be an object.
pub fn json_object(text: &str) -> std::result::Result<Value, String> {
    match json_value(text)? {
        v @ Value::Object(_) => Ok(v),
        _ => Err("must be a JSON object, e.g. '{\"pr\": 7}'".into()),
    }
}

/// `runs start WORKFLOW [--inputs JSON]`: starts a run (a session, for a `session` workflow).
pub async fn start(api: &Api<'_>, workflow: &str, inputs: Option<Value>) -> Result<()> {
    let inputs = inputs.unwrap_or_else(|| json!({}));
    let r = api.check(api.client.start_run(workflow, inputs).await)?;
    if api.show_typed(&r)?.is_some() {
        println!("run {} is {} (workflow {workflow})", r.run_id, r.status);
        println!("  follow it: trigger-bridge runs show {}", r.run_id);
    }
    Ok(())
}

/// `runs prompt RUN TEXT`.
pub async fn prompt(api: &Api<'_>, run: &str, text: String) -> Result<()> {
    let turn = api.check(api.client.prompt(run, &text).await)?;
    if let Some(v) = api.show_typed(&turn)? {
        println!(
            "queued turn {} (#{}) on {run}",
            v["turnId"].as_str().unwrap_or(""),
            v["seq"]
        );
    }
    Ok(())
}

const TURNS: &str = "SEQ=seq TURN=turnId KIND=kind STATE=state CLAIMS=claims CREATED=createdAt \
    ACKED=ackedAt";
const WAIT_KV: &str =
    "wait=waitId state=state kind=kind names=names reason=reason deadline=deadline \
    interrupted=interrupted winner=winner/kind signal=winner/signal/signalId losers=losers";

/// `runs cancel-wait RUN WAIT`.
pub async fn cancel_wait(api: &Api<'_>, run: &str, wait: &str) -> Result<()> {
    let w = api.check(api.client.cancel_wait(run, wait).await)?;
    if let Some(w) = api.show_typed(&w)? {
        print_kv(&w, WAIT_KV);
    }
    Ok(())
}

/// `runs turns RUN`.
pub async fn turns(api: &Api<'_>, run: &str) -> Result<()> {
    if let Some(v) = api.show_typed(&api.check(api.client.list_turns(run).await)?)? {
        print_list(&v, "turns", TURNS, "no turns");
    }
    Ok(())
}

/// `runs claim RUN`: prints the claimed turn as JSON (its content is for a program); when no turn came
/// in time it says so on stderr and exits with code 3.
pub async fn claim(api: &Api<'_>, run: &str, lease_ms: u64, timeout: u64) -> Result<()> {
    if timeout > 60 {
        bail!("--timeout is at most 60 seconds");
    }
    match api.check(api.client.claim_turn(run, lease_ms, timeout).await)? {
        Some(t) => println!("{}", serde_json::to_string_pretty(&t)?),
        None => {
            eprintln!("no turn within {timeout} s");
            std::process::exit(3);
        }
    }
    Ok(())
}

/// `runs ack RUN TURN --claim N`.
pub async fn ack(api: &Api<'_>, run: &str, turn: &str, claim: u32) -> Result<()> {
    let t = api.check(api.client.ack_turn(run, turn, claim).await)?;
    if let Some(t) = api.show_typed(&t)? {
        println!(
            "acknowledged turn {} ({}) on {run}",
            t["turnId"].as_str().unwrap_or(""),
            t["kind"].as_str().unwrap_or("")
        );
    }
    Ok(())
}

/// `runs cancel RUN`.
pub async fn cancel(api: &Api<'_>, run: &str) -> Result<()> {
    if let Some(r) = api.show_typed(&api.check(api.client.cancel_run(run).await)?)? {
        println!(
            "run {run} is {}",
            r["status"].as_str().unwrap_or("cancelled")
        );
    }
    Ok(())
}

/// `capabilities mint|list|revoke`.
pub async fn capabilities(o: &ClientOpts, c: CapabilitiesCmd) -> Result<()> {
    let api = Api::new(o)?;
    match c {
        CapabilitiesCmd::Mint {
            run,
            signal,
            label,
            expires_in_s,
            max_uses,
            wake,
            hmac,
        } => {
            let body = json!({
                "runId": run, "signal": signal, "label": label, "expiresInS": expires_in_s,
                "maxUses": max_uses, "wake": wake, "hmac": hmac,
            });
            let reply = api
                .call(Method::POST, "/v1/capabilities", &[], Some(&body))
                .await?;
            if let Some(v) = api.show(reply)? {
                let url = format!(
                    "{}{}",
                    o.server.trim_end_matches('/'),
                    v["url"].as_str().unwrap_or("")
                );
                println!("endpoint: {}", v["endpointId"].as_str().unwrap_or(""));
                println!("url:      {url}");
                println!("expires:  {}", v["expiresAt"].as_str().unwrap_or(""));
                println!("The URL (and key) are shown only now; store them in the sender's secret store.");
                let body = r#"{"ok":true}"#;
                match v["hmacSecret"].as_str() {
                    Some(k) => {
                        println!("hmac key: {k}");
                        println!("Try: curl -X POST -H 'content-type: application/json' -H \"X-Signature-256: sha256=$(printf '%s' '{body}' | openssl dgst -sha256 -hmac '{k}' | sed 's/^.* //')\" -d '{body}' {url}");
                    }
                    None => println!(
                        "Try: curl -X POST -H 'content-type: application/json' -d '{body}' {url}"
                    ),
                }
            }
        }
        CapabilitiesCmd::List => {
            if let Some(v) = api.get("/v1/capabilities", &[]).await? {
                print_list(&v, "capabilities", CAPABILITIES, "no capability endpoints");
            }
        }
        CapabilitiesCmd::Revoke { id } => {
            let path = format!("/v1/capabilities/{}/revoke", seg(&id));
            if let Some(v) = api.show(api.call(Method::POST, &path, &[], None).await?)? {
                print!("{}", render(std::slice::from_ref(&v), CAPABILITIES));
            }
        }
    }
    Ok(())
}
