
-- Jobs: reminders and scheduled tasks, rows of their conversation (a later bot column
-- on conversations keys them too). `origin`: what made the job; one origin makes one
-- job, however often it is asked (a redelivered command, a tool call asked again).
CREATE TABLE jobs (
    id              INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations (id),
    creator         TEXT    NOT NULL,
    creator_name    TEXT    NOT NULL,
    kind            TEXT    NOT NULL,
    schedule        TEXT    NOT NULL,
    timezone        TEXT    NOT NULL,
    text            TEXT    NOT NULL,
    next_at         INTEGER,
    state           TEXT    NOT NULL DEFAULT 'active',
    origin          TEXT    NOT NULL,
    created_at      INTEGER NOT NULL,
    ended_at        INTEGER,
    UNIQUE (conversation_id, origin)
);
-- Due jobs by when they are due; a conversation's active jobs.
CREATE INDEX jobs_due ON jobs (next_at) WHERE state = 'active';
CREATE INDEX jobs_active ON jobs (conversation_id) WHERE state = 'active';
-- An occurrence is a fact: one row per (job, scheduled instant).
CREATE TABLE job_occurrences (
    job_id       INTEGER NOT NULL REFERENCES jobs (id),
    scheduled_at INTEGER NOT NULL,
    fired_at     INTEGER NOT NULL,
    fired_by     TEXT    NOT NULL,
    PRIMARY KEY (job_id, scheduled_at)
);
-- A conversation's own time zone (`/timezone`); NULL: `LULL_TIMEZONE`.
ALTER TABLE conversations ADD COLUMN timezone TEXT;
