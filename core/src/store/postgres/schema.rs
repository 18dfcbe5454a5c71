//! The PostgreSQL schema and its migrations: forward-only, each applied in its own
//! transaction under a transaction-scoped advisory lock, tracked in a table of their
//! own (`lull_migrations`), so replicas starting at once on an empty database apply
//! each migration exactly once (the others wait on the lock, then find it applied).
//!
//! The schema mirrors SQLite's (`store::sqlite::schema`) table for table: times are
//! integer milliseconds since the Unix epoch, ids are identity columns, flags are
//! booleans. Only appended to: an applied migration is never edited.

use tokio_postgres::Client;

use crate::store::ddl;

/// Every migration, oldest first; the schema version counts them.
const ALL: &[&str] = &[
    V1_CORE,
    V2_WALLET,
    V3_MESSAGE_MEDIA,
    V4_EDITS,
    V5_TOKEN_RESERVATIONS,
    V6_ACTIONS,
    V7_STATUS,
    V8_SETTINGS,
    V9_ACKS,
    V10_COMMAND_CLAIMS,
    V11_RHYTHM,
    V12_OVERHEARD,
    V13_THREADS,
    V14_ONE_ROUND_TRIP,
    V15_INGEST_TOGETHER,
    V16_INGEST_AS_SETS,
    ddl::TOKEN_USAGE_BY_DAY,
    V18_INSTANCE,
    ddl::OUTBOX_QUICK_REPLIES,
];

/// The schema version this build migrates to.
pub(crate) const LATEST: i64 = ALL.len() as i64;

/// The advisory lock key migrations are applied under (an arbitrary constant of
/// lull's: "lull" in ASCII).
const MIGRATION_LOCK: i64 = 0x6c75_6c6c;

/// The whole schema SQLite reached in its first three migrations, in one.
const V1_CORE: &str = r#"
-- One row per conversation. `version` counts stored messages and edits; the reply
-- that covered everything up to `answered_version` has been committed.
CREATE TABLE conversations (
    id               BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    platform         TEXT    NOT NULL,
    key              TEXT    NOT NULL,
    is_group         BOOLEAN NOT NULL DEFAULT FALSE,
    version          BIGINT  NOT NULL DEFAULT 0,
    answered_version BIGINT  NOT NULL DEFAULT 0,
    -- /reset: history only offers replies generated after this version.
    context_version  BIGINT  NOT NULL DEFAULT 0,
    created_at       BIGINT  NOT NULL,
    UNIQUE (platform, key)
);

-- Every accepted message; pending while version > the conversation's answered_version.
CREATE TABLE messages (
    id                  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id     BIGINT NOT NULL REFERENCES conversations (id),
    platform_message_id TEXT   NOT NULL,
    user_id             TEXT   NOT NULL,
    author              TEXT   NOT NULL,
    text                TEXT   NOT NULL,
    version             BIGINT NOT NULL,
    received_at         BIGINT NOT NULL,
    -- No duplicate: a redelivered platform message is stored once.
    UNIQUE (conversation_id, platform_message_id)
);
CREATE INDEX messages_pending ON messages (conversation_id, version);

-- Timers live apart from the conversation row, so no writer of conversation data
-- can overwrite them. One row while messages are pending.
CREATE TABLE timers (
    conversation_id BIGINT  PRIMARY KEY REFERENCES conversations (id),
    platform        TEXT    NOT NULL,
    due_at          BIGINT  NOT NULL,
    armed_version   BIGINT  NOT NULL,
    armed_at        BIGINT  NOT NULL,
    armed_by        TEXT    NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    retry_at        BIGINT  NOT NULL DEFAULT 0
);
CREATE INDEX timers_due ON timers (platform, due_at);

-- Leases: conversations (one round at a time) and platform pollers. Claimed by a
-- compare-and-swap UPDATE; `token` grows with every claim (fencing).
CREATE TABLE leases (
    resource        TEXT   PRIMARY KEY,
    holder          TEXT,
    token           BIGINT NOT NULL DEFAULT 0,
    expires_at      BIGINT NOT NULL DEFAULT 0,
    -- The conversation a conversation lease protects (NULL for pollers).
    conversation_id BIGINT
);
-- Exclusive: at most one lease row per conversation.
CREATE UNIQUE INDEX leases_conversation ON leases (conversation_id);
CREATE INDEX leases_held ON leases (expires_at) WHERE holder IS NOT NULL;

