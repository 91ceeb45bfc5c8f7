//! The audit log's rules (signals seed: "audit connector and binding changes, secret rotation,
//! revocation, replay and delivery decisions"): what an entry holds, how it is chained, and how a chain
//! is checked. The store appends and reads; it decides nothing (docs/console.md, "The audit log").
//!
//! Each entry carries `seq` (1, 2, 3 ...), the hash of the entry before it (`prevHash`, [`GENESIS`] for
//! the first) and its own `hash`: HMAC-SHA256 under the audit [`Key`] (derived from the sealing key,
//! which the database does not hold) over `prevHash` and every field, each length-prefixed ([`mac`]).
//! Entries written before the chain was keyed carry the plain SHA-256 of the same bytes ([`hash`]); the
//! [`Verifier`] accepts those only before the first keyed entry, so an entry appended by someone
//! without the key (even one whose plain hash is correct) is [`Break::Forged`].
//!
//! Editing any field of a stored row, deleting a row or inserting one breaks the chain at that row,
//! which the verifier reports with the row's `seq`. A chain whose newest rows were deleted is caught by
//! comparing the last row with the head the store keeps beside the log, and a row inserted past the
//! head by comparing the largest stored `seq` with it in the same snapshot ([`Verifier::finish`]).
//! Someone who deletes the newest rows *and* moves the head back is caught only from outside the
//! database: by a [`Checkpoint`] (a head `seq` and its MAC under the key) exported earlier.
//!
//! A row planted past the head never stops appends: the next append ([`append`]) takes the next `seq`
//! after the largest stored one and first writes a [`BREAK_ACTION`] entry that names the rows it steps
//! over and links to the real head; the verifier accepts the planted rows only as that recorded break
//! and still reports it ([`Break::Recorded`]). When the largest stored `seq` leaves no room after it (a
//! row planted at or near `i64::MAX`), the chain goes on in the first free seqs after the head instead,
//! and the break entry names that largest `seq` ([`BreakFacts::top_seq`]) once.

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The `prevHash` of the first entry: 64 zeros.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// Longest `detail` JSON text of one entry, in bytes; a longer detail is replaced by
/// `{"truncated": true}` so an entry stays small.
pub const MAX_DETAIL: usize = 4096;

/// The purpose label the audit [`Key`] is derived under from the sealing key (HMAC-SHA256(sealing key,
/// label)), so the chain's key is not the key that seals secrets.
pub const KEY_PURPOSE: &str = "trigger-bridge audit chain v1";

/// The label a [`Checkpoint`]'s MAC starts with, so a checkpoint MAC is never an entry's.
const CHECKPOINT_LABEL: &str = "trigger-bridge audit checkpoint v1";

/// The action of an entry the store writes when rows lie past the head ([`append`]).
pub const BREAK_ACTION: &str = "audit.break";

/// The actor of a [`BREAK_ACTION`] entry.
pub const BREAK_ACTOR: &str = "rule:audit";

/// The audit chain's 32-byte key. Never printed (its `Debug` shows nothing of it).
#[derive(Clone, PartialEq, Eq)]
pub struct Key([u8; 32]);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("audit::Key(..)")
    }
}

impl Key {
    /// A key from its 32 bytes (the engine derives them from the sealing key under [`KEY_PURPOSE`]).
    pub fn from_bytes(bytes: [u8; 32]) -> Key {
        Key(bytes)
    }

    fn hmac(&self) -> Hmac<Sha256> {
        <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length")
    }
}

/// An action to record: who did what to which target, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NewEntry {
    /// When, in ms since the Unix epoch.
    pub at: i64,
    /// Who: an API key's name (`anonymous` on an open API), `replica:<id>` for the server itself, or
    /// `rule:<name>` for an automatic rule (`rule:quarantine`, [`BREAK_ACTOR`]).
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
    /// Position in the log, from 1; rows stepped over by a [`BREAK_ACTION`] entry are not the chain's.
    pub seq: i64,
    /// The recorded action.
    #[serde(flatten)]
    pub entry: NewEntry,
    /// `hash` of the entry before it in the chain ([`GENESIS`] for seq 1), lowercase hex.
    pub prev_hash: String,
    /// HMAC-SHA256 of this entry under the audit key ([`mac`]; plain SHA-256, [`hash`], for entries
    /// written before the chain was keyed), lowercase hex.
    pub hash: String,
}

/// Feeds `prev_hash`, `seq` and each field, every one preceded by its length in bytes (8, big-endian),
/// so no two different entries hash alike by moving bytes between fields.
fn feed_parts(update: &mut dyn FnMut(&[u8]), prev_hash: &str, seq: i64, e: &NewEntry) {
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
        update(&(part.len() as u64).to_be_bytes());
        update(part.as_bytes());
    }
}

/// The unkeyed hash of entry `seq` holding `e`, after `prev_hash`: SHA-256 over the length-prefixed
/// parts (see [`mac`]). What entries written before the chain was keyed carry, and what a writer
/// without a key still writes; anyone can compute it, so after the first keyed entry it proves nothing.
pub fn hash(prev_hash: &str, seq: i64, e: &NewEntry) -> String {
    let mut h = Sha256::new();
    feed_parts(&mut |b| h.update(b), prev_hash, seq, e);
    hex::encode(h.finalize())
}

