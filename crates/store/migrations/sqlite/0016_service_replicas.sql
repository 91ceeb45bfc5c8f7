-- The replicas of each triggers.v2 service (issue #12), told apart by their `started_at`: one row
-- per replica with its last heartbeat, so one replica's shutdown or another build does not stand
-- for the whole service. Rows of replicas silent for an hour are removed by the next heartbeat.
-- Same as PostgreSQL 0010.
CREATE TABLE service_replicas (
    service           TEXT NOT NULL,
    started_at        TEXT NOT NULL,
    manifest_hash     TEXT NOT NULL,
    last_heartbeat_at INTEGER NOT NULL,
    shutting_down     INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (service, started_at)
);
