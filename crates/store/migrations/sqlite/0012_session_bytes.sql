-- An idle session's bytes on disk (issue #10): what each session row holds, and which index it pays for.

-- Each distinct session configuration of a workflow, once, under its content key
-- (`tb_core::turn::config_ref`: 32 hex of the SHA-256 of the JSON text). A start turn refers to it by
-- `turns.config_ref` instead of carrying a copy; the store renders the turn when it is read. Rows are
-- never updated; a workflow whose configuration changes adds a row, so a session keeps showing the
-- configuration it started with, on every replica.
CREATE TABLE session_configs (
    hash       TEXT PRIMARY KEY,
    config     TEXT NOT NULL,          -- JSON, the workflow's operator-set `session` table
    created_at INTEGER NOT NULL
);
-- NULL for every turn but a start turn written from this version on (those keep `content` empty).
ALTER TABLE turns ADD COLUMN config_ref TEXT;

-- The run log, keyed by (run_id, sequence) only and stored in that key's B-tree (WITHOUT ROWID: no
-- separate primary-key index). The UNIQUE index on event_id (about 60 bytes per event) is gone: the
-- one read by event id (an outbound webhook delivery's event, `read::get_run_event`) knows its run and
-- reads `WHERE run_id = ? AND event_id = ?`. Event ids stay `evt_<32 hex>` from 128 random bits.
CREATE TABLE run_events_next (
    run_id       TEXT NOT NULL,
    sequence     INTEGER NOT NULL,
    event_id     TEXT NOT NULL,
    type         TEXT NOT NULL,
    payload      TEXT NOT NULL,        -- JSON, without the fields the run row holds (tb_core::events::stored_payload)
    causation_id TEXT,
    timestamp    INTEGER NOT NULL,
    PRIMARY KEY (run_id, sequence)
) WITHOUT ROWID;
INSERT INTO run_events_next (run_id, sequence, event_id, type, payload, causation_id, timestamp)
    SELECT run_id, sequence, event_id, type, payload, causation_id, timestamp FROM run_events;
DROP TABLE run_events;
ALTER TABLE run_events_next RENAME TO run_events;

-- No query orders or filters runs by created_at (lists walk the time-ordered id).
DROP INDEX runs_by_time;

-- Attempts, keyed by (delivery_id, attempt) in that key's B-tree, without the UNIQUE index on event_id:
-- no query reads an attempt by its event id (event ids are 128 random bits).
CREATE TABLE attempts_next (
    delivery_id  TEXT NOT NULL,
    attempt      INTEGER NOT NULL,
    event_id     TEXT NOT NULL,
    outcome      TEXT NOT NULL,
    error_class  TEXT,
    started_at   INTEGER NOT NULL,
    duration_ms  INTEGER NOT NULL,
    next_due_at  INTEGER,
    message      TEXT,
    PRIMARY KEY (delivery_id, attempt)
) WITHOUT ROWID;
INSERT INTO attempts_next (delivery_id, attempt, event_id, outcome, error_class, started_at, duration_ms, next_due_at, message)
    SELECT delivery_id, attempt, event_id, outcome, error_class, started_at, duration_ms, next_due_at, message FROM attempts;
DROP TABLE attempts;
ALTER TABLE attempts_next RENAME TO attempts;
