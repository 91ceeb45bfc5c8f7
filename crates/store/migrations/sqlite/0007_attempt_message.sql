-- Issue #9 (delivery failure handling): a short sanitized message per attempt, and the subscription's
-- failure streak, state time and last error.
ALTER TABLE attempts ADD COLUMN message TEXT;                  -- e.g. "HTTP 500: db down", "could not connect ..."
ALTER TABLE subscriptions ADD COLUMN first_failure_at INTEGER; -- start of the failures since the last success
ALTER TABLE subscriptions ADD COLUMN state_changed_at INTEGER; -- when the current state was entered (NULL: at creation)
ALTER TABLE subscriptions ADD COLUMN last_error TEXT;          -- last failed attempt: "<error class>: <message>"
