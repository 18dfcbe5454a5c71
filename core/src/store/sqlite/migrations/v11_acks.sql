
-- Ack reactions (LULL_ACK_REACTION): the one message of each pending burst that
-- carries lull's reaction. A burst is the messages pending after one answered_version:
-- once per burst, whichever process stored them. Taken (deleted) when the reply
-- covering the message is delivered, by the process that clears the reaction.
CREATE TABLE acks (
    conversation_id     INTEGER NOT NULL REFERENCES conversations (id),
    burst               INTEGER NOT NULL,
    platform_message_id TEXT    NOT NULL,
    PRIMARY KEY (conversation_id, burst)
);
CREATE INDEX acks_message ON acks (conversation_id, platform_message_id);
