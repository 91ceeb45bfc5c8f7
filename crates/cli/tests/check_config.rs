//! `trigger-bridge check-config` and `serve` refuse bad configs with messages that say what to fix.

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_trigger-bridge");

fn check(toml: &str, envs: &[(&str, &str)]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    std::fs::write(&p, toml).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.args(["check-config", "--config"])
        .arg(&p)
        .env_remove("TB_TEST_SECRET")
        .env_remove("TB_TEST_WHSEC")
        .env_remove("TRIGGER_BRIDGE_API_KEY");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout),
    )
}

const GOOD: &str = r#"
[[subscriptions]]
id = "gh"
connector = "github"
secret = "env:TB_TEST_SECRET"

[[workflows]]
id = "noop"
executor = "noop"

[[bindings]]
id = "b"
subscription = "gh"
event_types = ["pull_request.opened"]
action = "start_run"
workflow = "noop"
filter = { "repository.full_name" = "o/r" }
inputs = { n = "pull_request.number" }
"#;

#[test]
fn the_quickstart_and_a_good_config_pass() {
    let (code, out) = check(GOOD, &[("TB_TEST_SECRET", "s3cret")]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("ok (1 subscriptions, 1 workflows, 1 bindings); no API keys"),
        "{out}"
    );
    let keyed = format!(
        "{GOOD}\n[[api_keys]]\nname = \"ops\"\nsha256 = \"{}\"\nscopes = [\"*\"]\n",
        "a".repeat(64)
    );
    let (code, out) = check(&keyed, &[("TB_TEST_SECRET", "s3cret")]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("bindings); API keys: ops"), "{out}");
    let (_, out) = check(
        &keyed,
        &[
            ("TB_TEST_SECRET", "s3cret"),
            ("TRIGGER_BRIDGE_API_KEY", "k".repeat(30).as_str()),
        ],
    );
    assert!(
        out.contains("API keys: ops, TRIGGER_BRIDGE_API_KEY"),
        "{out}"
    );
    let q = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/quickstart.toml"
    ))
    .unwrap();
    let (code, out) = check(
        &q,
        &[
            ("GITHUB_WEBHOOK_SECRET", "x"),
            (
                "STANDARD_WEBHOOK_SECRET",
                "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            ),
        ],
    );
    assert_eq!(code, 0, "{out}");
}