-- The reply outbox: committed replies and notices, delivered after commit and
-- marked sent part by part.
CREATE TABLE outbox (
    id                BIGINT  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id   BIGINT  NOT NULL REFERENCES conversations (id),
    kind              TEXT    NOT NULL CHECK (kind IN ('reply', 'notice')),
    text              TEXT    NOT NULL,
    reply_to          TEXT,
    version           BIGINT,
    lease_token       BIGINT,
    forced            BOOLEAN NOT NULL DEFAULT FALSE,
    dedupe_key        TEXT UNIQUE,
    owner             TEXT    NOT NULL,
    prompt_tokens     BIGINT,
    completion_tokens BIGINT,
    llm_ms            BIGINT,
    created_at        BIGINT  NOT NULL,
    parts_sent        INTEGER NOT NULL DEFAULT 0,
    attempts          INTEGER NOT NULL DEFAULT 0,
    next_attempt_at   BIGINT  NOT NULL,
    sent_at           BIGINT,
    failed_at         BIGINT,
    error             TEXT
);
CREATE INDEX outbox_undelivered ON outbox (conversation_id, id)
    WHERE sent_at IS NULL AND failed_at IS NULL;
CREATE INDEX outbox_history ON outbox (conversation_id, kind, id);
CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE sent_at IS NULL AND failed_at IS NULL;

-- Which messages each reply (or give-up notice) was generated from.
CREATE TABLE reply_covers (
    outbox_id  BIGINT NOT NULL REFERENCES outbox (id),
    message_id BIGINT NOT NULL REFERENCES messages (id),
    PRIMARY KEY (outbox_id, message_id)
);
CREATE INDEX reply_covers_message ON reply_covers (message_id);

-- The pending-conversations gauge, kept by triggers in the transactions that arm and
-- disarm timers. Sixteen shards (by conversation) instead of SQLite's one row, so
-- concurrent ingests of different conversations rarely wait on the same counter;
-- reading it sums sixteen rows, whatever the number of conversations.
CREATE TABLE pending_shards (
    shard   INTEGER PRIMARY KEY CHECK (shard >= 0 AND shard < 16),
    pending BIGINT  NOT NULL
);
INSERT INTO pending_shards (shard, pending) SELECT s, 0 FROM generate_series(0, 15) s;
CREATE FUNCTION lull_count_pending() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE pending_shards SET pending = pending + 1 WHERE shard = NEW.conversation_id % 16;
        RETURN NEW;
    ELSE
        UPDATE pending_shards SET pending = pending - 1 WHERE shard = OLD.conversation_id % 16;
        RETURN OLD;
    END IF;
END $$;
CREATE TRIGGER timers_counted AFTER INSERT OR DELETE ON timers
    FOR EACH ROW EXECUTE FUNCTION lull_count_pending();
"#;

