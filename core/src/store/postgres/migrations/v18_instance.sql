
-- This database's own salt: the idempotency keys sent to tool servers are derived from
-- it, so two deployments sharing an MCP server never send the same key for different
-- calls. One row.
CREATE TABLE instance (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    salt TEXT    NOT NULL
);
INSERT INTO instance (id, salt) VALUES (1, md5(random()::text || clock_timestamp()::text));
