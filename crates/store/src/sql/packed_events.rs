//! The storage form of a new run's first events (docs/architecture.md §7, "Run log rows"): the events
//! `tb_core::attempt::first_events` decides (`run.started`, the delivered `trigger.delivery.attempted`
//! and, for a run already ended, its terminal event; or `run.dead_lettered` and `run.failed`) are
//! written as ONE `run_events` row instead of one row each. Which events those are is core's rule; this
//! module only encodes and decodes the row.
//!
//! A packed row holds:
//! * `type` = [`PACKED`], a reserved internal type no event has (event types are the spec's `run.*`,
//!   `trigger.*` and the bridge's `tb.turn.*` / `tb.wait.*` / `tb.signal.*`, never `tb.internal.*`);
//! * `sequence` = the LAST sequence it covers: its `n` events are at `sequence - n + 1 ..= sequence`,
//!   so the log's page query (`sequence > after ORDER BY sequence LIMIT n`) finds the row whenever one
//!   of its events is after `after`, and the run's next event (at `runs.next_sequence`) keeps the key
//!   `(run_id, sequence)` unique;
//! * `event_id`, `causation_id` = its FIRST event's; `timestamp` = the events' one timestamp (the
//!   run's creation time);
//! * `payload` = a JSON array, one entry per event in sequence order: `[type, payload]` for the first
//!   (its id and causation are the row's columns), `[type, payload, id]` for each later one, with its
//!   causation as a fourth element when it has one. Each payload is stored as a single row's would be
//!   (`tb_core::events::stored_payload`: without what the run row holds). Arrays, not objects, and the
//!   first event in the row's own columns: a packed row of a session's two first events stores fewer
//!   value bytes than their two rows did (`crates/store/tests/session_bytes.rs`).
//!
//! Readers expand a packed row ([`expand`]) before anything else, then put the run row's fields back
//! (`tb_core::events::shown_payload`) on each event as on a single row's, so every event a client
//! sees (id, sequence, type, payload, causation, timestamp) is what one row per event gave. Logs
//! written before (one row per event) read as they are. The outbox is unchanged: one delivery per event
//! per live webhook that takes its type, naming the event's own id.

use serde_json::Value;

use super::log::NewRunEvent;
use super::read::bad;
use crate::model::RunEventRecord;
use crate::StoreResult;

/// The reserved `run_events.type` of a packed row (never an event's type; readers expand it).
pub(crate) const PACKED: &str = "tb.internal.packed";

/// A packed row to insert: `run_events (run_id, sequence, event_id, type = PACKED, payload,
/// causation_id, timestamp = at)`.
pub(crate) struct PackedRow<'a> {
    pub run_id: &'a str,
    /// The last sequence the row covers.
    pub sequence: u64,
    /// The first event's id.
    pub event_id: &'a str,
    /// The JSON text of the entries.
    pub payload: String,
    /// The first event's causation id.
    pub causation_id: Option<&'a str>,
    /// Unix ms, the events' one timestamp.
    pub at: i64,
}

/// The one row `events` are stored as; `None` when they cannot share one: fewer than two, or not of
/// one run, at consecutive sequences and one timestamp (they are then stored one row each).
pub(crate) fn pack<'a>(events: &[NewRunEvent<'a>]) -> Option<PackedRow<'a>> {
    let (first, last) = (events.first()?, events.last()?);
    let one_row = events.len() >= 2
        && events.iter().enumerate().all(|(k, e)| {
            e.run_id == first.run_id && e.sequence == first.sequence + k as u64 && e.at == first.at
        });
    if !one_row {
        return None;
    }
    let entries: Vec<Value> = events
        .iter()
        .enumerate()
        .map(|(k, e)| {
            let mut entry = vec![
                e.event_type.into(),
                tb_core::events::stored_payload(e.event_type, e.run_id, e.payload),
            ];
            if k > 0 {
                entry.push(e.event_id.into());
                entry.extend(e.causation_id.map(Value::from));
            }
            Value::Array(entry)
        })
        .collect();
    Some(PackedRow {
        run_id: first.run_id,
        sequence: last.sequence,
        event_id: first.event_id,
        payload: Value::Array(entries).to_string(),
        causation_id: first.causation_id,
        at: first.at,
    })
}

