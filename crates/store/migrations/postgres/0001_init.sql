-- trigger-bridge PostgreSQL schema v1: the SQLite schema of migrations/sqlite/0001..0007, folded into one
-- file (no PostgreSQL store predates it). Same tables, columns, keys and indexes, so one SQL text serves
-- both backends. Every integer (Unix ms times, counters, 0/1 flags) is BIGINT, text and JSON text TEXT,
-- bytes BYTEA. No table needs a generated key: the two SQLite statements that use `rowid`
-- (idempotency_keys, signals) have a real primary key to use instead ((scope, key), (run_id, seq)).
-- Applied in one transaction by postgres::migrate, which records it in schema_migrations.

CREATE TABLE subscriptions (
    id                   TEXT PRIMARY KEY,
    source               TEXT NOT NULL,
    connector            TEXT NOT NULL,
    config               TEXT NOT NULL,           -- JSON: connector spec, retry policy, limits (no secrets)
    state                TEXT NOT NULL,
    failure_threshold    BIGINT NOT NULL DEFAULT 0,   -- consecutive failed attempts that trip active -> failed; 0 = never
    consecutive_failures BIGINT NOT NULL DEFAULT 0,
    last_success_at      BIGINT,
    created_at           BIGINT NOT NULL,
    updated_at           BIGINT NOT NULL,
    first_failure_at     BIGINT,                  -- start of the failures since the last success
    state_changed_at     BIGINT,                  -- when the current state was entered (NULL: at creation)
    last_error           TEXT                     -- last failed attempt: "<error class>: <message>"
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
    body_bytes        BIGINT NOT NULL,
    received_at       BIGINT NOT NULL,
    updated_at        BIGINT NOT NULL,
    dedup_until       BIGINT NOT NULL,            -- end of the dedup window
    dedup_live        BIGINT NOT NULL DEFAULT 1,  -- 0 once a later receipt took the key after the window
    duplicates        BIGINT NOT NULL DEFAULT 0,  -- repeated deliveries of the held key, counted here
    last_duplicate_at BIGINT
);
-- One live receipt per dedup key (DESIGN §5.2): enforced by the index, never by check-then-insert.
CREATE UNIQUE INDEX receipts_dedup ON receipts (subscription_id, dedup_key) WHERE dedup_live = 1;

CREATE TABLE bodies (
    receipt_id TEXT PRIMARY KEY,
    body       BYTEA NOT NULL
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
    attempts           BIGINT NOT NULL DEFAULT 0,
    replays            BIGINT NOT NULL DEFAULT 0,   -- operator replays; each grants one more attempt
    due_at             BIGINT,
    lease_owner        TEXT,
    lease_until        BIGINT,
    first_attempt_at   BIGINT,
    last_error         TEXT,
    dead_letter_reason TEXT,
    created_at         BIGINT NOT NULL,
    updated_at         BIGINT NOT NULL,
    params             TEXT,                        -- rendered action parameters (coalesce key, signal name, prompt)
    consumed_at        BIGINT,                      -- when its effect was consumed
    UNIQUE (receipt_id, binding_id)                 -- also serves lookups by receipt
);
CREATE INDEX deliveries_due ON deliveries (due_at) WHERE state IN ('pending', 'retrying');
CREATE INDEX deliveries_by_state ON deliveries (state, id);

CREATE TABLE attempts (
    delivery_id  TEXT NOT NULL,
    attempt      BIGINT NOT NULL,
    event_id     TEXT NOT NULL UNIQUE,
    outcome      TEXT NOT NULL,
    error_class  TEXT,
    started_at   BIGINT NOT NULL,
    duration_ms  BIGINT NOT NULL,
    next_due_at  BIGINT,
    message      TEXT,                              -- short sanitized message, e.g. "HTTP 500: db down"
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
    next_sequence   BIGINT NOT NULL,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL,
    wait_reason     TEXT,                           -- human-readable reason while waiting-external
    mailbox         TEXT                            -- JSON MailboxPolicy, NULL for non-session runs
);
CREATE INDEX runs_by_time ON runs (created_at DESC);

CREATE TABLE run_events (
    run_id       TEXT NOT NULL,
    sequence     BIGINT NOT NULL,
    event_id     TEXT NOT NULL UNIQUE,
    type         TEXT NOT NULL,
    payload      TEXT NOT NULL,
    causation_id TEXT,
    timestamp    BIGINT NOT NULL,
    PRIMARY KEY (run_id, sequence)
);

-- Run-less events: trigger.delivery.attempted, trigger.subscription.state.changed.
CREATE TABLE subscription_events (
    event_id        TEXT PRIMARY KEY,
    subscription_id TEXT NOT NULL,
    type            TEXT NOT NULL,
    payload         TEXT NOT NULL,
    delivery_id     TEXT,
    timestamp       BIGINT NOT NULL
);
CREATE INDEX subscription_events_by_sub ON subscription_events (subscription_id, timestamp);

