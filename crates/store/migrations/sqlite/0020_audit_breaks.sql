-- The audit log's recorded breaks (docs/operations.md, "The audit log"): when rows lie past the head
-- (written by hand), an append steps over them with an `audit.break` entry and continues; the head row
-- counts those breaks and keeps the seq of the newest one, so `GET /ready` can say the log is broken
-- without reading it. Same as PostgreSQL 0014.
ALTER TABLE audit_head ADD COLUMN breaks INTEGER NOT NULL DEFAULT 0;
ALTER TABLE audit_head ADD COLUMN last_break_seq INTEGER NOT NULL DEFAULT 0;
