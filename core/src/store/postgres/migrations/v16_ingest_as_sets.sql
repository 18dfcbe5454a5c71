-- Store a group of messages as sets: V15's `lull_ingest_many`, same arguments and
-- results, but each step is one statement for the whole group instead of one call
-- of `lull_ingest` (about ten statements) per message, and a conversation's timer is
-- armed once per group (by its last message) instead of once per message. The
-- set-based statement costs more to start than a single store (server time per
-- message, one client, `scripts/pg-ingest-cost`'s load, two runs: 2 messages
-- 239–286 µs as sets against 203–206 row by row, 4: 140–162 against 151–161, 16:
-- 83–88 against 122–130), so the
-- store sends a group of two or three row by row, to V15's function, kept as
-- `lull_ingest_rows` (`store::postgres::ingest::SETS_FROM` makes that choice, in
-- one place). A process of the previous release calling `lull_ingest_many` during
-- a rolling upgrade gets this function: same answers, stored as sets.
--
-- Every message is stored exactly as `lull_ingest` stores it, in the order given
-- within its conversation:
-- * no duplicate: a message whose platform id is stored already, or came earlier in
--   the group, is not stored (and bumps nothing); it answers with NULL version and
--   due time. The check is exact because every writer of a conversation's messages
--   holds its conversation row, which step 1 takes for the whole group;
-- * version counter: the conversation's version grows by the messages stored, each
--   message getting the next one in its order;
-- * capped debounce: each message's due time is `lull_ingest`'s, from the messages
--   pending up to it (those before the group and its own predecessors in the group),
--   never sooner than a failure's backoff or a limit's hold; the timer keeps the last
--   message's, which is what a row-by-row store leaves too;
-- * wake-ups: `NOTIFY lull_armed` (payload: the platform) once per platform, when a
--   timer the group armed is due before every future timer of that platform as the
--   replicas knew them before the group (a timer moved later needs no wake-up).
--
-- Lock order (no deadlock between groups, singles and every other writer, all of
-- which take their conversation row first and then at most one counter row), the
-- same in both ways of storing a group:
-- 1. every conversation row of the group, by (platform, key) in this database's
--    collation, created if new: one upsert fed in that order, which takes each row in
--    turn (DO UPDATE locks a row it finds even when its WHERE leaves it unchanged);
-- 2. then the counter rows of `pending_shards` that new timers touch (the
--    `timers_counted` trigger): the timers are armed in shard order
--    (`conversation_id % 16`, the trigger's), so those rows are taken in one order too.
ALTER FUNCTION lull_ingest_many(
    TEXT[], TEXT[], BOOLEAN[], TEXT[], TEXT[], TEXT[], TEXT[], TEXT[], TEXT[], BIGINT[],
    BIGINT[], BIGINT[], BIGINT, BIGINT) RENAME TO lull_ingest_rows;

CREATE FUNCTION lull_ingest_many(
    p_platform TEXT[], p_key TEXT[], p_is_group BOOLEAN[], p_message_id TEXT[], p_user_id TEXT[],
    p_author TEXT[], p_text TEXT[], p_media TEXT[], p_holder TEXT[], p_now BIGINT[],
    p_wait_min_ms BIGINT[], p_wait_max_ms BIGINT[], p_max_wait_ms BIGINT, p_max_batch BIGINT)
RETURNS TABLE (o_index INT, o_conversation BIGINT, o_version BIGINT, o_due_at BIGINT, o_now BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    v_clock    BIGINT := (extract(epoch from clock_timestamp()) * 1000)::int8;
    v_index    INT[];
    v_conv     BIGINT[];
    v_version  BIGINT[];
    v_due      BIGINT[];
    v_now      BIGINT[];
    v_announce TEXT[];
    v_platform TEXT;
BEGIN
    -- 1. The conversation rows, in (platform, key) order; a group stays a group.
    INSERT INTO conversations AS c (platform, key, is_group, created_at)
    SELECT g.platform, g.key, bool_or(g.is_group), MIN(COALESCE(g.now, v_clock))
      FROM unnest(p_platform, p_key, p_is_group, p_now) WITH ORDINALITY
           AS g(platform, key, is_group, now, i)
     GROUP BY g.platform, g.key
     ORDER BY g.platform, g.key
    ON CONFLICT (platform, key) DO UPDATE SET is_group = TRUE
     WHERE excluded.is_group AND NOT c.is_group;

    -- 2. The messages, the versions, the timers, in one statement (one snapshot: the
    -- reads below see the database as it was before this statement's writes).
    -- Every row it reads or writes is found through an index by the group's keys:
    -- the plan is made once per connection and kept, often while the tables are
    -- still empty, when a scan of a whole table (or a hash of it) looks cheapest and
    -- then costs a group time in proportion to the table. So lookups are written as
    -- lateral ones, and for this transaction (the store calls this function as a
    -- transaction of its own) the planner is told not to scan or hash what an index
    -- finds, and to keep the one plan it makes instead of planning this statement
    -- anew at every call (which it otherwise chose to do, at about 0.7 ms a call).
    PERFORM set_config('enable_seqscan', 'off', TRUE),
            set_config('enable_hashjoin', 'off', TRUE),
            set_config('enable_mergejoin', 'off', TRUE),
            set_config('plan_cache_mode', 'force_generic_plan', TRUE);
    WITH input AS (
        SELECT u.i::INT AS i, u.platform, u.key, u.message_id, u.user_id, u.author, u.text,
               u.media, u.holder, COALESCE(u.now, v_clock) AS now, u.wait_min, u.wait_max
          FROM unnest(p_platform, p_key, p_message_id, p_user_id, p_author, p_text, p_media,
                      p_holder, p_now, p_wait_min_ms, p_wait_max_ms) WITH ORDINALITY
               AS u(platform, key, message_id, user_id, author, text, media, holder, now,
                    wait_min, wait_max, i)
    ),
    -- The group's conversations, each found by its key (a lateral lookup: the plan
    -- cached for the first groups of a new database would otherwise scan the table).
    conv AS (
        SELECT c.*
          FROM (SELECT DISTINCT n.platform, n.key FROM input n) n
         CROSS JOIN LATERAL (
               SELECT c.id, c.platform, c.key, c.version, c.answered_version,
                      c.rhythm_first_ms, c.rhythm_burst_ms
                 FROM conversations c
                WHERE c.platform = n.platform AND c.key = n.key
                LIMIT 1) c
    ),
    message AS (
        SELECT n.*, c.id AS conversation, c.version AS base_version, c.answered_version,
               c.rhythm_first_ms, c.rhythm_burst_ms
          FROM input n JOIN conv c ON c.platform = n.platform AND c.key = n.key
    ),
    -- No duplicate: the first of each platform message id, unless stored before.
    fresh AS (
        SELECT DISTINCT ON (m.conversation, m.message_id) m.*
          FROM message m
          LEFT JOIN LATERAL (
               SELECT TRUE AS found FROM messages s
                WHERE s.conversation_id = m.conversation
                  AND s.platform_message_id = m.message_id
                LIMIT 1) before ON TRUE
         WHERE before.found IS NULL
         ORDER BY m.conversation, m.message_id, m.i
    ),
    -- Each stored message's place in its conversation's part of the group.
    counted AS (
        SELECT f.*, row_number() OVER w AS nth, MIN(f.now) OVER w AS first_new
          FROM fresh f
        WINDOW w AS (PARTITION BY f.conversation ORDER BY f.i)
    ),
    -- What was pending before the group (a row for every conversation: an
    -- aggregate without grouping always answers one).
    pending AS (
        SELECT c.id AS conversation_id, p.n, p.first
          FROM conv c
         CROSS JOIN LATERAL (
               SELECT COUNT(*) AS n, MIN(s.received_at) AS first FROM messages s
                WHERE s.conversation_id = c.id AND s.version > c.answered_version) p
    ),
    -- Version counter and capped debounce, message by message (`lull_ingest`'s
    -- arithmetic, with the pending count and first pending time up to the message).
    timed AS (
        SELECT k.*, k.base_version + k.nth AS version,
               CASE WHEN p.n + k.nth >= p_max_batch THEN k.now
                    ELSE LEAST(k.now + LEAST(GREATEST(COALESCE(
                                 CASE WHEN p.n + k.nth >= 2 THEN k.rhythm_burst_ms
                                      ELSE k.rhythm_first_ms END,
                                 k.wait_max), k.wait_min), k.wait_max),
                               LEAST(p.first, k.first_new) + p_max_wait_ms)
               END AS due_at
          FROM counted k JOIN pending p ON p.conversation_id = k.conversation
    ),
    stored AS (
        INSERT INTO messages (conversation_id, platform_message_id, user_id, author, text,
                              version, received_at, media)
        SELECT t.conversation, t.message_id, t.user_id, t.author, t.text, t.version, t.now,
               t.media
          FROM timed t ORDER BY t.conversation, t.i
    ),
    bumped AS (
        UPDATE conversations c SET version = c.version + b.n
          FROM (SELECT t.conversation, COUNT(*) AS n FROM timed t GROUP BY t.conversation) b
         WHERE c.id = b.conversation
    ),
    -- Each conversation's timer as its last stored message arms it.
    latest AS (
        SELECT DISTINCT ON (t.conversation) t.conversation, t.i, t.platform, t.due_at,
               t.version, t.now, t.holder
          FROM timed t ORDER BY t.conversation, t.i DESC
    ),
    armed AS (
        INSERT INTO timers AS t (conversation_id, platform, due_at, armed_version, armed_at, armed_by)
        SELECT l.conversation, l.platform, l.due_at, l.version, l.now, l.holder
          FROM latest l ORDER BY l.conversation % 16, l.conversation
        ON CONFLICT ON CONSTRAINT timers_pkey DO UPDATE SET
            due_at = GREATEST(excluded.due_at, t.retry_at, t.held_until),
            armed_version = excluded.armed_version,
            armed_at = excluded.armed_at,
            armed_by = excluded.armed_by
        RETURNING t.conversation_id, t.platform, t.due_at, t.retry_at, t.held_until
    ),
    -- What the replicas already look at: each platform's earliest future timer (read
    -- once per platform, not once per timer armed).
    known AS MATERIALIZED (
        SELECT x.platform,
               (SELECT MIN(t.due_at) FROM timers t
                 WHERE t.platform = x.platform AND t.due_at > x.now) AS due_at
          FROM (SELECT n.platform, MIN(n.now) AS now FROM input n GROUP BY n.platform) x
    )
    SELECT array_agg(m.i ORDER BY m.i),
           array_agg(m.conversation ORDER BY m.i),
           array_agg(t.version ORDER BY m.i),
           array_agg(CASE WHEN t.i IS NOT NULL
                          THEN GREATEST(t.due_at, a.retry_at, a.held_until) END ORDER BY m.i),
           array_agg(m.now ORDER BY m.i),
           (SELECT array_agg(k.platform) FROM known k
             WHERE EXISTS (SELECT 1 FROM armed x
                            WHERE x.platform = k.platform
                              AND (k.due_at IS NULL OR x.due_at < k.due_at)))
      INTO v_index, v_conv, v_version, v_due, v_now, v_announce
      FROM message m
      LEFT JOIN timed t ON t.i = m.i
      LEFT JOIN armed a ON a.conversation_id = m.conversation;

    -- 3. Wake-ups, once per platform (coalesced by the server within the transaction).
    FOREACH v_platform IN ARRAY COALESCE(v_announce, '{}') LOOP
        PERFORM pg_notify('lull_armed', v_platform);
    END LOOP;
    RETURN QUERY SELECT * FROM unnest(v_index, v_conv, v_version, v_due, v_now);
END $$;
