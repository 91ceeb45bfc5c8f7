//! Runs (DESIGN §4 Run; OpenWOP run statuses).

use serde::{Deserialize, Serialize};

/// OpenWOP run status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunStatus {
    Pending,
    Running,
    Paused,
    WaitingApproval,
    WaitingInput,
    WaitingExternal,
    Completed,
    Failed,
    Cancelling,
    Cancelled,
}

impl RunStatus {
    /// Wire string (`running`, `waiting-external`, ...).
    pub fn as_str(self) -> &'static str {
        use RunStatus::*;
        match self {
            Pending => "pending",
            Running => "running",
            Paused => "paused",
            WaitingApproval => "waiting-approval",
            WaitingInput => "waiting-input",
            WaitingExternal => "waiting-external",
            Completed => "completed",
            Failed => "failed",
            Cancelling => "cancelling",
            Cancelled => "cancelled",
        }
    }

    /// Parses the wire string.
    pub fn parse(s: &str) -> Option<Self> {
        use RunStatus::*;
        [
            Pending,
            Running,
            Paused,
            WaitingApproval,
            WaitingInput,
            WaitingExternal,
            Completed,
            Failed,
            Cancelling,
            Cancelled,
        ]
        .into_iter()
        .find(|x| x.as_str() == s)
    }

    /// `completed`, `failed` and `cancelled` are terminal.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        )
    }

    /// The terminal event type that ends a run in this status (`run.completed`, ...), if terminal.
    pub fn terminal_event(self) -> Option<&'static str> {
        match self {
            RunStatus::Completed => Some("run.completed"),
            RunStatus::Failed => Some("run.failed"),
            RunStatus::Cancelled => Some("run.cancelled"),
            _ => None,
        }
    }
}

/// A worker's report for a run (`POST /v1/runs/{runId}/result {status, output?}`): only a terminal
/// status is accepted. Returns the status, or an error message saying what is allowed.
pub fn parse_result_status(s: &str) -> Result<RunStatus, String> {
    match RunStatus::parse(s) {
        Some(st) if st.is_terminal() => Ok(st),
        _ => Err("status must be one of completed, failed, cancelled".to_string()),
    }
}

/// Prefix of a run's result token ([`result_token`]); the credential list knows it
/// (`crate::credentials`).
pub const RESULT_TOKEN_PREFIX: &str = "tbres_";

/// What a run's result token is an HMAC of, before the run id (a versioned purpose, so the token is
/// never a valid signature of anything else made with the workflow's key).
const RESULT_TOKEN_PURPOSE: &[u8] = b"trigger-bridge run result v1\n";

/// The result token of run `run_id` of an `http` workflow whose signing key is `key` (the decoded
/// `whsec_` secret the executor signs its start request with): `tbres_` + the lowercase hex of
/// HMAC-SHA256(`key`, `"trigger-bridge run result v1\n"` + `run_id`), 70 characters. The http executor
/// sends it in the start request (`resultToken`); the worker proves with it that it is the run's
/// executor when it reports the result (`Authorization: Bearer tbres_...` on
/// `POST /v1/runs/{id}/result`, docs/http-api.md). Only a holder of the workflow's key can make one,
/// and one token ends one run. A new key (a changed `secret`) makes the tokens of running runs stale.
pub fn result_token(key: &[u8], run_id: &str) -> String {
    use hmac::Mac;
    format!(
        "{RESULT_TOKEN_PREFIX}{}",
        hex::encode(result_mac(key, run_id).finalize().into_bytes())
    )
}

/// Whether `presented` is run `run_id`'s [`result_token`] under `key`, compared in constant time.
pub fn result_token_matches(key: &[u8], run_id: &str, presented: &str) -> bool {
    use hmac::Mac;
    let Some(mac) = presented
        .strip_prefix(RESULT_TOKEN_PREFIX)
        .filter(|h| h.len() == 64)
        .and_then(|h| hex::decode(h).ok())
    else {
        return false;
    };
    result_mac(key, run_id).verify_slice(&mac).is_ok()
}

fn result_mac(key: &[u8], run_id: &str) -> hmac::Hmac<sha2::Sha256> {
    use hmac::Mac;
    let mut m = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(key)
        .expect("HMAC takes a key of any length");
    m.update(RESULT_TOKEN_PURPOSE);
    m.update(run_id.as_bytes());
    m
}

/// Why a run cannot be ended as asked (`finish_run`; the store answers `StoreError::Conflict` with this
/// sentence, the API 409).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FinishRefused {
    /// The requested status is not `completed`, `failed` or `cancelled`.
    #[error("{} is not a terminal status", .0.as_str())]
    NotTerminal(RunStatus),
    /// The run has already ended in this status (a run ends once).
    #[error("the run is already {}", .0.as_str())]
    AlreadyEnded(RunStatus),
}

