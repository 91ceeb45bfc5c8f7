-- Per-run counters for a session's signals and turns (issue #10, DESIGN §9): each is the NEXT number to
-- hand out, kept on the run row that every session rule locks first, so two writers holding that lock one
-- after the other never take the same number (no more MAX(seq) + 1). Run events keep `next_sequence`.
ALTER TABLE runs ADD COLUMN next_signal_seq INTEGER NOT NULL DEFAULT 1;
ALTER TABLE runs ADD COLUMN next_turn_seq INTEGER NOT NULL DEFAULT 1;

-- Backfill from what is stored: one past the highest number each run has used.
UPDATE runs SET next_signal_seq = (SELECT MAX(seq) + 1 FROM signals WHERE signals.run_id = runs.id)
 WHERE id IN (SELECT run_id FROM signals);
UPDATE runs SET next_turn_seq = (SELECT MAX(seq) + 1 FROM turns WHERE turns.run_id = runs.id)
 WHERE id IN (SELECT run_id FROM turns);
