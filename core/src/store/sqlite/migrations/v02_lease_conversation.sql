
-- A conversation lease names its conversation in a column of its own, so a query
-- joins on it instead of rebuilding the lease's resource string in SQL. NULL for
-- every other lease (platform pollers). Rows written before are filled in once from
-- their resource (`conversation/<id>`).
ALTER TABLE leases ADD COLUMN conversation_id INTEGER;
UPDATE leases SET conversation_id = CAST(substr(resource, 14) AS INTEGER)
    WHERE substr(resource, 1, 13) = 'conversation/';
-- Exclusive: at most one lease row per conversation.
CREATE UNIQUE INDEX leases_conversation ON leases (conversation_id);
