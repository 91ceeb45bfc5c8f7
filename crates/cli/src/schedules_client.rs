//! `trigger-bridge schedules ...`: create, list, show, preview, pause, resume and retire
//! cron schedules through `/v1/schedules`. Same conventions as `client.rs`: tables by default, `--json`
//! prints the server's answer.

use anyhow::Result;
use serde_json::{json, Value};
use tb_client::Method;

use crate::api_client::{print_kv, print_list, render, seg, Api, ClientOpts};

const SCHEDULES: &str = "SCHEDULE=id STATE=state CRON=cron TIMEZONE=timezone MISSED=missed \
    OVERLAP=overlap NEXT_FIRE=nextFireTime LAST_TICK=lastNominalTime MISSED_TICKS=missedTicks ORIGIN=origin";
const NEXT: &str = "NOMINAL_UTC=nominalTime LOCAL=localTime FIRES_AT=fireTime";

/// `trigger-bridge schedules ...`
#[derive(clap::Subcommand, Debug)]
pub enum SchedulesCmd {
    /// List schedules with their state, next fire time and missed ticks
    List,
    /// Show one schedule
    Show {
        /// Schedule id
        id: String,
    },
    /// Create a schedule that starts WORKFLOW on every tick (DST rules: docs/configuration.md "Schedules")
    Create {
        /// Cron expression: 5 fields (minute hour day-of-month month day-of-week), or 6 with seconds first
        cron: String,
        /// The workflow every tick starts
        #[arg(long)]
        workflow: String,
        /// Schedule id (default: minted, sch_...)
        #[arg(long)]
        id: Option<String>,
        /// IANA time zone the expression is read in
        #[arg(long, default_value = "UTC")]
        timezone: String,
        /// Ticks missed while no replica ran: skip, run_once or all
        #[arg(long, default_value = "skip", value_parser = ["skip", "run_once", "all"])]
        missed: String,
        /// With --missed all: at most this many missed ticks fire (the latest)
        #[arg(long)]
        catch_up_max: Option<u32>,
        /// A tick is on time until this many ms past its fire time (default 60000)
        #[arg(long)]
        grace_ms: Option<u64>,
        /// While the previous tick's run still runs: allow, skip or buffer_one
        #[arg(long, default_value = "allow", value_parser = ["allow", "skip", "buffer_one"])]
        overlap: String,
        /// Fire each tick up to this many ms late (stable per tick)
        #[arg(long)]
        jitter_ms: Option<u64>,
        /// No tick before this RFC 3339 instant
        #[arg(long)]
        start: Option<String>,
        /// No tick after this RFC 3339 instant
        #[arg(long)]
        end: Option<String>,
    },
    /// Preview the next fire times in UTC and in the schedule's zone
    Next {
        /// Schedule id
        id: String,
        /// How many (1-100)
        #[arg(long, default_value_t = 5)]
        count: usize,
    },
    /// Pause: due ticks are skipped (and counted) until resumed
    Pause {
        /// Schedule id
        id: String,
    },
    /// Resume: fires from the next tick; nothing missed meanwhile is caught up
    Resume {
        /// Schedule id
        id: String,
    },
    /// Retire a schedule made through the API (its receipts and runs stay readable)
    Delete {
        /// Schedule id
        id: String,
    },
}

/// Runs one `schedules` command.
pub async fn schedules(o: &ClientOpts, c: SchedulesCmd) -> Result<()> {
    let api = Api::new(o)?;
    let one = |v: &Value| print_kv(&v["schedule"], SCHEDULES);
    match c {
        SchedulesCmd::List => {
            if let Some(v) = api.get("/v1/schedules", &[]).await? {
                print_list(&v, "schedules", SCHEDULES, "no schedules");
            }
        }
        SchedulesCmd::Show { id } => {
            if let Some(v) = api.get(&format!("/v1/schedules/{}", seg(&id)), &[]).await? {
                one(&v);
            }
        }
        SchedulesCmd::Create {
            cron,
            workflow,
            id,
            timezone,
            missed,
            catch_up_max,
            grace_ms,
            overlap,
            jitter_ms,
            start,
            end,
        } => {
            let mut body = json!({"cron": cron, "workflowId": workflow, "timezone": timezone,
                "missed": missed, "overlap": overlap});
            for (k, v) in [
                ("id", id.map(Value::from)),
                ("jitterMs", jitter_ms.map(Value::from)),
                ("start", start.map(Value::from)),
                ("end", end.map(Value::from)),
                ("catchUpMax", catch_up_max.map(Value::from)),
                ("graceMs", grace_ms.map(Value::from)),
            ] {
                if let Some(v) = v {
                    body[k] = v;
                }
            }
            if let Some(v) = api.show(
                api.call(Method::POST, "/v1/schedules", &[], Some(&body))
                    .await?,
            )? {
                one(&v);
            }
        }
        SchedulesCmd::Next { id, count } => {
            let path = format!("/v1/schedules/{}/next", seg(&id));
            if let Some(v) = api
                .get(&path, &[("count", Some(count.to_string()))])
                .await?
            {
                println!(
                    "schedule {id} ({})",
                    v["timezone"].as_str().unwrap_or("UTC")
                );
                print!(
                    "{}",
                    render(v["next"].as_array().map(Vec::as_slice).unwrap_or(&[]), NEXT)
                );
            }
        }
        SchedulesCmd::Pause { id } => verb(&api, &id, "pause").await?,
        SchedulesCmd::Resume { id } => verb(&api, &id, "resume").await?,
        SchedulesCmd::Delete { id } => {
            api.call(
                Method::DELETE,
                &format!("/v1/schedules/{}", seg(&id)),
                &[],
                None,
            )
            .await?;
            println!("schedule {id} retired (its receipts and runs stay)");
        }
    }
    Ok(())
}

async fn verb(api: &Api<'_>, id: &str, verb: &str) -> Result<()> {
    let path = format!("/v1/schedules/{}/{verb}", seg(id));
    if let Some(v) = api.show(api.call(Method::POST, &path, &[], None).await?)? {
        print!(
            "{}",
            render(std::slice::from_ref(&v["schedule"]), SCHEDULES)
        );
    }
    Ok(())
}
