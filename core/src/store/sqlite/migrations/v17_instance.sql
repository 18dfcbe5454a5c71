
-- This database's own salt: the idempotency keys sent to tool servers are derived from
-- it, so two deployments sharing an MCP server (or a restored backup, whose copy gets a
-- salt of its own) never send the same key for different calls. One row.
CREATE TABLE instance (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    salt TEXT    NOT NULL
);
INSERT INTO instance (id, salt) VALUES (1, lower(hex(randomblob(16))));
