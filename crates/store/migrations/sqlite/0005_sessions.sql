-- Sessions, durable signals, waits, turns and capability endpoints (issue #5; signals-and-connectors §4-§6).

-- The rendered action parameters of a delivery (coalesce key, signal name, prompt) and when its effect
-- was consumed (run started; signal or prompt taken by a wait or an acknowledged turn).
ALTER TABLE deliveries ADD COLUMN params TEXT;
ALTER TABLE deliveries ADD COLUMN consumed_at INTEGER;
-- Human-readable reason while the run is waiting-external.
ALTER TABLE runs ADD COLUMN wait_reason TEXT;
-- Session mailbox policy of the run (JSON MailboxPolicy), NULL for non-session runs.
ALTER TABLE runs ADD COLUMN mailbox TEXT;

-- One live session per (workflow, coalesce key): two concurrent first events create one session.
CREATE TABLE coalesce_keys (
    workflow_id TEXT NOT NULL,
    key         TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (workflow_id, key)
);

-- Per-run FIFO mailbox (seq = arrival order). A signalId is unique per run: a repeat is a duplicate.
CREATE TABLE signals (
    run_id      TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    signal_id   TEXT NOT NULL,
    name        TEXT NOT NULL,
    envelope    TEXT NOT NULL,        -- JSON SessionSignalV1 (inline data or payloadRef)
    state       TEXT NOT NULL,        -- buffered | consumed | dropped
    delivery_id TEXT,                 -- the webhook delivery that raised it
    consumed_by TEXT,                 -- wait or turn id
    raised_at   INTEGER NOT NULL,
    settled_at  INTEGER,
    PRIMARY KEY (run_id, seq),
    UNIQUE (run_id, signal_id)
);
CREATE INDEX signals_buffered ON signals (run_id, seq) WHERE state = 'buffered';

-- Large signal payloads, outside the event log; read only through their reference.
CREATE TABLE signal_payloads (
    ref        TEXT PRIMARY KEY,
    run_id     TEXT NOT NULL,
    data       BLOB NOT NULL,
    created_at INTEGER NOT NULL
);

CREATE TABLE waits (
    id             TEXT PRIMARY KEY,
    run_id         TEXT NOT NULL,
    spec           TEXT NOT NULL,     -- JSON WaitSpec
    deadline       INTEGER,           -- absolute (ms); the durable timer
    state          TEXT NOT NULL,     -- armed | resolved | cancelled
    interrupted_by TEXT,              -- turn id of the user input that interrupted it
    winner         TEXT,              -- JSON {kind, signal?, turnId?, deadline?}
    losers         TEXT,              -- JSON [{kind, disposition}]
    created_at     INTEGER NOT NULL,
    settled_at     INTEGER
);
CREATE UNIQUE INDEX waits_one_armed ON waits (run_id) WHERE state = 'armed';
CREATE INDEX waits_due ON waits (deadline) WHERE state = 'armed' AND deadline IS NOT NULL;

CREATE TABLE turns (
    id          TEXT PRIMARY KEY,
    run_id      TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    kind        TEXT NOT NULL,        -- start | prompt | signal | wait
    content     TEXT NOT NULL,        -- JSON, framed (turn.rs)
    state       TEXT NOT NULL,        -- queued | leased | acked
    lease_until INTEGER,
    claims      INTEGER NOT NULL DEFAULT 0,
    delivery_id TEXT,                 -- the delivery whose prompt / wake this turn carries
    user_input  INTEGER NOT NULL DEFAULT 0,
    seen_by     TEXT,                 -- wait id that already saw this input (interrupted or won)
    created_at  INTEGER NOT NULL,
    acked_at    INTEGER,
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
    wake        INTEGER NOT NULL DEFAULT 0,
    hmac_file   TEXT,                 -- secret file name when an HMAC is required
    created_by  TEXT,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    max_uses    INTEGER NOT NULL,
    use_count   INTEGER NOT NULL DEFAULT 0,
    revoked_at  INTEGER
);
