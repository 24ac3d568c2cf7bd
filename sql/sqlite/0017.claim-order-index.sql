-- The claim takes the due pending messages oldest first: `ORDER BY next_attempt_at, id LIMIT n`.
-- On the index of next_attempt_at alone, whether PostgreSQL reads only the first n rows depended
-- on its statistics: with statistics taken while the rows were still in the future (after a big
-- populate, before autovacuum analyses again: a backlog after an outage), it read every due row
-- and sorted them all, 29 ms to claim 1,000 of 50,000 due rows, against 0.7 ms on this index,
-- whose order is the claim's (docs/benchmarks.md, 2026-12-04 (later)).
-- depends: 0016.changed-since-indexes

DROP INDEX messages_due;
CREATE INDEX messages_due ON messages (next_attempt_at, id) WHERE status = 'pending';
