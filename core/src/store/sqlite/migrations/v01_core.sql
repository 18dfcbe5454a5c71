
-- One row per conversation. `version` counts stored messages and edits; the reply
-- that covered everything up to `answered_version` has been committed.
CREATE TABLE conversations (
    id               INTEGER PRIMARY KEY,
    platform         TEXT    NOT NULL,
    key              TEXT    NOT NULL,
    is_group         INTEGER NOT NULL DEFAULT 0,
    version          INTEGER NOT NULL DEFAULT 0,
    answered_version INTEGER NOT NULL DEFAULT 0,
    -- /reset: history only offers replies generated after this version.
    context_version  INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    UNIQUE (platform, key)
);

-- Every accepted message. `version` is the conversation's version after it was
-- stored (or last edited); it is pending while version > answered_version.
CREATE TABLE messages (
    id                  INTEGER PRIMARY KEY,
    conversation_id     INTEGER NOT NULL REFERENCES conversations (id),
    platform_message_id TEXT    NOT NULL,
    user_id             TEXT    NOT NULL,
    author              TEXT    NOT NULL,
    text                TEXT    NOT NULL,
    version             INTEGER NOT NULL,
    received_at         INTEGER NOT NULL,
    -- No duplicate: a redelivered platform message is stored once.
    UNIQUE (conversation_id, platform_message_id)
);
CREATE INDEX messages_pending ON messages (conversation_id, version);

-- Timers live apart from the conversation row, so no writer of conversation data
-- can overwrite them. One row while messages are pending.
CREATE TABLE timers (
    conversation_id INTEGER PRIMARY KEY REFERENCES conversations (id),
    platform        TEXT    NOT NULL,
    due_at          INTEGER NOT NULL,
    -- The version of the message that last armed it: a commit at v0 deletes the
    -- timer only if armed_version <= v0.
    armed_version   INTEGER NOT NULL,
    armed_at        INTEGER NOT NULL,
    -- The process that armed it is woken in-process at due_at; others take it over
    -- only a hand-off later (they poll), so processes do not race for every timer.
    armed_by        TEXT    NOT NULL,
    -- Failed generations: back off until retry_at.
    attempts        INTEGER NOT NULL DEFAULT 0,
    retry_at        INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX timers_due ON timers (platform, due_at);

-- Leases: conversations (one round at a time) and platform pollers. Claimed by a
-- compare-and-swap UPDATE; `token` grows with every claim (fencing).
CREATE TABLE leases (
    resource   TEXT    PRIMARY KEY,
    holder     TEXT,
    token      INTEGER NOT NULL DEFAULT 0,
    expires_at INTEGER NOT NULL DEFAULT 0
);

-- The reply outbox: committed replies and notices, delivered after commit and
-- marked sent part by part.
CREATE TABLE outbox (
    id                INTEGER PRIMARY KEY,
    conversation_id   INTEGER NOT NULL REFERENCES conversations (id),
    kind              TEXT    NOT NULL CHECK (kind IN ('reply', 'notice')),
    text              TEXT    NOT NULL,
    reply_to          TEXT,
    -- Replies: the version they answered, the fencing token of the committing holder,
    -- whether the cap forced them out although newer messages had arrived.
    version           INTEGER,
    lease_token       INTEGER,
    forced            INTEGER NOT NULL DEFAULT 0,
    dedupe_key        TEXT UNIQUE,
    -- The process that queued it delivers it; others only after a hand-off.
    owner             TEXT    NOT NULL,
    prompt_tokens     INTEGER,
    completion_tokens INTEGER,
    llm_ms            INTEGER,
    created_at        INTEGER NOT NULL,
    parts_sent        INTEGER NOT NULL DEFAULT 0,
    attempts          INTEGER NOT NULL DEFAULT 0,
    next_attempt_at   INTEGER NOT NULL,
    sent_at           INTEGER,
    failed_at         INTEGER,
    error             TEXT
);
-- Delivery is in outbox order per conversation: the head row of each decides when
-- that conversation's outbox is due.
CREATE INDEX outbox_undelivered ON outbox (conversation_id, id)
    WHERE sent_at IS NULL AND failed_at IS NULL;
CREATE INDEX outbox_history ON outbox (conversation_id, kind, id);

-- Which messages each reply was generated from.
CREATE TABLE reply_covers (
    outbox_id  INTEGER NOT NULL REFERENCES outbox (id),
    message_id INTEGER NOT NULL REFERENCES messages (id),
    PRIMARY KEY (outbox_id, message_id)
);
CREATE INDEX reply_covers_message ON reply_covers (message_id);
