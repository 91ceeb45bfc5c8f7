//! `trigger-bridge send`: signs a payload file exactly as the provider would and posts it, so a
//! subscription can be exercised end to end without the provider.

use std::path::PathBuf;

use anyhow::{anyhow, bail, Context, Result};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{json, Value};
use tb_core::connector::{ConnectorSpec, SignatureEncoding};

use crate::api_client::SERVE_HINT;

/// The sender's HTTP client. `send` plays the provider (exact signed bytes to any URL, often not this
/// server's API), so it is not a client of the API and does not go through `tb_client`.
fn http_client() -> Result<reqwest::Client> {
    reqwest::Client::builder()
        .user_agent(concat!("trigger-bridge/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(std::time::Duration::from_secs(5))
        .timeout(std::time::Duration::from_secs(60))
        .build()
        .context("cannot build the HTTP client")
}

/// A transport error as a message naming `url`, with the serve hint when nothing answered.
fn request_error(url: &str, e: reqwest::Error) -> anyhow::Error {
    let mut cause: &dyn std::error::Error = &e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    if e.is_connect() || e.is_timeout() {
        anyhow!("cannot reach {url}: {cause}; {SERVE_HINT}")
    } else {
        anyhow!("request to {url} failed: {cause}")
    }
}

/// Which provider's signing scheme to use.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connector {
    /// GitHub: X-Hub-Signature-256, X-GitHub-Event, X-GitHub-Delivery
    Github,
    /// Standard Webhooks v1: webhook-id, webhook-timestamp, webhook-signature (whsec_ secret)
    StandardWebhooks,
    /// Generic HMAC-SHA256 configured with the --hmac-* flags
    Hmac,
    /// Azure DevOps service hook: Authorization: Basic (--basic-username) and/or the secret in
    /// --header-name; the dedup id is the payload's own "id"
    AzureDevops,
}

/// How the generic hmac signature is encoded.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// Lowercase hex
    Hex,
    /// Standard base64
    Base64,
}

// Arguments of `trigger-bridge send` (no doc comment: it would override the subcommand's --help text).
#[derive(clap::Args, Debug)]
pub struct SendArgs {
    /// Ingest URL of the trigger subscription to post to
    #[arg(long)]
    pub url: String,
    /// Signing scheme of the subscription's connector
    #[arg(long, value_enum)]
    pub connector: Connector,
    /// Shared secret (a whsec_... value for standard-webhooks; for azure-devops the Basic-auth password
    /// and/or the --header-name value)
    #[arg(long, env = "TRIGGER_BRIDGE_SECRET", hide_env_values = true)]
    pub secret: String,
    /// Event name: X-GitHub-Event for github (required), the --hmac-event-header value for hmac (not for
    /// azure-devops: the payload's eventType is the event)
    #[arg(long)]
    pub event: Option<String>,
    /// Payload file; its exact bytes are sent (never re-serialized)
    #[arg(long)]
    pub file: PathBuf,
    /// Delivery id to send (reuse one to test deduplication); default: a fresh id. Not for azure-devops:
    /// its dedup id is the payload's top-level "id", so edit that in the file
    #[arg(long)]
    pub delivery_id: Option<String>,
    /// Content-Type; for github, application/x-www-form-urlencoded sends `payload=<file>` form-encoded
    #[arg(long, default_value = "application/json")]
    pub content_type: String,
    /// hmac: header carrying the signature, e.g. X-Signature (required for --connector hmac)
    #[arg(long)]
    pub hmac_header: Option<String>,
    /// hmac: signature encoding
    #[arg(long, value_enum, default_value_t = Encoding::Hex)]
    pub hmac_encoding: Encoding,
    /// hmac: prefix before the encoded signature, e.g. sha256=
    #[arg(long)]
    pub hmac_prefix: Option<String>,
    /// hmac: header carrying the Unix timestamp (then `{timestamp}.{body}` is signed)
    #[arg(long)]
    pub hmac_timestamp_header: Option<String>,
    /// hmac: header carrying the delivery id
    #[arg(long)]
    pub hmac_id_header: Option<String>,
    /// hmac: header carrying the event name (--event)
    #[arg(long)]
    pub hmac_event_header: Option<String>,
    /// azure-devops: Basic-auth username; the secret is the password [default: trigger-bridge]. With
    /// --header-name, Basic auth is sent only when this is given (subscriptions configured with both)
    #[arg(long)]
    pub basic_username: Option<String>,
    /// azure-devops: send the secret in this header (the service hook's httpHeaders), e.g. X-Hook-Secret
    #[arg(long)]
    pub header_name: Option<String>,
    /// Timestamp to sign, in Unix seconds (default: now)
    #[arg(long)]
    pub timestamp: Option<i64>,
    /// Print one JSON object {status, deliveryId, response} instead of a summary line
    #[arg(long)]
    pub json: bool,
}