#[test]
fn every_problem_is_named_with_its_fix() {
    let bad = r#"
[[subscriptions]]
id = "gh"
connector = "gitlab"
secret = "env:TB_TEST_SECRET"

[[subscriptions]]
id = "sw"
connector = "standard-webhooks"
secret = "env:TB_TEST_WHSEC"

[[subscriptions]]
id = "gh2"
connector = "github"
secret = "env:TB_TEST_SECRET"

[[workflows]]
id = "noop"
executor = "noop"

[[bindings]]
id = "b1"
subscription = "gh2"
event_types = ["push"]
action = "start_run"
workflow = "deploy"

[[bindings]]
id = "b2"
subscription = "gh2"
event_types = ["push"]
action = "start_run"
workflow = "noop"
filter = { "payload.secret_field" = "x" }
"#;
    let (code, out) = check(
        bad,
        &[("TB_TEST_SECRET", "s"), ("TB_TEST_WHSEC", "whsec_abc")],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("subscriptions[0] (gh): unknown connector \"gitlab\"; use github, standard-webhooks, hmac or azure-devops"), "{out}");
    assert!(out.contains("subscriptions[1] (sw): secret"), "{out}");
    assert!(
        out.contains("bindings[0] (b1): workflow \"deploy\" does not exist (defined: noop)"),
        "{out}"
    );
    assert!(out.contains("bindings[1] (b2): field \"payload.secret_field\" is not normalized by connector github"), "{out}");
    assert!(out.contains("4 problem(s)"), "{out}");
    assert!(
        !out.contains("whsec_abc"),
        "secret values are never printed: {out}"
    );

    // Typos in event types and a bad listen address are caught before serve.
    let typo = GOOD
        .replace(
            "[\"pull_request.opened\"]",
            "[\"\", \"pull_requests.opened\"]",
        )
        .replace(
            "[[subscriptions]]",
            "[server]\nlisten = \"not-an-addr\"\n\n[[subscriptions]]",
        );
    let (code, out) = check(&typo, &[("TB_TEST_SECRET", "s")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("[server].listen: \"not-an-addr\" is not host:port"),
        "{out}"
    );
    assert!(
        out.contains("event_types: \"\" is not an event type"),
        "{out}"
    );
    assert!(
        out.contains("\"pull_requests\" is not a GitHub webhook event"),
        "{out}"
    );

    // An unset secret names the variable.
    let (code, out) = check(GOOD, &[]);
    assert_eq!(code, 1);
    assert!(
        out.contains("environment variable TB_TEST_SECRET is not set"),
        "{out}"
    );

    // A whsec_ secret of the wrong length says how long it must be.
    let short = GOOD.replace("connector = \"github\"", "connector = \"standard-webhooks\"").replace("filter = { \"repository.full_name\" = \"o/r\" }\ninputs = { n = \"pull_request.number\" }", "");
    let (code, out) = check(&short, &[("TB_TEST_SECRET", "whsec_AAECAwQFBgcICQ==")]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("24 to 64 bytes"), "{out}");
}

const ADO: &str = r#"
[[subscriptions]]
id = "ado"
connector = "azure-devops"
secret = "env:TB_TEST_SECRET"

[subscriptions.azure_devops]
basic_username = "trigger-bridge"
header_name = "X-Hook-Secret"

[[workflows]]
id = "noop"
executor = "noop"

[[bindings]]
id = "pr"
subscription = "ado"
event_types = ["git.pullrequest.created", "git.pullrequest.updated", "ms.vss-code.git-pullrequest-comment-event"]
action = "start_run"
workflow = "noop"
filter = { "resource.repository.id" = "5f0d1c2e-7a3b-4c8d-9e10-a1b2c3d4e5f6", "resource.targetRefName" = "refs/heads/main" }
inputs = { pr = "resource.pullRequestId", lifecycle = "pull_request.action" }

[[bindings]]
id = "builds"
subscription = "ado"
event_types = ["build.complete"]
action = "start_run"
workflow = "noop"
filter = { "resource.result" = ["failed", "partiallySucceeded"] }
inputs = { build = "resource.id", definition = "resource.definition.name" }
"#;

#[test]
fn azure_devops_subscriptions() {
    let (code, out) = check(ADO, &[("TB_TEST_SECRET", "s3cret")]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("ok (1 subscriptions, 1 workflows, 2 bindings)"),
        "{out}"
    );
    // Header-only is enough.
    let header_only = ADO.replace("basic_username = \"trigger-bridge\"\n", "");
    let (code, out) = check(&header_only, &[("TB_TEST_SECRET", "s3cret")]);
    assert_eq!(code, 0, "{out}");

    // No table: names the table and both keys. Event types still follow the ADO rules (no extra noise).
    let no_table = ADO.replace(
        "[subscriptions.azure_devops]\nbasic_username = \"trigger-bridge\"\nheader_name = \"X-Hook-Secret\"\n",
        "",
    );
    let (code, out) = check(&no_table, &[("TB_TEST_SECRET", "s3cret")]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("subscriptions[0] (ado): connector \"azure-devops\" needs a [subscriptions.azure_devops] table with basic_username"), "{out}");
    assert!(out.contains("1 problem(s)"), "{out}");

    // An empty table: say what to set.
    let empty = ADO.replace(
        "basic_username = \"trigger-bridge\"\nheader_name = \"X-Hook-Secret\"\n",
        "",
    );
    let (code, out) = check(&empty, &[("TB_TEST_SECRET", "s3cret")]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("subscriptions[0] (ado): [subscriptions.azure_devops]: set basic_username (the secret is the Basic-auth password) and/or header_name"), "{out}");

    // Unknown keys, bad event types and fields another connector normalizes are refused.
    let typo = ADO.replace("basic_username =", "basic_user =");
    let (code, out) = check(&typo, &[("TB_TEST_SECRET", "s3cret")]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("unknown field `basic_user`"), "{out}");
    let bad = ADO
        .replace("\"build.complete\"", "\"Build.Complete\", \"git..push\"")
        .replace("\"resource.result\"", "\"repository.full_name\"");
    let (code, out) = check(&bad, &[("TB_TEST_SECRET", "s3cret")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("event_types: \"Build.Complete\" is not an Azure DevOps event type"),
        "{out}"
    );
    assert!(
        out.contains("\"git..push\" is not an Azure DevOps event type"),
        "{out}"
    );
    assert!(out.contains("bindings[1] (builds): field \"repository.full_name\" is not normalized by connector azure-devops"), "{out}");
    assert!(!out.contains("s3cret"), "{out}");
}

#[test]
fn serve_refuses_to_start_without_its_secrets() {
    let out = Command::new(BIN)
        .args([
            "serve",
            "--config",
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../examples/quickstart.toml"
            ),
            "--listen",
            "127.0.0.1:0",
        ])
        .env_remove("GITHUB_WEBHOOK_SECRET")
        .env_remove("STANDARD_WEBHOOK_SECRET")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("environment variable GITHUB_WEBHOOK_SECRET is not set"),
        "{err}"
    );
    assert!(
        err.contains("environment variable STANDARD_WEBHOOK_SECRET is not set"),
        "{err}"
    );
}

