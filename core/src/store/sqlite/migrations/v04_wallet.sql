
-- Rate limits count a user's recent messages across their conversations.
CREATE INDEX messages_by_user ON messages (user_id, received_at);
-- A limit's hold (rate, budget): the timer is not due before it. Apart from the
-- failure backoff (`retry_at`), which /reset clears; a hold it does not.
ALTER TABLE timers ADD COLUMN held_until INTEGER NOT NULL DEFAULT 0;
-- Tokens spent per scope and day: `user:<platform>:<id>`, `conversation:<id>`, `bot`;
-- the day as the deployment's time zone names it. Totals are only ever added to.
CREATE TABLE token_usage (
    scope  TEXT    NOT NULL,
    day    TEXT    NOT NULL,
    tokens INTEGER NOT NULL,
    PRIMARY KEY (scope, day)
);
-- Admins' run-time access decisions (/allow, /deny): one row per subject, the latest.
CREATE TABLE access_rules (
    platform TEXT    NOT NULL,
    kind     TEXT    NOT NULL CHECK (kind IN ('user', 'chat')),
    subject  TEXT    NOT NULL,
    allowed  INTEGER NOT NULL,
    set_by   TEXT    NOT NULL,
    set_at   INTEGER NOT NULL,
    PRIMARY KEY (platform, kind, subject)
);
