-- An idle session's bytes on disk (issue #10; SQLite's 0012): what each session row holds, and which
-- index it pays for.

-- Each distinct session configuration of a workflow, once, under its content key
-- (`tb_core::turn::config_ref`). A start turn refers to it by `turns.config_ref` instead of carrying
-- a copy; the store renders the turn when it is read.
CREATE TABLE session_configs (
    hash       TEXT PRIMARY KEY,
    config     TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
ALTER TABLE turns ADD COLUMN config_ref TEXT;

-- The UNIQUE index on run_events.event_id is gone: the one read by event id knows its run and reads
-- `WHERE run_id = ? AND event_id = ?` through the primary key.
ALTER TABLE run_events DROP CONSTRAINT run_events_event_id_key;

-- No query orders or filters runs by created_at.
DROP INDEX runs_by_time;

-- No query reads an attempt by its event id.
ALTER TABLE attempts DROP CONSTRAINT attempts_event_id_key;