#[test]
fn hash_key_prints_the_config_line_and_bad_key_entries_are_named() {
    use std::io::Write;
    let mut child = Command::new(BIN)
        .arg("hash-key")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"key\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "sha256 = \"2c70e12b7a0646f92279f427c7b38e7334d8e5389cff167a1dc30e73f826b683\""
    );
    // A short key is hashed, with a warning on stderr (stdout stays the one line to paste).
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a key of 3 characters is easy to guess"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bad = format!("{GOOD}\n[[api_keys]]\nname = \"ci\"\nsha256 = \"nothex\"\nscopes = [\"runs:read\", \"root\"]\n");
    let (code, out) = check(&bad, &[("TB_TEST_SECRET", "s")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("api_keys[0] (ci): sha256 must be the 64-hex SHA-256"),
        "{out}"
    );
    assert!(
        out.contains("api_keys[0] (ci): unknown scope \"root\""),
        "{out}"
    );
    // The same key twice, or one name twice, is refused (one key would act as the other).
    let h = "2c70e12b7a0646f92279f427c7b38e7334d8e5389cff167a1dc30e73f826b683";
    let h2 = "3c70e12b7a0646f92279f427c7b38e7334d8e5389cff167a1dc30e73f826b683";
    let twice = format!("{GOOD}\n[[api_keys]]\nname = \"a\"\nsha256 = \"{h}\"\nscopes = [\"*\"]\n[[api_keys]]\nname = \"b\"\nsha256 = \"{h}\"\nscopes = [\"runs:read\"]\n[[api_keys]]\nname = \"a\"\nsha256 = \"{h2}\"\nscopes = [\"runs:read\"]\n");
    let (code, out) = check(&twice, &[("TB_TEST_SECRET", "s")]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("\"a\" and \"b\" are the same key"), "{out}");
    assert!(out.contains("two keys are named \"a\""), "{out}");
}

#[test]
fn session_bindings_are_checked_with_the_fix_named() {
    let cfg = r#"
[[subscriptions]]
id = "gh"
connector = "github"
secret = "env:TB_TEST_SECRET"

[[workflows]]
id = "noop"
executor = "noop"

[[workflows]]
id = "pr-session"
executor = "session"
mailbox_overflow = "drop_oldest"
[workflows.session]
agent = "a"

[[bindings]]
id = "coalesce-noop"
subscription = "gh"
event_types = ["pull_request.opened"]
action = "start_run"
workflow = "noop"
coalesce_key = "{repository.full_name}"

[[bindings]]
id = "no-signal"
subscription = "gh"
event_types = ["pull_request.opened"]
action = "start_run"
workflow = "pr-session"
coalesce_key = "{repository.full_name}#{pull_request.number}"
on_existing = "signal"

[[bindings]]
id = "no-target"
subscription = "gh"
event_types = ["pull_request.closed"]
action = "raise_signal"
signal = "pr.closed"

[[bindings]]
id = "both-targets"
subscription = "gh"
event_types = ["pull_request.closed"]
action = "raise_signal"
run = "run_1"
workflow = "pr-session"
coalesce_key = "{repository.full_name}"
signal = "pr.closed"

[[bindings]]
id = "bad-template"
subscription = "gh"
event_types = ["pull_request.closed"]
action = "raise_signal"
workflow = "pr-session"
coalesce_key = "{payload.secret_field}"
signal = "PR {action}"

[[bindings]]
id = "prompt"
subscription = "gh"
event_types = ["issue_comment"]
action = "enqueue_prompt"
workflow = "pr-session"
coalesce_key = "{repository.full_name}"
"#;
    let (code, out) = check(cfg, &[("TB_TEST_SECRET", "s")]);
    assert_ne!(code, 0);
    for expected in [
        "coalesce-noop): coalesce_key needs a session workflow",
        "no-signal): on_existing = \"signal\" needs signal =",
        "no-target): raise_signal needs a target: either run =",
        "both-targets): raise_signal: set either run or workflow + coalesce_key, not both",
        "bad-template): signal \"PR {action}\": a signal name is 1 to 64 characters",
        "bad-template): field \"payload.secret_field\" is not normalized by connector github",
        "prompt): enqueue_prompt needs prompt =",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
}

#[test]
fn a_subscription_id_that_names_a_route_is_refused() {
    for id in ["ingest", "pause", "resume", "dead-letters"] {
        let toml = GOOD
            .replace("id = \"gh\"", &format!("id = \"{id}\""))
            .replace("subscription = \"gh\"", &format!("subscription = \"{id}\""));
        let (code, out) = check(&toml, &[("TB_TEST_SECRET", "s3cret")]);
        assert_ne!(code, 0, "{id}: {out}");
        assert!(out.contains(&format!("id \"{id}\" is reserved")), "{out}");
    }
}

#[test]
fn writer_queue_capacity_is_checked() {
    for (value, ok) in [
        ("1", true),
        ("10000", true),
        ("0", false),
        ("1000001", false),
    ] {
        let toml = format!("[server]\nwriter_queue_capacity = {value}\n{GOOD}");
        let (code, out) = check(&toml, &[("TB_TEST_SECRET", "s3cret")]);
        if ok {
            assert_eq!(code, 0, "{value}: {out}");
        } else {
            assert_eq!(code, 1, "{value}: {out}");
            assert!(
                out.contains(&format!(
                    "[server].writer_queue_capacity {value} is out of range; use 1 to 1000000 jobs (default 10000)"
                )),
                "{out}"
            );
        }
    }
}

#[test]
fn an_unknown_github_action_is_refused_with_a_did_you_mean() {
    let typo = GOOD.replace("pull_request.opened", "pull_request.opend");
    let (code, out) = check(&typo, &[("TB_TEST_SECRET", "s3cret")]);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains(
            "bindings[0] (b): event_types: \"opend\" is not an action of the GitHub \"pull_request\" event; did you mean \"pull_request.opened\"?"
        ),
        "{out}"
    );
    assert!(
        out.contains("synchronize"),
        "the known actions are listed: {out}"
    );
    let event_typo = GOOD.replace("pull_request.opened", "pull_reqest.opened");
    let (code, out) = check(&event_typo, &[("TB_TEST_SECRET", "s3cret")]);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("did you mean \"pull_request\"?"), "{out}");
    // Events whose actions are not fixed, and known actions, still pass.
    for ok in [
        "pull_request.synchronize",
        "issues.opened",
        "push",
        "repository_dispatch.deploy",
    ] {
        let (code, out) = check(
            &GOOD.replace("pull_request.opened", ok),
            &[("TB_TEST_SECRET", "s3cret")],
        );
        assert_eq!(code, 0, "{ok}: {out}");
    }
}

