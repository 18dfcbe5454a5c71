
-- Store a group of messages in one call (one round trip, one transaction, one commit):
-- each exactly as `lull_ingest` stores one, so every invariant of a single ingest
-- holds for each message of the group. What grouping adds is the lock order across
-- the rows several messages share, so that two groups (or a group and any other
-- writer) never wait on each other in a circle. A single ingest, and every other
-- writer of a conversation, takes its conversation row and then at most one counter
-- row of `pending_shards` (the `timers_counted` trigger, when a timer row appears or
-- goes). A group takes them in the same order, each kind sorted:
-- 1. every conversation row of the group, by (platform, key) in this database's
--    collation (created if new), the order every group of every replica takes them
--    in; a row-by-row loop, as a set-based statement locks in its plan's order;
-- 2. then the messages, sorted by the counter shard of their conversation
--    (`conversation_id % 16`, the trigger's), so the counter rows their timers touch
--    are taken in shard order; messages of one conversation in the order given (the
--    array index breaks the tie), so their versions follow their arrival.
-- Returns, for each message, its index in the arrays (1-based) and what
-- `lull_ingest` returned for it.
CREATE FUNCTION lull_ingest_many(
    p_platform TEXT[], p_key TEXT[], p_is_group BOOLEAN[], p_message_id TEXT[], p_user_id TEXT[],
    p_author TEXT[], p_text TEXT[], p_media TEXT[], p_holder TEXT[], p_now BIGINT[],
    p_wait_min_ms BIGINT[], p_wait_max_ms BIGINT[], p_max_wait_ms BIGINT, p_max_batch BIGINT)
RETURNS TABLE (o_index INT, o_conversation BIGINT, o_version BIGINT, o_due_at BIGINT, o_now BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    v_i   INT;
    v_id  BIGINT;
    v_ids BIGINT[] := '{}';
BEGIN
    FOR v_i IN SELECT s.i FROM generate_subscripts(p_key, 1) AS s(i)
               ORDER BY p_platform[s.i], p_key[s.i], s.i LOOP
        SELECT c.id INTO v_id FROM conversations c
         WHERE c.platform = p_platform[v_i] AND c.key = p_key[v_i] FOR UPDATE;
        IF NOT FOUND THEN
            INSERT INTO conversations AS c (platform, key, is_group, created_at)
            VALUES (p_platform[v_i], p_key[v_i], p_is_group[v_i],
                    COALESCE(p_now[v_i], (extract(epoch from clock_timestamp()) * 1000)::int8))
            ON CONFLICT (platform, key) DO UPDATE SET is_group = c.is_group OR excluded.is_group
            RETURNING c.id INTO v_id;
        END IF;
        v_ids[v_i] := v_id;
    END LOOP;
    FOR v_i IN SELECT s.i FROM generate_subscripts(p_key, 1) AS s(i)
               ORDER BY v_ids[s.i] % 16, v_ids[s.i], s.i LOOP
        o_index := v_i;
        SELECT r.o_conversation, r.o_version, r.o_due_at, r.o_now
          INTO o_conversation, o_version, o_due_at, o_now
          FROM lull_ingest(p_platform[v_i], p_key[v_i], p_is_group[v_i], p_message_id[v_i],
                           p_user_id[v_i], p_author[v_i], p_text[v_i], p_media[v_i],
                           p_holder[v_i], p_now[v_i], p_wait_min_ms[v_i], p_wait_max_ms[v_i],
                           p_max_wait_ms, p_max_batch) AS r;
        RETURN NEXT;
    END LOOP;
END $$;
