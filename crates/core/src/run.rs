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

#[cfg(test)]
mod tests {
    use super::*;

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