/// The keyed hash of entry `seq` holding `e`, after `prev_hash`: HMAC-SHA256 under `key` over
/// `prev_hash`, `seq`, `at`, `actor`, `action`, `target`, `outcome` and `detail`, each preceded by its
/// length in bytes (8, big-endian); lowercase hex. Without the key nobody can compute it.
pub fn mac(key: &Key, prev_hash: &str, seq: i64, e: &NewEntry) -> String {
    let mut m = key.hmac();
    feed_parts(&mut |b| m.update(b), prev_hash, seq, e);
    hex::encode(m.finalize().into_bytes())
}

/// The hash an entry gets from a writer holding `key` ([`mac`]) or none ([`hash`]).
fn seal(key: Option<&Key>, prev_hash: &str, seq: i64, e: &NewEntry) -> String {
    match key {
        Some(k) => mac(k, prev_hash, seq, e),
        None => hash(prev_hash, seq, e),
    }
}

/// The entry that follows the head `(seq, hash)` (`(0, GENESIS)` for an empty log), hashed under `key`
/// (unkeyed without one). A detail longer than [`MAX_DETAIL`] is replaced by `{"truncated":true}`.
/// Panics: `head_seq` is `i64::MAX` (no `seq` follows it; [`append`], which the store uses, returns
/// [`NoRoom`] instead).
pub fn next(head_seq: i64, head_hash: &str, e: NewEntry, key: Option<&Key>) -> Entry {
    let seq = head_seq
        .checked_add(1)
        .expect("no seq follows i64::MAX (append returns NoRoom instead)");
    entry_at(seq, head_hash, e, key)
}

/// Entry `seq` holding `e` after `prev_hash`, hashed under `key` (see [`next`]).
fn entry_at(seq: i64, prev_hash: &str, mut e: NewEntry, key: Option<&Key>) -> Entry {
    if e.detail.len() > MAX_DETAIL {
        e.detail = r#"{"truncated":true}"#.into();
    }
    let hash = seal(key, prev_hash, seq, &e);
    Entry {
        seq,
        entry: e,
        prev_hash: prev_hash.to_string(),
        hash,
    }
}

/// What one append writes ([`append`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    /// The [`BREAK_ACTION`] entry written first because rows lay past the head, if any.
    pub break_entry: Option<Entry>,
    /// The entry asked for; the new head.
    pub entry: Entry,
}

/// The facts of a [`BREAK_ACTION`] entry (its `detail`, `{"headSeq":H,"maxSeq":M}` plus `"topSeq":T`
/// when the log's largest `seq` left no room after it). The rows `head_seq + 1 ..= max_seq` are not
/// the chain's, and the break entry sits at `max_seq + 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BreakFacts {
    /// The head the chain continues from (`headSeq`): the `seq` of the last entry before the break,
    /// whose `hash` is the break entry's `prevHash` (0 for an empty log).
    pub head_seq: i64,
    /// The last `seq` the break steps over (`maxSeq`): rows `head_seq + 1 ..= max_seq` were written by
    /// hand and are not the chain's, and the break entry's own `seq` is `max_seq + 1`. Normally the
    /// largest `seq` stored when the break was written; equal to `head_seq` when nothing lay right
    /// after the head and only a row at the top ([`BreakFacts::top_seq`]) is recorded.
    pub max_seq: i64,
    /// The largest `seq` stored when it left no room for two more entries after it (a row planted at
    /// or within 2 of `i64::MAX`): the chain goes on below it, in the first free seqs after the head,
    /// and rows up to `top_seq` still lie past the head. Absent (`None`) otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_seq: Option<i64>,
}

/// What the store reads, under the append's lock, when rows lie past the head (`max_seq > head_seq`;
/// [`append`] needs it only then).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Past {
    /// The first `seq` after the head such that it and the next one are both free (the store's gap
    /// query), `None` when there is none.
    pub room: Option<i64>,
    /// The `detail` of the newest [`BREAK_ACTION`] entry (`audit_head.last_break_seq`), if any.
    pub last_break: Option<String>,
}

/// Why an append found no `seq` to write: every seq after the head up to `i64::MAX` is taken (or the
/// head itself is `i64::MAX`). Nothing is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoRoom {
    /// The head's `seq`.
    pub head_seq: i64,
}

impl std::fmt::Display for NoRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the audit log has no free seq left after its head (entry {}): rows up to {} were written by hand (docs/operations.md, \"The audit log\")", self.head_seq, i64::MAX)
    }
}