const HTTP_WORKFLOW: &str = r#"
[[workflows]]
id = "worker"
executor = "http"
url = "http://127.0.0.1:9/run"
allow_private = true
secret = "env:TB_TEST_WHSEC"
timeout_ms = 4000
"#;

#[test]
fn a_lease_shorter_than_the_executor_timeout_plus_a_margin_is_refused() {
    let envs = [
        ("TB_TEST_SECRET", "s3cret"),
        ("TB_TEST_WHSEC", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
    ];
    let short = format!("[server]\nlease_ms = 1000\n{GOOD}{HTTP_WORKFLOW}");
    let (code, out) = check(&short, &envs);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("workflows[1] (worker): timeout_ms = 4000 needs [server].lease_ms of at least 5000 (the timeout plus a 1000 ms margin), but lease_ms is 1000"),
        "{out}"
    );
    let enough = format!("[server]\nlease_ms = 5000\n{GOOD}{HTTP_WORKFLOW}");
    let (code, out) = check(&enough, &envs);
    assert_eq!(code, 0, "{out}");
    // The default lease (60 s) covers the default timeout (15 s).
    let default = format!("{GOOD}{HTTP_WORKFLOW}").replace("timeout_ms = 4000\n", "");
    let (code, out) = check(&default, &envs);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn failure_policy_keys_are_read_and_checked() {
    let envs = [("TB_TEST_SECRET", "s3cret")];
    let good = GOOD.replace(
        "secret = \"env:TB_TEST_SECRET\"\n",
        "secret = \"env:TB_TEST_SECRET\"\ndead_letter_after_ms = 3600000\ndead_letter_min_failures = 3\nfailure_window_ms = 1000\n",
    );
    let (code, out) = check(
        &format!("[server]\ndead_letter_after_ms = 86400000\n{good}"),
        &envs,
    );
    assert_eq!(code, 0, "{out}");
    let zero = GOOD.replace(
        "secret = \"env:TB_TEST_SECRET\"\n",
        "secret = \"env:TB_TEST_SECRET\"\ndead_letter_min_failures = 0\n",
    );
    let (code, out) = check(&zero, &envs);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("subscriptions[0] (gh): dead_letter_min_failures must be at least 1"),
        "{out}"
    );
    let (code, out) = check(
        &format!("[server]\ndead_letter_min_failures = 0\n{GOOD}"),
        &envs,
    );
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("[server].dead_letter_min_failures must be at least 1"),
        "{out}"
    );
}

/// A host name with a port is a valid listen address.
#[test]
fn listen_accepts_a_host_name_with_a_port() {
    let cfg = GOOD.replace(
        "[[subscriptions]]",
        "[server]\nlisten = \"localhost:8093\"\n\n[[subscriptions]]",
    );
    let (code, out) = check(&cfg, &[("TB_TEST_SECRET", "s")]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(": ok ("), "{out}");
}

/// The edge keys of `[server]` refuse values that would disable them or could never
/// fit a body.
#[test]
fn edge_limits_refuse_zero_and_a_budget_below_a_body_limit() {
    let cfg = GOOD.replace(
        "[[subscriptions]]",
        "[server]\nheader_timeout_ms = 0\nmax_connections = 8\nmax_inflight_bodies = 16\nbody_budget_bytes = 1000\n\n[[subscriptions]]",
    );
    let (code, out) = check(&cfg, &[("TB_TEST_SECRET", "s")]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("[server].header_timeout_ms must be at least 1"),
        "{out}"
    );
    assert!(
        out.contains("[server].max_inflight_bodies (16) must not exceed max_connections (8)"),
        "{out}"
    );
    assert!(
        out.contains("[server].body_budget_bytes (1000) must be between the largest subscription max_body_bytes (26214400)"),
        "{out}"
    );
    assert!(out.contains("3 problem(s)"), "{out}");
}

