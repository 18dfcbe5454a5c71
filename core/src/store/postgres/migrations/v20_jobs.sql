
-- Jobs: reminders and scheduled tasks, rows of their conversation (a later bot column
-- on conversations keys them too). `origin`: what made the job; one origin makes one
-- job, however often it is asked (a redelivered command, a tool call asked again).
CREATE TABLE jobs (
    id              BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id BIGINT  NOT NULL REFERENCES conversations (id),
    creator         TEXT    NOT NULL,
    creator_name    TEXT    NOT NULL,
    kind            TEXT    NOT NULL,
    schedule        TEXT    NOT NULL,
    timezone        TEXT    NOT NULL,
    text            TEXT    NOT NULL,
    next_at         BIGINT,
    state           TEXT    NOT NULL DEFAULT 'active',
    origin          TEXT    NOT NULL,
    created_at      BIGINT  NOT NULL,
    ended_at        BIGINT,
    UNIQUE (conversation_id, origin)
);
-- Due jobs by when they are due; a conversation's active jobs.
CREATE INDEX jobs_due ON jobs (next_at) WHERE state = 'active';
CREATE INDEX jobs_active ON jobs (conversation_id) WHERE state = 'active';
-- An occurrence is a fact: one row per (job, scheduled instant).
CREATE TABLE job_occurrences (
    job_id       BIGINT  NOT NULL REFERENCES jobs (id),
    scheduled_at BIGINT  NOT NULL,
    fired_at     BIGINT  NOT NULL,
    fired_by     TEXT    NOT NULL,
    PRIMARY KEY (job_id, scheduled_at)
);
-- A conversation's own time zone (`/timezone`); NULL: `LULL_TIMEZONE`.
ALTER TABLE conversations ADD COLUMN timezone TEXT;
