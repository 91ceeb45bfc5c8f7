//! `trigger-bridge deliveries replay-all`: bulk replay of a subscription's dead letters through
//! `POST /v1/trigger-subscriptions/{id}/dead-letters:replay`. Previews the count, asks
//! `Replay N dead-lettered deliveries of ID? [y/N]` on a terminal (or takes `--yes`), then replays
//! in batches, each confirmed with the count the server is expected to select (the preview's, then
//! each batch's `remaining`). Without a terminal and without `--yes` it refuses (exit 2).

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{bail, Result};
use serde_json::json;
use tb_client::{ReplayFilter, ReplayRequest, ReplaySkip};

use crate::api_client::Api;

// Flags of `deliveries replay-all` (plain comments: a doc comment would replace the subcommand's help).
#[derive(clap::Args, Debug)]
pub struct ReplayAllArgs {
    /// Trigger subscription whose dead letters are replayed
    #[arg(long)]
    pub subscription: String,
    /// Only deliveries dead-lettered at or after this RFC 3339 time (e.g. 2026-12-01T09:00:00Z)
    #[arg(long)]
    pub from: Option<String>,
    /// Only deliveries dead-lettered before this RFC 3339 time
    #[arg(long)]
    pub to: Option<String>,
    /// Only deliveries whose last attempt failed with this error class (http_500, connect, timeout, ...)
    #[arg(long)]
    pub error_class: Option<String>,
    /// Replay without asking (needed when stdin is not a terminal)
    #[arg(long, short)]
    pub yes: bool,
}

/// Most batches one command runs: far beyond any retention's worth of dead letters at 1 000 a batch;
/// a bound so a selection that keeps growing cannot loop forever.
const MAX_BATCHES: usize = 10_000;

/// Whether to replay, ask, or refuse.
#[derive(Debug, PartialEq, Eq)]
enum Gate {
    Go,
    Ask,
    Refuse,
}

/// `--yes` goes; otherwise ask on a terminal, refuse without one.
fn gate(yes: bool, stdin_is_terminal: bool) -> Gate {
    match (yes, stdin_is_terminal) {
        (true, _) => Gate::Go,
        (false, true) => Gate::Ask,
        (false, false) => Gate::Refuse,
    }
}

/// Only `y` / `yes` (any case) confirms; the default (empty line, EOF) is no.
fn confirmed(answer: &str) -> bool {
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

/// Runs the command. Errors (exit 2): API errors, refusal without a terminal, a selection that changed
/// between two batches.
pub async fn replay_all(api: &Api<'_>, json_out: bool, a: ReplayAllArgs) -> Result<()> {
    let filter = ReplayFilter {
        from: a.from.clone(),
        to: a.to.clone(),
        error_class: a.error_class.clone(),
    };
    let request = |dry_run: bool, expect: Option<u64>| ReplayRequest {
        filter: filter.clone(),
        dry_run: Some(dry_run),
        expect,
        limit: None,
    };
    let sub = &a.subscription;
    let preview = api.check(
        api.client
            .replay_dead_letters(sub, &request(true, None))
            .await,
    )?;
    let count = preview.count.unwrap_or(0);
    if count == 0 {
        if json_out {
            println!(
                "{}",
                json!({"count": 0, "replayed": 0, "deliveryIds": [], "skipped": []})
            );
        } else {
            println!(
                "no dead-lettered deliveries of {} match; nothing to replay",
                a.subscription
            );
        }
        return Ok(());
    }
    match gate(a.yes, std::io::stdin().is_terminal()) {
        Gate::Go => {}
        Gate::Refuse => bail!(
            "{} of {} match; refusing to replay without confirmation: stdin is not a terminal, pass --yes",
            dead_letters(count),
            a.subscription
        ),
        Gate::Ask => {
            eprint!(
                "Replay {} of {}? [y/N] ",
                dead_letters(count),
                a.subscription
            );
            std::io::stderr().flush()?;
            let mut answer = String::new();
            std::io::stdin().lock().read_line(&mut answer)?;
            if !confirmed(&answer) {
                println!("aborted; nothing replayed");
                return Ok(());
            }
        }
    }
    let mut expect = count;
    let mut replayed: Vec<String> = Vec::new();
    let mut skipped: Vec<ReplaySkip> = Vec::new();
    for _ in 0..MAX_BATCHES {
        let body = request(false, Some(expect));
        let r = match api.check(api.client.replay_dead_letters(sub, &body).await) {
            Ok(r) => r,
            Err(e) if !replayed.is_empty() || !skipped.is_empty() => bail!(
                "{e:#}\n{} replayed so far; run the command again for the rest",
                replayed.len()
            ),
            Err(e) => return Err(e),
        };
        replayed.extend(r.delivery_ids.unwrap_or_default());
        skipped.extend(r.skipped.unwrap_or_default());
        if !r.more {
            break;
        }
        expect = r.remaining.unwrap_or(0);
    }
    if json_out {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "count": count,
                "replayed": replayed.len(),
                "deliveryIds": replayed,
                "skipped": skipped,
            }))?
        );
        return Ok(());
    }
    println!(
        "replayed {} of {} of {} (one more attempt each)",
        replayed.len(),
        dead_letters(count),
        a.subscription
    );
    for id in &replayed {
        println!("  {id}");
    }
    for s in &skipped {
        println!("  skipped {}: {}", s.delivery_id, s.reason);
    }
    Ok(())
}

/// `1 dead-lettered delivery`, `N dead-lettered deliveries`.
fn dead_letters(n: u64) -> String {
    if n == 1 {
        "1 dead-lettered delivery".into()
    } else {
        format!("{n} dead-lettered deliveries")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asks_on_a_terminal_refuses_without_one_unless_yes() {
        assert_eq!(gate(true, false), Gate::Go);
        assert_eq!(gate(true, true), Gate::Go);
        assert_eq!(gate(false, true), Gate::Ask);
        assert_eq!(gate(false, false), Gate::Refuse);
    }

    #[test]
    fn only_y_or_yes_confirms() {
        for a in ["y\n", "Y", "yes", " YES \n"] {
            assert!(confirmed(a), "{a:?}");
        }
        for a in ["", "\n", "n", "no", "yy", "sure"] {
            assert!(!confirmed(a), "{a:?}");
        }
    }
}
