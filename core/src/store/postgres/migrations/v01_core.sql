
-- One row per conversation. `version` counts stored messages and edits; the reply
-- that covered everything up to `answered_version` has been committed.
CREATE TABLE conversations (
    id               BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    platform         TEXT    NOT NULL,
    key              TEXT    NOT NULL,
    is_group         BOOLEAN NOT NULL DEFAULT FALSE,
    version          BIGINT  NOT NULL DEFAULT 0,
    answered_version BIGINT  NOT NULL DEFAULT 0,
    -- /reset: history only offers replies generated after this version.
    context_version  BIGINT  NOT NULL DEFAULT 0,
    created_at       BIGINT  NOT NULL,
    UNIQUE (platform, key)
);

-- Every accepted message; pending while version > the conversation's answered_version.
CREATE TABLE messages (
    id                  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id     BIGINT NOT NULL REFERENCES conversations (id),
    platform_message_id TEXT   NOT NULL,
    user_id             TEXT   NOT NULL,
    author              TEXT   NOT NULL,
    text                TEXT   NOT NULL,
    version             BIGINT NOT NULL,
    received_at         BIGINT NOT NULL,
    -- No duplicate: a redelivered platform message is stored once.
    UNIQUE (conversation_id, platform_message_id)
);
CREATE INDEX messages_pending ON messages (conversation_id, version);

-- Timers live apart from the conversation row, so no writer of conversation data
-- can overwrite them. One row while messages are pending.
CREATE TABLE timers (
    conversation_id BIGINT  PRIMARY KEY REFERENCES conversations (id),
    platform        TEXT    NOT NULL,
    due_at          BIGINT  NOT NULL,
    armed_version   BIGINT  NOT NULL,
    armed_at        BIGINT  NOT NULL,
    armed_by        TEXT    NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    retry_at        BIGINT  NOT NULL DEFAULT 0
);
CREATE INDEX timers_due ON timers (platform, due_at);

-- Leases: conversations (one round at a time) and platform pollers. Claimed by a
-- compare-and-swap UPDATE; `token` grows with every claim (fencing).
CREATE TABLE leases (
    resource        TEXT   PRIMARY KEY,
    holder          TEXT,
    token           BIGINT NOT NULL DEFAULT 0,
    expires_at      BIGINT NOT NULL DEFAULT 0,
    -- The conversation a conversation lease protects (NULL for pollers).
    conversation_id BIGINT
);
-- Exclusive: at most one lease row per conversation.
CREATE UNIQUE INDEX leases_conversation ON leases (conversation_id);
CREATE INDEX leases_held ON leases (expires_at) WHERE holder IS NOT NULL;

-- The reply outbox: committed replies and notices, delivered after commit and
-- marked sent part by part.
CREATE TABLE outbox (
    id                BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id   BIGINT  NOT NULL REFERENCES conversations (id),
    kind              TEXT    NOT NULL CHECK (kind IN ('reply', 'notice')),
    text              TEXT    NOT NULL,
    reply_to          TEXT,
    version           BIGINT,
    lease_token       BIGINT,
    forced            BOOLEAN NOT NULL DEFAULT FALSE,
    dedupe_key        TEXT UNIQUE,
    owner             TEXT    NOT NULL,
    prompt_tokens     BIGINT,
    completion_tokens BIGINT,
    llm_ms            BIGINT,
    created_at        BIGINT  NOT NULL,
    parts_sent        INTEGER NOT NULL DEFAULT 0,
    attempts          INTEGER NOT NULL DEFAULT 0,
    next_attempt_at   BIGINT  NOT NULL,
    sent_at           BIGINT,
    failed_at         BIGINT,
    error             TEXT
);
CREATE INDEX outbox_undelivered ON outbox (conversation_id, id)
    WHERE sent_at IS NULL AND failed_at IS NULL;
CREATE INDEX outbox_history ON outbox (conversation_id, kind, id);
CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE sent_at IS NULL AND failed_at IS NULL;

-- Which messages each reply (or give-up notice) was generated from.
CREATE TABLE reply_covers (
    outbox_id  BIGINT NOT NULL REFERENCES outbox (id),
    message_id BIGINT NOT NULL REFERENCES messages (id),
    PRIMARY KEY (outbox_id, message_id)
);
CREATE INDEX reply_covers_message ON reply_covers (message_id);

-- The pending-conversations gauge, kept by triggers in the transactions that arm and
-- disarm timers. Sixteen shards (by conversation) instead of SQLite's one row, so
-- concurrent ingests of different conversations rarely wait on the same counter;
-- reading it sums sixteen rows, whatever the number of conversations.
CREATE TABLE pending_shards (
    shard   INTEGER PRIMARY KEY CHECK (shard >= 0 AND shard < 16),
    pending BIGINT  NOT NULL
);
INSERT INTO pending_shards (shard, pending) SELECT s, 0 FROM generate_series(0, 15) s;
CREATE FUNCTION lull_count_pending() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE pending_shards SET pending = pending + 1 WHERE shard = NEW.conversation_id % 16;
        RETURN NEW;
    ELSE
        UPDATE pending_shards SET pending = pending - 1 WHERE shard = OLD.conversation_id % 16;
        RETURN OLD;
    END IF;
END $$;
CREATE TRIGGER timers_counted AFTER INSERT OR DELETE ON timers
    FOR EACH ROW EXECUTE FUNCTION lull_count_pending();
