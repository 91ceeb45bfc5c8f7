-- trigger-bridge SQLite schema v1. Times are Unix milliseconds (INTEGER).

CREATE TABLE subscriptions (
    id                   TEXT PRIMARY KEY,
    source               TEXT NOT NULL,
    connector            TEXT NOT NULL,
    config               TEXT NOT NULL,           -- JSON: connector spec, retry policy, limits (no secrets)
    state                TEXT NOT NULL,
    failure_threshold    INTEGER NOT NULL DEFAULT 0,   -- consecutive failed attempts that trip active -> failed; 0 = never
    consecutive_failures INTEGER NOT NULL DEFAULT 0,
    last_success_at      INTEGER,
    created_at           INTEGER NOT NULL,
    updated_at           INTEGER NOT NULL
);

CREATE TABLE receipts (
    id                TEXT PRIMARY KEY,
    subscription_id   TEXT NOT NULL,
    dedup_key         TEXT NOT NULL,
    provider_event_id TEXT NOT NULL,
    event_type        TEXT NOT NULL,
    normalized        TEXT NOT NULL,              -- JSON NormalizedEvent (allowlisted fields only)
    state             TEXT NOT NULL,
    content_type      TEXT,
    body_bytes        INTEGER NOT NULL,
    received_at       INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    dedup_until       INTEGER NOT NULL,           -- end of the dedup window
    dedup_live        INTEGER NOT NULL DEFAULT 1  -- 0 once a later receipt took the key after the window
);
-- One live receipt per dedup key (DESIGN §5.2): enforced by the index, never by check-then-insert.
CREATE UNIQUE INDEX receipts_dedup ON receipts (subscription_id, dedup_key) WHERE dedup_live = 1;

CREATE TABLE bodies (
    receipt_id TEXT PRIMARY KEY,
    body       BLOB NOT NULL
);

CREATE TABLE deliveries (
    id                 TEXT PRIMARY KEY,
    receipt_id         TEXT NOT NULL,
    subscription_id    TEXT NOT NULL,
    binding_id         TEXT NOT NULL,
    dedup_key          TEXT NOT NULL,
    action             TEXT NOT NULL,
    workflow_id        TEXT,
    run_id             TEXT,
    inputs             TEXT NOT NULL,
    state              TEXT NOT NULL,
    attempts           INTEGER NOT NULL DEFAULT 0,
    replays            INTEGER NOT NULL DEFAULT 0,   -- operator replays; each grants one more attempt
    due_at             INTEGER,
    lease_owner        TEXT,
    lease_until        INTEGER,
    first_attempt_at   INTEGER,
    last_error         TEXT,
    dead_letter_reason TEXT,
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL,
    UNIQUE (receipt_id, binding_id)                 -- also serves lookups by receipt
);
CREATE INDEX deliveries_due ON deliveries (due_at) WHERE state IN ('pending', 'retrying');
CREATE INDEX deliveries_by_state ON deliveries (state, id);

CREATE TABLE attempts (
    delivery_id  TEXT NOT NULL,
    attempt      INTEGER NOT NULL,
    event_id     TEXT NOT NULL UNIQUE,
    outcome      TEXT NOT NULL,
    error_class  TEXT,
    started_at   INTEGER NOT NULL,
    duration_ms  INTEGER NOT NULL,
    next_due_at  INTEGER,
    PRIMARY KEY (delivery_id, attempt)
);

CREATE TABLE runs (
    id              TEXT PRIMARY KEY,
    workflow_id     TEXT NOT NULL,
    status          TEXT NOT NULL,
    inputs          TEXT NOT NULL,
    output          TEXT,
    delivery_id     TEXT UNIQUE,
    receipt_id      TEXT,
    subscription_id TEXT,
    causation_id    TEXT,
    next_sequence   INTEGER NOT NULL,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);
CREATE INDEX runs_by_time ON runs (created_at DESC);

CREATE TABLE run_events (
    run_id       TEXT NOT NULL,
    sequence     INTEGER NOT NULL,
    event_id     TEXT NOT NULL UNIQUE,
    type         TEXT NOT NULL,
    payload      TEXT NOT NULL,
    causation_id TEXT,
    timestamp    INTEGER NOT NULL,
    PRIMARY KEY (run_id, sequence)
);

-- Run-less events: trigger.delivery.attempted, trigger.subscription.state.changed.
CREATE TABLE subscription_events (
    event_id        TEXT PRIMARY KEY,
    subscription_id TEXT NOT NULL,
    type            TEXT NOT NULL,
    payload         TEXT NOT NULL,
    delivery_id     TEXT,
    timestamp       INTEGER NOT NULL
);
CREATE INDEX subscription_events_by_sub ON subscription_events (subscription_id, timestamp);