/// Slow bodies: `max_inflight_bodies_per_target` must be 1 ..=
/// `max_inflight_bodies`, and `body_min_rate_grace_ms` 1 .. one hour.
#[test]
fn per_target_body_slots_and_the_rate_grace_are_checked() {
    let with = |server: &str| {
        GOOD.replace(
            "[[subscriptions]]",
            &format!("[server]\n{server}\n\n[[subscriptions]]"),
        )
    };
    let env = [("TB_TEST_SECRET", "s")];
    let (code, out) = check(
        &with("max_inflight_bodies = 8\nmax_inflight_bodies_per_target = 9\nbody_min_rate_grace_ms = 0"),
        &env,
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("[server].max_inflight_bodies_per_target (9) must be between 1 and max_inflight_bodies (8)"),
        "{out}"
    );
    assert!(
        out.contains("[server].body_min_rate_grace_ms must be at least 1"),
        "{out}"
    );
    assert!(out.contains("2 problem(s)"), "{out}");
    let (code, out) = check(&with("max_inflight_bodies_per_target = 0"), &env);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("[server].max_inflight_bodies_per_target (0) must be between 1 and max_inflight_bodies (64)"),
        "{out}"
    );
    let (code, out) = check(&with("body_min_rate_grace_ms = 3600001"), &env);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("[server].body_min_rate_grace_ms = 3600001 is over one hour"),
        "{out}"
    );
    // A small max_inflight_bodies alone is fine: the per-target default follows it down.
    let (code, out) = check(
        &with("max_inflight_bodies = 4\nmax_inflight_bodies_per_target = 4\nbody_min_rate_grace_ms = 500"),
        &env,
    );
    assert_eq!(code, 0, "{out}");
    let (code, out) = check(&with("max_inflight_bodies = 4"), &env);
    assert_eq!(code, 0, "{out}");
}

/// The per-client keys of `[server]` (docs/limits.md "Per-client limits"): shares within their pools,
/// proxies that are addresses or CIDR ranges, a known client-address header, one spelling of the
/// proxies. `serve` refuses what `check-config` refuses, with the same message.
#[test]
fn per_client_limits_and_trusted_proxies_are_checked() {
    let with = |server: &str| {
        GOOD.replace(
            "[[subscriptions]]",
            &format!("[server]\n{server}\n\n[[subscriptions]]"),
        )
    };
    let env = [("TB_TEST_SECRET", "s")];
    let good = "max_connections = 100\nmax_connections_per_client = 100\nmax_inflight_bodies_per_target = 8\nmax_inflight_bodies_per_client = 8\ntrusted_proxies = [\"10.0.0.0/8\", \"192.0.2.7\", \"2001:db8::/48\", \"10.1.2.3/16\"]\nclient_address_header = \"Forwarded\"";
    let (code, out) = check(&with(good), &env);
    assert_eq!(code, 0, "{out}");
    for (server, says) in [
        (
            "max_connections = 100\nmax_connections_per_client = 101",
            "[server].max_connections_per_client (101) must be between 1 and max_connections (100)",
        ),
        (
            "max_connections_per_client = 0",
            "[server].max_connections_per_client (0) must be between 1 and max_connections (512)",
        ),
        (
            "max_inflight_bodies_per_client = 17",
            "[server].max_inflight_bodies_per_client (17) must be between 1 and max_inflight_bodies_per_target (16)",
        ),
        (
            "max_inflight_bodies_per_target = 8\nmax_inflight_bodies_per_client = 0",
            "[server].max_inflight_bodies_per_client (0) must be between 1 and max_inflight_bodies_per_target (8)",
        ),
        (
            "trusted_proxies = [\"10.0.0.0/33\"]",
            "[server].trusted_proxies: \"10.0.0.0/33\" is not an address or a CIDR range (e.g. 10.0.0.0/8)",
        ),
        (
            "trusted_proxies = [\"proxy.internal\"]",
            "[server].trusted_proxies: \"proxy.internal\" is not an address or a CIDR range",
        ),
        (
            "client_address_header = \"x-real-ip\"",
            "[server].client_address_header = \"x-real-ip\": use \"x-forwarded-for\" or \"forwarded\"",
        ),
    ] {
        let (code, out) = check(&with(server), &env);
        assert_eq!(code, 1, "{server}: {out}");
        assert!(out.contains(says), "{server}: {out}");
    }
    // Both spellings of the proxies: refused, naming the one to keep.
    let both = format!(
        "[rate_limits]\ntrusted_proxies = [\"10.0.0.0/8\"]\n{}",
        with("trusted_proxies = [\"10.0.0.0/8\"]")
    );
    let (code, out) = check(&both, &env);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("[rate_limits].trusted_proxies and [server].trusted_proxies are both set"),
        "{out}"
    );
    // A default per-client share follows a small cap down (a quarter of it).
    let (code, out) = check(&with("max_connections = 8\nmax_inflight_bodies = 8"), &env);
    assert_eq!(code, 0, "{out}");
    // serve refuses the same file with the same words.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    std::fs::write(&p, with("trusted_proxies = [\"10.0.0.0/33\"]")).unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&p)
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("TB_TEST_SECRET", "s")
        .env_remove("TRIGGER_BRIDGE_API_KEY")
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("[server].trusted_proxies: \"10.0.0.0/33\" is not an address or a CIDR range"),
        "{err}"
    );
}

