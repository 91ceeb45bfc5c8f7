//! Bulk dead-letter replay rules: which dead letters a filter selects, how many one call may replay,
//! and the confirmation a real (non-preview) replay must carry.
//!
//! The confirmation is an echo of the previewed count: a preview (`dryRun: true`, the default) answers
//! `count`; the real call must send `expect` equal to the count of dead letters matching the filter at
//! that moment, else it is refused (409 `replay_count_changed`) with nothing replayed. A missing
//! `expect` on a real call is 400 `validation_error`, so neither a bare POST nor a changed selection
//! (new dead letters, a filter typo widening it) can replay anything by accident.

use crate::delivery::DeliveryState;
use crate::receipt::ReceiptState;
use crate::{ErrorCode, TbError};

/// Most deliveries one bulk replay call replays (and the default batch); the answer says `more: true`
/// when further matching dead letters remain.
pub const MAX_BATCH: u32 = 1000;

/// Most delivery ids a preview lists as its `sample`.
pub const SAMPLE_SIZE: u32 = 20;

/// Longest error class a filter may name (attempt error classes are short codes like `http_500`).
pub const MAX_ERROR_CLASS_LEN: usize = 64;

/// Which dead letters of one subscription a bulk replay selects. Times are Unix ms on the delivery's
/// dead-lettering time: `from` inclusive, `to` exclusive. `error_class` is the exact error class of
/// the delivery's last (dead-lettering) attempt, e.g. `http_500`, `connect`, `timeout`. The store
/// selects by it (`Store::dead_letter_selection`); only dead letters within the retention are selected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplayFilter {
    pub from_ms: Option<i64>,
    pub to_ms: Option<i64>,
    pub error_class: Option<String>,
}

impl ReplayFilter {
    /// Checks the filter. Errors (`validation_error`): `from` not before `to`; an error class that is
    /// empty, over [`MAX_ERROR_CLASS_LEN`] bytes, or not `[a-z0-9_.-]`.
    pub fn validate(&self) -> Result<(), TbError> {
        if let (Some(f), Some(t)) = (self.from_ms, self.to_ms) {
            if f >= t {
                return Err(invalid("filter.from must be before filter.to"));
            }
        }
        if let Some(c) = &self.error_class {
            let ok = !c.is_empty()
                && c.len() <= MAX_ERROR_CLASS_LEN
                && c.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'.' | b'-')
                });
            if !ok {
                return Err(invalid(
                    "filter.errorClass must be 1 to 64 of [a-z0-9_.-], e.g. http_500 or connect",
                ));
            }
        }
        Ok(())
    }
}

/// The batch size of one call: `requested` (1 to [`MAX_BATCH`]) or [`MAX_BATCH`]. Errors
/// (`validation_error`): 0 or over the cap.
pub fn batch_limit(requested: Option<u64>) -> Result<u32, TbError> {
    match requested {
        None => Ok(MAX_BATCH),
        Some(n) if (1..=MAX_BATCH as u64).contains(&n) => Ok(n as u32),
        Some(_) => Err(invalid(format!("limit must be 1 to {MAX_BATCH}"))),
    }
}

/// What a bulk replay call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayMode {
    /// Count and sample only; nothing changes.
    Preview,
    /// Replay (the confirmation matched).
    Replay,
}

/// Decides a call from its `dryRun` (default true), its `expect` and the `count` of dead letters the
/// filter selects now. Errors: a real call without `expect` is 400 `validation_error`; one whose
/// `expect` differs from `count` is 409 `replay_count_changed` (preview again).
pub fn decide(
    dry_run: Option<bool>,
    expect: Option<u64>,
    count: u64,
) -> Result<ReplayMode, TbError> {
    if dry_run.unwrap_or(true) {
        return Ok(ReplayMode::Preview);
    }
    match expect {
        None => Err(invalid(
            "a replay (dryRun: false) must confirm with expect: the count its preview (dryRun: true) answered",
        )),
        Some(e) if e == count => Ok(ReplayMode::Replay),
        Some(e) => Err(TbError::new(
            ErrorCode::ReplayCountChanged,
            format!(
                "expected {e} dead letters but the filter selects {count} now; preview again (dryRun: true) and confirm that count"
            ),
        )),
    }
}

/// Why a selected delivery was not replayed: it is no longer dead-lettered (a concurrent replay or
/// a previous call already put it back in the queue).
pub const SKIP_NOT_DEAD_LETTERED: &str = "not_dead_lettered";

