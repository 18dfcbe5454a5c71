
-- Store one message: the whole ingest transaction of `store::MessageStore::ingest`,
-- in one call. Invariants, in statement order:
-- * lock order: the conversation row first (FOR UPDATE, or the upsert that creates
--   it), so every writer of the conversation queues here, as in every other method;
-- * no duplicate: a redelivered platform message is stored once (and bumps nothing);
-- * version counter: bumped in the transaction that stores the message;
-- * capped debounce: due = min(now + wait, first pending + max wait), now once
--   max_batch messages are pending (`TimerPolicy::due_after`), never sooner than a
--   failure's backoff or a limit's hold. The wait is `rhythm::Waits::pick`: the
--   conversation's stored burst wait once two messages are pending, else its first
--   wait, the whole window `p_wait_max_ms` while its rhythm is unknown (NULL), always
--   within [p_wait_min_ms, p_wait_max_ms] (the caller's `TimerPolicy::wait_range` for
--   this message: both the debounce when fixed or when the message reads unfinished);
-- * wake-ups: `NOTIFY lull_armed` (payload: the platform) only when the timer is due
--   before every future timer of its platform. Every replica serving the platform
--   looks for due work by the earliest of those (its scheduler sleeps until the next
--   deadline it read, or was woken by that timer's own announcement) and then reads
--   the timers as they are; a later timer needs no wake-up. The poll bounds the rest:
--   a replica that looked just before this commit sees it at its next poll, within
--   `LULL_POLL_MS`, which is the hand-off after which it may take another process's
--   timer anyway, and the process that armed it is woken in-process.
-- `p_now`: the caller's clock when the caller drives time (tests), NULL for the
-- database's. Returns the conversation, the new version and due time (NULL for a
-- duplicate) and the transaction's now on the clock used.
CREATE FUNCTION lull_ingest(
    p_platform TEXT, p_key TEXT, p_is_group BOOLEAN, p_message_id TEXT, p_user_id TEXT,
    p_author TEXT, p_text TEXT, p_media TEXT, p_holder TEXT, p_now BIGINT,
    p_wait_min_ms BIGINT, p_wait_max_ms BIGINT, p_max_wait_ms BIGINT, p_max_batch BIGINT,
    OUT o_conversation BIGINT, OUT o_version BIGINT, OUT o_due_at BIGINT, OUT o_now BIGINT)
LANGUAGE plpgsql AS $$
DECLARE
    v_version  BIGINT;
    v_answered BIGINT;
    v_group    BOOLEAN;
    v_pending  BIGINT;
    v_first    BIGINT;
    v_known    BIGINT;
    v_first_w  BIGINT;
    v_burst_w  BIGINT;
    v_wait     BIGINT;
BEGIN
    o_now := COALESCE(p_now, (extract(epoch from clock_timestamp()) * 1000)::int8);
    SELECT c.id, c.version, c.answered_version, c.is_group, c.rhythm_first_ms, c.rhythm_burst_ms
      INTO o_conversation, v_version, v_answered, v_group, v_first_w, v_burst_w
      FROM conversations c WHERE c.platform = p_platform AND c.key = p_key FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO conversations AS c (platform, key, is_group, created_at)
        VALUES (p_platform, p_key, p_is_group, o_now)
        ON CONFLICT (platform, key) DO UPDATE SET is_group = c.is_group OR excluded.is_group
        RETURNING c.id, c.version, c.answered_version, c.is_group, c.rhythm_first_ms, c.rhythm_burst_ms
        INTO o_conversation, v_version, v_answered, v_group, v_first_w, v_burst_w;
    END IF;
    INSERT INTO messages AS m (conversation_id, platform_message_id, user_id, author, text,
                               version, received_at, media)
    VALUES (o_conversation, p_message_id, p_user_id, p_author, p_text, v_version + 1, o_now, p_media)
    ON CONFLICT ON CONSTRAINT messages_conversation_id_platform_message_id_key DO NOTHING;
    IF NOT FOUND THEN
        -- A group stays a group, and a redelivery may say it is one.
        IF p_is_group AND NOT v_group THEN
            UPDATE conversations c SET is_group = TRUE WHERE c.id = o_conversation;
        END IF;
        RETURN;
    END IF;
    UPDATE conversations c SET version = c.version + 1, is_group = c.is_group OR p_is_group
     WHERE c.id = o_conversation;
    o_version := v_version + 1;
    SELECT COUNT(*), MIN(m.received_at) INTO v_pending, v_first
      FROM messages m WHERE m.conversation_id = o_conversation AND m.version > v_answered;
    v_wait := LEAST(GREATEST(COALESCE(CASE WHEN v_pending >= 2 THEN v_burst_w ELSE v_first_w END,
                                      p_wait_max_ms), p_wait_min_ms), p_wait_max_ms);
    o_due_at := CASE WHEN v_pending >= p_max_batch THEN o_now
                     ELSE LEAST(o_now + v_wait, COALESCE(v_first, o_now) + p_max_wait_ms) END;
    -- What the replicas already look at: the platform's earliest future timer (one seek
    -- of timers_due), read before this conversation's own timer moves.
    SELECT t.due_at INTO v_known FROM timers t
     WHERE t.platform = p_platform AND t.due_at > o_now ORDER BY t.due_at LIMIT 1;
    INSERT INTO timers AS t (conversation_id, platform, due_at, armed_version, armed_at, armed_by)
    VALUES (o_conversation, p_platform, o_due_at, o_version, o_now, p_holder)
    ON CONFLICT ON CONSTRAINT timers_pkey DO UPDATE SET
        due_at = GREATEST(excluded.due_at, t.retry_at, t.held_until),
        armed_version = excluded.armed_version,
        armed_at = excluded.armed_at,
        armed_by = excluded.armed_by
    RETURNING t.due_at INTO o_due_at;
    IF v_known IS NULL OR o_due_at < v_known THEN
        PERFORM pg_notify('lull_armed', p_platform);
    END IF;
END $$;