fn schedule_config(section: &str) -> String {
    format!(
        r#"
[[subscriptions]]
id = "nightly"
source = "schedule"
{section}

[[workflows]]
id = "noop"
executor = "noop"

[[bindings]]
id = "b"
subscription = "nightly"
event_types = ["schedule.tick"]
action = "start_run"
workflow = "noop"
inputs = {{ at = "schedule.nominal_time" }}
"#
    )
}

/// A schedule subscription is checked like the others, each problem named with its fix.
#[test]
fn schedule_subscriptions_are_checked() {
    let ok = schedule_config(
        "[subscriptions.schedule]\ncron = \"30 2 * * *\"\ntimezone = \"Europe/Berlin\"\nmissed = \"run_once\"\noverlap = \"buffer_one\"\nstart = \"2026-01-01T00:00:00Z\"",
    );
    let (code, out) = check(&ok, &[]);
    assert_eq!(code, 0, "{out}");
    for (section, says) in [
        ("", "source \"schedule\" needs a [subscriptions.schedule] table with cron"),
        ("[subscriptions.schedule]\ncron = \"* * *\"", "3 fields; use 5"),
        ("[subscriptions.schedule]\ncron = \"* * * * *\"\ntimezone = \"Berlin\"", "not an IANA time zone"),
        ("[subscriptions.schedule]\ncron = \"* * * * *\"\nstart = \"soon\"", "start: \"soon\" is not an RFC 3339 instant"),
        ("[subscriptions.schedule]\ncron = \"* * * * *\"\nmissed = \"later\"", "unknown variant `later`"),
        ("connector = \"github\"\nsecret = \"env:X\"\n[subscriptions.schedule]\ncron = \"* * * * *\"", "a schedule takes no connector"),
    ] {
        let (code, out) = check(&schedule_config(section), &[]);
        assert_eq!(code, 1, "{section}: {out}");
        assert!(out.contains(says), "{section}: wanted {says:?} in {out}");
    }
    // A binding on a schedule takes its one event type only; a window in the past never fires.
    let wrong_type = ok.replace(
        "event_types = [\"schedule.tick\"]",
        "event_types = [\"pull_request.opened\"]",
    );
    let (code, out) = check(&wrong_type, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("only event type is \"schedule.tick\""),
        "{out}"
    );
    let (code, out) = check(
        &schedule_config(
            "[subscriptions.schedule]\ncron = \"* * * * *\"\nend = \"2020-01-01T00:00:00Z\"",
        ),
        &[],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("no tick after now"), "{out}");
    // A binding on a schedule may only read the tick's fields.
    let bad_field = ok.replace("schedule.nominal_time", "repository.full_name");
    let (code, out) = check(&bad_field, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("schedule.nominal_time"),
        "the allowed fields are listed: {out}"
    );
}

/// A queue subscription is checked like the others.
#[test]
fn queue_subscriptions_are_checked() {
    let cfg = |section: &str| {
        format!(
            "[[subscriptions]]\nid = \"orders\"\nsource = \"queue\"\n{section}\n\n[[workflows]]\nid = \"noop\"\nexecutor = \"noop\"\n\n[[bindings]]\nid = \"b\"\nsubscription = \"orders\"\nevent_types = [\"queue.message\"]\naction = \"start_run\"\nworkflow = \"noop\"\nfilter = {{ type = [\"order.created\"] }}\n"
        )
    };
    let (code, out) = check(
        &cfg("[subscriptions.queue]\nstream = \"ORDERS\"\nsubjects = [\"orders.>\"]\ncreate_stream = true"),
        &[],
    );
    assert_eq!(code, 0, "{out}");
    let (code, out) = check(
        &format!(
            "[server]\nnats_url = \"http://127.0.0.1:4222\"\n{}",
            cfg("[subscriptions.queue]\nstream = \"ORDERS\"")
        ),
        &[],
    );
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("[server].nats_url: \"http://127.0.0.1:4222\" is not a NATS URL"),
        "{out}"
    );
    for (section, says) in [
        (
            "",
            "source \"queue\" needs a [subscriptions.queue] table with stream",
        ),
        (
            "[subscriptions.queue]\nstream = \"OR DERS\"",
            "stream \"OR DERS\": use 1 to 64",
        ),
        (
            "[subscriptions.queue]\nstream = \"S\"\ncreate_stream = true",
            "create_stream needs subjects",
        ),
        (
            "[subscriptions.queue]\nstream = \"S\"\nbatch = 10\nmax_ack_pending = 5",
            "max_ack_pending (5) must be at least batch (10)",
        ),
        (
            "dedup_window_s = 0\n[subscriptions.queue]\nstream = \"S\"",
            "dedup_window_s must be at least 1 for a queue",
        ),
        (
            "secret = \"env:X\"\n[subscriptions.queue]\nstream = \"S\"",
            "a queue takes no connector, secret",
        ),
    ] {
        let (code, out) = check(&cfg(section), &[]);
        assert_eq!(code, 1, "{section}: {out}");
        assert!(out.contains(says), "{section}: wanted {says:?} in {out}");
    }
}

