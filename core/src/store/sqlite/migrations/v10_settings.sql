
-- A conversation's own choices (/model, /persona, /prompt); NULL: the default. A
-- change bumps the conversation's version in the same transaction (fresh).
CREATE TABLE conversation_settings (
    conversation_id INTEGER PRIMARY KEY REFERENCES conversations (id),
    model           TEXT,
    persona         TEXT,
    prompt          TEXT,
    updated_at      INTEGER NOT NULL
);
