-- Receipts are written once and updated about once (their state when the deliveries settle), and each
-- holds its body (0015). Leaving a page 30 % free lets that update stay on the page as a heap-only tuple:
-- no new entries in the receipt's three indexes, and the WAL record carries only the changed bytes instead
-- of a new copy of the row and its body (docs/architecture.md, "Storage"). Pages written before this keep
-- their fill; new pages use it. PostgreSQL only: SQLite rewrites the row in place.
ALTER TABLE receipts SET (fillfactor = 70);