/// `[limits]` and `[subscriptions.limits]` are read, and a bad value is named with its key.
#[test]
fn request_limits_are_checked_with_the_key_to_fix() {
    let with = |limits: &str, own: &str| {
        GOOD.replacen(
            "[[subscriptions]]",
            &format!("{limits}\n[[subscriptions]]"),
            1,
        )
        .replacen(
            "secret = \"env:TB_TEST_SECRET\"",
            &format!("secret = \"env:TB_TEST_SECRET\"\n{own}"),
            1,
        )
    };
    let ok = with(
        "[limits]\nmax_json_depth = 16\nmax_headers = 50",
        "[subscriptions.limits]\ncontent_encodings = [\"gzip\"]\nmax_decompression_ratio = 20",
    );
    let (code, out) = check(&ok, &[("TB_TEST_SECRET", "s")]);
    assert_eq!(code, 0, "{out}");
    for (limits, own, says) in [
        (
            "[limits]\nmax_json_fields = 0",
            "",
            "[limits]: max_json_fields must be at least 1",
        ),
        ("[limits]\nmax_json_depth = 500", "", "at most 128"),
        (
            "",
            "[subscriptions.limits]\nmax_headers = 1000",
            "max_headers is 1000; at most 256",
        ),
        (
            "",
            "[subscriptions.limits]\ncontent_encodings = [\"br\"]",
            "unknown coding \"br\"",
        ),
        ("[limits]\nmax_body = 1", "", "unknown field `max_body`"),
    ] {
        let (code, out) = check(&with(limits, own), &[("TB_TEST_SECRET", "s")]);
        assert_ne!(code, 0, "{limits} {own}: {out}");
        assert!(out.contains(says), "{limits} {own}: {out}");
    }
}

/// A worker URL naming a private address needs `allow_private = true`; `[rate_limits]` and
/// `[subscriptions.quarantine]` are read and checked.
#[test]
fn private_worker_addresses_rate_limits_and_quarantine_are_checked() {
    let envs = [
        ("TB_TEST_SECRET", "s3cret"),
        ("TB_TEST_WHSEC", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
    ];
    for url in [
        "http://127.0.0.1:9/run",
        "http://169.254.169.254/run",
        "http://[::1]/run",
    ] {
        let wf = HTTP_WORKFLOW
            .replace("allow_private = true\n", "")
            .replace("http://127.0.0.1:9/run", url);
        let (code, out) = check(&format!("{GOOD}{wf}"), &envs);
        assert_ne!(code, 0, "{url}: {out}");
        assert!(
            out.contains("a private, loopback, link-local or metadata address; if this worker is on your own network set allow_private = true"),
            "{url}: {out}"
        );
    }
    let named = HTTP_WORKFLOW
        .replace("allow_private = true\n", "")
        .replace("http://127.0.0.1:9/run", "http://localhost:9/run");
    let (code, out) = check(&format!("{GOOD}{named}"), &envs);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("names a local or metadata host; if this worker is on your own network set allow_private = true"),
        "{out}"
    );
    let ok = format!(
        "[rate_limits]\nglobal_per_min = 6000\nsource_per_min = 600\ntrusted_proxies = [\"10.0.0.0/8\", \"192.0.2.1\"]\n{}",
        GOOD.replacen(
            "secret = \"env:TB_TEST_SECRET\"",
            "secret = \"env:TB_TEST_SECRET\"\n[subscriptions.quarantine]\nrefusals_per_min = 600\nminutes = 5",
            1
        )
    );
    let (code, out) = check(&ok, &envs);
    assert_eq!(code, 0, "{out}");
    for (bad, says) in [
        (
            ok.replace("\"192.0.2.1\"", "\"not-an-address\""),
            "[rate_limits].trusted_proxies: \"not-an-address\" is not an address or a CIDR range",
        ),
        (
            ok.replace("minutes = 5", "minutes = 0"),
            "[subscriptions.quarantine] minutes 0 is out of range; use 1 to 60",
        ),
        (
            ok.replace("source_per_min = 600", "per_ip = 600"),
            "unknown field `per_ip`",
        ),
    ] {
        let (code, out) = check(&bad, &envs);
        assert_ne!(code, 0, "{bad}: {out}");
        assert!(out.contains(says), "{says}: {out}");
    }
}

