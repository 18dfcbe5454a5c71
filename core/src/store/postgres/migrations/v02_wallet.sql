
-- Rate limits count a user's recent messages across their conversations.
CREATE INDEX messages_by_user ON messages (user_id, received_at);
-- A limit's hold (rate, budget): the timer is not due before it. Apart from the
-- failure backoff (`retry_at`), which /reset clears; a hold it does not.
ALTER TABLE timers ADD COLUMN held_until BIGINT NOT NULL DEFAULT 0;
-- Tokens spent per scope and day; totals are only ever added to.
CREATE TABLE token_usage (
    scope  TEXT   NOT NULL,
    day    TEXT   NOT NULL,
    tokens BIGINT NOT NULL,
    PRIMARY KEY (scope, day)
);
-- Admins' run-time access decisions (/allow, /deny): one row per subject, the latest.
-- `id` keeps the order rows were first written in (SQLite's rowid).
CREATE TABLE access_rules (
    id       BIGINT  GENERATED ALWAYS AS IDENTITY,
    platform TEXT    NOT NULL,
    kind     TEXT    NOT NULL CHECK (kind IN ('user', 'chat')),
    subject  TEXT    NOT NULL,
    allowed  BOOLEAN NOT NULL,
    set_by   TEXT    NOT NULL,
    set_at   BIGINT  NOT NULL,
    PRIMARY KEY (platform, kind, subject)
);
