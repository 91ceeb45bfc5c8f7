//! Shared harness of the binary's end-to-end tests: the server as a child process on a free port,
//! SIGKILL and restart, and blocking JSON GET / POST helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_trigger-bridge");
pub const GH_SECRET: &str = "e2e-github-secret";
pub const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn fixtures() -> PathBuf {
    let p = repo().join("tests/fixtures");
    assert!(
        p.is_dir(),
        "fixtures not found at {} (the repo's tests/fixtures)",
        p.display()
    );
    p
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub struct Server {
    pub child: Child,
    pub base: String,
    pub config: PathBuf,
    pub data: PathBuf,
    pub port: u16,
}

impl Server {
    pub fn spawn(config: &Path, data: &Path, port: u16) -> Server {
        let child = Command::new(BIN)
            .args(["serve", "--config"])
            .arg(config)
            .args(["--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
            .arg(data)
            .env("GITHUB_WEBHOOK_SECRET", GH_SECRET)
            .env("STANDARD_WEBHOOK_SECRET", SW_SECRET)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn server");
        let s = Server {
            child,
            base: format!("http://127.0.0.1:{port}"),
            config: config.into(),
            data: data.into(),
            port,
        };
        for _ in 0..200 {
            if ureq_get(&format!("{}/health", s.base)).is_some() {
                return s;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("server did not become healthy on {}", s.base);
    }

    pub fn kill9(&mut self) {
        self.child.kill().unwrap(); // SIGKILL on unix
        self.child.wait().unwrap();
    }

    pub fn restart(&mut self) {
        *self = Server::spawn(&self.config.clone(), &self.data.clone(), self.port);
    }

    pub fn get(&self, path: &str) -> Value {
        ureq_get(&format!("{}{path}", self.base)).unwrap_or_else(|| panic!("GET {path} failed"))
    }

    pub fn wait_for(&self, path: &str, f: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..600 {
            let v = self.get(path);
            if f(&v) {
                return v;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("condition on {path} not reached; last: {}", self.get(path))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Minimal blocking GET through the CLI's own HTTP stack would be overkill; use a tiny tokio runtime.
pub fn ureq_get(url: &str) -> Option<Value> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let r = reqwest::Client::new()
            .get(url)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .ok()?;
        r.json::<Value>().await.ok()
    })
}

/// Blocking JSON POST: (status, body or `Null`).
pub fn post(url: &str, body: &Value) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let r = reqwest::Client::new()
            .post(url)
            .json(body)
            .timeout(Duration::from_secs(15))
            .send()
            .await
            .expect("POST");
        let st = r.status().as_u16();
        (st, r.json::<Value>().await.unwrap_or(Value::Null))
    })
}

/// Blocking GET of a text body (e.g. `/metrics`).
pub fn get_text(url: &str) -> String {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        reqwest::Client::new()
            .get(url)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .expect("GET")
            .text()
            .await
            .expect("body")
    })
}

impl Server {
    /// `POST {base}{path}` with a JSON body.
    pub fn post(&self, path: &str, body: Value) -> (u16, Value) {
        post(&format!("{}{path}", self.base), &body)
    }
}