/// The entries an append of `e` writes, given the head `(head_seq, head_hash)`, the largest `seq`
/// stored (`max_seq`) and, when rows lie past the head, [`Past`], all read under the append's lock.
/// Normally `e` alone, at `head_seq + 1`. When rows lie past the head (`max_seq > head_seq`: written by
/// hand, since every append moves the head with its row), first a [`BREAK_ACTION`] entry at
/// `max_seq + 1` that links to the head and names the rows it steps over ([`BreakFacts`]), then `e`
/// after it: a planted row never stops an append. When `max_seq + 2` does not fit an `i64`, the break
/// entry and `e` take `past.room` and the seq after it instead, naming `max_seq` as
/// [`BreakFacts::top_seq`]; once a break named that top, later appends with nothing right after the
/// head just take `head_seq + 1` (one break per planted top, not one per append). Errors: [`NoRoom`].
pub fn append(
    head_seq: i64,
    head_hash: &str,
    max_seq: i64,
    past: Option<&Past>,
    e: NewEntry,
    key: Option<&Key>,
) -> Result<Appended, NoRoom> {
    let no_room = NoRoom { head_seq };
    let after_head = head_seq.checked_add(1).ok_or(no_room)?;
    if max_seq <= head_seq {
        return Ok(Appended {
            break_entry: None,
            entry: entry_at(after_head, head_hash, e, key),
        });
    }
    let facts = match max_seq.checked_add(2) {
        Some(_) => BreakFacts {
            head_seq,
            max_seq,
            top_seq: None,
        },
        None => {
            let room = past
                .and_then(|p| p.room)
                .filter(|r| *r > head_seq && r.checked_add(1).is_some())
                .ok_or(no_room)?;
            let named = past
                .and_then(|p| p.last_break.as_deref())
                .and_then(|d| serde_json::from_str::<BreakFacts>(d).ok())
                .and_then(|f| f.top_seq);
            if room == after_head && named == Some(max_seq) {
                return Ok(Appended {
                    break_entry: None,
                    entry: entry_at(after_head, head_hash, e, key),
                });
            }
            BreakFacts {
                head_seq,
                max_seq: room - 1,
                top_seq: Some(max_seq),
            }
        }
    };
    let b = NewEntry {
        at: e.at,
        actor: BREAK_ACTOR.into(),
        action: BREAK_ACTION.into(),
        target: String::new(),
        outcome: "rows_past_head".into(),
        detail: serde_json::to_string(&facts).expect("two integers serialize"),
    };
    // Both fit: `max_seq + 2` did, or the store's room and the seq after it were checked above.
    let seq = facts.max_seq + 1;
    let break_entry = entry_at(seq, head_hash, b, key);
    let entry = entry_at(seq + 1, &break_entry.hash, e, key);
    Ok(Appended {
        break_entry: Some(break_entry),
        entry,
    })
}

/// A signed head, exported from the server now and then (a log line and a gauge) so that a later check
/// can prove the log still holds that head: `seq` and HMAC-SHA256 under the audit key over a label,
/// `seq` and that entry's `hash` ([`Checkpoint::of`]). Written `SEQ:MAC` (`12:9f…`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The head's `seq` (1 or more).
    pub seq: i64,
    /// The MAC, 64 lowercase hex characters.
    pub mac: String,
}

impl Checkpoint {
    /// The checkpoint of the head `(seq, head_hash)` under `key`.
    pub fn of(key: &Key, seq: i64, head_hash: &str) -> Checkpoint {
        Checkpoint {
            seq,
            mac: hex::encode(checkpoint_mac(key, seq, head_hash).finalize().into_bytes()),
        }
    }

    /// Parses `SEQ:MAC` (`seq` 1 or more, the MAC as 64 hex characters, either case). Errors: a sentence
    /// saying which part is wrong (the text is not echoed past its length).
    pub fn parse(text: &str) -> Result<Checkpoint, String> {
        let (seq, mac) = text
            .trim()
            .split_once(':')
            .ok_or("a checkpoint is SEQ:MAC, e.g. 12:9f86d0...")?;
        let seq: i64 = seq
            .parse()
            .ok()
            .filter(|s| *s >= 1)
            .ok_or("a checkpoint's SEQ must be an integer of 1 or more")?;
        if mac.len() != 64 || !mac.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "a checkpoint's MAC must be 64 hex characters (got {})",
                mac.len()
            ));
        }
        Ok(Checkpoint {
            seq,
            mac: mac.to_ascii_lowercase(),
        })
    }

    /// Whether this is the checkpoint of `(self.seq, head_hash)` under `key` (compared in constant time).
    pub fn matches(&self, key: &Key, head_hash: &str) -> bool {
        let Ok(want) = hex::decode(&self.mac) else {
            return false;
        };
        checkpoint_mac(key, self.seq, head_hash)
            .verify_slice(&want)
            .is_ok()
    }
}

impl std::fmt::Display for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.seq, self.mac)
    }
}

fn checkpoint_mac(key: &Key, seq: i64, head_hash: &str) -> Hmac<Sha256> {
    let mut m = key.hmac();
    let seq = seq.to_string();
    for part in [CHECKPOINT_LABEL, seq.as_str(), head_hash] {
        m.update(&(part.len() as u64).to_be_bytes());
        m.update(part.as_bytes());
    }
    m
}

