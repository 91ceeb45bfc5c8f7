-- Services that speak triggers.v2 (issue #12): the manifest each registered (with its hash) and its
-- liveness from heartbeats, in the store so every replica answers from the same record. Same as
-- PostgreSQL 0009.
CREATE TABLE services (
    name              TEXT PRIMARY KEY,
    service_version   TEXT NOT NULL,
    manifest          TEXT NOT NULL,
    manifest_hash     TEXT NOT NULL,
    registered_at     INTEGER NOT NULL,
    last_heartbeat_at INTEGER,
    started_at        TEXT,
    heartbeat_hash    TEXT,
    shutting_down     INTEGER NOT NULL DEFAULT 0
);
