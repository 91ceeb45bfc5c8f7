//! The console and the audit log through the real binary: login, the cookie's
//! attributes, a read-only key that sees no mutating control and cannot act, a form post without the
//! CSRF token refused with nothing changed, a confirmation before a pause, every action in the audit
//! log, and `audit list --verify` failing on a row edited in the database by hand. (The browser
//! tests under tests/browser drive the same pages in Chromium.)

use std::process::Command;

use sha2::{Digest, Sha256};

mod common;

use common::*;

const OPS_KEY: &str = "ops-key-0123456789";
const VIEW_KEY: &str = "viewer-key-0123456789";

fn config(dir: &std::path::Path) -> std::path::PathBuf {
    let h = |k: &str| hex::encode(Sha256::digest(k.as_bytes()));
    let cfg = format!(
        r#"
[[api_keys]]
name = "ops"
sha256 = "{}"
scopes = ["*"]

[[api_keys]]
name = "viewer"
sha256 = "{}"
scopes = ["operator:read", "audit:read"]

[[subscriptions]]
id = "github"
source = "webhook"
connector = "github"
secret = "env:GITHUB_WEBHOOK_SECRET"

[[workflows]]
id = "noop"
executor = "noop"

[[bindings]]
id = "pr-opened"
subscription = "github"
event_types = ["pull_request.opened"]
action = "start_run"
workflow = "noop"
"#,
        h(OPS_KEY),
        h(VIEW_KEY)
    );
    let p = dir.join("console.toml");
    std::fs::write(&p, cfg).unwrap();
    p
}

/// A blocking face over the async client (the harness is synchronous): no redirects followed, no
/// cookie jar (each call names its cookie).
struct Browser {
    rt: tokio::runtime::Runtime,
    inner: reqwest::Client,
    base: String,
}

struct Answer {
    status: reqwest::StatusCode,
    headers: reqwest::header::HeaderMap,
    text: String,
}

impl Answer {
    fn status(&self) -> reqwest::StatusCode {
        self.status
    }
    fn headers(&self) -> &reqwest::header::HeaderMap {
        &self.headers
    }
    fn text(self) -> Result<String, ()> {
        Ok(self.text)
    }
}

fn browser(base: &str) -> Browser {
    Browser {
        rt: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
        inner: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .unwrap(),
        base: base.to_string(),
    }
}

impl Browser {
    fn send(&self, r: reqwest::RequestBuilder) -> Answer {
        self.rt.block_on(async {
            let r = r.send().await.unwrap();
            Answer {
                status: r.status(),
                headers: r.headers().clone(),
                text: r.text().await.unwrap(),
            }
        })
    }
    fn get_raw(&self, path: &str, cookie: Option<&str>) -> Answer {
        let mut r = self.inner.get(format!("{}{path}", self.base));
        if let Some(c) = cookie {
            r = r.header("cookie", c);
        }
        self.send(r)
    }
    fn post_raw(&self, path: &str, form: &[(&str, &str)]) -> Answer {
        self.send(self.inner.post(format!("{}{path}", self.base)).form(form))
    }

