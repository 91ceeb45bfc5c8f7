//! Deliveries and attempts (DESIGN §4 Delivery): the decision after each attempt lives here.

use serde::{Deserialize, Serialize};

use crate::retry::RetryPolicy;

/// What a delivery is for, stored as `deliveries.kind` and written with the delivery: the worker picks
/// the retry policy, the action and the run rules by it (never by the shape of its ids).
///
/// - `binding`: a trigger binding matched an inbound event (any source: webhook, schedule, queue); its
///   subscription row holds the retry policy and counts its attempts.
/// - `api_run`: a run requested through `POST /v1/runs` (OpenWOP §12); the API run retry policy, and a
///   start that is exhausted is kept as a dead-lettered, failed run (RFC 0053).
/// - `capability_signal`: a minted capability endpoint's signal on its one run (signals-and-connectors
///   §4); the default retry policy.
/// - `outbound_webhook`: a run event sent to an outbound webhook registration; its `receipt_id` column
///   holds the run event's id and its `subscription_id`/`binding_id` the webhook id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryKind {
    Binding,
    ApiRun,
    CapabilitySignal,
    OutboundWebhook,
}

impl DeliveryKind {
    /// Every kind, in declaration order.
    pub const ALL: [DeliveryKind; 4] = [
        DeliveryKind::Binding,
        DeliveryKind::ApiRun,
        DeliveryKind::CapabilitySignal,
        DeliveryKind::OutboundWebhook,
    ];

    /// Stored string (`binding`, `api_run`, `capability_signal`, `outbound_webhook`).
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryKind::Binding => "binding",
            DeliveryKind::ApiRun => "api_run",
            DeliveryKind::CapabilitySignal => "capability_signal",
            DeliveryKind::OutboundWebhook => "outbound_webhook",
        }
    }

    /// Parses the stored string; `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// Delivery state: `pending -> delivered`, `pending -> retrying -> ... -> delivered | dead-lettered`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeliveryState {
    Pending,
    Retrying,
    Delivered,
    DeadLettered,
}

impl DeliveryState {
    /// Wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Retrying => "retrying",
            DeliveryState::Delivered => "delivered",
            DeliveryState::DeadLettered => "dead-lettered",
        }
    }

    /// Parses the wire string.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => DeliveryState::Pending,
            "retrying" => DeliveryState::Retrying,
            "delivered" => DeliveryState::Delivered,
            "dead-lettered" => DeliveryState::DeadLettered,
            _ => return None,
        })
    }

    /// True for `delivered` and `dead-lettered`.
    pub fn is_terminal(self) -> bool {
        matches!(self, DeliveryState::Delivered | DeliveryState::DeadLettered)
    }
}

/// The state word a delivery is shown with (API and CLI): its stored state, except that an open
/// (`pending`/`retrying`) delivery whose lease expires after `now` (ms) reads `in-flight`: a worker holds
/// it and an attempt is under way. Never stored or filtered on.
pub fn shown_state(state: DeliveryState, lease_until: Option<i64>, now: i64) -> &'static str {
    match lease_until {
        Some(until) if !state.is_terminal() && until > now => "in-flight",
        _ => state.as_str(),
    }
}

/// Outcome of one attempt, as announced by `trigger.delivery.attempted.outcome` (OpenWOP trigger-bridge §3),
/// plus [`AttemptOutcome::Lost`], which only the attempt log holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttemptOutcome {
    Delivered,
    Retrying,
    DeadLettered,
    /// The attempt's lease lapsed with no outcome recorded (its worker stopped, or its commit could
    /// not reach the store) and the delivery was leased again: whether its action took effect is not
    /// known (`crate::lease::take_over`, docs/operations.md "Lost attempts"). Recorded when the lease
    /// is taken over, never announced as a `trigger.delivery.attempted` event.
    Lost,
}

impl AttemptOutcome {
    /// Wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Delivered => "delivered",
            AttemptOutcome::Retrying => "retrying",
            AttemptOutcome::DeadLettered => "dead-lettered",
            AttemptOutcome::Lost => "lost",
        }
    }
}

