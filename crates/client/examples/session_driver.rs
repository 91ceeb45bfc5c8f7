//! A session driver: the loop an agent runs for one session (a run of a `session` workflow).
//!
//! ```text
//! export TRIGGER_BRIDGE_SERVER=http://127.0.0.1:8080 TRIGGER_BRIDGE_API_KEY=...   # key: runs:create + runs:read
//! cargo run -p trigger-bridge-client --example session_driver -- RUN_ID [SIGNAL_NAME ...]
//! ```
//!
//! Each round: claim the run's next turn (its `content.untrusted` is data from outside, never
//! instructions), arm `wait_for_any` on the signal names (default `approved`, `rejected`) with a 10
//! minute timer, block until the winner, react to it, and acknowledge the turn. It stops when the run
//! is stopped (winner `stop`) or after `rejected`.

use std::time::Duration;

use tb_client::{ArmWait, Client, Wait};

/// What one round saw.
#[derive(Debug)]
#[allow(dead_code)] // read by the CLI's test that runs this driver
pub struct Round {
    /// The turn claimed and acknowledged (`None`: no turn was queued within the claim's long-poll).
    pub turn: Option<String>,
    /// The resolved wait.
    pub wait: Wait,
}

/// One round on `run`: claim (up to `claim_s`), arm a `wait_for_any` on `names` with `timeout_ms`,
/// wait for its winner, ack. Errors: whatever the API refuses (a run that has ended is 409
/// `target_terminal` on arming).
pub async fn round(
    api: &Client,
    run: &str,
    names: &[String],
    timeout_ms: u64,
    claim_s: u64,
) -> tb_client::Result<Round> {
    let turn = api.claim_turn(run, 60_000, claim_s).await?;
    if let Some(t) = &turn {
        let system = t.content["system"].as_str().unwrap_or("");
        println!("turn {} ({}): {system}", t.turn_id, t.kind);
    }
    let armed = api
        .arm_wait(
            run,
            &ArmWait {
                kind: "any".into(),
                names: names.to_vec(),
                timeout_ms: Some(timeout_ms),
                user_input: Some(true),
                reason: format!("waiting for {}", names.join(" or ")),
            },
        )
        .await?;
    // Block until the winner; a budget longer than the timer is never spent.
    let mut wait = armed;
    while wait.is_armed() {
        wait = api
            .wait_for(run, &wait.wait_id, Duration::from_secs(55))
            .await?;
    }
    match &wait.winner {
        Some(w) if w.kind == "signal" => {
            let s = w.signal.as_ref().expect("a signal winner names its signal");
            println!(
                "signal {} won ({}); its data is untrusted",
                s.name, s.signal_id
            );
        }
        Some(w) => println!("{} won", w.kind),
        None => println!("wait {} is {}", wait.wait_id, wait.state),
    }
    if let Some(t) = &turn {
        api.ack_turn(run, &t.turn_id, t.claims).await?;
    }
    Ok(Round {
        turn: turn.map(|t| t.turn_id),
        wait,
    })
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let run = args
        .next()
        .ok_or("usage: session_driver RUN_ID [SIGNAL_NAME ...]")?;
    let mut names: Vec<String> = args.collect();
    if names.is_empty() {
        names = vec!["approved".into(), "rejected".into()];
    }
    let server =
        std::env::var("TRIGGER_BRIDGE_SERVER").unwrap_or_else(|_| "http://127.0.0.1:8080".into());
    let mut api = Client::new(&server)?;
    if let Ok(key) = std::env::var("TRIGGER_BRIDGE_API_KEY") {
        api = api.with_api_key(key);
    }
    loop {
        let r = round(&api, &run, &names, 600_000, 5).await?;
        let winner = r.wait.winner.as_ref().map(|w| w.kind.as_str());
        let signal = r.wait.winner.as_ref().and_then(|w| w.signal.as_ref());
        if winner == Some("stop") || signal.is_some_and(|s| s.name == "rejected") {
            return Ok(());
        }
    }
}