/// The events row `r` stores, in sequence order, their payloads as stored (the caller puts the run
/// row's fields back): `r` itself unless it is a packed row. Errors: `Database` for a packed row whose
/// payload is not the form above.
pub(crate) fn expand(r: RunEventRecord) -> StoreResult<Vec<RunEventRecord>> {
    if r.event_type != PACKED {
        return Ok(vec![r]);
    }
    let malformed = || bad("packed run events", &r.payload.to_string());
    let entries = match r.payload.as_array() {
        Some(entries) if !entries.is_empty() && entries.len() as u64 <= r.sequence + 1 => entries,
        _ => return Err(malformed()),
    };
    let from = r.sequence + 1 - entries.len() as u64;
    entries
        .iter()
        .enumerate()
        .map(|(k, entry)| {
            let text = |i: usize| entry.get(i).and_then(Value::as_str).map(str::to_string);
            let (event_id, causation_id) = match k {
                0 => (Some(r.event_id.clone()), r.causation_id.clone()),
                _ => (text(2), text(3)),
            };
            let (Some(event_type), Some(payload), Some(event_id)) =
                (text(0), entry.get(1), event_id)
            else {
                return Err(malformed());
            };
            Ok(RunEventRecord {
                run_id: r.run_id.clone(),
                sequence: from + k as u64,
                event_id,
                event_type,
                payload: payload.clone(),
                causation_id,
                timestamp: r.timestamp,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ev<'a>(
        id: &'a str,
        seq: u64,
        ty: &'a str,
        payload: &'a Value,
        causation: Option<&'a str>,
    ) -> NewRunEvent<'a> {
        NewRunEvent {
            event_id: id,
            run_id: "run_1",
            sequence: seq,
            event_type: ty,
            payload,
            causation_id: causation,
            at: 7_000,
        }
    }

    fn record(row: &PackedRow<'_>) -> RunEventRecord {
        RunEventRecord {
            run_id: row.run_id.into(),
            sequence: row.sequence,
            event_id: row.event_id.into(),
            event_type: PACKED.into(),
            payload: serde_json::from_str(&row.payload).unwrap(),
            causation_id: row.causation_id.map(String::from),
            timestamp: row.at,
        }
    }

    #[test]
    fn first_events_pack_into_one_row_and_expand_back_as_stored() {
        let started = json!({"workflowId": "noop", "inputs": {"pr": 1}});
        let attempted = json!({"outcome": "delivered", "runId": "run_1", "attempt": 1});
        let done = json!({});
        let events = [
            ev("evt_a", 0, "run.started", &started, Some("evt_b")),
            ev("evt_b", 1, "trigger.delivery.attempted", &attempted, None),
            ev("evt_c", 2, "run.completed", &done, None),
        ];
        let row = pack(&events).unwrap();
        assert_eq!(
            (row.sequence, row.event_id, row.causation_id, row.at),
            (2, "evt_a", Some("evt_b"), 7_000)
        );
        assert_eq!(
            row.payload,
            r#"[["run.started",{}],["trigger.delivery.attempted",{"attempt":1,"outcome":"delivered"},"evt_b"],["run.completed",{},"evt_c"]]"#
        );
        let got = expand(record(&row)).unwrap();
        let want: Vec<RunEventRecord> = events
            .iter()
            .map(|e| RunEventRecord {
                run_id: "run_1".into(),
                sequence: e.sequence,
                event_id: e.event_id.into(),
                event_type: e.event_type.into(),
                payload: tb_core::events::stored_payload(e.event_type, "run_1", e.payload),
                causation_id: e.causation_id.map(String::from),
                timestamp: 7_000,
            })
            .collect();
        assert_eq!(got, want);
        assert_eq!(
            got[0].payload,
            json!({}),
            "run.started without the run row's fields"
        );
        assert_eq!(
            got[1].payload,
            json!({"outcome": "delivered", "attempt": 1})
        );
    }

    #[test]
    fn events_that_cannot_share_a_row_are_not_packed() {
        let p = json!({});
        assert!(pack(&[ev("evt_a", 0, "run.started", &p, None)]).is_none());
        assert!(pack(&[
            ev("evt_a", 0, "run.started", &p, None),
            ev("evt_b", 2, "run.completed", &p, None)
        ])
        .is_none());
        let mut later = ev("evt_b", 1, "run.completed", &p, None);
        later.at = 7_001;
        assert!(pack(&[ev("evt_a", 0, "run.started", &p, None), later]).is_none());
    }

    #[test]
    fn a_single_row_expands_to_itself_and_a_malformed_pack_is_an_error() {
        let single = RunEventRecord {
            run_id: "run_1".into(),
            sequence: 4,
            event_id: "evt_a".into(),
            event_type: "run.completed".into(),
            payload: json!({}),
            causation_id: None,
            timestamp: 1,
        };
        assert_eq!(expand(single.clone()).unwrap(), vec![single.clone()]);
        let mut packed = single;
        packed.event_type = PACKED.into();
        packed.payload = json!([["run.started", {}], ["run.completed", {}, "evt_b"]]);
        assert_eq!(
            expand(packed.clone())
                .unwrap()
                .iter()
                .map(|e| (e.sequence, e.event_id.as_str()))
                .collect::<Vec<_>>(),
            [(3, "evt_a"), (4, "evt_b")],
            "the row's sequence is its last event's"
        );
        for bad in [
            json!({}),
            json!([]),
            json!([["run.started", {}], ["run.completed", {}]]),
            json!([["run.started"], ["run.completed", {}, "evt_b"]]),
            json!([[], [], [], [], [], []]),
        ] {
            packed.payload = bad.clone();
            assert!(expand(packed.clone()).is_err(), "{bad}");
        }
    }
}
