
-- Rate limits count edits as they count messages: an applied edit makes a message
-- pending again (and a generation in flight stale) as a new message does. One row per
-- applied edit, by the author of the edited message, on its conversation's platform.
CREATE TABLE edits (
    message_id INTEGER NOT NULL REFERENCES messages (id),
    user_id    TEXT    NOT NULL,
    platform   TEXT    NOT NULL,
    edited_at  INTEGER NOT NULL
);
CREATE INDEX edits_by_user ON edits (user_id, edited_at);
