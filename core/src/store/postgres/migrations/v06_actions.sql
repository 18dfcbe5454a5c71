
-- One row per call a round asked for, reserved before it runs, under the lease and
-- only at the round's v0. Moves (only these): reserved -> done | unknown,
-- awaiting -> approved | refused, approved -> reserved; done, unknown and refused are
-- facts (a late result of the reserving token turns unknown into done).
CREATE TABLE actions (
    id              BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- Act once: the idempotency key (conversation, batch, tool, canonical arguments).
    key             TEXT    NOT NULL UNIQUE,
    conversation_id BIGINT  NOT NULL REFERENCES conversations (id),
    -- The first pending message row of the batch the call serves.
    batch           BIGINT  NOT NULL,
    tool            TEXT    NOT NULL,
    arguments       TEXT    NOT NULL,
    state           TEXT    NOT NULL
        CHECK (state IN ('reserved', 'done', 'unknown', 'awaiting', 'approved', 'refused')),
    -- The tool's result, once done (written once); is_error: the tool reported a failure.
    result          TEXT,
    is_error        BOOLEAN NOT NULL DEFAULT FALSE,
    -- The lease token of the last reservation (fencing its result); 0 while awaiting.
    token           BIGINT  NOT NULL,
    -- A reservation's or an approval's expiry, on the database's clock.
    expires_at      BIGINT  NOT NULL,
    requested_by    TEXT,
    created_at      BIGINT  NOT NULL,
    updated_at      BIGINT  NOT NULL
);
CREATE INDEX actions_batch ON actions (conversation_id, batch, id);
CREATE INDEX actions_open ON actions (conversation_id, id) WHERE state IN ('awaiting', 'approved');
