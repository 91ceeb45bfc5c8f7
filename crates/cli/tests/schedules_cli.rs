//! `trigger-bridge schedules ...` against a running server: a config-file schedule fires
//! on the real clock, and one made through the CLI is previewed, paused and retired.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{free_port, Server, BIN};

fn cli(server: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .args(["--server", server])
        .stdin(Stdio::null())
        .output()
        .expect("run the CLI")
}

fn ok(out: Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn schedules_fire_and_are_managed_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tb.toml");
    std::fs::write(
        &config,
        r#"
[[subscriptions]]
id = "every-second"
source = "schedule"
[subscriptions.schedule]
cron = "* * * * * *"
timezone = "Europe/Berlin"

[[workflows]]
id = "noop"
executor = "noop"

[[bindings]]
id = "tick"
subscription = "every-second"
event_types = ["schedule.tick"]
action = "start_run"
workflow = "noop"
"#,
    )
    .unwrap();
    let server = Server::spawn(&config, &dir.path().join("data"), free_port());
    let s = server.base.as_str();

    // The config-file schedule fires on the real clock: a few ticks, each a receipt and a run.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let v = server.get("/v1/receipts?subscription=every-second&state=consumed");
        if v["receipts"].as_array().is_some_and(|r| r.len() >= 2) {
            assert_eq!(v["receipts"][0]["eventType"], "schedule.tick");
            break;
        }
        assert!(Instant::now() < deadline, "no ticks within 10 s: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let list = ok(cli(s, &["schedules", "list"]));
    assert!(
        list.contains("every-second") && list.contains("Europe/Berlin") && list.contains("config"),
        "{list}"
    );

    let created = ok(cli(
        s,
        &[
            "schedules",
            "create",
            "30 2 * * *",
            "--workflow",
            "noop",
            "--id",
            "nightly",
            "--timezone",
            "America/New_York",
            "--missed",
            "run_once",
        ],
    ));
    assert!(
        created.contains("nightly") && created.contains("run_once"),
        "{created}"
    );
    let next = ok(cli(s, &["schedules", "next", "nightly", "--count", "3"]));
    // A header, a column line and three ticks, each 02:30 in New York (or 03:00 on a spring-forward day).
    let ticks: Vec<&str> = next.lines().filter(|l| l.contains("-0")).collect();
    assert_eq!(ticks.len(), 3, "{next}");
    assert!(
        ticks
            .iter()
            .all(|l| l.contains("T02:30:00-0") || l.contains("T03:00:00-04:00")),
        "{next}"
    );
    let paused = ok(cli(s, &["schedules", "pause", "nightly"]));
    assert!(paused.contains("paused"), "{paused}");
    let gone = ok(cli(s, &["schedules", "delete", "nightly"]));
    assert!(gone.contains("retired"), "{gone}");
    let out = cli(s, &["schedules", "show", "nightly"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("404 not_found"),
        "{out:?}"
    );
    // A bad expression is refused with the field named, and nothing is created.
    let out = cli(
        s,
        &["schedules", "create", "61 * * * *", "--workflow", "noop"],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("400 validation_error: cron"),
        "{out:?}"
    );
}
