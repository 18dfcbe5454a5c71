
-- Rate limits count edits as they count messages: one row per applied edit, by the
-- author of the edited message, on its conversation's platform.
CREATE TABLE edits (
    message_id BIGINT NOT NULL REFERENCES messages (id),
    user_id    TEXT   NOT NULL,
    platform   TEXT   NOT NULL,
    edited_at  BIGINT NOT NULL
);
CREATE INDEX edits_by_user ON edits (user_id, edited_at);
