
-- A conversation's rhythm (`rhythm::Rhythm`), learned when a reply is committed and
-- read by ingest with the version bump, to pick the adaptive wait: bursts learned
-- from, an upper estimate of the gaps inside bursts (ms), the share of bursts with
-- more than one message (per mille), and when the last burst learned from ended.
ALTER TABLE conversations ADD COLUMN rhythm_bursts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE conversations ADD COLUMN rhythm_gap_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE conversations ADD COLUMN rhythm_multi INTEGER NOT NULL DEFAULT 0;
ALTER TABLE conversations ADD COLUMN rhythm_last_at INTEGER;
-- The two waits it allows (`rhythm::Waits`), worked out when it is learned; NULL while
-- it is not known (the full window).
ALTER TABLE conversations ADD COLUMN rhythm_first_ms INTEGER;
ALTER TABLE conversations ADD COLUMN rhythm_burst_ms INTEGER;
