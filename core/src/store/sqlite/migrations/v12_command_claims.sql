
-- Command messages acted on (SettingStore::claim_command): a redelivered command acts
-- once. Kept for a week (deleted by the next claim after that).
CREATE TABLE command_claims (
    platform   TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    message_id TEXT    NOT NULL,
    claimed_at INTEGER NOT NULL,
    PRIMARY KEY (platform, key, message_id)
);
CREATE INDEX command_claims_age ON command_claims (claimed_at);