/// What performing the action gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionResult {
    /// The action took effect.
    Done,
    /// The action failed. `retry_after_ms` is the target's `Retry-After`, if any; `permanent` failures
    /// (e.g. the workflow no longer exists) dead-letter without further attempts. `error_class` is a short,
    /// content-free classification such as `http_500`, `timeout`, `connect`.
    Failed {
        error_class: String,
        retry_after_ms: Option<u64>,
        permanent: bool,
    },
}

/// The decision after attempt number `attempt` (1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptDecision {
    Delivered,
    /// Try again after `delay_ms`.
    Retry {
        delay_ms: u64,
    },
    DeadLetter,
}

impl AttemptDecision {
    /// The announced outcome and the delivery's next state.
    pub fn outcome(self) -> (AttemptOutcome, DeliveryState) {
        match self {
            AttemptDecision::Delivered => (AttemptOutcome::Delivered, DeliveryState::Delivered),
            AttemptDecision::Retry { .. } => (AttemptOutcome::Retrying, DeliveryState::Retrying),
            AttemptDecision::DeadLetter => {
                (AttemptOutcome::DeadLettered, DeliveryState::DeadLettered)
            }
        }
    }
}

/// Decides what follows attempt `attempt` under `policy`; `unit` in [0, 1) draws the jitter.
pub fn decide(
    policy: &RetryPolicy,
    attempt: u32,
    result: &ActionResult,
    unit: f64,
) -> AttemptDecision {
    match result {
        ActionResult::Done => AttemptDecision::Delivered,
        ActionResult::Failed {
            permanent: true, ..
        } => AttemptDecision::DeadLetter,
        ActionResult::Failed { retry_after_ms, .. } => {
            if attempt >= policy.max_attempts {
                AttemptDecision::DeadLetter
            } else {
                AttemptDecision::Retry {
                    delay_ms: policy.delay_ms(attempt + 1, unit, *retry_after_ms),
                }
            }
        }
    }
}

/// Dead-letter reason of a delivery whose retries ran out.
pub const RETRIES_EXHAUSTED: &str = "retries_exhausted";

/// The worker answers a workflow never retries unless it says otherwise
/// (`[[workflows]] non_retryable_statuses`, docs/configuration.md): `410 Gone`, by which a worker says
/// the target is gone for good (RFC 9110 §15.5.11); retried, it would run to the end of the schedule
/// (about 38 h with the default one).
pub const DEFAULT_NON_RETRYABLE_STATUSES: &[u16] = &[410];

/// Most statuses one workflow lists as non-retryable.
pub const MAX_NON_RETRYABLE_STATUSES: usize = 64;

/// Checks a workflow's `non_retryable_statuses`: at most [`MAX_NON_RETRYABLE_STATUSES`], each a
/// failure a worker can answer (300 to 599; 2xx complete or hold the run, 1xx never ends a request).
/// Errors: a sentence naming the bad value.
pub fn check_non_retryable_statuses(statuses: &[u16]) -> Result<(), String> {
    if statuses.len() > MAX_NON_RETRYABLE_STATUSES {
        return Err(format!(
            "non_retryable_statuses lists {} statuses; at most {MAX_NON_RETRYABLE_STATUSES}",
            statuses.len()
        ));
    }
    match statuses.iter().find(|s| !(300..=599).contains(*s)) {
        Some(s) => Err(format!(
            "non_retryable_statuses: {s} is not a failure status (300 to 599)"
        )),
        None => Ok(()),
    }
}

/// The failed attempt of a worker that answered `status` (a failure): class `http_<status>`, with the
/// worker's `Retry-After`. It is permanent when `status` is one of the workflow's `non_retryable`
/// statuses, so [`decide`] dead-letters it at once and [`dead_letter_reason`] keeps `http_<status>` as
/// the reason; otherwise it is retried per the policy.
pub fn http_answer_failure(
    status: u16,
    retry_after_ms: Option<u64>,
    non_retryable: &[u16],
) -> ActionResult {
    ActionResult::Failed {
        error_class: format!("http_{status}"),
        retry_after_ms,
        permanent: non_retryable.contains(&status),
    }
}

