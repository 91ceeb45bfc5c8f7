//! The audit log's rules (issue #13; signals seed: "audit connector and binding changes, secret
//! rotation, revocation, replay and delivery decisions"): what an entry holds, how it is chained, and
//! how a chain is checked. The store appends and reads; it decides nothing.
//!
//! Each entry carries `seq` (1, 2, 3 ... with no gaps), the hash of the entry before it (`prevHash`,
//! [`GENESIS`] for the first) and its own `hash` = SHA-256 over `prevHash` and every field, each
//! length-prefixed. Editing any field of a stored row, deleting a row or inserting one breaks the chain at
//! that row, which [`Verifier`] reports with the row's `seq`. A chain whose newest rows were deleted is
//! caught by comparing the last row with the head the store keeps beside the log, and a row inserted past
//! the head by comparing the largest stored `seq` with it in the same snapshot ([`Verifier::finish`]).
//! What the chain cannot catch is someone who rewrites every row after the edit *and* the head: the log
//! is evidence against a hand edit, not against a database owner rewriting history.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The `prevHash` of the first entry: 64 zeros.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Longest `detail` JSON text of one entry, in bytes; a longer detail is replaced by
/// `{"truncated": true}` so an entry stays small.
pub const MAX_DETAIL: usize = 4096;

/// An action to record: who did what to which target, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewEntry {
    /// When, in ms since the Unix epoch.
    pub at: i64,
    /// Who: an API key's name (`anonymous` on an open API), `replica:<id>` for the server itself, or
    /// `rule:<name>` for an automatic rule (`rule:quarantine`).
    pub actor: String,
    /// What, as a stable dotted name: `subscription.pause`, `dead_letters.replay`, `signal.raise` ...
    pub action: String,
    /// On what: the record id(s) the action names (`sub_…`, `run_…/ci-done`), or `""`.
    pub target: String,
    /// How it ended: `ok`, or the error code of the answer (`not_found`, `conflict`, ...).
    pub outcome: String,
    /// A small JSON object with the action's facts (counts, HTTP status); never a body or a secret.
    pub detail: String,
}

/// A stored entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Entry {
    /// Position in the log, from 1, without gaps.
    pub seq: i64,
    /// The recorded action.
    #[serde(flatten)]
    pub entry: NewEntry,
    /// `hash` of entry `seq - 1` ([`GENESIS`] for seq 1), lowercase hex.
    pub prev_hash: String,
    /// SHA-256 of this entry (see [`hash`]), lowercase hex.
    pub hash: String,
}

/// The hash of entry `seq` holding `e`, after `prev_hash`: SHA-256 over `prev_hash`, `seq` and each field,
/// every one preceded by its length in bytes (8, big-endian), so no two different entries hash alike by
/// moving bytes between fields.
pub fn hash(prev_hash: &str, seq: i64, e: &NewEntry) -> String {
    let mut h = Sha256::new();
    let seq = seq.to_string();
    let at = e.at.to_string();
    for part in [
        prev_hash,
        seq.as_str(),
        at.as_str(),
        e.actor.as_str(),
        e.action.as_str(),
        e.target.as_str(),
        e.outcome.as_str(),
        e.detail.as_str(),
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

/// The entry that follows the head `(seq, hash)` (`(0, GENESIS)` for an empty log). A detail longer than
/// [`MAX_DETAIL`] is replaced by `{"truncated":true}`.
pub fn next(head_seq: i64, head_hash: &str, mut e: NewEntry) -> Entry {
    if e.detail.len() > MAX_DETAIL {
        e.detail = r#"{"truncated":true}"#.into();
    }
    let seq = head_seq + 1;
    let hash = hash(head_hash, seq, &e);
    Entry {
        seq,
        entry: e,
        prev_hash: head_hash.to_string(),
        hash,
    }
}

/// Why a chain does not hold, at which `seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "problem")]
pub enum Break {
    /// The row's fields do not hash to its stored `hash`: the row was edited.
    Edited { seq: i64 },
    /// The row's `prevHash` is not the hash of the row before it: a row before it was replaced.
    Relinked { seq: i64 },
    /// `seq` jumps: rows `expected ..= found - 1` are missing.
    Gap { expected: i64, found: i64 },
    /// The last row is not the head the store recorded: newest rows were deleted (or the head edited).
    HeadMismatch { last_seq: i64, head_seq: i64 },
    /// Rows exist past the head (read in the same snapshot, where every append moves the head with
    /// its row): they were inserted by hand, or the head was moved back.
    BeyondHead { head_seq: i64, max_seq: i64 },
}

impl std::fmt::Display for Break {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Break::Edited { seq } => write!(f, "entry {seq} was edited: its fields do not hash to its stored hash"),
            Break::Relinked { seq } => write!(f, "entry {seq} does not follow entry {}: its prevHash is not that entry's hash", seq - 1),
            Break::Gap { expected, found } => write!(f, "entries {expected}..{} are missing (the next stored entry is {found})", found - 1),
            Break::HeadMismatch { last_seq, head_seq } => write!(f, "the log ends at entry {last_seq} but its head says {head_seq}: entries were deleted or the head was edited"),
            Break::BeyondHead { head_seq, max_seq } => write!(f, "entries {}..{max_seq} lie past the head (entry {head_seq}): they were inserted by hand or the head was moved back", head_seq + 1),
        }
    }
}

/// Checks a chain read in `seq` order, one page at a time (memory stays one page).
#[derive(Debug, Clone)]
pub struct Verifier {
    seq: i64,
    hash: String,
    checked: u64,
}