    /// Logs in with `key`; returns the cookie header value and the page's CSRF token.
    fn login(&self, key: &str) -> (String, String) {
        let r = self.post_raw("/ui/login", &[("key", key), ("next", "/ui/subscriptions")]);
        assert_eq!(r.status().as_u16(), 303, "login with a known key redirects");
        assert_eq!(r.headers()["location"], "/ui/subscriptions");
        let set = r.headers()["set-cookie"].to_str().unwrap().to_string();
        for attr in ["HttpOnly", "SameSite=Strict", "Path=/ui", "Max-Age=43200"] {
            assert!(set.contains(attr), "{attr} missing in {set}");
        }
        assert!(
            !set.contains("Secure"),
            "plain HTTP: no Secure attribute ({set})"
        );
        let cookie = set.split(';').next().unwrap().to_string();
        let page = self.get(&cookie, "/ui/subscriptions");
        let csrf = page
            .split("data-csrf=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .unwrap()
            .to_string();
        assert_eq!(csrf.len(), 32);
        (cookie, csrf)
    }

    fn get(&self, cookie: &str, path: &str) -> String {
        let r = self.get_raw(path, Some(cookie));
        assert_eq!(r.status().as_u16(), 200, "GET {path}");
        r.text().unwrap()
    }

    fn post(&self, cookie: &str, path: &str, form: &[(&str, &str)]) -> (u16, String) {
        let r = self.send(
            self.inner
                .post(format!("{}{path}", self.base))
                .header("cookie", cookie)
                .form(form),
        );
        (r.status().as_u16(), r.text().unwrap())
    }
}

fn audit(base: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(["audit", "list", "--server", base, "--api-key", OPS_KEY])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn login_scopes_csrf_confirmation_and_a_verified_audit_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = Server::spawn(&config(dir.path()), &data, free_port());
    let b = browser(&s.base);

    // No login: a page sends to the login form, keeping where it was going; a form post is refused.
    let r = b.get_raw("/ui/receipts?state=consumed", None);
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(
        r.headers()["location"],
        "/ui/login?next=/ui/receipts%3Fstate%3Dconsumed"
    );
    let r = b.post_raw("/ui/login", &[("key", "nope"), ("next", "/ui")]);
    assert_eq!(
        r.status().as_u16(),
        401,
        "an unknown key gets the form again"
    );
    assert!(r.text().unwrap().contains("not an API key of this server"));

    // The read-only key sees state but no mutating control, and cannot act even with its token.
    let (view, view_csrf) = b.login(VIEW_KEY);
    let page = b.get(&view, "/ui/subscriptions");
    assert!(page.contains("data-subscription=\"github\""), "{page}");
    assert!(page.contains("(read-only)"));
    assert!(
        !page.contains("Pause…") && !page.contains("Resume…"),
        "no mutating control for a read-only key"
    );
    let dl = b.get(&view, "/ui/dead-letters");
    assert!(!dl.contains("Replay selected") && !dl.contains("name=\"ids\""));
    let (code, body) = b.post(
        &view,
        "/ui/subscriptions/github/pause",
        &[("csrf", &view_csrf), ("confirmed", "yes")],
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("lacks the scope operator:write"));
    let r = b.get_raw(
        "/ui/receipts/rcpt_00000000000000000000000000000000/body",
        Some(&view),
    );
    assert_eq!(r.status().as_u16(), 403, "bodies need operator:bodies");

    // The operator: a forged post (no token, or another login's token) changes nothing.
    let (ops, ops_csrf) = b.login(OPS_KEY);
    assert!(b.get(&ops, "/ui/subscriptions").contains("Pause…"));
    let (code, body) = b.post(
        &ops,
        "/ui/subscriptions/github/pause",
        &[("confirmed", "yes")],
    );
    assert_eq!(code, 403);
    assert!(body.contains("csrf_failed"), "{body}");
    let (code, _) = b.post(
        &ops,
        "/ui/subscriptions/github/pause",
        &[("csrf", &view_csrf), ("confirmed", "yes")],
    );
    assert_eq!(code, 403, "another login's token is not this one's");
    assert!(
        b.get(&ops, "/ui/subscriptions/github").contains(">active<"),
        "still active"
    );

    // Without confirmation the pause only asks, saying what will happen.
    let (code, body) = b.post(
        &ops,
        "/ui/subscriptions/github/pause",
        &[("csrf", &ops_csrf)],
    );
    assert_eq!(code, 200);
    assert!(
        body.contains("Yes, pause github") && body.contains("409 subscription_not_active"),
        "{body}"
    );
    assert!(
        b.get(&ops, "/ui/subscriptions/github").contains(">active<"),
        "asking changed nothing"
    );
    let (code, body) = b.post(
        &ops,
        "/ui/subscriptions/github/pause",
        &[("csrf", &ops_csrf), ("confirmed", "yes")],
    );
    assert_eq!(code, 200);
    assert!(body.contains("github is now paused"), "{body}");
    let (code, body) = b.post(
        &ops,
        "/ui/subscriptions/github/resume",
        &[("csrf", &ops_csrf), ("confirmed", "yes")],
    );
    assert_eq!(code, 200);
    assert!(body.contains("github is now active"), "{body}");
    let (code, _) = b.post(&ops, "/ui/logout", &[("csrf", &ops_csrf)]);
    assert_eq!(code, 303);
    let r = b.get_raw("/ui", Some(&ops));
    assert_eq!(r.status().as_u16(), 303, "a logged-out cookie is no login");

    // The audit log has every action, newest first, and its chain verifies.
    let (code, out, err) = audit(&s.base, &["--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows: Vec<(String, String, String, String)> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let f = |k: &str| e[k].as_str().unwrap().to_string();
            (f("actor"), f("action"), f("target"), f("outcome"))
        })
        .collect();
    let r = |a: &str, b: &str, c: &str, d: &str| {
        (a.to_string(), b.to_string(), c.to_string(), d.to_string())
    };
    assert_eq!(
        rows[..5],
        [
            r("ops", "console.logout", "", "ok"),
            r("ops", "subscription.resume", "github", "ok"),
            r("ops", "subscription.pause", "github", "ok"),
            r("ops", "console.login", "", "ok"),
            r("viewer", "console.login", "", "ok"),
        ]
    );
    assert_eq!(rows.last().unwrap().1, "config.load");
    assert_eq!(v["entries"][1]["detail"]["via"], "console");
    // Login and logout are recorded with the status they were answered with: a 303 to the console.
    assert_eq!(v["entries"][0]["detail"]["status"], 303);
    assert_eq!(v["entries"][3]["detail"]["status"], 303);
    let (code, out, err) = audit(&s.base, &["--verify"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("audit log verified: 6 entries"), "{out}");

    // An unknown record is a 404 page, and an unknown run's page offers no form.
    let (ops2, _) = b.login(OPS_KEY);
    let r = b.get_raw("/ui/runs/run_00000000000000000000000000000000", Some(&ops2));
    assert_eq!(r.status().as_u16(), 404);
    assert!(!r.text().unwrap().contains("Raise…"));
    let r = b.get_raw(
        "/ui/receipts/rcpt_00000000000000000000000000000000",
        Some(&ops2),
    );
    assert_eq!(r.status().as_u16(), 404);
    // A crafted id cannot climb out of its path segment in a form's action.
    let r = b.get_raw(
        "/ui/runs/run_x%2F..%2F..%2Fsubscriptions%2Fgithub%2Fpause%3F",
        Some(&ops2),
    );
    assert_eq!(r.status().as_u16(), 404);
    let page = r.text().unwrap();
    assert!(!page.contains("action=\"/ui/runs/run_x/"), "{page}");
    // The id stays one encoded segment in the live region's address.
    assert!(
        page.contains("hx-get=\"/ui/runs/run_x%2F..%2F..%2Fsubscriptions%2Fgithub%2Fpause%3F\""),
        "{page}"
    );

    // The same key name with another key (a rotation) ends the old key's logins.
    let cfg = std::fs::read_to_string(&s.config).unwrap();
    let rotated = cfg.replace(
        &hex::encode(Sha256::digest(OPS_KEY.as_bytes())),
        &hex::encode(Sha256::digest(b"ops-key-rotated-000")),
    );
    std::fs::write(&s.config, rotated).unwrap();
    let mut s = s;
    s.kill9();
    s.restart();
    let b = browser(&s.base);
    let r = b.get_raw("/ui", Some(&ops2));
    assert_eq!(r.status().as_u16(), 303, "a rotated key's login is over");
    std::fs::write(&s.config, cfg).unwrap();
    s.kill9();
    s.restart();
    let b = browser(&s.base);
    let r = b.get_raw("/ui", Some(&ops2));
    assert_eq!(
        r.status().as_u16(),
        303,
        "putting the old key back does not revive its login"
    );

    // Someone with the database file edits an entry by hand (dropping the guard first).
    let db = rusqlite::Connection::open(data.join("trigger-bridge.db")).unwrap();
    let refused = db.execute(
        "UPDATE audit_log SET actor = 'someone-else' WHERE action = 'subscription.pause'",
        [],
    );
    assert!(refused.unwrap_err().to_string().contains("append-only"));
    db.execute_batch("DROP TRIGGER audit_log_no_update; UPDATE audit_log SET actor = 'someone-else' WHERE action = 'subscription.pause';").unwrap();
    let seq: i64 = db
        .query_row(
            "SELECT seq FROM audit_log WHERE action = 'subscription.pause'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let (code, out, err) = audit(&s.base, &["--verify"]);
    assert_eq!(code, 1, "{out} {err}");
    assert!(err.contains(&format!("entry {seq} was edited")), "{err}");
}

#[test]
fn an_open_console_makes_one_login_and_live_streams_are_capped_per_login() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // The same configuration without its keys: the console is open (loopback).
    let cfg = std::fs::read_to_string(config(dir.path())).unwrap();
    let open: String = cfg
        .split("[[subscriptions]]")
        .skip(1)
        .collect::<Vec<_>>()
        .join("[[subscriptions]]");
    let path = dir.path().join("open.toml");
    std::fs::write(&path, format!("[[subscriptions]]{open}")).unwrap();
    let s = Server::spawn(&path, &data, free_port());
    let b = browser(&s.base);
    // Cookieless visits share the one anonymous login: one row, one cookie.
    let mut cookies = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let r = b.get_raw("/ui", None);
        assert_eq!(r.status().as_u16(), 200);
        cookies.insert(
            r.headers()["set-cookie"]
                .to_str()
                .unwrap()
                .split(';')
                .next()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(cookies.len(), 1, "{cookies:?}");
    let db = rusqlite::Connection::open(data.join("trigger-bridge.db")).unwrap();
    let rows: i64 = db
        .query_row("SELECT COUNT(*) FROM console_logins", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 1);
    // One login holds at most 8 live streams; a closed one gives its place back.
    let cookie = cookies.into_iter().next().unwrap();
    let open_stream = || {
        b.rt.block_on(
            b.inner
                .get(format!("{}/ui/events", s.base))
                .header("cookie", &cookie)
                .send(),
        )
        .unwrap()
    };
    let mut streams: Vec<reqwest::Response> = (0..8).map(|_| open_stream()).collect();
    assert!(streams.iter().all(|r| r.status().as_u16() == 200));
    assert_eq!(
        open_stream().status().as_u16(),
        429,
        "the ninth stream of one login"
    );
    drop(streams.pop());
    let again = tokio::time::Duration::from_millis(20);
    let mut status = 0;
    for _ in 0..100 {
        status = open_stream().status().as_u16();
        if status == 200 {
            break;
        }
        std::thread::sleep(again);
    }
    assert_eq!(status, 200, "a closed stream gives its place back");
}