/// Checks ending a run now in `current` with `to`, and gives the terminal event type to append
/// (`run.completed`, `run.failed`, `run.cancelled`). The backend loads `current` under the run row's
/// lock (`SELECT status FROM runs WHERE id = ?1 FOR UPDATE`), calls this BEFORE anything else of the
/// run's end (the session rules' run-end expiry writes its events first), then sets `status = to`,
/// clears `wait_reason` and appends the event at the run row's `next_sequence`. Errors:
/// [`FinishRefused::NotTerminal`], [`FinishRefused::AlreadyEnded`].
pub fn finish(current: RunStatus, to: RunStatus) -> Result<&'static str, FinishRefused> {
    let Some(event) = to.terminal_event() else {
        return Err(FinishRefused::NotTerminal(to));
    };
    if current.is_terminal() {
        return Err(FinishRefused::AlreadyEnded(current));
    }
    Ok(event)
}

/// What a run id announced in a 202 reads as while no run row exists yet, decided from the state of
/// the `start_run` delivery that will start it (an announced run id always resolves).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnnouncedRun {
    /// `pending`/`retrying` delivery (also after a replay): the run reads `pending`.
    Pending,
    /// `delivered`: the run exists now; read it.
    Started,
    /// `dead-lettered`: the run reads `failed` with this `statusReason` until a replay makes it
    /// `pending` again.
    Failed {
        /// Machine word for why, e.g. `dead_lettered`.
        reason: &'static str,
    },
}

/// The [`AnnouncedRun`] of a run whose starting delivery is in `state`.
pub fn announced_run(state: crate::delivery::DeliveryState) -> AnnouncedRun {
    use crate::delivery::DeliveryState as D;
    match state {
        D::Pending | D::Retrying => AnnouncedRun::Pending,
        D::Delivered => AnnouncedRun::Started,
        D::DeadLettered => AnnouncedRun::Failed {
            reason: "dead_lettered",
        },
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_result_token_belongs_to_one_run_and_one_key() {
        use super::{result_token, result_token_matches};
        let key = b"0123456789abcdef01234567";
        let t = result_token(key, "run_1");
        assert!(t.starts_with("tbres_") && t.len() == 70, "{t}");
        assert_eq!(t, result_token(key, "run_1"));
        assert!(result_token_matches(key, "run_1", &t));
        assert!(!result_token_matches(key, "run_2", &t));
        assert!(!result_token_matches(b"another key", "run_1", &t));
        assert!(!result_token_matches(key, "run_1", &t.to_uppercase()));
        assert!(!result_token_matches(key, "run_1", &t[..69]));
        assert!(!result_token_matches(key, "run_1", "tbres_"));
        assert!(
            crate::credentials::contains(&t),
            "the credential list knows the shape"
        );
    }

    #[test]
    fn an_announced_run_reads_from_its_delivery() {
        use super::{announced_run, AnnouncedRun};
        use crate::delivery::DeliveryState as D;
        assert_eq!(announced_run(D::Pending), AnnouncedRun::Pending);
        assert_eq!(announced_run(D::Retrying), AnnouncedRun::Pending);
        assert_eq!(announced_run(D::Delivered), AnnouncedRun::Started);
        assert_eq!(
            announced_run(D::DeadLettered),
            AnnouncedRun::Failed {
                reason: "dead_lettered"
            }
        );
    }

    use super::*;

    #[test]
    fn a_run_ends_once_and_only_in_a_terminal_status() {
        use RunStatus as S;
        assert_eq!(finish(S::Running, S::Completed), Ok("run.completed"));
        assert_eq!(
            finish(S::WaitingExternal, S::Cancelled),
            Ok("run.cancelled")
        );
        assert_eq!(finish(S::Pending, S::Failed), Ok("run.failed"));
        assert_eq!(
            finish(S::Running, S::Paused),
            Err(FinishRefused::NotTerminal(S::Paused))
        );
        assert_eq!(
            finish(S::Completed, S::Failed),
            Err(FinishRefused::AlreadyEnded(S::Completed))
        );
        assert_eq!(
            finish(S::Completed, S::Running),
            Err(FinishRefused::NotTerminal(S::Running)),
            "a bad request is named before the run's state"
        );
        assert_eq!(
            FinishRefused::NotTerminal(S::Running).to_string(),
            "running is not a terminal status"
        );
        assert_eq!(
            FinishRefused::AlreadyEnded(S::Cancelled).to_string(),
            "the run is already cancelled"
        );
    }

    #[test]
    fn terminal_statuses() {
        assert!(RunStatus::Completed.is_terminal());
        assert!(!RunStatus::WaitingExternal.is_terminal());
        assert_eq!(
            RunStatus::parse("waiting-external"),
            Some(RunStatus::WaitingExternal)
        );
        assert_eq!(RunStatus::Failed.terminal_event(), Some("run.failed"));
        assert!(parse_result_status("running").is_err());
        assert_eq!(parse_result_status("completed"), Ok(RunStatus::Completed));
    }
}
