//! `GET /v1/openapi.json`: the OpenAPI 3.1 document of the whole API, generated from the handlers'
//! `#[utoipa::path]` annotations and the request types' schemas (never hand-written).

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use utoipa::OpenApi;

/// The API description.
#[derive(OpenApi)]
#[openapi(
    info(title = "trigger-bridge", description = "Durable inbound-work bridge: OpenWOP v1 trigger-bridge surface and management API."),
    paths(crate::auth::key_info, crate::runs::get_workflow, crate::runs::fork, crate::webhooks::register, crate::webhooks::delete, crate::dead_letters::list, crate::replay::replay_all, crate::discovery::discovery, crate::ingest::ingest, crate::inspect::list_subscriptions, crate::inspect::get_subscription, crate::inspect::pause_subscription, crate::inspect::resume_subscription, crate::quarantine::quarantine, crate::quarantine::release, crate::quarantine::list, crate::quarantine::counts, crate::inspect::list_receipts, crate::inspect::get_receipt, crate::inspect::list_deliveries, crate::inspect::get_delivery, crate::inspect::replay_delivery, crate::ops::health, crate::ops::ready, crate::ops::metrics, crate::registration::register, crate::registration::rotate, crate::runs::list_runs, crate::runs::get_run, crate::runs::poll_events, crate::runs::post_result, crate::runs::cancel, crate::runs::ancestry, crate::runs::create, crate::sse::events, crate::sessions::raise, crate::sessions::list_signals, crate::sessions::signal_payload, crate::sessions::create_wait, crate::sessions::list_waits, crate::sessions::get_wait, crate::sessions::wait_action, crate::sessions::prompt, crate::sessions::claim, crate::sessions::ack, crate::sessions::list_turns, crate::sessions::mint, crate::sessions::list_capabilities, crate::sessions::revoke, crate::sessions::hook, crate::bindings::list, crate::bindings::revoke, crate::bindings::restore, crate::schedules::create, crate::schedules::list, crate::schedules::get, crate::schedules::next, crate::schedules::pause, crate::schedules::resume, crate::schedules::delete, crate::services::list, crate::services::dead_letters, crate::audit::list, crate::audit::verify, crate::activity::activity, crate::inspect::redacted_body),
    components(schemas(crate::webhooks::WebhookBody, crate::registration::RegistrationBody, crate::registration::RetryBody, crate::registration::VerificationBody, crate::registration::RotateBody, crate::runs::CreateRunBody, crate::runs::ResultBody, tb_api_types::RaiseSignal, tb_api_types::SignalRaised, tb_api_types::SignalPage, tb_api_types::SignalEntry, tb_api_types::ArmWait, tb_api_types::WaitAction, tb_api_types::Wait, tb_api_types::Winner, tb_api_types::WaitList, tb_api_types::Prompt, tb_api_types::Turn, tb_api_types::TurnList, tb_api_types::KeyInfo, tb_api_types::ErrorBody, tb_api_types::replay::ReplayRequest, tb_api_types::replay::ReplayFilter, tb_api_types::replay::ReplayOutcome, tb_api_types::replay::ReplaySkip, crate::sessions::MintBody, crate::schedules::ScheduleBody, crate::audit::AuditPage, crate::audit::AuditEntryView, crate::audit::Verification, crate::activity::Activity, crate::activity::SubscriptionActivity, crate::wire::ReceiptView, crate::wire::DeliveryView, crate::wire::AttemptView, crate::wire::DeliveryDetail, crate::wire::ReceiptDetail)),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
pub struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The document as served: its JSON bytes and their strong `ETag` (`"<first 16 hex of SHA-256>"`).
/// The document depends only on the code, so it is built and serialized once per process, at the
/// first request, and every later request is a copy of a reference count: before, every request
/// rebuilt and serialized it (about 60 KB of JSON) at a cost of ~0.8 ms of CPU (docs/limits.md).
pub struct Served {
    /// The serialized document (`application/json`).
    pub body: axum::body::Bytes,
    /// Its strong entity tag, quoted.
    pub etag: String,
}

static SERVED: std::sync::LazyLock<Served> = std::sync::LazyLock::new(|| {
    let body = serde_json::to_vec(&ApiDoc::openapi()).expect("the OpenAPI document serializes");
    let digest = <sha2::Sha256 as sha2::Digest>::digest(&body);
    Served {
        etag: format!("\"{}\"", &hex_of(&digest)[..16]),
        body: body.into(),
    }
});

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The document of this build, serialized once ([`Served`]).
pub fn served() -> &'static Served {
    &SERVED
}

/// The handler (no auth): the cached document with its `ETag` and `Cache-Control: no-cache` (a
/// client may keep it and revalidate); 304 with no body when `If-None-Match` names the `ETag` (or is
/// `*`).
pub async fn openapi(headers: HeaderMap) -> Response {
    let doc = served();
    let matches = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().trim_start_matches("W/"))
        .any(|t| t == doc.etag || t == "*");
    let etag = HeaderValue::from_str(&doc.etag).expect("a hex etag is a header value");
    let cache = HeaderValue::from_static("no-cache");
    if matches {
        return (
            StatusCode::NOT_MODIFIED,
            [(header::ETAG, etag), (header::CACHE_CONTROL, cache)],
        )
            .into_response();
    }
    (
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
            (header::ETAG, etag),
            (header::CACHE_CONTROL, cache),
        ],
        doc.body.clone(),
    )
        .into_response()
}
