-- Issue #14: request counts per UTC minute, level and outcome, shared by every replica. Rate limits
-- read the admitted counts (`outcome = 'admitted'`) of the running minute; refused requests past the
-- first few per subscription and minute are only counted here, so a flood is a bounded number of
-- writes (each replica adds its counts once a second, one row per level, key and outcome).
-- `minute` = Unix ms / 60 000 (UTC). Rows older than seven days are removed as new minutes begin.
-- Same as SQLite 0018.
CREATE TABLE ingress_counts (
    minute  BIGINT NOT NULL,
    scope   TEXT NOT NULL,
    key     TEXT NOT NULL,
    outcome TEXT NOT NULL,
    n       BIGINT NOT NULL,
    PRIMARY KEY (minute, scope, key, outcome)
);
CREATE INDEX ingress_counts_by_scope ON ingress_counts (scope, key, minute);

-- Quarantined subscriptions: one row while quarantined, deleted on release. `quarantined_by` is the
-- operator's key id, or NULL for the automatic rule.
CREATE TABLE subscription_quarantines (
    subscription_id TEXT PRIMARY KEY,
    since           BIGINT NOT NULL,
    reason          TEXT NOT NULL,
    quarantined_by  TEXT
);
