-- Binding revocation (issue #5: a revoked binding stops routing at once) and duplicate counts.

-- A revoked binding routes nothing new, and its open deliveries are dead-lettered `binding_revoked`
-- when the worker reaches them (their receipts end `disabled`). Deleting the row restores it.
CREATE TABLE binding_revocations (
    binding_id TEXT PRIMARY KEY,
    revoked_at INTEGER NOT NULL,
    revoked_by TEXT
);

-- Repeated deliveries of a held dedup key are counted on the first receipt (no row per duplicate).
ALTER TABLE receipts ADD COLUMN duplicates INTEGER NOT NULL DEFAULT 0;
ALTER TABLE receipts ADD COLUMN last_duplicate_at INTEGER;
