-- A receipt's raw body lives in its own row (docs/architecture.md, "Storage"): written by the receipt's
-- insert, so a new receipt writes one row instead of a `receipts` row plus a `bodies` row (and the
-- `bodies` heap and its key index are no longer written per event). NULL when the body is empty (empty
-- bodies never had a `bodies` row) and once the retention sweeper dropped it. Default storage
-- (compressed, out of line in the TOAST table when the row is large), as `bodies.body` had.
-- Same as SQLite 0021.
ALTER TABLE receipts ADD COLUMN body BYTEA;
-- Every stored body moves into its receipt. `bodies` rows are written in the transaction of their
-- receipt and receipts are never deleted, so each body has its receipt.
UPDATE receipts r SET body = b.body FROM bodies b WHERE b.receipt_id = r.id;
DROP TABLE bodies;
-- The sweeper walks the receipts that still hold a body, in id order (`sql::write::sweep`): without
-- this index a pass would read every old receipt, not only the old bodies.
CREATE INDEX receipts_body_held ON receipts (id) WHERE body IS NOT NULL;
