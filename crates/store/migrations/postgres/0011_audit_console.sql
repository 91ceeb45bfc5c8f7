-- The audit log (issue #13): append-only, hash-chained (rules in tb_core::audit). `audit_head` is the
-- one row every append updates in the same transaction, so appends are serialized and the newest
-- entry is known even if rows are deleted from the end. UPDATE and DELETE on the log are refused.
-- Same as SQLite 0017.
CREATE TABLE audit_log (
    seq       BIGINT PRIMARY KEY,
    at        BIGINT NOT NULL,
    actor     TEXT NOT NULL,
    action    TEXT NOT NULL,
    target    TEXT NOT NULL,
    outcome   TEXT NOT NULL,
    detail    TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash      TEXT NOT NULL UNIQUE
);
CREATE INDEX audit_log_at ON audit_log (at);
CREATE TABLE audit_head (
    id   BIGINT PRIMARY KEY CHECK (id = 1),
    seq  BIGINT NOT NULL,
    hash TEXT NOT NULL
);
INSERT INTO audit_head (id, seq, hash)
    VALUES (1, 0, '0000000000000000000000000000000000000000000000000000000000000000');
CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'audit_log is append-only'; END $$;
CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();

-- Console logins (issue #13): one row per browser login; the cookie holds a random token whose
-- SHA-256 is the key. The API key's name and digest are kept, never the key; its scopes are read from
-- the configuration on every request, so removing or rotating a key ends its logins.
CREATE TABLE console_logins (
    token_sha256 TEXT PRIMARY KEY,
    key_name     TEXT NOT NULL,
    key_sha256   TEXT NOT NULL,
    csrf         TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL
);
