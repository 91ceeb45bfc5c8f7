//! What every run executor is handed and how a failed start is told ([`crate::executor`] dispatches,
//! [`crate::nats_executor`] is one executor; both use these, neither uses the other's internals).

use serde_json::Value;
use tb_core::delivery::ActionResult;

/// What a run's executor is handed.
#[derive(Debug, Clone)]
pub struct StartRequest<'a> {
    pub run_id: &'a str,
    pub delivery_id: &'a str,
    /// Id of the attempt's `trigger.delivery.attempted` event (the run's `causationId`).
    pub causation_id: &'a str,
    pub inputs: &'a Value,
    pub subscription_id: &'a str,
    pub event_type: &'a str,
    pub receipt_id: &'a str,
    /// This attempt's number, 1-based.
    pub attempt: u32,
    /// The attempt's trace context, passed on as `traceparent` ([`crate::trace::attempt_span`]).
    pub trace: tb_core::trace::TraceContext,
}

/// A failed start: the attempt's result and its short, sanitized message: `HTTP
/// <status>[: <first bytes of the body, printable only, <= 256 bytes>]`, or a plain sentence for
/// connect / timeout / request errors. Never a header value, a URL or a secret.
#[derive(Debug, Clone, PartialEq)]
pub struct StartFailure {
    /// The failed result (`error_class`, `Retry-After`, permanence) the retry decision reads.
    pub result: ActionResult,
    /// Stored as the attempt's `message`, shown as `attempts[].message`, logged at `warn`.
    pub message: String,
}

/// A retryable failure of class `error_class` with `message`.
pub(crate) fn failure(error_class: &str, message: String) -> StartFailure {
    StartFailure {
        result: ActionResult::Failed {
            error_class: error_class.into(),
            retry_after_ms: None,
            permanent: false,
        },
        message,
    }
}
