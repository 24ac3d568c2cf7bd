-- A hand-off keeps the run's clock.
-- depends: 0017.claim-order-index

-- Pausing for a hand-off stops the clock (`next_eval_at` is NULL while paused, so nothing claims
-- the run); the instant it stopped at is kept here, so the hand-off's end resumes at the later of
-- that instant and the flow's grace: a patient keeps the time they had left to answer, and a
-- fixed wait is not stretched (engine/flows/replies.py).
ALTER TABLE enrollments ADD COLUMN paused_next_eval_at TIMESTAMPTZ;