-- Layer-1 HTTP idempotency records (OpenWOP idempotency.md): one per (scope, key), kept 24 h.
CREATE TABLE idempotency_keys (
    scope        TEXT NOT NULL,   -- principal + method + path
    key          TEXT NOT NULL,
    digest       TEXT NOT NULL,   -- SHA-256 of method, path and body
    state        TEXT NOT NULL,   -- pending | completed
    status       BIGINT,
    content_type TEXT,
    body         BYTEA,
    lease_until  BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    PRIMARY KEY (scope, key)
);

-- Outbound webhooks (OpenWOP webhooks.md, durable mode): each registration is also a trigger
-- subscription row (same id) so its deliveries follow the 4-state machine and dead-letter.
CREATE TABLE webhooks (
    id                   TEXT PRIMARY KEY,
    url                  TEXT NOT NULL,
    events               TEXT NOT NULL,      -- JSON array of run event types
    tenant_id            TEXT NOT NULL,
    secret_file          TEXT NOT NULL,      -- file under the secrets directory; never the secret
    deleted              BIGINT NOT NULL DEFAULT 0,
    created_at           BIGINT NOT NULL,
    standard_secret_file TEXT                -- RFC 0201 Standard Webhooks key file; NULL when not opted in
);

-- One live session per (workflow, coalesce key): two concurrent first events create one session.
CREATE TABLE coalesce_keys (
    workflow_id TEXT NOT NULL,
    key         TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    PRIMARY KEY (workflow_id, key)
);

-- Per-run FIFO mailbox (seq = arrival order). A signalId is unique per run: a repeat is a duplicate.
CREATE TABLE signals (
    run_id      TEXT NOT NULL,
    seq         BIGINT NOT NULL,
    signal_id   TEXT NOT NULL,
    name        TEXT NOT NULL,
    envelope    TEXT NOT NULL,        -- JSON SessionSignalV1 (inline data or payloadRef)
    state       TEXT NOT NULL,        -- buffered | consumed | dropped
    delivery_id TEXT,                 -- the webhook delivery that raised it
    consumed_by TEXT,                 -- wait or turn id
    raised_at   BIGINT NOT NULL,
    settled_at  BIGINT,
    PRIMARY KEY (run_id, seq),
    UNIQUE (run_id, signal_id)
);
CREATE INDEX signals_buffered ON signals (run_id, seq) WHERE state = 'buffered';

-- Large signal payloads, outside the event log; read only through their reference.
CREATE TABLE signal_payloads (
    ref        TEXT PRIMARY KEY,
    run_id     TEXT NOT NULL,
    data       BYTEA NOT NULL,
    created_at BIGINT NOT NULL
);

CREATE TABLE waits (
    id             TEXT PRIMARY KEY,
    run_id         TEXT NOT NULL,
    spec           TEXT NOT NULL,     -- JSON WaitSpec
    deadline       BIGINT,            -- absolute (ms); the durable timer
    state          TEXT NOT NULL,     -- armed | resolved | cancelled
    interrupted_by TEXT,              -- turn id of the user input that interrupted it
    winner         TEXT,              -- JSON {kind, signal?, turnId?, deadline?}
    losers         TEXT,              -- JSON [{kind, disposition}]
    created_at     BIGINT NOT NULL,
    settled_at     BIGINT
);
CREATE UNIQUE INDEX waits_one_armed ON waits (run_id) WHERE state = 'armed';
CREATE INDEX waits_due ON waits (deadline) WHERE state = 'armed' AND deadline IS NOT NULL;

CREATE TABLE turns (
    id          TEXT PRIMARY KEY,
    run_id      TEXT NOT NULL,
    seq         BIGINT NOT NULL,
    kind        TEXT NOT NULL,        -- start | prompt | signal | wait
    content     TEXT NOT NULL,        -- JSON, framed (turn.rs)
    state       TEXT NOT NULL,        -- queued | leased | acked
    lease_until BIGINT,
    claims      BIGINT NOT NULL DEFAULT 0,
    delivery_id TEXT,                 -- the delivery whose prompt / wake this turn carries
    user_input  BIGINT NOT NULL DEFAULT 0,
    seen_by     TEXT,                 -- wait id that already saw this input (interrupted or won)
    created_at  BIGINT NOT NULL,
    acked_at    BIGINT,
    UNIQUE (run_id, seq)
);
CREATE INDEX turns_open ON turns (run_id, seq) WHERE state != 'acked';

-- Minted capability URLs (signals-and-connectors §4): the token is stored only as its SHA-256.
CREATE TABLE capabilities (
    id          TEXT PRIMARY KEY,
    token_hash  TEXT NOT NULL UNIQUE,
    run_id      TEXT NOT NULL,
    signal      TEXT NOT NULL,
    label       TEXT,
    wake        BIGINT NOT NULL DEFAULT 0,
    hmac_file   TEXT,                 -- secret file name when an HMAC is required
    created_by  TEXT,
    created_at  BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    max_uses    BIGINT NOT NULL,
    use_count   BIGINT NOT NULL DEFAULT 0,
    revoked_at  BIGINT
);

-- A revoked binding routes nothing new, and its open deliveries are dead-lettered `binding_revoked`
-- when the worker reaches them (their receipts end `disabled`). Deleting the row restores it.
CREATE TABLE binding_revocations (
    binding_id TEXT PRIMARY KEY,
    revoked_at BIGINT NOT NULL,
    revoked_by TEXT
);
