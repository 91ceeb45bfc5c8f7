-- Per-run counters for a session's signals and turns (issue #10, DESIGN §9; SQLite's 0009): each is the
-- NEXT number to hand out, kept on the run row that every session rule locks first (`FOR UPDATE`), so
-- two replicas holding that lock one after the other never take the same number. Run events keep
-- `next_sequence`.
ALTER TABLE runs ADD COLUMN next_signal_seq BIGINT NOT NULL DEFAULT 1;
ALTER TABLE runs ADD COLUMN next_turn_seq BIGINT NOT NULL DEFAULT 1;

-- Backfill from what is stored: one past the highest number each run has used.
UPDATE runs r SET next_signal_seq = s.top + 1
  FROM (SELECT run_id, MAX(seq) AS top FROM signals GROUP BY run_id) s WHERE s.run_id = r.id;
UPDATE runs r SET next_turn_seq = t.top + 1
  FROM (SELECT run_id, MAX(seq) AS top FROM turns GROUP BY run_id) t WHERE t.run_id = r.id;