/// Basic-auth username `send --connector azure-devops` uses when `--basic-username` is not given.
pub const DEFAULT_BASIC_USERNAME: &str = "trigger-bridge";

/// A signed request, ready to post.
#[derive(Debug)]
pub struct Prepared {
    pub body: Vec<u8>,
    pub headers: Vec<(String, String)>,
    /// The id the server dedups on, when the sender chooses it (hmac without an id header: none; for
    /// azure-devops the payload's `id` when it has one).
    pub delivery_id: Option<String>,
}

/// True for a Standard Webhooks message id: `^[A-Za-z0-9_-]{16,128}$`.
pub fn valid_webhook_id(id: &str) -> bool {
    (16..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `msg_` followed by 24 random alphanumerics (randomness from UUID v4).
pub fn new_webhook_id() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let bytes = [
        uuid::Uuid::new_v4().into_bytes(),
        uuid::Uuid::new_v4().into_bytes(),
    ]
    .concat();
    let tail: String = bytes[..24]
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect();
    format!("msg_{tail}")
}

/// GitHub's form body: `payload=<percent-encoded bytes>`.
pub fn form_body(payload: &[u8]) -> Vec<u8> {
    let mut out = b"payload=".to_vec();
    out.extend(form_urlencoded::byte_serialize(payload).flat_map(str::bytes));
    out
}

fn is_form(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/x-www-form-urlencoded")
}

/// Builds the body and headers the provider would send for `file` at `now_s` (Unix seconds).
pub fn prepare(a: &SendArgs, file: Vec<u8>, now_s: i64) -> Result<Prepared> {
    if a.secret.is_empty() {
        bail!("--secret is empty");
    }
    let ts = a.timestamp.unwrap_or(now_s);
    let mut h = vec![("Content-Type".to_owned(), a.content_type.clone())];
    let mut push = |k: &str, v: String| h.push((k.to_owned(), v));
    let (body, id) = match a.connector {
        Connector::Github => {
            let event = a.event.clone().ok_or_else(|| {
                anyhow!("--event is required for --connector github (the X-GitHub-Event, e.g. --event pull_request)")
            })?;
            let body = if is_form(&a.content_type) {
                form_body(&file)
            } else {
                file
            };
            let id = a
                .delivery_id
                .clone()
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            push("X-GitHub-Event", event);
            push("X-GitHub-Delivery", id.clone());
            push(
                "X-Hub-Signature-256",
                tb_ingress::github::sign(a.secret.as_bytes(), &body),
            );
            push(
                "User-Agent",
                "GitHub-Hookshot/trigger-bridge-send".to_owned(),
            );
            (body, Some(id))
        }
        Connector::StandardWebhooks => {
            let key = tb_ingress::parse_whsec(&a.secret)
                .map_err(|e| anyhow!("--secret for --connector standard-webhooks: {e}"))?;
            let id = match &a.delivery_id {
                Some(id) if !valid_webhook_id(id) => bail!(
                    "--delivery-id {id:?} is not a valid webhook-id: use 16 to 128 characters of A-Z a-z 0-9 _ -"
                ),
                Some(id) => id.clone(),
                None => new_webhook_id(),
            };
            push("webhook-id", id.clone());
            push("webhook-timestamp", ts.to_string());
            push(
                "webhook-signature",
                tb_ingress::standard_webhooks::sign(&key, &id, ts, &file),
            );
            (file, Some(id))
        }
        Connector::Hmac => {
            let header = a.hmac_header.clone().ok_or_else(|| {
                anyhow!("--hmac-header is required for --connector hmac (the signature header, e.g. X-Signature)")
            })?;
            let spec = ConnectorSpec::Hmac {
                signature_header: header.clone(),
                signature_prefix: a.hmac_prefix.clone(),
                encoding: match a.hmac_encoding {
                    Encoding::Hex => SignatureEncoding::Hex,
                    Encoding::Base64 => SignatureEncoding::Base64,
                },
                timestamp_header: a.hmac_timestamp_header.clone(),
                tolerance_s: 300,
                id_header: a.hmac_id_header.clone(),
                event_header: a.hmac_event_header.clone(),
            };
            let signed_ts = a.hmac_timestamp_header.as_ref().map(|_| ts);
            push(
                &header,
                tb_ingress::hmac_generic::sign(&spec, a.secret.as_bytes(), signed_ts, &file),
            );
            if let Some(th) = &a.hmac_timestamp_header {
                push(th, ts.to_string());
            }
            if let Some(eh) = &a.hmac_event_header {
                let event = a
                    .event
                    .clone()
                    .ok_or_else(|| anyhow!("--event is required with --hmac-event-header"))?;
                push(eh, event);
            }
            let id = match (&a.hmac_id_header, &a.delivery_id) {
                (Some(ih), id) => {
                    let id = id.clone().unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
                    push(ih, id.clone());
                    Some(id)
                }
                (None, Some(_)) => bail!("--delivery-id needs --hmac-id-header for --connector hmac (without it the server dedups on the body's SHA-256)"),
                (None, None) => None,
            };
            (file, id)
        }
        Connector::AzureDevops => {
            if a.delivery_id.is_some() {
                bail!("--delivery-id does not apply to --connector azure-devops: Azure DevOps sends no delivery header, the dedup id is the payload's top-level \"id\"; edit it in the file (reuse one to test deduplication)");
            }
            if a.event.is_some() {
                bail!("--event does not apply to --connector azure-devops: the event is the payload's \"eventType\" (e.g. git.pullrequest.created); edit it in the file");
            }
            let basic = match (&a.basic_username, &a.header_name) {
                (Some(u), _) => Some(u.as_str()),
                (None, None) => Some(DEFAULT_BASIC_USERNAME),
                (None, Some(_)) => None,
            };
            if let Some(user) = basic {
                if user.contains(':') {
                    bail!("--basic-username must not contain ':' (Basic auth separates user and password with it)");
                }
                push(
                    "Authorization",
                    tb_ingress::azure_devops::basic_authorization(user, a.secret.as_bytes()),
                );
            }
            if let Some(name) = &a.header_name {
                push(name, a.secret.clone());
            }
            let id = serde_json::from_slice::<Value>(&file)
                .ok()
                .and_then(|v| v.get("id")?.as_str().map(str::to_owned));
            (file, id)
        }
    };
    Ok(Prepared {
        body,
        headers: h,
        delivery_id: id,
    })
}

/// Validates header names and values into a [`HeaderMap`].
pub fn header_map(headers: &[(String, String)]) -> Result<HeaderMap> {
    let mut map = HeaderMap::new();
    for (k, v) in headers {
        let name = HeaderName::from_bytes(k.as_bytes())
            .with_context(|| format!("invalid header name {k:?}"))?;
        let value =
            HeaderValue::from_str(v).with_context(|| format!("invalid value for header {k}"))?;
        map.append(name, value);
    }
    Ok(map)
}

/// `202 Accepted  outcome=accepted receipt=rcpt_... run=run_...` or `401 Unauthorized  error=code: message`.
fn summary(status: reqwest::StatusCode, body: Option<&Value>, raw: &str) -> String {
    let head = format!(
        "{} {}",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    );
    let field = |k: &str| body.and_then(|b| b.get(k)).and_then(Value::as_str);
    let detail = match (field("error"), body) {
        (Some(code), _) => format!("error={code}: {}", field("message").unwrap_or("")),
        (None, Some(_)) => [
            ("outcome", "outcome"),
            ("receipt", "receiptId"),
            ("run", "runId"),
        ]
        .iter()
        .filter_map(|(label, key)| field(key).map(|v| format!("{label}={v}")))
        .collect::<Vec<_>>()
        .join(" "),
        (None, None) => raw.trim().chars().take(200).collect(),
    };
    format!("{}  {detail}", head.trim_end())
        .trim_end()
        .to_owned()
}

/// Runs `send`; returns the process exit code (0 when the server answered 2xx, 1 otherwise).
pub async fn run(args: SendArgs) -> Result<i32> {
    let file = std::fs::read(&args.file)
        .with_context(|| format!("cannot read payload file {}", args.file.display()))?;
    let p = prepare(&args, file, chrono::Utc::now().timestamp())?;
    let headers = header_map(&p.headers)?;
    let resp = http_client()?
        .post(&args.url)
        .headers(headers)
        .body(p.body)
        .send()
        .await
        .map_err(|e| request_error(&args.url, e))?;
    let status = resp.status();
    let raw = resp.text().await.map_err(|e| request_error(&args.url, e))?;
    let parsed: Option<Value> = serde_json::from_str(&raw).ok();
    if args.json {
        // Built by hand so the keys keep this order and the response keeps the server's key order.
        let response = if parsed.is_some() { raw.trim() } else { "null" };
        let id = json!(p.delivery_id);
        println!(
            r#"{{"status":{},"deliveryId":{id},"response":{response}}}"#,
            status.as_u16()
        );
    } else {
        println!("{}", summary(status, parsed.as_ref(), &raw));
        if let Some(id) = &p.delivery_id {
            println!("delivery-id: {id}");
        }
    }
    Ok(if status.is_success() { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: SendArgs,
    }

    /// Parses `send --url .. --file .. <extra>` (`extra` split on spaces).
    fn args(extra: &str) -> SendArgs {
        let base = "send --url http://x/ingest --file p.json ".to_owned() + extra;
        T::try_parse_from(base.split_whitespace()).unwrap().a
    }

    fn verify(spec: &ConnectorSpec, secret: &[u8], p: &Prepared, now: i64) -> tb_ingress::Verified {
        tb_ingress::verify(
            spec,
            secret,
            &header_map(&p.headers).unwrap(),
            &p.body,
            now,
            &Default::default(),
        )
        .unwrap()
    }

    #[test]
    fn webhook_ids() {
        let id = new_webhook_id();
        assert!(
            id.starts_with("msg_") && id.len() == 28 && valid_webhook_id(&id),
            "{id}"
        );
        assert_ne!(id, new_webhook_id());
        assert!(valid_webhook_id("abc_DEF-0123456789"));
        assert!(!valid_webhook_id("short_id"));
        assert!(!valid_webhook_id("has space 0123456789"));
        assert!(!valid_webhook_id(&"a".repeat(129)));
    }

    #[test]
    fn form_encoding() {
        assert_eq!(
            form_body(br#"{"a":"b c&d"}"#),
            b"payload=%7B%22a%22%3A%22b+c%26d%22%7D".to_vec()
        );
        let a = args("--connector github --secret s --event push --content-type application/x-www-form-urlencoded");
        let p = prepare(&a, br#"{"zen":"x"}"#.to_vec(), 0).unwrap();
        assert!(p.body.starts_with(b"payload=%7B"));
        let v = verify(&ConnectorSpec::Github, b"s", &p, 0);
        assert_eq!(Some(v.provider_event_id), p.delivery_id);
    }

    #[test]
    fn standard_webhooks_refuses_non_whsec_secret() {
        let a = args("--connector standard-webhooks --secret plain-secret");
        let err = prepare(&a, b"{}".to_vec(), 0).unwrap_err().to_string();
        assert!(err.contains("whsec_"), "{err}");
        let whsec = tb_ingress::secret::format_whsec(&[7; 32]);
        let bad_id = args(&format!(
            "--connector standard-webhooks --secret {whsec} --delivery-id x"
        ));
        let err = prepare(&bad_id, b"{}".to_vec(), 0).unwrap_err().to_string();
        assert!(err.contains("webhook-id"), "{err}");
    }

    #[test]
    fn signatures_verify() {
        let whsec = tb_ingress::secret::format_whsec(&[7; 32]);
        let a = args(&format!(
            "--connector standard-webhooks --secret {whsec} --timestamp 1700000000"
        ));
        let p = prepare(&a, br#"{"type":"x"}"#.to_vec(), 0).unwrap();
        let v = verify(
            &ConnectorSpec::StandardWebhooks { tolerance_s: 300 },
            &[7; 32],
            &p,
            1_700_000_000,
        );
        assert_eq!(Some(v.provider_event_id), p.delivery_id);

        let a = args(
            "--connector hmac --secret s --hmac-header X-Sig --hmac-encoding base64 --hmac-prefix sha256= \
             --hmac-timestamp-header X-Ts --hmac-id-header X-Id --hmac-event-header X-Ev --event order.paid \
             --delivery-id d1",
        );
        let p = prepare(&a, b"hello".to_vec(), 1_700_000_000).unwrap();
        let spec = ConnectorSpec::Hmac {
            signature_header: "X-Sig".into(),
            signature_prefix: Some("sha256=".into()),
            encoding: SignatureEncoding::Base64,
            timestamp_header: Some("X-Ts".into()),
            tolerance_s: 300,
            id_header: Some("X-Id".into()),
            event_header: Some("X-Ev".into()),
        };
        let v = verify(&spec, b"s", &p, 1_700_000_000);
        assert_eq!(
            (v.provider_event_id.as_str(), v.event.event.as_str()),
            ("d1", "order.paid")
        );
        let no_event = args("--connector github --secret s");
        assert!(prepare(&no_event, vec![], 0)
            .unwrap_err()
            .to_string()
            .contains("--event"));
    }

    #[test]
    fn azure_devops_auth_and_delivery_id() {
        let body = br#"{"id":"5d3c2b1a-0000-4000-8000-000000000001","eventType":"git.push","publisherId":"tfs"}"#;
        let basic = args("--connector azure-devops --secret pw");
        let p = prepare(&basic, body.to_vec(), 0).unwrap();
        assert_eq!(
            p.delivery_id.as_deref(),
            Some("5d3c2b1a-0000-4000-8000-000000000001")
        );
        let spec = |user: Option<&str>, header: Option<&str>| ConnectorSpec::AzureDevops {
            basic_username: user.map(Into::into),
            header_name: header.map(Into::into),
        };
        let v = verify(&spec(Some("trigger-bridge"), None), b"pw", &p, 0);
        assert_eq!(v.event.event, "git.push");

        let header = args("--connector azure-devops --secret pw --header-name X-Hook-Secret");
        let p = prepare(&header, body.to_vec(), 0).unwrap();
        assert!(!p.headers.iter().any(|(k, _)| k == "Authorization"));
        verify(&spec(None, Some("X-Hook-Secret")), b"pw", &p, 0);

        let both = args(
            "--connector azure-devops --secret pw --header-name X-Hook-Secret --basic-username ado",
        );
        let p = prepare(&both, body.to_vec(), 0).unwrap();
        verify(&spec(Some("ado"), Some("X-Hook-Secret")), b"pw", &p, 0);

        let with_id = args("--connector azure-devops --secret pw --delivery-id d1");
        let err = prepare(&with_id, body.to_vec(), 0).unwrap_err().to_string();
        assert!(err.contains("payload's top-level \"id\""), "{err}");
        let with_event = args("--connector azure-devops --secret pw --event git.push");
        assert!(prepare(&with_event, body.to_vec(), 0)
            .unwrap_err()
            .to_string()
            .contains("eventType"));
        let colon = args("--connector azure-devops --secret pw --basic-username a:b");
        assert!(prepare(&colon, body.to_vec(), 0).is_err());
    }
}
