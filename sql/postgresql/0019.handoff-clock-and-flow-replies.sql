-- A hand-off keeps the run's clock, and Conversas knows which replies a follow-up flow read.
-- depends: 0018.meta-template-buttons

-- Pausing for a hand-off stops the clock (`next_eval_at` is NULL while paused, so nothing claims
-- the run); the instant it stopped at is kept here, so the hand-off's end resumes at the later of
-- that instant and the flow's grace: a patient keeps the time they had left to answer, and a
-- fixed wait is not stretched (engine/flows/replies.py).
ALTER TABLE enrollments ADD COLUMN paused_next_eval_at TIMESTAMPTZ;

-- A patient's reply that a waiting node took: the run that took (then read) it, what the flow
-- made of it (codes and node ids only: the step's reason, the class, where the run went) and,
-- when the flow understood it and went on, when. Conversas shows such a reply as the flow's,
-- not as one to answer (engine/messaging/conversations.py).
ALTER TABLE inbound_messages ADD COLUMN flow_enrollment_id BIGINT REFERENCES enrollments(id);
ALTER TABLE inbound_messages ADD COLUMN flow_result JSONB;
ALTER TABLE inbound_messages ADD COLUMN flow_handled_at TIMESTAMPTZ;
-- "Is a run still holding this reply unread?" is asked for every reply Conversas lists.
CREATE INDEX enrollments_pending_inbound ON enrollments (pending_inbound_id) WHERE pending_inbound_id IS NOT NULL;
