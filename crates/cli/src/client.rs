//! Client commands over the HTTP API: `receipts`, `deliveries`, `runs`, `subscriptions`.
//!
//! Responses are read as `serde_json::Value` so extra fields are tolerated; `--json` prints the server's
//! body as sent (re-indented, key order kept).

use anyhow::{bail, Context, Result};

use crate::api_client::{print_kv, print_list, render, seg, Api, ClientOpts};
use serde_json::Value;
use tb_client::Method;

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
    /// Start a run of a configured workflow (a session, for an `executor = "session"` workflow);
    /// prints its run id
    Start {
        /// Workflow id (`[[workflows]] id` in the config)
        workflow: String,
        /// The run's inputs, a JSON object (default `{}`)
        #[arg(long, value_name = "JSON", value_parser = crate::sessions_client::json_object)]
        inputs: Option<serde_json::Value>,
    },
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
    /// Quarantine a subscription: every request to it is refused (403 subscription_quarantined)
    /// before its body is read, on every replica, until released
    Quarantine {
        /// Subscription id
        id: String,
        /// Why: one line, at most 500 bytes (kept with the quarantine and in the audit entry)
        #[arg(long)]
        reason: String,
    },
    /// Release a quarantined subscription: requests are taken again
    Release {
        /// Subscription id
        id: String,
    },
    /// Rotate the signing secret of a registered (API-created) webhook subscription: prints the new
    /// secret once; the old one is still accepted for --overlap-seconds (0 refuses it at once). A
    /// subscription from the config file rotates there ([subscriptions.rotation])
    RotateSecret {
        /// Subscription id
        id: String,
        /// How long the old secret stays valid beside the new one, in seconds (0 to 2592000 = 30 days)
        #[arg(long, default_value_t = 86_400)]
        overlap_seconds: u64,
    },
    /// Requests a subscription refused per minute, by outcome (signature_invalid, rate_limited,
    /// too_large, quarantined, ...), and those it admitted under a rate limit (`admitted`, only when
    /// it has one), summed over every replica
    Counts {
        /// Subscription id
        id: String,
        /// How many minutes back (1 to 10080)
        #[arg(long, default_value_t = 60)]
        minutes: u32,
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
    MAX_ATTEMPTS=retryPolicy/maxAttempts BACKOFF=retryPolicy/backoff \
    QUARANTINED=stateDetail/quarantine/since LAST_ERROR=stateDetail/lastError";
const INGRESS_COUNTS: &str = "MINUTE=minute OUTCOME=outcome REQUESTS=n";
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
                // The API's own wire type: an answer of another shape (another version) is an error.
                let _: tb_api::wire::ReceiptDetail = serde_json::from_value(v.clone())
                    .context("the server's answer is not a receipt as this version knows it (another version?)")?;
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
                let _: tb_api::wire::DeliveryDetail = serde_json::from_value(v.clone())
                    .context("the server's answer is not a delivery as this version knows it (another version?)")?;
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
        RunsCmd::Start { workflow, inputs } => {
            return crate::sessions_client::start(&api, &workflow, inputs).await
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
        SubscriptionsCmd::Quarantine { id, reason } => {
            let path = format!("/v1/trigger-subscriptions/{}/quarantine", seg(&id));
            let body = serde_json::json!({ "reason": reason });
            if let Some(v) = api.show(api.call(Method::POST, &path, &[], Some(&body)).await?)? {
                let q = &v["quarantine"];
                let verb = if v["created"] == true {
                    "quarantined"
                } else {
                    "already quarantined"
                };
                println!(
                    "{id} {verb} since {} ({}); release it with `trigger-bridge subscriptions release {id}`",
                    q["since"].as_str().unwrap_or("?"),
                    q["reason"].as_str().unwrap_or("")
                );
            }
            return Ok(());
        }
        SubscriptionsCmd::Release { id } => {
            let path = format!("/v1/trigger-subscriptions/{}/release", seg(&id));
            if let Some(v) = api.show(api.call(Method::POST, &path, &[], None).await?)? {
                if v["released"] == true {
                    println!("{id} released: requests are taken again");
                } else {
                    println!("{id} was not quarantined");
                }
            }
            return Ok(());
        }
        SubscriptionsCmd::RotateSecret {
            id,
            overlap_seconds,
        } => {
            let path = format!("/v1/trigger-subscriptions/{}/rotate-secret", seg(&id));
            let body = serde_json::json!({ "overlapSeconds": overlap_seconds });
            if let Some(v) = api.show(api.call(Method::POST, &path, &[], Some(&body)).await?)? {
                println!(
                    "new signing secret (shown once): {}",
                    v["signingSecret"].as_str().unwrap_or("?")
                );
                println!(
                    "fingerprint: {}",
                    v["secretFingerprint"].as_str().unwrap_or("?")
                );
                match v["previousSecretUntil"].as_str() {
                    Some(until) => {
                        println!("the previous secret is accepted until {until}; move senders to the new one before then")
                    }
                    None => println!("the previous secret is no longer accepted"),
                }
            }
            return Ok(());
        }
        SubscriptionsCmd::Counts { id, minutes } => {
            let path = format!("/v1/trigger-subscriptions/{}/ingress-counts", seg(&id));
            if let Some(v) = api
                .get(&path, &[("minutes", Some(minutes.to_string()))])
                .await?
            {
                print_list(
                    &v,
                    "counts",
                    INGRESS_COUNTS,
                    "nothing admitted under a limit or refused in that time",
                );
            }
            return Ok(());
        }
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

    /// `subscriptions list` shows state, since when, failures and the last error.
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
}
