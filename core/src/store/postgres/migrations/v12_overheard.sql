
CREATE TABLE overheard (
    id                  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id     BIGINT NOT NULL REFERENCES conversations (id),
    platform_message_id TEXT   NOT NULL,
    author              TEXT   NOT NULL,
    text                TEXT   NOT NULL,
    received_at         BIGINT NOT NULL,
    -- No duplicate: a redelivered platform message is kept once.
    UNIQUE (conversation_id, platform_message_id)
);
CREATE INDEX overheard_newest ON overheard (conversation_id, id);