/// The writes of replaying one dead-lettered delivery (`replay_delivery`, one or a bulk call's each).
/// Times are Unix ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reopen {
    /// The delivery's new state: `pending`.
    pub state: DeliveryState,
    /// Its new `due_at` (and `updated_at`): `now`, due at once.
    pub due_at: i64,
    /// Its new `replays`: one more; each replay grants one attempt beyond the retry policy's
    /// `max_attempts` (attempt numbers never reset). `dead_letter_reason`, `lease_owner`,
    /// `lease_token` and `lease_until` are cleared.
    pub replays: u32,
    /// The receipt's new state: `routed` (its work is open again; it settles anew when it ends).
    pub receipt_state: ReceiptState,
}

/// Why a delivery cannot be replayed (the store answers `StoreError::Conflict` with this sentence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("only dead-lettered deliveries can be replayed; this one is {}", .0.as_str())]
pub struct NotDeadLettered(pub DeliveryState);

/// Replays a delivery now in `state` with `replays` replays so far, at `now` (Unix ms). The backend
/// loads `state` and `replays` under the delivery row's lock (`FOR UPDATE`), so two replays racing on
/// one dead letter reopen it once: the second sees `pending` and is refused. Errors:
/// [`NotDeadLettered`] for any state but `dead-lettered` (bulk replay reports it as
/// [`SKIP_NOT_DEAD_LETTERED`]).
pub fn reopen(state: DeliveryState, replays: u32, now: i64) -> Result<Reopen, NotDeadLettered> {
    if state != DeliveryState::DeadLettered {
        return Err(NotDeadLettered(state));
    }
    Ok(Reopen {
        state: DeliveryState::Pending,
        due_at: now,
        replays: replays.saturating_add(1),
        receipt_state: ReceiptState::Routed,
    })
}

fn invalid(m: impl Into<String>) -> TbError {
    TbError::new(ErrorCode::ValidationError, m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_validation() {
        assert!(ReplayFilter::default().validate().is_ok());
        let f = ReplayFilter {
            from_ms: Some(10),
            to_ms: Some(10),
            error_class: None,
        };
        assert_eq!(f.validate().unwrap_err().code, ErrorCode::ValidationError);
        for bad in ["", "HTTP_500", "a b", &"x".repeat(65)] {
            let f = ReplayFilter {
                error_class: Some(bad.into()),
                ..Default::default()
            };
            assert!(f.validate().is_err(), "{bad:?}");
        }
        let f = ReplayFilter {
            error_class: Some("http_500".into()),
            ..Default::default()
        };
        assert!(f.validate().is_ok());
    }

    #[test]
    fn only_a_dead_letter_reopens_due_now_with_one_more_replay() {
        assert_eq!(
            reopen(DeliveryState::DeadLettered, 2, 5_000),
            Ok(Reopen {
                state: DeliveryState::Pending,
                due_at: 5_000,
                replays: 3,
                receipt_state: ReceiptState::Routed,
            })
        );
        for s in [
            DeliveryState::Pending,
            DeliveryState::Retrying,
            DeliveryState::Delivered,
        ] {
            assert_eq!(reopen(s, 0, 1), Err(NotDeadLettered(s)));
        }
        assert_eq!(
            NotDeadLettered(DeliveryState::Retrying).to_string(),
            "only dead-lettered deliveries can be replayed; this one is retrying"
        );
    }

    #[test]
    fn batch_limits() {
        assert_eq!(batch_limit(None).unwrap(), MAX_BATCH);
        assert_eq!(batch_limit(Some(5)).unwrap(), 5);
        assert!(batch_limit(Some(0)).is_err());
        assert!(batch_limit(Some(MAX_BATCH as u64 + 1)).is_err());
    }

    #[test]
    fn confirmation() {
        assert_eq!(decide(None, None, 3).unwrap(), ReplayMode::Preview);
        assert_eq!(decide(Some(true), Some(9), 3).unwrap(), ReplayMode::Preview);
        assert_eq!(
            decide(Some(false), None, 3).unwrap_err().code,
            ErrorCode::ValidationError
        );
        assert_eq!(
            decide(Some(false), Some(2), 3).unwrap_err().code,
            ErrorCode::ReplayCountChanged
        );
        assert_eq!(decide(Some(false), Some(3), 3).unwrap(), ReplayMode::Replay);
    }
}
