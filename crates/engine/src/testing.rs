//! Test support shared by the engine's and the binary's tests: a private nats-server with
//! JetStream on a free port and its own store directory, which a test can kill and start again
//! (the machine's shared server cannot be). Not used by the server itself.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where the nats-server binary is (Debian package `nats-server`).
pub const NATS_SERVER: &str = "/usr/sbin/nats-server";

/// A private nats-server, killed (and its store directory removed) on drop.
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

impl NatsServer {
    /// Starts one and waits (at most 10 s) until it listens. `None`, with the reason printed, when
    /// the binary is missing; under `CI` that panics instead, so CI never passes by skipping.
    pub fn start() -> Option<NatsServer> {
        if !std::path::Path::new(NATS_SERVER).exists() {
            let why = format!("{NATS_SERVER} not found (Debian package nats-server)");
            assert!(std::env::var_os("CI").is_none(), "{why}");
            eprintln!("skipping NATS test: {why}");
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let dir = std::env::temp_dir().join(format!("tb-nats-{}-{port}", std::process::id()));
        let mut n = NatsServer {
            child: None,
            port,
            dir,
        };
        n.restart();
        Some(n)
    }

    /// Starts the server again (after [`NatsServer::kill`]) on the same port and store directory,
    /// and waits until it listens.
    pub fn restart(&mut self) {
        let child = Command::new(NATS_SERVER)
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server did not listen within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