impl Default for Verifier {
    fn default() -> Self {
        Verifier {
            seq: 0,
            hash: GENESIS.into(),
            checked: 0,
        }
    }
}

impl Verifier {
    /// Checks the next entry; the first problem is returned and the verifier should not be fed more.
    pub fn feed(&mut self, e: &Entry) -> Result<(), Break> {
        if e.seq != self.seq + 1 {
            return Err(Break::Gap {
                expected: self.seq + 1,
                found: e.seq,
            });
        }
        if hash(&e.prev_hash, e.seq, &e.entry) != e.hash {
            return Err(Break::Edited { seq: e.seq });
        }
        if e.prev_hash != self.hash {
            return Err(Break::Relinked { seq: e.seq });
        }
        self.seq = e.seq;
        self.hash = e.hash.clone();
        self.checked += 1;
        Ok(())
    }

    /// The last `seq` checked (0 before any).
    pub fn last_seq(&self) -> i64 {
        self.seq
    }

    /// Entries checked so far.
    pub fn checked(&self) -> u64 {
        self.checked
    }

    /// Ends the check against the head the store keeps and the largest `seq` stored, both read in one
    /// snapshot: no row may lie past the head, and the last entry checked must be the head.
    pub fn finish(&self, head_seq: i64, head_hash: &str, max_seq: i64) -> Result<u64, Break> {
        if max_seq > head_seq {
            return Err(Break::BeyondHead { head_seq, max_seq });
        }
        if self.seq != head_seq || self.hash != head_hash {
            return Err(Break::HeadMismatch {
                last_seq: self.seq,
                head_seq,
            });
        }
        Ok(self.checked)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(action: &str) -> NewEntry {
        NewEntry {
            at: 1_700_000_000_000,
            actor: "ops".into(),
            action: action.into(),
            target: "sub_1".into(),
            outcome: "ok".into(),
            detail: "{}".into(),
        }
    }

    fn chain(n: usize) -> Vec<Entry> {
        let mut out: Vec<Entry> = Vec::new();
        for i in 0..n {
            let (s, h) = out
                .last()
                .map(|l| (l.seq, l.hash.clone()))
                .unwrap_or((0, GENESIS.into()));
            out.push(next(s, &h, e(&format!("a{i}"))));
        }
        out
    }

    fn check(rows: &[Entry]) -> Result<u64, Break> {
        let mut v = Verifier::default();
        for r in rows {
            v.feed(r)?;
        }
        let (s, h) = rows
            .last()
            .map(|l| (l.seq, l.hash.clone()))
            .unwrap_or((0, GENESIS.into()));
        v.finish(s, &h, s)
    }

    #[test]
    fn an_untouched_chain_verifies() {
        let c = chain(5);
        assert_eq!(c[0].prev_hash, GENESIS);
        assert_eq!(c[1].prev_hash, c[0].hash);
        assert_eq!(check(&c), Ok(5));
        assert_eq!(check(&[]), Ok(0));
    }

    #[test]
    fn an_edited_field_is_found_at_its_row() {
        let mut c = chain(5);
        c[2].entry.outcome = "forbidden".into();
        assert_eq!(check(&c), Err(Break::Edited { seq: 3 }));
        let mut c = chain(5);
        c[3].entry.at += 1;
        assert_eq!(check(&c), Err(Break::Edited { seq: 4 }));
    }

    #[test]
    fn a_rehashed_row_breaks_the_link_of_the_next() {
        let mut c = chain(4);
        c[1].entry.actor = "mallory".into();
        c[1].hash = hash(&c[1].prev_hash, 2, &c[1].entry);
        assert_eq!(check(&c), Err(Break::Relinked { seq: 3 }));
    }

    #[test]
    fn a_deleted_row_is_a_gap_and_a_deleted_tail_a_head_mismatch() {
        let mut c = chain(5);
        c.remove(2);
        assert_eq!(
            check(&c),
            Err(Break::Gap {
                expected: 3,
                found: 4
            })
        );
        let c = chain(5);
        let mut v = Verifier::default();
        for r in &c[..3] {
            v.feed(r).unwrap();
        }
        assert_eq!(
            v.finish(5, &c[4].hash, 5),
            Err(Break::HeadMismatch {
                last_seq: 3,
                head_seq: 5
            })
        );
        // A row inserted past the head, even a well-chained one, is found by the snapshot's bounds.
        let mut v = Verifier::default();
        for r in &c {
            v.feed(r).unwrap();
        }
        assert_eq!(
            v.finish(5, &c[4].hash, 6),
            Err(Break::BeyondHead {
                head_seq: 5,
                max_seq: 6
            })
        );
    }

    #[test]
    fn moving_bytes_between_fields_changes_the_hash() {
        let mut a = e("x");
        a.actor = "ab".into();
        a.action = "c".into();
        let mut b = e("x");
        b.actor = "a".into();
        b.action = "bc".into();
        assert_ne!(hash(GENESIS, 1, &a), hash(GENESIS, 1, &b));
    }

    #[test]
    fn a_long_detail_is_truncated() {
        let mut big = e("x");
        big.detail = format!("{{\"k\":\"{}\"}}", "a".repeat(MAX_DETAIL));
        let n = next(0, GENESIS, big);
        assert_eq!(n.entry.detail, r#"{"truncated":true}"#);
        assert_eq!(check(&[n]), Ok(1));
    }
}
