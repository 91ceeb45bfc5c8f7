//! Start-up and command-line surface: one server per data dir, host-name
//! listen addresses and `--listen` over the config, `migrate` on the config's data dir, client options
//! before the command group.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_trigger-bridge");
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn write_config(dir: &Path, server: &str) -> std::path::PathBuf {
    let p = dir.join("c.toml");
    std::fs::write(
        &p,
        format!(
            "[server]\n{server}\n\n[[subscriptions]]\nid = \"sw\"\nconnector = \"standard-webhooks\"\nsecret = \"env:STANDARD_WEBHOOK_SECRET\"\n"
        ),
    )
    .unwrap();
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn serve(cfg: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(["serve", "--config"])
        .arg(cfg)
        .args(args)
        .env("STANDARD_WEBHOOK_SECRET", SECRET)
        .env_remove("TRIGGER_BRIDGE_LISTEN")
        .env_remove("TRIGGER_BRIDGE_DATA_DIR")
        .env("RUST_LOG", "warn");
    c
}

/// Waits (at most 10 s) until `url` answers 200.
fn healthy(url: &str) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let http = reqwest::Client::new();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10) {
            if let Ok(r) = http.get(url).timeout(Duration::from_secs(1)).send().await {
                if r.status() == 200 {
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        false
    })
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).to_string() + &String::from_utf8_lossy(&o.stdout)
}

#[test]
fn a_second_server_on_the_same_data_dir_is_refused_naming_the_dir_and_pid() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = write_config(
        dir.path(),
        &format!("data_dir = {:?}", data.display().to_string()),
    );
    let p1 = free_port();
    let first = Killed(
        serve(&cfg, &["--listen", &format!("127.0.0.1:{p1}")])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(healthy(&format!("http://127.0.0.1:{p1}/health")));
    // A new data dir (and its secrets) is the owner's only: it holds raw bodies and secrets.
    #[cfg(unix)]
    for d in [data.clone(), data.join("secrets")] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", d.display());
    }
    let p2 = free_port();
    let second = serve(&cfg, &["--listen", &format!("127.0.0.1:{p2}")])
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(2), "{}", text(&second));
    let out = text(&second);
    assert!(
        out.contains(&format!(
            "data dir {} is in use by another process (pid {})",
            data.display(),
            first.0.id()
        )),
        "{out}"
    );
    // migrate is refused too while the server runs.
    let m = Command::new(BIN)
        .args(["migrate", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert_eq!(m.status.code(), Some(2), "{}", text(&m));
    assert!(
        text(&m).contains("is in use by another process"),
        "{}",
        text(&m)
    );
    // The first server still serves.
    assert!(healthy(&format!("http://127.0.0.1:{p1}/health")));
}

#[test]
fn listen_takes_a_host_name_with_a_port() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = write_config(dir.path(), &format!("listen = \"localhost:{port}\""));
    let _s = Killed(
        serve(
            &cfg,
            &["--data-dir", dir.path().join("d").to_str().unwrap()],
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap(),
    );
    assert!(healthy(&format!("http://localhost:{port}/health")));
}

#[test]
fn listen_flag_overrides_an_invalid_config_value() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let cfg = write_config(dir.path(), "listen = \"not an address\"");
    let _s = Killed(
        serve(
            &cfg,
            &[
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--data-dir",
                dir.path().join("d").to_str().unwrap(),
            ],
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap(),
    );
    assert!(healthy(&format!("http://127.0.0.1:{port}/health")));
}

#[test]
fn migrate_uses_the_config_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("configured-store");
    let cfg = write_config(
        dir.path(),
        &format!("data_dir = {:?}", data.display().to_string()),
    );
    let out = Command::new(BIN)
        .args(["migrate", "--config"])
        .arg(&cfg)
        .env_remove("TRIGGER_BRIDGE_DATA_DIR")
        .env_remove("STANDARD_WEBHOOK_SECRET")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let db = data.join("trigger-bridge.db");
    assert!(
        text(&out).contains(&format!("store {} is at schema version", db.display())),
        "{}",
        text(&out)
    );
    assert!(db.is_file());
    assert!(
        !dir.path().join("data").exists(),
        "./data must not be created"
    );
}

#[test]
fn client_options_are_accepted_before_the_command_group() {
    for args in [
        &["--server", "http://127.0.0.1:1", "runs", "list"][..],
        &["runs", "--server", "http://127.0.0.1:1", "list"][..],
        &[
            "--json",
            "--server",
            "http://127.0.0.1:1",
            "receipts",
            "list",
        ][..],
    ] {
        let out = Command::new(BIN)
            .args(args)
            .env_remove("TRIGGER_BRIDGE_SERVER")
            .output()
            .unwrap();
        let t = text(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {t}");
        assert!(
            t.contains("cannot reach http://127.0.0.1:1"),
            "{args:?} was not parsed: {t}"
        );
    }
}
