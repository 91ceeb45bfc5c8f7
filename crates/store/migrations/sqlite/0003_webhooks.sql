-- Outbound webhooks (OpenWOP webhooks.md, durable mode): each registration is also a trigger
-- subscription row (same id) so its deliveries follow the 4-state machine and dead-letter.
CREATE TABLE webhooks (
    id          TEXT PRIMARY KEY,
    url         TEXT NOT NULL,
    events      TEXT NOT NULL,      -- JSON array of run event types
    tenant_id   TEXT NOT NULL,
    secret_file TEXT NOT NULL,      -- file under the secrets directory; never the secret
    deleted     INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL
);
