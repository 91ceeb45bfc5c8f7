//! The client's retry rules against a stand-in server that fails on purpose: a mutating call keeps
//! one `Idempotency-Key` across its retries, 503 and 429 are retried after `Retry-After`, a 4xx is not,
//! and the error carries the API's code.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::json;
use tb_client::{Call, Client, Code, Error, ErrorCode, Retry};

type Seen = Arc<Mutex<Vec<Option<String>>>>;

/// A server whose `POST /v1/x` answers `fails` times with `status` + `code`, then 200.
async fn stand_in(status: u16, code: &'static str, fails: usize) -> (String, Seen) {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let app = axum::Router::new().route(
        "/v1/x",
        post(move |h: HeaderMap| {
            let s = s.clone();
            async move {
                let mut v = s.lock().unwrap();
                v.push(
                    h.get("idempotency-key")
                        .map(|k| k.to_str().unwrap().to_string()),
                );
                if v.len() <= fails {
                    let st = StatusCode::from_u16(status).unwrap();
                    let body = axum::Json(json!({"error": code, "message": "try later"}));
                    ([("retry-after", "0")], (st, body)).into_response()
                } else {
                    axum::Json(json!({"ok": true, "try": v.len()})).into_response()
                }
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (base, seen)
}

fn fast() -> Retry {
    Retry {
        retries: 3,
        base: Duration::from_millis(5),
        max: Duration::from_millis(20),
    }
}

#[tokio::test]
async fn a_retried_post_keeps_one_idempotency_key() {
    let (base, seen) = stand_in(503, "unavailable", 2).await;
    let api = Client::new(&base).unwrap().with_retry(fast());
    let v: serde_json::Value = api.json(Call::post("/v1/x")).await.unwrap();
    assert_eq!(v["try"], 3);
    let keys = seen.lock().unwrap().clone();
    assert_eq!(keys.len(), 3);
    let first = keys[0]
        .clone()
        .expect("a mutating call carries an Idempotency-Key");
    assert!(first.starts_with("tbc-"), "{first}");
    assert!(
        keys.iter().all(|k| k.as_deref() == Some(first.as_str())),
        "{keys:?}"
    );

    // A second call is a new operation: a new key.
    let (base, seen) = stand_in(429, "rate_limited", 1).await;
    let api = Client::new(&base).unwrap().with_retry(fast());
    api.send(Call::post("/v1/x")).await.unwrap();
    api.send(Call::post("/v1/x").idempotency_key("mine-1"))
        .await
        .unwrap();
    let keys = seen.lock().unwrap().clone();
    assert_eq!(keys.len(), 3);
    assert_eq!(keys[0], keys[1]);
    assert_eq!(keys[2].as_deref(), Some("mine-1"));
}

#[tokio::test]
async fn refusals_are_not_retried_and_carry_their_code() {
    let (base, seen) = stand_in(409, "target_terminal", 5).await;
    let api = Client::new(&base).unwrap().with_retry(fast());
    let e = api.send(Call::post("/v1/x")).await.unwrap_err();
    assert!(e.is(ErrorCode::TargetTerminal), "{e}");
    assert_eq!(e.status(), Some(409));
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "a 409 is the answer, not a hiccup"
    );

    let (base, seen) = stand_in(503, "unavailable", 10).await;
    let api = Client::new(&base).unwrap().with_retry(fast());
    let e = api.send(Call::post("/v1/x")).await.unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Api {
                code: Code::Core(ErrorCode::Unavailable),
                retry_after: Some(_),
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        seen.lock().unwrap().len(),
        4,
        "the first try and three retries"
    );
}

#[tokio::test]
async fn a_server_that_is_not_there_is_unreachable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let api = Client::new(&format!("http://127.0.0.1:{port}"))
        .unwrap()
        .with_retry(fast());
    let e = api.key_info().await.unwrap_err();
    assert!(matches!(e, Error::Unreachable { .. }), "{e:?}");
    assert!(
        e.to_string().starts_with("cannot reach http://127.0.0.1:"),
        "{e}"
    );
}

#[tokio::test]
async fn a_request_that_cannot_be_built_is_invalid_and_not_retried() {
    let (base, seen) = stand_in(503, "unavailable", 0).await;
    let api = Client::new(&base).unwrap().with_retry(fast());
    let e = api
        .send(Call::post(format!("/v1/{}", "x".repeat(70_000))))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e:?}");
    assert!(seen.lock().unwrap().is_empty());

    // A server URL that carries credentials is refused, and the refusal does not repeat them.
    for url in [
        "http://admin:s3cr3tpw@127.0.0.1:1",
        "http://127.0.0.1:1/?access_token=s3cr3tpw",
        "http://127.0.0.1:1/#s3cr3tpw",
    ] {
        let e = Client::new(url).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{url}: {e:?}");
        assert!(!e.to_string().contains("s3cr3tpw"), "{e}");
    }
}

#[tokio::test]
async fn wait_for_keeps_one_deadline_over_a_server_that_hangs() {
    let app = axum::Router::new().route(
        "/v1/runs/{run}/waits/{wait}",
        axum::routing::get(|| async {
            tokio::time::sleep(Duration::from_secs(3600)).await;
            "never"
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    let api = Client::new(&base)
        .unwrap()
        .with_retry(fast())
        .with_timeout(Duration::from_millis(200));
    let started = std::time::Instant::now();
    let e = api
        .wait_for("run_1", "wt_1", Duration::from_secs(1))
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(e, Error::Unreachable { .. }), "{e:?}");
    // The budget (1 s) plus the margin (the 200 ms timeout); each long-poll alone could take 11 s.
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert!(took >= Duration::from_secs(1), "{took:?}");
}
