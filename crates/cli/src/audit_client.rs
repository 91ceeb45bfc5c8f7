//! `trigger-bridge audit ...`: the audit log of operator actions, and the check of its
//! hash chain.

use anyhow::Result;
use tb_client::Method;

use crate::api_client::{print_list, Api, ClientOpts};

const ENTRIES: &str =
    "SEQ=seq AT=at ACTOR=actor ACTION=action TARGET=target OUTCOME=outcome DETAIL=detail";

/// `trigger-bridge audit ...`
#[derive(clap::Subcommand, Debug)]
pub enum AuditCmd {
    /// List operator actions, newest first: who did what to which record, and how it ended
    /// (needs a key with the audit:read scope). With --verify, check the whole log's keyed hash
    /// chain instead: exits 1 and names the first problem when a row was edited, removed, inserted
    /// or forged by hand, or (with --checkpoint) when the newest rows were deleted
    List {
        /// Only this actor (an API key's name)
        #[arg(long)]
        actor: Option<String>,
        /// Only this action, or the actions under it (e.g. subscription, dead_letters.replay)
        #[arg(long)]
        action: Option<String>,
        /// Only this target id (e.g. a subscription id)
        #[arg(long)]
        target: Option<String>,
        /// Entries before this seq (to page back)
        #[arg(long)]
        before: Option<i64>,
        /// How many (1..=500)
        #[arg(long, default_value_t = 50)]
        limit: u32,
        /// Check the chain of every entry (hash, link, no gap, ends at the recorded head); it checks
        /// the whole log, so it takes no filter
        #[arg(long, conflicts_with_all = ["actor", "action", "target", "before"])]
        verify: bool,
        /// With --verify: a checkpoint exported earlier, SEQ:MAC (from the server's log line `audit
        /// checkpoint seq=SEQ head=.. mac=MAC`, or the checkpoint a previous --verify printed); the log
        /// must still hold that entry
        #[arg(long, requires = "verify", value_name = "SEQ:MAC")]
        checkpoint: Option<String>,
    },
}

/// Runs one `audit` command; the exit code is 1 when `--verify` finds the chain broken.
pub async fn audit(o: &ClientOpts, c: AuditCmd) -> Result<i32> {
    let api = Api::new(o)?;
    let AuditCmd::List {
        actor,
        action,
        target,
        before,
        limit,
        verify,
        checkpoint,
    } = c;
    if verify {
        let q = [("checkpoint", checkpoint)];
        let (v, raw) = api.call(Method::GET, "/v1/audit/verify", &q, None).await?;
        if o.json {
            println!("{raw}");
        } else if v["ok"] == true {
            println!(
                "audit log verified: {} entries, chained from the first to the head (seq {})",
                v["checked"], v["headSeq"]
            );
            if v["unkeyed"].as_u64().is_some_and(|n| n > 0) {
                println!(
                    "  {} of them were written before the chain was keyed (checked by their plain hash)",
                    v["unkeyed"]
                );
            }
            if v["keyed"] == false {
                println!("  the server has no audit key: entries are not keyed, anyone who can write the database can forge them");
            }
            if let Some(c) = v["checkpoint"].as_str() {
                println!("  checkpoint of this head: {c} (keep it outside the database; --checkpoint {c} checks it later)");
            }
        } else {
            eprintln!(
                "audit log BROKEN: {} ({} entries verified)",
                v["message"].as_str().unwrap_or("unknown problem"),
                v["checked"]
            );
        }
        return Ok(if v["ok"] == true { 0 } else { 1 });
    }
    let q = [
        ("actor", actor),
        ("action", action),
        ("target", target),
        ("beforeSeq", before.map(|b| b.to_string())),
        ("limit", Some(limit.to_string())),
    ];
    if let Some(v) = api.get("/v1/audit", &q).await? {
        print_list(&v, "entries", ENTRIES, "no audit entries match");
        if let Some(n) = v["next"].as_i64() {
            println!("(more: --before {n})");
        }
    }
    Ok(0)
}
