
-- Index-driven scheduling: undelivered outbox rows found by when they are due, not by
-- walking every conversation's outbox.
CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE sent_at IS NULL AND failed_at IS NULL;
-- Lease expiry of held leases (released ones drop out of the index).
CREATE INDEX leases_held ON leases (expires_at) WHERE holder IS NOT NULL;
-- The pending-conversations gauge, kept by triggers in the transactions that arm and
-- disarm timers, so reading it costs one row whatever the number of conversations.
CREATE TABLE stats (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    pending INTEGER NOT NULL
);
INSERT INTO stats (id, pending) SELECT 1, COUNT(*) FROM timers;
CREATE TRIGGER timers_armed AFTER INSERT ON timers
    BEGIN UPDATE stats SET pending = pending + 1 WHERE id = 1; END;
CREATE TRIGGER timers_disarmed AFTER DELETE ON timers
    BEGIN UPDATE stats SET pending = pending - 1 WHERE id = 1; END;