/// Why a chain does not hold, at which `seq`. On the wire: `{"problem": "<variant>", <fields>}`, all
/// in camelCase (`{"problem": "headMismatch", "lastSeq": 3, "headSeq": 5}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(
    rename_all = "camelCase",
    rename_all_fields = "camelCase",
    tag = "problem"
)]
pub enum Break {
    /// The row's fields do not hash to its stored `hash`: the row was edited.
    Edited { seq: i64 },
    /// The row's hash is neither its MAC under the key nor its plain hash, and the verifier has no key:
    /// it was edited, or it is keyed and this verifier cannot tell.
    KeyNeeded { seq: i64 },
    /// The row carries a correct plain (unkeyed) hash after the chain was keyed: it was written by
    /// someone without the key (or by a server without one).
    Forged { seq: i64 },
    /// The verifier holds the key but the chain's newest entry `seq` (the head) is not keyed: no keyed
    /// entry at all, the whole log (and its head) rewritten with plain hashes by someone without the
    /// key. A server holding the key appends a keyed `config.load` entry at every start, so a log it
    /// verifies ends on a keyed entry (docs/operations.md, "The audit log").
    ForgedHead { seq: i64 },
    /// The row's `prevHash` is not the hash of the row before it: a row before it was replaced.
    Relinked { seq: i64 },
    /// `seq` jumps: rows `expected ..= found - 1` are missing.
    Gap { expected: i64, found: i64 },
    /// The last row is not the head the store recorded: newest rows were deleted (or the head edited).
    HeadMismatch { last_seq: i64, head_seq: i64 },
    /// `rows` rows are stored with `seq` below 1 (0 or negative): a server's entries start at 1, so they
    /// were inserted by hand; the chain (read from seq 1) never reaches them, yet the log lists them.
    BeforeFirst { rows: i64 },
    /// Rows exist past the head (read in the same snapshot, where every append moves the head with
    /// its row): they were inserted by hand, or the head was moved back.
    BeyondHead { head_seq: i64, max_seq: i64 },
    /// A checkpoint names an entry the chain no longer reaches: the newest rows were deleted (and the
    /// head moved back to hide it).
    Truncated { checkpoint_seq: i64, last_seq: i64 },
    /// The entry a checkpoint names is not the one the checkpoint was made of (or the checkpoint is not
    /// this key's).
    CheckpointMismatch { seq: i64 },
    /// The chain holds, but entry `seq` records that rows `head_seq + 1 ..= max_seq` were written past
    /// the head by hand (a [`BREAK_ACTION`] entry); the chain goes on after it.
    Recorded {
        seq: i64,
        head_seq: i64,
        max_seq: i64,
    },
}

impl std::fmt::Display for Break {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Break::Edited { seq } => write!(f, "entry {seq} was edited: its fields do not hash to its stored hash"),
            Break::KeyNeeded { seq } => write!(f, "entry {seq} does not match its plain hash and this server has no audit key to check its MAC: it was edited, or the chain is keyed (set TRIGGER_BRIDGE_SECRET_KEY as on the replica that wrote it)"),
            Break::Forged { seq } => write!(f, "entry {seq} was written without the audit key after the chain was keyed: it was forged by someone who can write the database (or appended by a server without the key)"),
            Break::ForgedHead { seq } => write!(f, "the log ends on entry {seq}, which carries no MAC under the audit key although this server holds it: every server start appends a keyed entry, so the log was rewritten without the key by someone who can write the database (or the keyed config.load entry of this server's start was not recorded: see its log)"),
            Break::Relinked { seq } => write!(f, "entry {seq} does not follow entry {}: its prevHash is not that entry's hash", i128::from(*seq) - 1),
            Break::Gap { expected, found } => write!(f, "entries {expected}..{} are missing (the next stored entry is {found})", i128::from(*found) - 1),
            Break::HeadMismatch { last_seq, head_seq } => write!(f, "the log ends at entry {last_seq} but its head says {head_seq}: entries were deleted or the head was edited"),
            Break::BeforeFirst { rows } => write!(f, "{rows} entries are stored with a seq below 1, before the first entry: they were inserted by hand"),
            Break::BeyondHead { head_seq, max_seq } => write!(f, "entries {}..{max_seq} lie past the head (entry {head_seq}): they were inserted by hand or the head was moved back", i128::from(*head_seq) + 1),
            Break::Truncated { checkpoint_seq, last_seq } => write!(f, "the checkpoint names entry {checkpoint_seq} but the chain ends at entry {last_seq}: the newest entries were deleted and the head moved back"),
            Break::CheckpointMismatch { seq } => write!(f, "entry {seq} is not the entry the checkpoint was made of (or the checkpoint was made under another key)"),
            Break::Recorded { seq, head_seq, max_seq } if max_seq <= head_seq => write!(f, "entry {seq} records that rows were written by hand far past the head (entry {head_seq}), up to a seq that leaves no room after it; the chain goes on below them, after entry {seq}"),
            Break::Recorded { seq, head_seq, max_seq } => write!(f, "entry {seq} records that entries {}..{max_seq} were written past the head (entry {head_seq}) by hand, not by the server; the chain goes on after it", i128::from(*head_seq) + 1),
        }
    }
}

