
-- Summaries: derived rows, never a message. A conversation's summary covers every
-- exchange whose reply's outbox id is at most `through_reply`, made after the reset at
-- `context_version` (a summary made before `/new` is never read after it). One row per
-- conversation (a later bot column keys it with the conversation): a summary replaces
-- the row only if it covers more, or the row is of an earlier context; messages and
-- replies are never cut, trimmed or rewritten by it. `messages`: how many messages it
-- covers in all; `through_at`: when the newest of them arrived.
CREATE TABLE summaries (
    conversation_id   BIGINT PRIMARY KEY REFERENCES conversations (id),
    context_version   BIGINT  NOT NULL,
    through_reply     BIGINT  NOT NULL,
    through_message   BIGINT  NOT NULL,
    through_at        BIGINT  NOT NULL,
    messages          BIGINT  NOT NULL,
    text              TEXT    NOT NULL,
    model             TEXT    NOT NULL,
    prompt_tokens     BIGINT,
    completion_tokens BIGINT,
    created_at        BIGINT  NOT NULL
);
-- Retention (`LULL_RETENTION_DAYS`): a delivered reply whose text was removed keeps
-- its row (parts, covers, counters), as an erased message does.
ALTER TABLE outbox ADD COLUMN erased_at BIGINT;
-- What retention may still remove, oldest first: texts not yet removed.
CREATE INDEX messages_unexpired ON messages (received_at) WHERE erased_at IS NULL;
CREATE INDEX outbox_unexpired ON outbox (sent_at)
    WHERE erased_at IS NULL AND sent_at IS NOT NULL;
CREATE INDEX overheard_by_age ON overheard (received_at);
