//! The console's front door (docs/console.md, "Login" and "Live pages"; docs/limits.md "Wrong API
//! keys"): wrong keys at the login form are throttled per client address together with the API's
//! bearer checks; a login posted from another site is refused; every answer says `nosniff` and every
//! page forbids `<base>`; `next=` cannot leave `/ui` by encoded dot segments; bidirectional controls in
//! free text are shown, not obeyed; one API key cannot hold every live-page stream.
//!
//! The server runs in this process (API and console routers over one engine and a SQLite store),
//! with the peer address as `serve` gives it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use serde_json::json;
use tb_api::auth::ApiKey;
use tb_core::connector::ConnectorSpec;
use tb_engine::{Catalog, Engine, SubscriptionConfig};
use tb_store::sqlite::SqliteStore;
use tb_store::Store;

const OPS_KEY: &str = "ops-key-0123456789abcdef";
const VIEW_KEY: &str = "viewer-key-0123456789abcdef";
const OTHER_VIEW_KEY: &str = "other-viewer-key-0123456789";

struct Server {
    base: String,
    addr: SocketAddr,
    engine: Arc<Engine>,
    _dir: tempfile::TempDir,
}

async fn start() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_dir(dir.path()).unwrap());
    let sub = SubscriptionConfig::webhook("github", ConnectorSpec::Github, b"gh-secret");
    let engine = Engine::start(store, Catalog::new(vec![sub], vec![], vec![]))
        .await
        .unwrap();
    let read = |name: &str, key: &str| ApiKey {
        scopes: vec!["operator:read".into()],
        ..ApiKey::full_scope(name, key)
    };
    let keys = vec![
        ApiKey::full_scope("ops", OPS_KEY),
        read("viewer", VIEW_KEY),
        read("other-viewer", OTHER_VIEW_KEY),
    ];
    let state = tb_api::AppState {
        engine: engine.clone(),
        metrics: None,
        host: Default::default(),
        keys: tb_api::auth::ApiKeys(Arc::new(keys)),
        secrets: None,
    };
    let app = tb_api::router(state.clone()).merge(trigger_bridge_console::router(state));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Server {
        base: format!("http://{addr}"),
        addr,
        engine,
        _dir: dir,
    }
}

/// A client from `127.0.0.<last>` that follows no redirect.
fn client(last: u8) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(IpAddr::V4(Ipv4Addr::new(127, 0, 0, last)))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// `POST /ui/login` with `key` and `next`, plus `headers`.
async fn login(
    s: &Server,
    c: &reqwest::Client,
    key: &str,
    next: &str,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = c
        .post(format!("{}/ui/login", s.base))
        .form(&[("key", key), ("next", next)]);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

/// The login cookie of a successful login (`name=value`).
fn cookie(r: &reqwest::Response) -> String {
    assert_eq!(r.status().as_u16(), 303, "a login answers 303");
    r.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string()
}

/// Before: about 3 900 wrong keys a second from one client, all 401, no metric, no log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_keys_at_the_login_form_are_throttled_per_address_with_the_api_s() {
    let s = start().await;
    s.engine.set_failed_keys_limit(4);
    let (a, b) = (client(1), client(2));
    // Two wrong bearer keys to the API and two wrong keys at the form: one budget per address.
    for i in 0..2 {
        let r = a
            .get(format!("{}/v1/receipts", s.base))
            .bearer_auth(format!("guess-api-{i}"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 401);
        let r = login(&s, &a, &format!("guess-form-{i}"), "/ui", &[]).await;
        assert_eq!(r.status().as_u16(), 401);
    }
    // The fifth is refused unchecked; so is the right key (else the answer would tell it apart).
    for key in ["guess-form-5", OPS_KEY] {
        let r = login(&s, &a, key, "/ui", &[]).await;
        assert_eq!(r.status().as_u16(), 429, "{key}");
        assert!(r.headers().get("set-cookie").is_none());
        let wait: u64 = r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=60).contains(&wait));
        assert!(r.text().await.unwrap().contains("Too many wrong keys"));
    }
    // The API refuses the address too.
    let r = a
        .get(format!("{}/v1/receipts", s.base))
        .bearer_auth(OPS_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    // Another address logs in.
    let r = login(&s, &b, OPS_KEY, "/ui", &[]).await;
    assert_eq!(r.status().as_u16(), 303);
}