/// `[subscriptions.rotation]` takes the previous secret and an end at most 30 days away.
#[test]
fn a_secret_rotation_is_checked_with_the_fix_named() {
    let soon = (chrono::Utc::now() + chrono::Duration::days(7)).to_rfc3339();
    let with = |previous: &str, until: &str| {
        GOOD.replacen(
            "secret = \"env:TB_TEST_SECRET\"",
            &format!("secret = \"env:TB_TEST_SECRET\"\n[subscriptions.rotation]\nprevious_secret = \"{previous}\"\nuntil = \"{until}\""),
            1,
        )
    };
    let envs = [
        ("TB_TEST_SECRET", "new-secret"),
        ("TB_TEST_OLD", "old-secret"),
    ];
    let (code, out) = check(&with("env:TB_TEST_OLD", &soon), &envs);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!(
            "note: subscriptions[0] (gh): the previous secret is accepted until {soon}"
        )),
        "{out}"
    );
    // An ended rotation is a note, not an error: a server restarted after `until` starts.
    let (code, out) = check(&with("env:TB_TEST_OLD", "2020-01-01T00:00:00Z"), &envs);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("[subscriptions.rotation] ended at 2020-01-01T00:00:00Z: the previous secret is no longer accepted; remove the section"),
        "{out}"
    );
    let far = (chrono::Utc::now() + chrono::Duration::days(31)).to_rfc3339();
    for (previous, until, says) in [
        (
            "env:TB_TEST_OLD",
            far.as_str(),
            "more than 30 days from now",
        ),
        ("env:TB_TEST_OLD", "next week", "is not an RFC 3339 time"),
        (
            "env:TB_TEST_SECRET",
            soon.as_str(),
            "previous_secret is the same as secret",
        ),
        (
            "env:TB_TEST_MISSING",
            soon.as_str(),
            "environment variable TB_TEST_MISSING is not set",
        ),
    ] {
        let (code, out) = check(&with(previous, until), &envs);
        assert_ne!(code, 0, "{previous} {until}: {out}");
        assert!(
            out.contains("[subscriptions.rotation]") && out.contains(says),
            "{says}: {out}"
        );
    }
}

/// OpenWOP settings of the config file reach the engine: `fixture = true` workflows are advertised
/// fixtures, an http workflow's `non_retryable_statuses` (default `[410]`) is its executor's, and
/// `[[api_keys]] tenants` (default `["default"]`) is the key's; bad values are refused by name.
#[test]
fn fixtures_non_retryable_statuses_and_key_tenants_reach_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("gh.secret"), "s3cret").unwrap();
    std::fs::write(
        dir.path().join("worker.secret"),
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    )
    .unwrap();
    let sha = |c: char| c.to_string().repeat(64);
    let toml = format!(
        r#"{good}
[[workflows]]
id = "conformance-idempotent"
executor = "noop"
fixture = true

[[workflows]]
id = "worker"
executor = "http"
url = "http://127.0.0.1:9/run"
allow_private = true
secret = "file:worker.secret"
non_retryable_statuses = [404, 410]

[[workflows]]
id = "default-worker"
executor = "http"
url = "http://127.0.0.1:9/run"
allow_private = true
secret = "file:worker.secret"

[[api_keys]]
name = "a"
sha256 = "{a}"
tenants = ["a", "b"]

[[api_keys]]
name = "d"
sha256 = "{d}"
"#,
        good = GOOD.replace("env:TB_TEST_SECRET", "file:gh.secret"),
        a = sha('a'),
        d = sha('d'),
    );
    let p = dir.path().join("c.toml");
    std::fs::write(&p, &toml).unwrap();
    let loaded = trigger_bridge::config::load(&p).unwrap_or_else(|e| panic!("{e:?}"));
    let (_, catalog, keys) = loaded.into_catalog();
    assert_eq!(
        catalog.fixtures(),
        ["conformance-noop", "conformance-idempotent"]
    );
    let statuses = |id: &str| match &catalog.workflow(id).unwrap().executor {
        tb_core::workflow::Executor::Http {
            non_retryable_statuses,
            ..
        } => non_retryable_statuses.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(statuses("worker"), vec![404, 410]);
    assert_eq!(statuses("default-worker"), vec![410]);
    let tenants = |name: &str| {
        keys.iter()
            .find(|k| k.name == name)
            .map(|k| k.tenants.clone())
            .unwrap()
    };
    assert_eq!(tenants("a"), vec!["a", "b"]);
    assert_eq!(tenants("d"), vec!["default"]);

    let envs = [
        ("TB_TEST_SECRET", "s3cret"),
        ("TB_TEST_WHSEC", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
    ];
    for (bad, says) in [
        (
            format!("{GOOD}{HTTP_WORKFLOW}non_retryable_statuses = [410, 202]\n"),
            "workflows[1] (worker): non_retryable_statuses: 202 is not a failure status (300 to 599)",
        ),
        (
            GOOD.replace("executor = \"noop\"", "executor = \"noop\"\nnon_retryable_statuses = [410]"),
            "workflows[0] (noop): non_retryable_statuses applies to the http executor only",
        ),
        (
            format!("{GOOD}\n[[api_keys]]\nname = \"x\"\nsha256 = \"{}\"\ntenants = [\"\"]\n", sha('e')),
            "api_keys[0] (x): tenant \"\" must be * or 1 to 128 visible ASCII characters",
        ),
    ] {
        let (code, out) = check(&bad, &envs);
        assert_ne!(code, 0, "{out}");
        assert!(out.contains(says), "{says}: {out}");
    }
}