/// SQLite's fourth migration: rate limits, token budgets, access decisions.
const V2_WALLET: &str = r#"
-- Rate limits count a user's recent messages across their conversations.
CREATE INDEX messages_by_user ON messages (user_id, received_at);
-- A limit's hold (rate, budget): the timer is not due before it. Apart from the
-- failure backoff (`retry_at`), which /reset clears; a hold it does not.
ALTER TABLE timers ADD COLUMN held_until BIGINT NOT NULL DEFAULT 0;
-- Tokens spent per scope and day; totals are only ever added to.
CREATE TABLE token_usage (
    scope  TEXT   NOT NULL,
    day    TEXT   NOT NULL,
    tokens BIGINT NOT NULL,
    PRIMARY KEY (scope, day)
);
-- Admins' run-time access decisions (/allow, /deny): one row per subject, the latest.
-- `id` keeps the order rows were first written in (SQLite's rowid).
CREATE TABLE access_rules (
    id       BIGINT  GENERATED ALWAYS AS IDENTITY,
    platform TEXT    NOT NULL,
    kind     TEXT    NOT NULL CHECK (kind IN ('user', 'chat')),
    subject  TEXT    NOT NULL,
    allowed  BOOLEAN NOT NULL,
    set_by   TEXT    NOT NULL,
    set_at   BIGINT  NOT NULL,
    PRIMARY KEY (platform, kind, subject)
);
"#;

/// SQLite's fifth migration: media sent with a message, and its transcript.
const V3_MESSAGE_MEDIA: &str = r#"
-- Media references as a JSON array (`store::encode_media`), stored with the message;
-- NULL for text.
ALTER TABLE messages ADD COLUMN media TEXT;
-- The transcript of a voice note or audio file: written once, under the round's lease.
ALTER TABLE messages ADD COLUMN transcript TEXT;
"#;

/// SQLite's sixth migration: every applied edit, which rate limits count.
const V4_EDITS: &str = r#"
-- Rate limits count edits as they count messages: one row per applied edit, by the
-- author of the edited message, on its conversation's platform.
CREATE TABLE edits (
    message_id BIGINT NOT NULL REFERENCES messages (id),
    user_id    TEXT   NOT NULL,
    platform   TEXT   NOT NULL,
    edited_at  BIGINT NOT NULL
);
CREATE INDEX edits_by_user ON edits (user_id, edited_at);
"#;

/// SQLite's seventh migration: reservations of rounds not yet settled.
const V5_TOKEN_RESERVATIONS: &str = r#"
-- What a round reserved, per scope, until it settles; keyed by conversation, lease
-- token and day. An unsettled one is given back at the conversation's next claim.
CREATE TABLE token_reservations (
    conversation_id BIGINT NOT NULL,
    lease_token     BIGINT NOT NULL,
    day             TEXT   NOT NULL,
    scope           TEXT   NOT NULL,
    tokens          BIGINT NOT NULL,
    PRIMARY KEY (conversation_id, lease_token, day, scope)
);
"#;

/// SQLite's eighth migration: the journal of tool calls that act.
const V6_ACTIONS: &str = r#"
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
"#;

const V7_STATUS: &str = ddl::STATUS_INDEXES;

const V8_SETTINGS: &str = r#"
-- A conversation's own choices (/model, /persona, /prompt); NULL: the default. A
-- change bumps the conversation's version in the same transaction (fresh).
CREATE TABLE conversation_settings (
    conversation_id BIGINT PRIMARY KEY REFERENCES conversations (id),
    model           TEXT,
    persona         TEXT,
    prompt          TEXT,
    updated_at      BIGINT NOT NULL
);
"#;

/// SQLite's `V11_ACKS`: one ack reaction per pending burst.
const V9_ACKS: &str = r#"
CREATE TABLE acks (
    conversation_id     BIGINT NOT NULL REFERENCES conversations (id),
    -- The conversation's answered_version when the burst's ack was claimed.
    burst               BIGINT NOT NULL,
    platform_message_id TEXT   NOT NULL,
    -- Once per burst, whichever replica stored its messages.
    PRIMARY KEY (conversation_id, burst)
);
CREATE INDEX acks_message ON acks (conversation_id, platform_message_id);
"#;

/// SQLite's `V12_COMMAND_CLAIMS`: a redelivered command acts once.
const V10_COMMAND_CLAIMS: &str = r#"
CREATE TABLE command_claims (
    platform   TEXT   NOT NULL,
    key        TEXT   NOT NULL,
    message_id TEXT   NOT NULL,
    claimed_at BIGINT NOT NULL,
    PRIMARY KEY (platform, key, message_id)
);
CREATE INDEX command_claims_age ON command_claims (claimed_at);
"#;

/// SQLite's `V13_RHYTHM`: a conversation's rhythm (`rhythm::Rhythm`), learned at
/// commit, read by ingest with the version bump.
const V11_RHYTHM: &str = r#"
ALTER TABLE conversations ADD COLUMN rhythm_bursts BIGINT NOT NULL DEFAULT 0;
ALTER TABLE conversations ADD COLUMN rhythm_gap_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE conversations ADD COLUMN rhythm_multi BIGINT NOT NULL DEFAULT 0;
ALTER TABLE conversations ADD COLUMN rhythm_last_at BIGINT;
ALTER TABLE conversations ADD COLUMN rhythm_first_ms BIGINT;
ALTER TABLE conversations ADD COLUMN rhythm_burst_ms BIGINT;
"#;

/// SQLite's `V14_OVERHEARD`: group context, bounded per conversation.
const V12_OVERHEARD: &str = r#"
CREATE TABLE overheard (
    id                  BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    conversation_id     BIGINT NOT NULL REFERENCES conversations (id),
    platform_message_id TEXT   NOT NULL,
    author              TEXT   NOT NULL,
    text                TEXT   NOT NULL,
    received_at         BIGINT NOT NULL,
    -- No duplicate: a redelivered platform message is kept once.
    UNIQUE (conversation_id, platform_message_id)
);
CREATE INDEX overheard_newest ON overheard (conversation_id, id);
"#;

/// SQLite's `V15_THREADS`: the Discord threads lull opened.
const V13_THREADS: &str = r#"
CREATE TABLE threads (
    platform  TEXT   NOT NULL,
    key       TEXT   NOT NULL,
    opened_at BIGINT NOT NULL,
    PRIMARY KEY (platform, key)
);
"#;

/// The ingest as one call (one round trip, one transaction), and the announcement of a
/// timer only when it is earlier than every future timer of its platform.
const V14_ONE_ROUND_TRIP: &str = r#"
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
"#;

/// Messages that reach one process together stored in one call (`postgres::ingest`).
const V15_INGEST_TOGETHER: &str = r#"
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
"#;

/// Messages stored together as sets: `lull_ingest_many` replaced, same arguments and
/// results, a few statements a group instead of about ten a message (the file's
/// header states the invariants and the lock order it keeps).
const V18_INSTANCE: &str = r#"
-- This database's own salt: the idempotency keys sent to tool servers are derived from
-- it, so two deployments sharing an MCP server never send the same key for different
-- calls. One row.
CREATE TABLE instance (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    salt TEXT    NOT NULL
);
INSERT INTO instance (id, salt) VALUES (1, md5(random()::text || clock_timestamp()::text));
"#;

const V16_INGEST_AS_SETS: &str = include_str!("migrations/v16_ingest_as_sets.sql");

/// Bring the schema up to date: each missing migration in its own transaction under
/// the advisory lock, recorded in `lull_migrations` in that same transaction.
pub(crate) async fn migrate(client: &mut Client) -> Result<i64, tokio_postgres::Error> {
    loop {
        let tx = client.transaction().await?;
        // Migrations cannot race: replicas starting at once queue on this lock, held
        // until the transaction ends.
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS lull_migrations (
                 version    BIGINT PRIMARY KEY,
                 applied_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
             )",
        )
        .await?;
        let applied: i64 = tx
            .query_one("SELECT COALESCE(MAX(version), 0) FROM lull_migrations", &[])
            .await?
            .get(0);
        let Some(sql) = ALL.get(applied as usize) else {
            tx.commit().await?;
            return Ok(applied);
        };
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO lull_migrations (version) VALUES ($1)",
            &[&(applied + 1)],
        )
        .await?;
        tx.commit().await?;
        tracing::info!(
            version = applied + 1,
            "applied a PostgreSQL schema migration"
        );
    }
}

/// The schema version of a database, read without changing anything: 0 when no
/// migration was ever applied (no `lull_migrations` table).
pub(crate) async fn version(client: &Client) -> Result<i64, tokio_postgres::Error> {
    let exists: bool = client
        .query_one("SELECT to_regclass('lull_migrations') IS NOT NULL", &[])
        .await?
        .get(0);
    if !exists {
        return Ok(0);
    }
    Ok(client
        .query_one("SELECT COALESCE(MAX(version), 0) FROM lull_migrations", &[])
        .await?
        .get(0))
}
