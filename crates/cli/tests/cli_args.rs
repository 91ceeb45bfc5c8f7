//! Client argument checks that need no server.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_trigger-bridge");

fn run(args: &[&str]) -> (i32, String) {
    let out = Command::new(BIN)
        .args(args)
        .args(["--server", "http://127.0.0.1:9"])
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn receipts_list_accepts_only_real_receipt_states() {
    for timeline_only in [
        "received",
        "authenticated",
        "normalized",
        "matched",
        "duplicate",
    ] {
        let (code, out) = run(&["receipts", "list", "--state", timeline_only]);
        assert_eq!(code, 2, "{timeline_only}: {out}");
        assert!(out.contains("invalid value"), "{out}");
        assert!(
            out.contains("dead_lettered"),
            "the real states are listed: {out}"
        );
    }
    let help = run(&["receipts", "list", "--help"]).1;
    assert!(help.contains("target_terminal"), "{help}");
}

#[test]
fn resume_help_names_every_state_it_resumes_from() {
    let (code, out) = run(&["subscriptions", "resume", "--help"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("paused, failed or dead-lettered"), "{out}");
}
