//! Connector configuration as data (DESIGN §2 connector). The behaviour (verify + normalize) lives in the
//! ingress crate; this is what a subscription stores.

use serde::{Deserialize, Serialize};

/// How the generic `hmac` connector's signature is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SignatureEncoding {
    #[default]
    Hex,
    Base64,
}

fn default_tolerance_s() -> u64 {
    300
}

/// One provider's authentication and normalization settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "connector", rename_all = "kebab-case")]
pub enum ConnectorSpec {
    /// GitHub: `X-Hub-Signature-256`, `X-GitHub-Event`, `X-GitHub-Delivery` (signals-and-connectors §1).
    Github,
    /// Standard Webhooks v1 (signals-and-connectors §3): `webhook-id`, `webhook-timestamp`,
    /// `webhook-signature`; timestamps more than `tolerance_s` seconds off are refused (default 300).
    StandardWebhooks {
        #[serde(default = "default_tolerance_s")]
        tolerance_s: u64,
    },
    /// Generic HMAC-SHA256 sender.
    ///
    /// * `signature_header`: header carrying the MAC (e.g. `X-Signature`), with optional `signature_prefix`
    ///   (e.g. `sha256=`), encoded as `encoding` (hex or standard base64).
    /// * `timestamp_header`: when set, the signed content is `{timestamp}.{body}` and timestamps (Unix s)
    ///   more than `tolerance_s` off are refused; when unset the signed content is the body.
    /// * `id_header`: header with the sender's delivery id (dedup); without it the id is the SHA-256 of the
    ///   body, so identical bodies are duplicates.
    /// * `event_header`: header naming the event type; without it the event is `webhook`.
    Hmac {
        signature_header: String,
        #[serde(default)]
        signature_prefix: Option<String>,
        #[serde(default)]
        encoding: SignatureEncoding,
        #[serde(default)]
        timestamp_header: Option<String>,
        #[serde(default = "default_tolerance_s")]
        tolerance_s: u64,
        #[serde(default)]
        id_header: Option<String>,
        #[serde(default)]
        event_header: Option<String>,
    },
    /// Azure DevOps service hooks, consumer `webHooks` / action `httpRequest` (signals-and-connectors §2).
    ///
    /// Azure DevOps has no HMAC or signature scheme: authenticity rests on Basic auth and/or a secret custom
    /// header over TLS (signals-and-connectors §2.2). The subscription's resolved secret bytes are:
    ///
    /// * with `basic_username`: the Basic-auth password; the request must carry
    ///   `Authorization: Basic base64(basic_username ":" secret)`;
    /// * with `header_name`: the exact expected value of that header (configured in the service hook's
    ///   `httpHeaders` as `Name:value`).
    ///
    /// At least one must be set (config validation refuses neither); when both are set, both must pass.
    /// The dedup identity is the payload's top-level `id` (event GUID, §2.3), never a header.
    AzureDevops {
        #[serde(default)]
        basic_username: Option<String>,
        #[serde(default)]
        header_name: Option<String>,
    },
    /// A cron schedule: not a webhook connector; the scheduler produces its events
    /// (`schedule.tick`), and its ingest URL answers 404.
    Schedule(crate::schedule::ScheduleSpec),
    /// A NATS JetStream queue: not a webhook connector; the queue consumer produces its
    /// events (`queue.message`), and its ingest URL answers 404.
    Nats(crate::queue::QueueSpec),
}

impl ConnectorSpec {
    /// The connector's name (`github`, `standard-webhooks`, `hmac`, `azure-devops`), as used in config and
    /// metrics labels.
    pub fn name(&self) -> &'static str {
        match self {
            ConnectorSpec::Github => "github",
            ConnectorSpec::StandardWebhooks { .. } => "standard-webhooks",
            ConnectorSpec::Hmac { .. } => "hmac",
            ConnectorSpec::AzureDevops { .. } => "azure-devops",
            ConnectorSpec::Schedule(_) => "schedule",
            ConnectorSpec::Nats(_) => "nats",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_serde_shape() {
        let spec: ConnectorSpec = serde_json::from_str(
            r#"{"connector":"schedule","cron":"*/5 * * * *","timezone":"Europe/Berlin","missed":"run_once"}"#,
        )
        .unwrap();
        let ConnectorSpec::Schedule(s) = &spec else {
            panic!("{spec:?}")
        };
        assert_eq!(s.cron, "*/5 * * * *");
        assert_eq!(s.missed, crate::schedule::MissedTicks::RunOnce);
        assert_eq!(s.grace_ms, crate::schedule::DEFAULT_GRACE_MS);
        let back: ConnectorSpec =
            serde_json::from_value(serde_json::to_value(&spec).unwrap()).unwrap();
        assert_eq!(back, spec);
        assert!(serde_json::from_str::<ConnectorSpec>(
            r#"{"connector":"schedule","cron":"* * * * *","cronn":"x"}"#
        )
        .is_err());
    }

    #[test]
    fn azure_devops_serde_shape() {
        let spec: ConnectorSpec =
            serde_json::from_str(r#"{"connector":"azure-devops","basic_username":"ado"}"#).unwrap();
        assert_eq!(
            spec,
            ConnectorSpec::AzureDevops {
                basic_username: Some("ado".into()),
                header_name: None,
            }
        );
        assert_eq!(spec.name(), "azure-devops");
        let both = ConnectorSpec::AzureDevops {
            basic_username: Some("u".into()),
            header_name: Some("X-Hook-Secret".into()),
        };
        let json = serde_json::to_value(&both).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"connector": "azure-devops", "basic_username": "u", "header_name": "X-Hook-Secret"})
        );
        assert_eq!(serde_json::from_value::<ConnectorSpec>(json).unwrap(), both);
    }
}