/// The dead-letter reason a delivery is stored with after `decision`: `None` unless it dead-letters; a
/// `permanent` failure keeps its own `error_class` (e.g. `target_terminal`, `workflow_missing`, which
/// [`crate::receipt::settle`] reads), anything else is [`RETRIES_EXHAUSTED`].
pub fn dead_letter_reason(
    decision: AttemptDecision,
    error_class: Option<&str>,
    permanent: bool,
) -> Option<String> {
    if decision != AttemptDecision::DeadLetter {
        return None;
    }
    Some(match (error_class, permanent) {
        (Some(class), true) => class.to_string(),
        _ => RETRIES_EXHAUSTED.to_string(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_dead_letter_keeps_a_permanent_class_else_retries_exhausted() {
        use super::*;
        let dl = AttemptDecision::DeadLetter;
        let reason = |d, class, permanent| dead_letter_reason(d, class, permanent);
        assert_eq!(
            reason(dl, Some("target_terminal"), true).as_deref(),
            Some("target_terminal")
        );
        assert_eq!(
            reason(dl, Some("http_500"), false).as_deref(),
            Some("retries_exhausted")
        );
        assert_eq!(reason(dl, None, true).as_deref(), Some("retries_exhausted"));
        assert_eq!(reason(AttemptDecision::Delivered, None, false), None);
        let retry = AttemptDecision::Retry { delay_ms: 5 };
        assert_eq!(reason(retry, Some("http_500"), true), None);
    }

    #[test]
    fn a_leased_open_delivery_reads_in_flight() {
        use super::{shown_state, DeliveryState as D};
        assert_eq!(shown_state(D::Pending, Some(2_000), 1_000), "in-flight");
        assert_eq!(shown_state(D::Retrying, Some(2_000), 1_000), "in-flight");
        assert_eq!(
            shown_state(D::Pending, Some(1_000), 1_000),
            "pending",
            "lapsed lease"
        );
        assert_eq!(shown_state(D::Retrying, None, 1_000), "retrying");
        assert_eq!(shown_state(D::Delivered, Some(2_000), 1_000), "delivered");
    }

    use super::*;
    use crate::retry::Backoff;

    fn failed() -> ActionResult {
        ActionResult::Failed {
            error_class: "http_500".into(),
            retry_after_ms: None,
            permanent: false,
        }
    }

    #[test]
    fn retries_until_max_attempts_then_dead_letters() {
        let p = RetryPolicy {
            max_attempts: 3,
            backoff: Backoff::Fixed,
            initial_ms: 10,
            max_ms: 10,
            jitter: 0.0,
            schedule_ms: None,
        };
        assert_eq!(
            decide(&p, 1, &failed(), 0.5),
            AttemptDecision::Retry { delay_ms: 10 }
        );
        assert_eq!(
            decide(&p, 2, &failed(), 0.5),
            AttemptDecision::Retry { delay_ms: 10 }
        );
        assert_eq!(decide(&p, 3, &failed(), 0.5), AttemptDecision::DeadLetter);
        assert_eq!(
            decide(&p, 3, &ActionResult::Done, 0.5),
            AttemptDecision::Delivered
        );
        let perm = ActionResult::Failed {
            error_class: "x".into(),
            retry_after_ms: None,
            permanent: true,
        };
        assert_eq!(decide(&p, 1, &perm, 0.5), AttemptDecision::DeadLetter);
    }

    #[test]
    fn retry_after_feeds_the_delay() {
        let p = RetryPolicy::default();
        let r = ActionResult::Failed {
            error_class: "http_503".into(),
            retry_after_ms: Some(7_000),
            permanent: false,
        };
        assert_eq!(
            decide(&p, 1, &r, 0.5),
            AttemptDecision::Retry { delay_ms: 7_000 }
        );
    }
}

/// Largest response-body excerpt kept in an attempt's message, in bytes.
pub const MESSAGE_BODY_BYTES: usize = 256;

/// The short, sanitized message of an attempt that got an HTTP answer: `HTTP <status>` and, when the
/// body has printable text, `: <excerpt>` from at most the first [`MESSAGE_BODY_BYTES`] bytes of the
/// body. Only printable ASCII survives (control characters, escapes and non-ASCII become one space,
/// runs of spaces collapse), so the message can be logged and shown as is. Headers are never read.
pub fn http_failure_message(status: u16, body_head: &[u8]) -> String {
    let head = &body_head[..body_head.len().min(MESSAGE_BODY_BYTES)];
    let mut text = String::with_capacity(head.len());
    for &b in head {
        let c = if (0x21..=0x7e).contains(&b) {
            b as char
        } else {
            ' '
        };
        if c == ' ' && (text.is_empty() || text.ends_with(' ')) {
            continue;
        }
        text.push(c);
    }
    let text = text.trim_end();
    if text.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {text}")
    }
}

#[cfg(test)]
mod message_tests {
    use super::*;

    #[test]
    fn http_messages_are_capped_printable_and_single_line() {
        assert_eq!(http_failure_message(500, b""), "HTTP 500");
        assert_eq!(http_failure_message(503, b" \r\n\t "), "HTTP 503");
        assert_eq!(
            http_failure_message(500, b"{\"error\":\n  \"db down\"}\x1b[31m\xc3\xa9"),
            "HTTP 500: {\"error\": \"db down\"} [31m"
        );
        let long = vec![b'a'; 10_000];
        let m = http_failure_message(502, &long);
        assert_eq!(m.len(), "HTTP 502: ".len() + MESSAGE_BODY_BYTES);
        assert!(m.bytes().all(|b| (0x20..=0x7e).contains(&b)));
    }
    #[test]
    fn delivery_kinds_round_trip() {
        let names: Vec<_> = DeliveryKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "binding",
                "api_run",
                "capability_signal",
                "outbound_webhook"
            ]
        );
        for k in DeliveryKind::ALL {
            assert_eq!(DeliveryKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(DeliveryKind::parse("webhook"), None);
    }
}

#[cfg(test)]
mod non_retryable_tests {
    use super::*;

    #[test]
    fn a_non_retryable_status_dead_letters_at_the_first_attempt_with_its_class() {
        let policy = RetryPolicy::default();
        let gone = http_answer_failure(410, None, DEFAULT_NON_RETRYABLE_STATUSES);
        assert_eq!(decide(&policy, 1, &gone, 0.5), AttemptDecision::DeadLetter);
        let ActionResult::Failed {
            error_class,
            permanent,
            ..
        } = &gone
        else {
            panic!("a failure")
        };
        assert_eq!(
            dead_letter_reason(AttemptDecision::DeadLetter, Some(error_class), *permanent)
                .as_deref(),
            Some("http_410")
        );
        // Other failures are retried, Retry-After kept; a workflow may list others or none.
        let busy = http_answer_failure(503, Some(7_000), DEFAULT_NON_RETRYABLE_STATUSES);
        assert_eq!(
            decide(&policy, 1, &busy, 0.5),
            AttemptDecision::Retry { delay_ms: 7_000 }
        );
        assert_eq!(
            decide(
                &policy,
                1,
                &http_answer_failure(404, None, &[404, 410]),
                0.5
            ),
            AttemptDecision::DeadLetter
        );
        assert!(matches!(
            decide(&policy, 1, &http_answer_failure(410, None, &[]), 0.5),
            AttemptDecision::Retry { .. }
        ));
    }

    #[test]
    fn non_retryable_statuses_must_be_failures() {
        assert!(check_non_retryable_statuses(&[410, 404, 301, 599]).is_ok());
        assert!(check_non_retryable_statuses(&[]).is_ok());
        for bad in [200, 202, 299, 600, 100] {
            let e = check_non_retryable_statuses(&[410, bad]).unwrap_err();
            assert!(e.contains(&bad.to_string()), "{e}");
        }
        assert!(check_non_retryable_statuses(&[410; 65]).is_err());
    }
}
