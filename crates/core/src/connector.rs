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
}

impl ConnectorSpec {
    /// The connector's name (`github`, `standard-webhooks`, `hmac`), as used in config and metrics labels.
    pub fn name(&self) -> &'static str {
        match self {
            ConnectorSpec::Github => "github",
            ConnectorSpec::StandardWebhooks { .. } => "standard-webhooks",
            ConnectorSpec::Hmac { .. } => "hmac",
        }
    }
}
