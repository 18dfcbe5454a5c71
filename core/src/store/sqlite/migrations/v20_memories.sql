
-- Memories: what the model was asked to remember, one row per fact, in a scope: a
-- person on a platform (`owner` is their user id) or a chat (`owner` is the
-- conversation's key). A later bot column keys them too. Rows are inserted and
-- deleted one by one, never written back as a list; `version` grows with a change of
-- the row (a merge's compare-and-swap).
CREATE TABLE memories (
    id         INTEGER PRIMARY KEY,
    scope      TEXT    NOT NULL,
    platform   TEXT    NOT NULL,
    owner      TEXT    NOT NULL,
    text       TEXT    NOT NULL,
    author     TEXT    NOT NULL,
    source     TEXT,
    created_at INTEGER NOT NULL,
    version    INTEGER NOT NULL DEFAULT 1
);
-- A scope's memories, newest first; what one person asked for (`/forgetme`).
CREATE INDEX memories_scope ON memories (platform, scope, owner, id);
CREATE INDEX memories_author ON memories (platform, author);
-- A fact is kept once per scope, however often it is remembered.
CREATE UNIQUE INDEX memories_once ON memories (platform, scope, owner, text);
-- A clear (`/memory clear`, `/forgetme`) fences the rounds in flight: a fact staged by
-- a round whose newest message was stored before the clear (its id at most
-- `through_message`) is not written. `kind`: a scope's (`person`, `chat`), or `author`
-- (every fact a person asked for).
CREATE TABLE memory_fences (
    platform        TEXT    NOT NULL,
    kind            TEXT    NOT NULL,
    owner           TEXT    NOT NULL,
    through_message INTEGER NOT NULL,
    PRIMARY KEY (platform, kind, owner)
);
-- `/forgetme`: a message whose texts were erased keeps its row (counters, covers).
ALTER TABLE messages ADD COLUMN erased_at INTEGER;
CREATE INDEX messages_user ON messages (user_id);
-- Who wrote an overheard message, so `/forgetme` finds it (NULL for older rows).
ALTER TABLE overheard ADD COLUMN user_id TEXT;