/// What a snapshot of the log's bounds shows, apart from the chain (which is read from seq 1 up to the
/// head): rows stored with `seq` below 1 (`below_one` of them, [`Break::BeforeFirst`]), or rows past the
/// head (`max_seq > head_seq`, [`Break::BeyondHead`]); `None` when neither. Both are rows written by
/// hand: every append moves the head with its row, from seq 1 on.
pub fn bounds(head_seq: i64, max_seq: i64, below_one: i64) -> Option<Break> {
    if below_one > 0 {
        return Some(Break::BeforeFirst { rows: below_one });
    }
    (max_seq > head_seq).then_some(Break::BeyondHead { head_seq, max_seq })
}

/// Checks a chain read in `seq` order, one page at a time (memory stays one page), with the audit key
/// when the checker has it. Problems are reported by [`Verifier::finish`]: the first one not explained
/// by a recorded break, else the first recorded break.
#[derive(Debug, Clone, Default)]
pub struct Verifier {
    key: Option<Key>,
    checkpoint: Option<Checkpoint>,
    /// The last entry accepted into the chain (`(0, GENESIS)` before any).
    seq: i64,
    hash: String,
    /// A keyed entry was accepted: from then on a plain hash is a forgery.
    keyed: bool,
    /// The last entry accepted was keyed.
    last_keyed: bool,
    checked: u64,
    unkeyed: u64,
    breaks: u64,
    first_break: Option<Break>,
    /// The first problem after the last accepted entry; cleared when a break entry explains it.
    pending: Option<Break>,
    checkpoint_matched: bool,
}

impl Verifier {
    /// A verifier holding `key` (`None`: only unkeyed entries can be checked) and, optionally, a
    /// checkpoint the chain must still reach.
    pub fn new(key: Option<Key>, checkpoint: Option<Checkpoint>) -> Verifier {
        Verifier {
            key,
            checkpoint,
            hash: GENESIS.into(),
            ..Verifier::default()
        }
    }

    fn last_hash(&self) -> &str {
        if self.seq == 0 {
            GENESIS
        } else {
            &self.hash
        }
    }

    /// How `e`'s hash authenticates it: `Ok(true)` keyed, `Ok(false)` plain hash accepted (before the
    /// first keyed entry), else the problem.
    fn authentic(&self, e: &Entry) -> Result<bool, Break> {
        if let Some(k) = &self.key {
            if mac(k, &e.prev_hash, e.seq, &e.entry) == e.hash {
                return Ok(true);
            }
        }
        if hash(&e.prev_hash, e.seq, &e.entry) == e.hash {
            return if self.keyed {
                Err(Break::Forged { seq: e.seq })
            } else {
                Ok(false)
            };
        }
        Err(match self.key {
            Some(_) => Break::Edited { seq: e.seq },
            None => Break::KeyNeeded { seq: e.seq },
        })
    }

    fn accept(&mut self, e: &Entry, keyed: bool) {
        self.seq = e.seq;
        self.hash = e.hash.clone();
        self.keyed |= keyed;
        self.last_keyed = keyed;
        self.checked += 1;
        self.unkeyed += u64::from(!keyed);
        if let (Some(cp), Some(k)) = (&self.checkpoint, &self.key) {
            if cp.seq == e.seq {
                self.checkpoint_matched = cp.matches(k, &e.hash);
            }
        }
    }

    /// Checks the next entry. After a problem the following entries are only searched for a
    /// [`BREAK_ACTION`] entry that links to the last good entry and names exactly the rows in between;
    /// anything else stays the problem [`Verifier::finish`] reports.
    pub fn feed(&mut self, e: &Entry) {
        if self.pending.is_some() {
            self.try_break(e);
            return;
        }
        if Some(e.seq) != self.seq.checked_add(1) {
            self.pending = Some(Break::Gap {
                expected: self.seq.saturating_add(1),
                found: e.seq,
            });
            self.try_break(e);
            return;
        }
        let keyed = match self.authentic(e) {
            Ok(k) => k,
            Err(b) => {
                self.pending = Some(b);
                return;
            }
        };
        if e.prev_hash != self.last_hash() {
            self.pending = Some(Break::Relinked { seq: e.seq });
            return;
        }
        // A break entry that steps over nothing (rows only far past the head, `topSeq`) follows the
        // head directly: it is still a recorded break.
        if let Some(facts) = self.break_fits(e) {
            self.record_break(e, facts);
        }
        self.accept(e, keyed);
    }

    /// The facts of `e` if it is a [`BREAK_ACTION`] entry that links to the last good entry and names
    /// exactly the rows in between (none only when it names a `topSeq` past itself).
    fn break_fits(&self, e: &Entry) -> Option<BreakFacts> {
        if e.entry.action != BREAK_ACTION || e.prev_hash != self.last_hash() {
            return None;
        }
        let facts = serde_json::from_str::<BreakFacts>(&e.entry.detail).ok()?;
        let fits = facts.head_seq == self.seq
            && Some(facts.max_seq) == e.seq.checked_sub(1)
            && (facts.max_seq > facts.head_seq
                || (facts.max_seq == facts.head_seq && facts.top_seq.is_some_and(|t| t > e.seq)));
        fits.then_some(facts)
    }

