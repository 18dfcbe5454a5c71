
-- Group context (LULL_GROUP_CONTEXT): recent group messages not addressed to lull,
-- shown to the model when it is addressed. Never pending: no version, no timer.
-- Bounded per conversation by the write that adds one; /reset deletes them.
CREATE TABLE overheard (
    id                  INTEGER PRIMARY KEY,
    conversation_id     INTEGER NOT NULL REFERENCES conversations (id),
    platform_message_id TEXT    NOT NULL,
    author              TEXT    NOT NULL,
    text                TEXT    NOT NULL,
    received_at         INTEGER NOT NULL,
    UNIQUE (conversation_id, platform_message_id)
);
CREATE INDEX overheard_newest ON overheard (conversation_id, id);
