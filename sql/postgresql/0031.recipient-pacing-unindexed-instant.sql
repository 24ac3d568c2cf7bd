-- No statement reads recipient_pacing by its instant: a check and a wave find a row by its
-- primary key. The index cost every new recipient an index entry and made every move of a
-- row's instant a non-HOT update (a new index entry for the same row, each send).
DROP INDEX recipient_pacing_next_allowed;