    fn record_break(&mut self, e: &Entry, facts: BreakFacts) {
        self.breaks += 1;
        self.first_break.get_or_insert(Break::Recorded {
            seq: e.seq,
            head_seq: facts.head_seq,
            max_seq: facts.max_seq,
        });
    }

    /// Accepts `e` if it is an authentic break entry explaining every row since the last good entry.
    fn try_break(&mut self, e: &Entry) {
        let Some(facts) = self.break_fits(e) else {
            return;
        };
        let Ok(keyed) = self.authentic(e) else {
            return;
        };
        self.pending = None;
        self.record_break(e, facts);
        self.accept(e, keyed);
    }

    /// The last `seq` accepted into the chain (0 before any).
    pub fn last_seq(&self) -> i64 {
        self.seq
    }

    /// Entries accepted so far.
    pub fn checked(&self) -> u64 {
        self.checked
    }

    /// Entries accepted by their plain hash (written before the chain was keyed).
    pub fn unkeyed(&self) -> u64 {
        self.unkeyed
    }

    /// Recorded breaks ([`BREAK_ACTION`] entries) accepted so far.
    pub fn breaks(&self) -> u64 {
        self.breaks
    }

    /// Ends the check against the head the store keeps and the largest `seq` stored, both read in one
    /// snapshot: the first problem not explained by a recorded break; else no row may lie past the head,
    /// the last entry checked must be the head, the head must be keyed when this verifier holds the key
    /// ([`Break::ForgedHead`]), and the checkpoint (if any) must be reached and match; else the first
    /// recorded break. `Ok` holds the entries checked.
    pub fn finish(&self, head_seq: i64, head_hash: &str, max_seq: i64) -> Result<u64, Break> {
        if let Some(b) = &self.pending {
            return Err(b.clone());
        }
        if max_seq > head_seq {
            return Err(Break::BeyondHead { head_seq, max_seq });
        }
        if self.seq != head_seq || self.last_hash() != head_hash {
            return Err(Break::HeadMismatch {
                last_seq: self.seq,
                head_seq,
            });
        }
        if self.key.is_some() && self.seq > 0 && !self.last_keyed {
            return Err(Break::ForgedHead { seq: self.seq });
        }
        if let Some(cp) = &self.checkpoint {
            if cp.seq > self.seq {
                return Err(Break::Truncated {
                    checkpoint_seq: cp.seq,
                    last_seq: self.seq,
                });
            }
            if !self.checkpoint_matched {
                return Err(Break::CheckpointMismatch { seq: cp.seq });
            }
        }
        if let Some(b) = &self.first_break {
            return Err(b.clone());
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

    fn key() -> Key {
        Key::from_bytes([7; 32])
    }

    /// `n` entries; the first `plain` of them unkeyed (written before the chain was keyed).
    fn chain_from(plain: usize, n: usize) -> Vec<Entry> {
        let k = key();
        let mut out: Vec<Entry> = Vec::new();
        for i in 0..n {
            let (s, h) = out
                .last()
                .map(|l| (l.seq, l.hash.clone()))
                .unwrap_or((0, GENESIS.into()));
            let with = (i >= plain).then_some(&k);
            out.push(next(s, &h, e(&format!("a{i}")), with));
        }
        out
    }

    fn chain(n: usize) -> Vec<Entry> {
        chain_from(0, n)
    }

    fn check_with(rows: &[Entry], cp: Option<Checkpoint>) -> Result<u64, Break> {
        let mut v = Verifier::new(Some(key()), cp);
        for r in rows {
            v.feed(r);
        }
        let (s, h) = rows
            .last()
            .map(|l| (l.seq, l.hash.clone()))
            .unwrap_or((0, GENESIS.into()));
        v.finish(s, &h, s)
    }

    fn check(rows: &[Entry]) -> Result<u64, Break> {
        check_with(rows, None)
    }

    #[test]
    fn an_untouched_chain_verifies() {
        let c = chain(5);
        assert_eq!(c[0].prev_hash, GENESIS);
        assert_eq!(c[1].prev_hash, c[0].hash);
        assert_eq!(c[0].hash, mac(&key(), GENESIS, 1, &c[0].entry));
        assert_ne!(c[0].hash, hash(GENESIS, 1, &c[0].entry), "keyed, not plain");
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
        c[1].hash = mac(&key(), &c[1].prev_hash, 2, &c[1].entry);
        assert_eq!(check(&c), Err(Break::Relinked { seq: 3 }));
    }

    #[test]
    fn an_appended_entry_with_a_correct_plain_hash_is_forged() {
        // Someone who can write the database but has no key appends a well-chained entry.
        let mut c = chain(3);
        let head = c.last().unwrap().clone();
        c.push(next(head.seq, &head.hash, e("subscription.resume"), None));
        assert_eq!(check(&c), Err(Break::Forged { seq: 4 }));
        // ... or with another key.
        let mut c = chain(3);
        c.push(next(3, &head.hash, e("x"), Some(&Key::from_bytes([8; 32]))));
        assert_eq!(check(&c), Err(Break::Edited { seq: 4 }));
    }

    #[test]
    fn plain_entries_from_before_the_key_verify_only_before_the_first_keyed_one() {
        let c = chain_from(3, 6);
        assert_eq!(c[2].hash, hash(&c[2].prev_hash, 3, &c[2].entry));
        let mut v = Verifier::new(Some(key()), None);
        for r in &c {
            v.feed(r);
        }
        assert_eq!(v.finish(6, &c[5].hash, 6), Ok(6));
        assert_eq!(v.unkeyed(), 3);
        // A log rewritten with plain hashes only (and its head with it): a key holder knows a server
        // with the key ends the log on a keyed entry.
        let all_plain = chain_from(4, 4);
        assert_eq!(check(&all_plain), Err(Break::ForgedHead { seq: 4 }));
        // Without the key, a keyed entry cannot be told from an edited one.
        let mut v = Verifier::new(None, None);
        for r in &c {
            v.feed(r);
        }
        assert_eq!(v.finish(6, &c[5].hash, 6), Err(Break::KeyNeeded { seq: 4 }));
        // An old log, never keyed, still verifies without a key.
        let old = chain_from(4, 4);
        let mut v = Verifier::default();
        for r in &old {
            v.feed(r);
        }
        assert_eq!(v.finish(4, &old[3].hash, 4), Ok(4));
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
        let mut v = Verifier::new(Some(key()), None);
        for r in &c[..3] {
            v.feed(r);
        }
        assert_eq!(
            v.finish(5, &c[4].hash, 5),
            Err(Break::HeadMismatch {
                last_seq: 3,
                head_seq: 5
            })
        );
        // A row inserted past the head, even a well-chained one, is found by the snapshot's bounds.
        let mut v = Verifier::new(Some(key()), None);
        for r in &c {
            v.feed(r);
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
    fn a_checkpoint_catches_a_tail_deleted_with_its_head() {
        let c = chain(5);
        let cp = Checkpoint::of(&key(), 5, &c[4].hash);
        assert_eq!(Checkpoint::parse(&cp.to_string()), Ok(cp.clone()));
        assert_eq!(check_with(&c, Some(cp.clone())), Ok(5));
        // Entries 4 and 5 deleted and the head moved back to 3: the chain alone holds ...
        assert_eq!(check(&c[..3]), Ok(3));
        // ... the checkpoint does not.
        assert_eq!(
            check_with(&c[..3], Some(cp.clone())),
            Err(Break::Truncated {
                checkpoint_seq: 5,
                last_seq: 3
            })
        );
        // Entry 5 replaced by another keyed one (say, re-appended by a key holder after a rollback).
        let mut other = c[..4].to_vec();
        other.push(next(4, &c[3].hash, e("other"), Some(&key())));
        assert_eq!(
            check_with(&other, Some(cp.clone())),
            Err(Break::CheckpointMismatch { seq: 5 })
        );
        // A checkpoint made under another key does not match.
        let foreign = Checkpoint::of(&Key::from_bytes([9; 32]), 5, &c[4].hash);
        assert_eq!(
            check_with(&c, Some(foreign)),
            Err(Break::CheckpointMismatch { seq: 5 })
        );
        // An older checkpoint still verifies after more appends.
        let old = Checkpoint::of(&key(), 2, &c[1].hash);
        assert_eq!(check_with(&c, Some(old)), Ok(5));
        for bad in [
            "",
            "5",
            "0:ab",
            &format!("x:{}", cp.mac),
            &format!("5:{}", &cp.mac[1..]),
        ] {
            assert!(Checkpoint::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_planted_row_is_stepped_over_by_a_recorded_break() {
        let k = key();
        let mut c = chain(5);
        let head = c[4].clone();
        // A row planted at head + 1 (its hash is anything).
        let mut planted = next(5, &head.hash, e("planted"), None);
        planted.hash = "bad".into();
        c.push(planted);
        let a = append(5, &head.hash, 6, None, e("subscription.pause"), Some(&k)).unwrap();
        let b = a.break_entry.clone().expect("a break entry");
        assert_eq!((b.seq, b.prev_hash.as_str()), (7, head.hash.as_str()));
        assert_eq!(b.entry.action, BREAK_ACTION);
        assert_eq!(b.entry.detail, r#"{"headSeq":5,"maxSeq":6}"#);
        assert_eq!(
            (a.entry.seq, a.entry.prev_hash.as_str()),
            (8, b.hash.as_str())
        );
        c.push(b);
        c.push(a.entry.clone());
        c.push(next(8, &a.entry.hash, e("later"), Some(&k)));
        let recorded = Break::Recorded {
            seq: 7,
            head_seq: 5,
            max_seq: 6,
        };
        let mut v = Verifier::new(Some(k.clone()), None);
        for r in &c {
            v.feed(r);
        }
        assert_eq!(v.finish(9, &c[8].hash, 9), Err(recorded.clone()));
        assert_eq!(
            (v.breaks(), v.checked()),
            (1, 8),
            "every entry but the planted one"
        );
        // A problem after the break is still found, before the recorded break.
        let mut edited = c.clone();
        edited[8].entry.actor = "mallory".into();
        assert_eq!(check(&edited), Err(Break::Edited { seq: 9 }));
        // A break entry nobody with the key wrote explains nothing.
        let mut forged = c.clone();
        forged[6].hash = hash(&forged[6].prev_hash, 7, &forged[6].entry);
        assert_eq!(check(&forged), Err(Break::Edited { seq: 6 }));
        // No rows past the head: no break entry.
        assert_eq!(
            append(9, &c[8].hash, 9, None, e("x"), Some(&k))
                .unwrap()
                .break_entry,
            None
        );
    }

    #[test]
    fn a_row_at_the_largest_seq_is_gone_around_once() {
        let k = key();
        let c = chain(5);
        let head = c[4].clone();
        // A planted row at i64::MAX: max_seq + 1 does not fit, the store's room is 6.
        let past = Past {
            room: Some(6),
            last_break: None,
        };
        let a = append(5, &head.hash, i64::MAX, Some(&past), e("x"), Some(&k)).unwrap();
        let b = a.break_entry.clone().expect("a break entry");
        assert_eq!((b.seq, a.entry.seq), (6, 7));
        assert_eq!(
            b.entry.detail,
            format!(r#"{{"headSeq":5,"maxSeq":5,"topSeq":{}}}"#, i64::MAX)
        );
        // The next append: the top is named by the last break, nothing right after the head.
        let past = Past {
            room: Some(8),
            last_break: Some(b.entry.detail.clone()),
        };
        let a2 = append(7, &a.entry.hash, i64::MAX, Some(&past), e("y"), Some(&k)).unwrap();
        assert_eq!((a2.break_entry.clone(), a2.entry.seq), (None, 8));
        // Within 2 of the top too (max_seq + 2 overflows).
        let a3 = append(
            5,
            &head.hash,
            i64::MAX - 1,
            Some(&Past {
                room: Some(6),
                last_break: None,
            }),
            e("x"),
            Some(&k),
        )
        .unwrap();
        assert_eq!(a3.break_entry.map(|b| b.seq), Some(6));
        // No room, no room stated, or a head at i64::MAX: an error, never a panic or a wrap.
        let none = Past::default();
        assert_eq!(
            append(5, &head.hash, i64::MAX, Some(&none), e("x"), Some(&k)),
            Err(NoRoom { head_seq: 5 })
        );
        assert_eq!(
            append(5, &head.hash, i64::MAX, None, e("x"), Some(&k)),
            Err(NoRoom { head_seq: 5 })
        );
        assert_eq!(
            append(i64::MAX, &head.hash, i64::MAX, None, e("x"), Some(&k)),
            Err(NoRoom { head_seq: i64::MAX })
        );
        // The verifier counts the break that stepped over nothing, and the chain holds.
        let mut all = c.clone();
        all.extend([b, a.entry.clone(), a2.entry.clone()]);
        let mut v = Verifier::new(Some(k.clone()), None);
        for r in &all {
            v.feed(r);
        }
        let recorded = Break::Recorded {
            seq: 6,
            head_seq: 5,
            max_seq: 5,
        };
        assert_eq!(v.finish(8, &a2.entry.hash, 8), Err(recorded.clone()));
        assert_eq!((v.checked(), v.breaks()), (8, 1));
        assert!(recorded.to_string().contains("far past the head (entry 5)"));
        // Overflowing seqs in a problem's sentence do not panic.
        let _ = Break::Gap {
            expected: 1,
            found: i64::MIN,
        }
        .to_string();
        let _ = Break::BeyondHead {
            head_seq: i64::MAX,
            max_seq: i64::MAX,
        }
        .to_string();
    }

    #[test]
    fn rows_below_seq_one_or_past_the_head_are_out_of_bounds() {
        assert_eq!(bounds(5, 5, 0), None);
        assert_eq!(bounds(0, 0, 0), None);
        assert_eq!(bounds(5, 5, 2), Some(Break::BeforeFirst { rows: 2 }));
        assert_eq!(bounds(5, 9, 1), Some(Break::BeforeFirst { rows: 1 }));
        assert_eq!(
            bounds(5, 9, 0),
            Some(Break::BeyondHead {
                head_seq: 5,
                max_seq: 9
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
        assert_ne!(mac(&key(), GENESIS, 1, &a), mac(&key(), GENESIS, 1, &b));
    }

    #[test]
    fn a_long_detail_is_truncated() {
        let mut big = e("x");
        big.detail = format!("{{\"k\":\"{}\"}}", "a".repeat(MAX_DETAIL));
        let n = next(0, GENESIS, big, Some(&key()));
        assert_eq!(n.entry.detail, r#"{"truncated":true}"#);
        assert_eq!(check(&[n]), Ok(1));
        assert_eq!(format!("{:?}", key()), "audit::Key(..)");
    }
}
