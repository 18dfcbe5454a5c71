
-- The journal of tool calls that act (DESIGN.md, "Actions: act once"): one row per
-- call a round asked for, reserved before it runs, under the conversation's lease and
-- only while the conversation is still at the round's v0. Its moves (and only those):
-- reserved -> done | unknown, awaiting -> approved | refused, approved -> reserved;
-- done, unknown and refused are facts (a late result of the reserving token turns
-- unknown into done).
CREATE TABLE actions (
    id              INTEGER PRIMARY KEY,
    -- Act once: the idempotency key (conversation, batch, tool, canonical arguments);
    -- a later round asking for the same call reads this row instead of running it.
    key             TEXT    NOT NULL UNIQUE,
    conversation_id INTEGER NOT NULL REFERENCES conversations (id),
    -- The first pending message row of the batch the call serves.
    batch           INTEGER NOT NULL,
    -- The tool as the model names it (SERVER__TOOL), its arguments as canonical JSON.
    tool            TEXT    NOT NULL,
    arguments       TEXT    NOT NULL,
    state           TEXT    NOT NULL
        CHECK (state IN ('reserved', 'done', 'unknown', 'awaiting', 'approved', 'refused')),
    -- The tool's result, once done (written once); is_error: the tool reported a failure.
    result          TEXT,
    is_error        INTEGER NOT NULL DEFAULT 0,
    -- The lease token of the last reservation (fencing its result); 0 while awaiting.
    token           INTEGER NOT NULL,
    -- A reservation's expiry (abandoned after it without a result), or an approval's
    -- (the question expires).
    expires_at      INTEGER NOT NULL,
    -- The user whose message led to the call (who may approve it, besides admins).
    requested_by    TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL
);
-- A batch's actions, in the order stored (what the reply reports).
CREATE INDEX actions_batch ON actions (conversation_id, batch, id);
-- A conversation's open approvals, oldest first.
CREATE INDEX actions_open ON actions (conversation_id, id) WHERE state IN ('awaiting', 'approved');
