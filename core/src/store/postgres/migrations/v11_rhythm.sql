
ALTER TABLE conversations ADD COLUMN rhythm_bursts BIGINT NOT NULL DEFAULT 0;
ALTER TABLE conversations ADD COLUMN rhythm_gap_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE conversations ADD COLUMN rhythm_multi BIGINT NOT NULL DEFAULT 0;
ALTER TABLE conversations ADD COLUMN rhythm_last_at BIGINT;
ALTER TABLE conversations ADD COLUMN rhythm_first_ms BIGINT;
ALTER TABLE conversations ADD COLUMN rhythm_burst_ms BIGINT;
