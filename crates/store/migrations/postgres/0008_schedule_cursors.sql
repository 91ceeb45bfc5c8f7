-- The durable cursor of each schedule subscription (issue #11): the last nominal tick instant handled,
-- moved only by compare-and-set on `version`, so two scheduler loops (replicas, or a restart mid-pass)
-- never both advance it. A tick's exactly-once rests on its receipt's dedup key; the cursor only keeps
-- the loops from re-planning ticks already handled. Same as SQLite 0014.
CREATE TABLE schedule_cursors (
    subscription_id TEXT PRIMARY KEY,
    last_nominal_at BIGINT NOT NULL,
    missed_total    BIGINT NOT NULL DEFAULT 0,
    buffered_at     BIGINT,
    last_receipt_id TEXT,
    version         BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);