/// Before: a form on any site could log a victim's browser into the console with the attacker's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_posted_from_another_site_is_refused() {
    let s = start().await;
    let c = client(1);
    let host = s.addr.to_string();
    let evil = [("origin", "https://evil.example")];
    let r = login(&s, &c, OPS_KEY, "/ui", &evil).await;
    assert_eq!(r.status().as_u16(), 403);
    assert!(r.headers().get("set-cookie").is_none());
    assert!(r.text().await.unwrap().contains("cross_site_refused"));
    let r = login(&s, &c, OPS_KEY, "/ui", &[("sec-fetch-site", "cross-site")]).await;
    assert_eq!(r.status().as_u16(), 403);
    // The console's own form: same origin.
    let own = format!("http://{host}");
    let r = login(&s, &c, OPS_KEY, "/ui", &[("origin", &own)]).await;
    let jar = cookie(&r);
    let r = login(&s, &c, OPS_KEY, "/ui", &[("sec-fetch-site", "same-origin")]).await;
    assert_eq!(r.status().as_u16(), 303);
    // A logged-in form from another site is refused before its CSRF token is even read.
    let r = c
        .post(format!("{}/ui/logout", s.base))
        .header("cookie", &jar)
        .header("origin", "https://evil.example")
        .form(&[("csrf", "whatever")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert!(r.text().await.unwrap().contains("cross_site_refused"));
}

/// Before: `next=/ui/.%2e/.%2e/v1/...` was followed out of the console.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_cannot_leave_the_console_by_encoded_dot_segments() {
    let s = start().await;
    let c = client(1);
    for (next, to) in [
        ("/ui/.%2e/.%2e/v1/runs", "/ui"),
        ("/ui/%2e%2E/v1/runs", "/ui"),
        ("/ui/%2e./%2e./metrics", "/ui"),
        ("/ui/receipts/../runs", "/ui/runs"),
        ("/ui/receipts?state=consumed", "/ui/receipts?state=consumed"),
    ] {
        let r = login(&s, &c, OPS_KEY, next, &[]).await;
        assert_eq!(r.status().as_u16(), 303, "{next}");
        assert_eq!(r.headers()["location"], to, "{next}");
    }
    // The login page keeps only a safe `next` in its form.
    let page = c
        .get(format!(
            "{}/ui/login?next=/ui/.%252e/.%252e/v1/runs",
            s.base
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(r#"name="next" value="/ui""#), "{page}");
}

/// Before: no `nosniff` anywhere and no `base-uri` in the policy; a U+202E in a quarantine reason
/// reversed the text after it on the subscription page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_say_nosniff_and_free_text_shows_its_bidi_controls() {
    let s = start().await;
    let c = client(1);
    let login_page = c.get(format!("{}/ui/login", s.base)).send().await.unwrap();
    let csp = login_page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(csp.contains("base-uri 'none'"), "{csp}");
    for path in [
        "/ui/login",
        "/ui/assets/console.css",
        "/ui",
        "/health",
        "/v1/openapi.json",
        "/v1/receipts",
        "/no/such/route",
    ] {
        let r = c.get(format!("{}{path}", s.base)).send().await.unwrap();
        assert_eq!(
            r.headers()
                .get("x-content-type-options")
                .map(|v| v.to_str().unwrap()),
            Some("nosniff"),
            "{path} ({})",
            r.status()
        );
    }
    // A reason holding a right-to-left override, through the API.
    let reason = "checked by \u{202E}nimda\u{202C} today";
    let r = c
        .post(format!(
            "{}/v1/trigger-subscriptions/github/quarantine",
            s.base
        ))
        .bearer_auth(OPS_KEY)
        .json(&json!({ "reason": reason }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let jar = cookie(&login(&s, &c, VIEW_KEY, "/ui", &[]).await);
    let page = c
        .get(format!("{}/ui/subscriptions/github", s.base))
        .header("cookie", &jar)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status().as_u16(), 200);
    assert_eq!(page.headers()["x-content-type-options"], "nosniff");
    let text = page.text().await.unwrap();
    assert!(
        text.contains("checked by ⟨U+202E⟩nimda⟨U+202C⟩ today"),
        "the reason as shown: {}",
        text.lines().find(|l| l.contains("nimda")).unwrap_or("")
    );
    assert!(!text.contains('\u{202E}') && !text.contains('\u{202C}'));
}

/// Before: each login held 8 streams, and a key could log in as often as it liked: 32 logins of one
/// read-only key held all 256 streams of the replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_cannot_hold_every_live_stream() {
    let s = start().await;
    let c = client(1);
    let per_key = trigger_bridge_console::live::MAX_STREAMS_PER_KEY;
    let per_login = trigger_bridge_console::live::MAX_STREAMS_PER_LOGIN;
    assert_eq!(per_key, trigger_bridge_console::live::MAX_STREAMS / 4);
    let logins = per_key / per_login + 1;
    let mut jars = Vec::new();
    for _ in 0..logins {
        jars.push(cookie(&login(&s, &c, VIEW_KEY, "/ui", &[]).await));
    }
    let open = |jar: String| {
        let (c, url) = (c.clone(), format!("{}/ui/events", s.base));
        async move { c.get(url).header("cookie", jar).send().await.unwrap() }
    };
    let mut held = Vec::new();
    for jar in &jars[..logins - 1] {
        for _ in 0..per_login {
            let r = open(jar.clone()).await;
            assert_eq!(r.status().as_u16(), 200);
            held.push(r);
        }
    }
    assert_eq!(held.len(), per_key);
    // A fresh login of the same key: its own per-login share is free, the key's is not.
    let r = open(jars[logins - 1].clone()).await;
    assert_eq!(r.status().as_u16(), 429);
    assert!(r.text().await.unwrap().contains("for this API key"));
    // Another key still gets a stream.
    let other = cookie(&login(&s, &c, OTHER_VIEW_KEY, "/ui", &[]).await);
    let r = open(other).await;
    assert_eq!(r.status().as_u16(), 200);
    // A closed stream gives the key's place back.
    drop(held.pop());
    let mut status = 0;
    for _ in 0..100 {
        status = open(jars[logins - 1].clone()).await.status().as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(status, 200, "a closed stream gives its place back");
}
