-- Several replicas on one database (issue #10): the configuration another replica must see.

-- The change log: one row per committed configuration change (operator pause/resume, binding revoke/
-- restore, registration, outbound webhook create/delete, capability revoke), appended in the same
-- transaction as the change. Replicas poll it by id (`WHERE id > ?`) and refresh what a row names.
-- Ids come from `config_change_seq` so they are handed out in commit order (see sql/config.rs).
CREATE TABLE config_changes (
    id        BIGINT PRIMARY KEY,
    kind      TEXT NOT NULL,       -- subscription | binding | registration | webhook | capability
    record_id TEXT NOT NULL,
    at        BIGINT NOT NULL     -- Unix ms
);

-- One row: the last id handed out. Its row lock serializes appends, so a reader never sees id N+1
-- committed while id N is still to come.
CREATE TABLE config_change_seq (
    id   BIGINT PRIMARY KEY CHECK (id = 1),
    last BIGINT NOT NULL
);
INSERT INTO config_change_seq (id, last) VALUES (1, 0);

-- Host-generated secrets every replica needs (registration `whsec_` keys, outbound webhook keys),
-- sealed by the engine with an AEAD under TRIGGER_BRIDGE_SECRET_KEY; the store never sees plaintext.
CREATE TABLE sealed_secrets (
    id         TEXT PRIMARY KEY,
    sealed     BYTEA NOT NULL,
    created_at BIGINT NOT NULL
);
