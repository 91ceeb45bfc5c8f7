-- Layer-1 HTTP idempotency records (OpenWOP idempotency.md): one per (scope, key), kept 24 h.
CREATE TABLE idempotency_keys (
    scope        TEXT NOT NULL,   -- principal + method + path
    key          TEXT NOT NULL,
    digest       TEXT NOT NULL,   -- SHA-256 of method, path and body
    state        TEXT NOT NULL,   -- pending | completed
    status       INTEGER,
    content_type TEXT,
    body         BLOB,
    lease_until  INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
);
