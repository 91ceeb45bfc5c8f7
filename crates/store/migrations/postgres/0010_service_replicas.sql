-- The replicas of each triggers.v2 service (issue #12), told apart by their `started_at`: one row
-- per replica with its last heartbeat, so one replica's shutdown or another build does not stand
-- for the whole service. Rows of replicas silent for an hour are removed by the next heartbeat.
-- Same as SQLite 0016.
CREATE TABLE service_replicas (
    service           TEXT NOT NULL,
    started_at        TEXT NOT NULL,
    manifest_hash     TEXT NOT NULL,
    last_heartbeat_at BIGINT NOT NULL,
    shutting_down     BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (service, started_at)
);
