-- The durable cursor of each schedule subscription (issue #11): the last nominal tick instant handled,
-- moved only by compare-and-set on `version`, so two scheduler loops (replicas, or a restart mid-pass)
-- never both advance it. A tick's exactly-once rests on its receipt's dedup key; the cursor only keeps
-- the loops from re-planning ticks already handled. Same as PostgreSQL 0008.
CREATE TABLE schedule_cursors (
    subscription_id TEXT PRIMARY KEY,
    last_nominal_at INTEGER NOT NULL,
    missed_total    INTEGER NOT NULL DEFAULT 0,
    buffered_at     INTEGER,
    last_receipt_id TEXT,
    version         INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);
