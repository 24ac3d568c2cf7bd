-- When the worker's actor began on an enrollment's claim. The scheduler's claim sets it to NULL and
-- the actor sets it as it starts (one statement per claim), so a lease that runs out tells a claim
-- that never reached a worker (a broker outage or flush lost it: put back in the queue free) from a
-- step that started and did not finish (a worker that died: a failed attempt, backed off).
-- depends: 0019.handoff-clock-and-flow-replies

ALTER TABLE enrollments ADD COLUMN claim_started_at TIMESTAMPTZ;
