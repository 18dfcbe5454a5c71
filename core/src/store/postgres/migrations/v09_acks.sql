
CREATE TABLE acks (
    conversation_id     BIGINT NOT NULL REFERENCES conversations (id),
    -- The conversation's answered_version when the burst's ack was claimed.
    burst               BIGINT NOT NULL,
    platform_message_id TEXT   NOT NULL,
    -- Once per burst, whichever replica stored its messages.
    PRIMARY KEY (conversation_id, burst)
);
CREATE INDEX acks_message ON acks (conversation_id, platform_message_id);
