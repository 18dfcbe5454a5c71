
-- The Discord threads lull opened (LULL_DISCORD_AUTO_THREAD): messages there need no
-- mention. By platform and key, so remembered before the thread has a conversation.
CREATE TABLE threads (
    platform  TEXT    NOT NULL,
    key       TEXT    NOT NULL,
    opened_at INTEGER NOT NULL,
    PRIMARY KEY (platform, key)
);
