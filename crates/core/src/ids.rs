//! Identifiers: a short type prefix plus a UUIDv7 in lowercase hex (time-ordered, so ids sort by creation).
//!
//! Shapes: `rcpt_<32 hex>` receipt, `dlv_<32 hex>` delivery, `run_<32 hex>` run, `evt_<32 hex>` event,
//! `lse_<32 hex>` lease token.
//! All fit the OpenWOP 1..128 character limit for `eventId` / `runId`.

/// Kinds of id this host mints; the prefix makes a pasted id self-describing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    Receipt,
    Delivery,
    Run,
    Event,
    Attempt,
    /// A signal raised without a caller-chosen `signalId`.
    Signal,
    /// An armed `wait_for_signal` / `wait_for_any`.
    Wait,
    /// A turn on a run's queue.
    Turn,
    /// A minted capability endpoint (`sgep_`, signals-and-connectors §4.1).
    Capability,
    /// A delivery lease's fencing token (`lse_`, `crate::lease`).
    Lease,
}

impl IdKind {
    /// The prefix written before the underscore.
    pub fn prefix(self) -> &'static str {
        match self {
            IdKind::Receipt => "rcpt",
            IdKind::Delivery => "dlv",
            IdKind::Run => "run",
            IdKind::Event => "evt",
            IdKind::Attempt => "att",
            IdKind::Signal => "sig",
            IdKind::Wait => "wait",
            IdKind::Turn => "turn",
            IdKind::Capability => "sgep",
            IdKind::Lease => "lse",
        }
    }
}

/// Mints a new, time-ordered id of the given kind, e.g. `rcpt_0192f0c3a1e47c2b9d3f6a0b1c2d3e4f`.
pub fn new_id(kind: IdKind) -> String {
    format!("{}_{}", kind.prefix(), uuid::Uuid::now_v7().simple())
}

/// The smallest id of `kind` minted at or after `ms` (ms since the epoch): a UUIDv7's first 12 hex
/// digits are its ms timestamp, so a time range is an id range and a scan of the primary key.
pub fn floor(kind: IdKind, ms: i64) -> String {
    format!("{}_{:012x}{}", kind.prefix(), ms.max(0), "0".repeat(20))
}

/// The id of the run a `start_run` delivery starts: the delivery's own UUID under the `run_` prefix, so
/// the run id can be announced at ingest and traced back to its delivery without a lookup table.
pub fn run_id_for_delivery(delivery_id: &str) -> String {
    format!(
        "run_{}",
        delivery_id.strip_prefix("dlv_").unwrap_or(delivery_id)
    )
}

/// The delivery that starts (or started) the run `run_id`, when `run_id` has the derived shape.
pub fn delivery_id_for_run(run_id: &str) -> Option<String> {
    run_id.strip_prefix("run_").map(|u| format!("dlv_{u}"))
}

/// Path segments that name routes under `/v1/trigger-subscriptions/` and so can never be a subscription
/// id (a subscription named `ingest` would collide with `/{id}/ingest` readers and links).
pub const RESERVED_SUBSCRIPTION_IDS: &[&str] = &[
    "ingest",
    "pause",
    "resume",
    "dead-letters",
    "dead-letters:replay",
    "quarantine",
    "release",
    "ingress-counts",
    "rotate-secret",
    ".",
    "..",
];

/// Checks a subscription id: 1 to 128 of letters, digits, `-`, `_`, `.`, and not one of
/// [`RESERVED_SUBSCRIPTION_IDS`]. Errors: the fix, as a sentence (config check and registration).
pub fn validate_subscription_id(id: &str) -> Result<(), String> {
    if id.is_empty()
        || id.len() > 128
        || !id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err("id must be 1 to 128 letters, digits, '-', '_', '.'".into());
    }
    if RESERVED_SUBSCRIPTION_IDS.contains(&id) {
        return Err(format!(
            "id {id:?} is reserved (it names a route under /v1/trigger-subscriptions/); reserved: {}",
            RESERVED_SUBSCRIPTION_IDS.join(", ")
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{floor, new_id, IdKind};

    #[test]
    fn a_floor_sorts_before_every_id_minted_at_or_after_it() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let before = floor(IdKind::Receipt, now - 1_000);
        let id = new_id(IdKind::Receipt);
        let after = floor(IdKind::Receipt, now + 60_000);
        assert!(before < id, "{before} {id}");
        assert!(id < after, "{id} {after}");
        assert_eq!(before.len(), id.len());
        assert!(before.starts_with("rcpt_"));
    }

    #[test]
    fn reserved_and_malformed_subscription_ids_are_refused() {
        for id in super::RESERVED_SUBSCRIPTION_IDS {
            assert!(super::validate_subscription_id(id).is_err(), "{id}");
        }
        assert!(super::validate_subscription_id("").is_err());
        assert!(super::validate_subscription_id("a/b").is_err());
        assert!(super::validate_subscription_id("github").is_ok());
        assert!(super::validate_subscription_id("ingest-2").is_ok());
    }

    use super::*;

    #[test]
    fn ids_are_prefixed_unique_and_time_ordered() {
        let a = new_id(IdKind::Receipt);
        let b = new_id(IdKind::Receipt);
        assert!(a.starts_with("rcpt_"));
        assert_eq!(a.len(), 5 + 32);
        assert_ne!(a, b);
        assert!(a < b, "uuid v7 ids sort by creation: {a} {b}");
    }

    #[test]
    fn run_and_delivery_ids_map_both_ways() {
        let d = new_id(IdKind::Delivery);
        let r = run_id_for_delivery(&d);
        assert!(r.starts_with("run_") && r.len() == d.len());
        assert_eq!(delivery_id_for_run(&r), Some(d));
        assert_eq!(delivery_id_for_run("nope"), None);
    }
}
