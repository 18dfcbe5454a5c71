
CREATE TABLE command_claims (
    platform   TEXT   NOT NULL,
    key        TEXT   NOT NULL,
    message_id TEXT   NOT NULL,
    claimed_at BIGINT NOT NULL,
    PRIMARY KEY (platform, key, message_id)
);
CREATE INDEX command_claims_age ON command_claims (claimed_at);
