//! Versioned schema migrations (tracked in SQLite's `user_version`). Migrations only
//! ever get appended; an applied one is never edited.
//!
//! Times are integer milliseconds since the Unix epoch. SQL stays portable where it
//! costs nothing (no SQLite-only types), so a Postgres schema can mirror it.

use std::time::Duration;

use rusqlite::Connection;
use rusqlite_migration::{M, Migrations};

use crate::store::ddl;

const V1_CORE: &str = r#"
-- One row per conversation. `version` counts stored messages and edits; the reply
-- that covered everything up to `answered_version` has been committed.
CREATE TABLE conversations (
    id               INTEGER PRIMARY KEY,
    platform         TEXT    NOT NULL,
    key              TEXT    NOT NULL,
    is_group         INTEGER NOT NULL DEFAULT 0,
    version          INTEGER NOT NULL DEFAULT 0,
    answered_version INTEGER NOT NULL DEFAULT 0,
    -- /reset: history only offers replies generated after this version.
    context_version  INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    UNIQUE (platform, key)
);

-- Every accepted message. `version` is the conversation's version after it was
-- stored (or last edited); it is pending while version > answered_version.
CREATE TABLE messages (
    id                  INTEGER PRIMARY KEY,
    conversation_id     INTEGER NOT NULL REFERENCES conversations (id),
    platform_message_id TEXT    NOT NULL,
    user_id             TEXT    NOT NULL,
    author              TEXT    NOT NULL,
    text                TEXT    NOT NULL,
    version             INTEGER NOT NULL,
    received_at         INTEGER NOT NULL,
    -- No duplicate: a redelivered platform message is stored once.
    UNIQUE (conversation_id, platform_message_id)
);
CREATE INDEX messages_pending ON messages (conversation_id, version);

-- Timers live apart from the conversation row, so no writer of conversation data
-- can overwrite them. One row while messages are pending.
CREATE TABLE timers (
    conversation_id INTEGER PRIMARY KEY REFERENCES conversations (id),
    platform        TEXT    NOT NULL,
    due_at          INTEGER NOT NULL,
    -- The version of the message that last armed it: a commit at v0 deletes the
    -- timer only if armed_version <= v0.
    armed_version   INTEGER NOT NULL,
    armed_at        INTEGER NOT NULL,
    -- The process that armed it is woken in-process at due_at; others take it over
    -- only a hand-off later (they poll), so processes do not race for every timer.
    armed_by        TEXT    NOT NULL,
    -- Failed generations: back off until retry_at.
    attempts        INTEGER NOT NULL DEFAULT 0,
    retry_at        INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX timers_due ON timers (platform, due_at);

-- Leases: conversations (one round at a time) and platform pollers. Claimed by a
-- compare-and-swap UPDATE; `token` grows with every claim (fencing).
CREATE TABLE leases (
    resource   TEXT    PRIMARY KEY,
    holder     TEXT,
    token      INTEGER NOT NULL DEFAULT 0,
    expires_at INTEGER NOT NULL DEFAULT 0
);

-- The reply outbox: committed replies and notices, delivered after commit and
-- marked sent part by part.
CREATE TABLE outbox (
    id                INTEGER PRIMARY KEY,
    conversation_id   INTEGER NOT NULL REFERENCES conversations (id),
    kind              TEXT    NOT NULL CHECK (kind IN ('reply', 'notice')),
    text              TEXT    NOT NULL,
    reply_to          TEXT,
    -- Replies: the version they answered, the fencing token of the committing holder,
    -- whether the cap forced them out although newer messages had arrived.
    version           INTEGER,
    lease_token       INTEGER,
    forced            INTEGER NOT NULL DEFAULT 0,
    dedupe_key        TEXT UNIQUE,
    -- The process that queued it delivers it; others only after a hand-off.
    owner             TEXT    NOT NULL,
    prompt_tokens     INTEGER,
    completion_tokens INTEGER,
    llm_ms            INTEGER,
    created_at        INTEGER NOT NULL,
    parts_sent        INTEGER NOT NULL DEFAULT 0,
    attempts          INTEGER NOT NULL DEFAULT 0,
    next_attempt_at   INTEGER NOT NULL,
    sent_at           INTEGER,
    failed_at         INTEGER,
    error             TEXT
);
-- Delivery is in outbox order per conversation: the head row of each decides when
-- that conversation's outbox is due.
CREATE INDEX outbox_undelivered ON outbox (conversation_id, id)
    WHERE sent_at IS NULL AND failed_at IS NULL;
CREATE INDEX outbox_history ON outbox (conversation_id, kind, id);

-- Which messages each reply was generated from.
CREATE TABLE reply_covers (
    outbox_id  INTEGER NOT NULL REFERENCES outbox (id),
    message_id INTEGER NOT NULL REFERENCES messages (id),
    PRIMARY KEY (outbox_id, message_id)
);
CREATE INDEX reply_covers_message ON reply_covers (message_id);
"#;

const V2_LEASE_CONVERSATION: &str = r#"
-- A conversation lease names its conversation in a column of its own, so a query
-- joins on it instead of rebuilding the lease's resource string in SQL. NULL for
-- every other lease (platform pollers). Rows written before are filled in once from
-- their resource (`conversation/<id>`).
ALTER TABLE leases ADD COLUMN conversation_id INTEGER;
UPDATE leases SET conversation_id = CAST(substr(resource, 14) AS INTEGER)
    WHERE substr(resource, 1, 13) = 'conversation/';
-- Exclusive: at most one lease row per conversation.
CREATE UNIQUE INDEX leases_conversation ON leases (conversation_id);
"#;

const V3_INDEXED_SCHEDULING: &str = r#"
-- Index-driven scheduling: undelivered outbox rows found by when they are due, not by
-- walking every conversation's outbox.
CREATE INDEX outbox_due ON outbox (next_attempt_at) WHERE sent_at IS NULL AND failed_at IS NULL;
-- Lease expiry of held leases (released ones drop out of the index).
CREATE INDEX leases_held ON leases (expires_at) WHERE holder IS NOT NULL;
-- The pending-conversations gauge, kept by triggers in the transactions that arm and
-- disarm timers, so reading it costs one row whatever the number of conversations.
CREATE TABLE stats (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    pending INTEGER NOT NULL
);
INSERT INTO stats (id, pending) SELECT 1, COUNT(*) FROM timers;
CREATE TRIGGER timers_armed AFTER INSERT ON timers
    BEGIN UPDATE stats SET pending = pending + 1 WHERE id = 1; END;
CREATE TRIGGER timers_disarmed AFTER DELETE ON timers
    BEGIN UPDATE stats SET pending = pending - 1 WHERE id = 1; END;
"#;

const V4_WALLET: &str = r#"
-- Rate limits count a user's recent messages across their conversations.
CREATE INDEX messages_by_user ON messages (user_id, received_at);
-- A limit's hold (rate, budget): the timer is not due before it. Apart from the
-- failure backoff (`retry_at`), which /reset clears; a hold it does not.
ALTER TABLE timers ADD COLUMN held_until INTEGER NOT NULL DEFAULT 0;
-- Tokens spent per scope and day: `user:<platform>:<id>`, `conversation:<id>`, `bot`;
-- the day as the deployment's time zone names it. Totals are only ever added to.
CREATE TABLE token_usage (
    scope  TEXT    NOT NULL,
    day    TEXT    NOT NULL,
    tokens INTEGER NOT NULL,
    PRIMARY KEY (scope, day)
);
-- Admins' run-time access decisions (/allow, /deny): one row per subject, the latest.
CREATE TABLE access_rules (
    platform TEXT    NOT NULL,
    kind     TEXT    NOT NULL CHECK (kind IN ('user', 'chat')),
    subject  TEXT    NOT NULL,
    allowed  INTEGER NOT NULL,
    set_by   TEXT    NOT NULL,
    set_at   INTEGER NOT NULL,
    PRIMARY KEY (platform, kind, subject)
);
"#;

const V5_MESSAGE_MEDIA: &str = r#"
-- Media sent with a message (photos, image files, voice notes, audio): the platform's
-- durable references as a JSON array (see `store::encode_media`), stored with the
-- message in the same transaction; NULL for text. The bytes are fetched when the reply is generated.
ALTER TABLE messages ADD COLUMN media TEXT;
-- The transcript of a voice note or audio file: written once, under the round's lease,
-- and never transcribed again (it enters history as text).
ALTER TABLE messages ADD COLUMN transcript TEXT;
"#;

const V6_EDITS: &str = r#"
-- Rate limits count edits as they count messages: an applied edit makes a message
-- pending again (and a generation in flight stale) as a new message does. One row per
-- applied edit, by the author of the edited message, on its conversation's platform.
CREATE TABLE edits (
    message_id INTEGER NOT NULL REFERENCES messages (id),
    user_id    TEXT    NOT NULL,
    platform   TEXT    NOT NULL,
    edited_at  INTEGER NOT NULL
);
CREATE INDEX edits_by_user ON edits (user_id, edited_at);
"#;

const V7_TOKEN_RESERVATIONS: &str = r#"
-- What a round reserved before asking the model, per scope, until it settles: keyed
-- by the conversation, the lease token and the day it counts for. A reservation whose
-- round never settled (lease lost, stop, crash) is given back at the next claim of
-- the conversation, on its own day.
CREATE TABLE token_reservations (
    conversation_id INTEGER NOT NULL,
    lease_token     INTEGER NOT NULL,
    day             TEXT    NOT NULL,
    scope           TEXT    NOT NULL,
    tokens          INTEGER NOT NULL,
    PRIMARY KEY (conversation_id, lease_token, day, scope)
);
"#;

const V8_ACTIONS: &str = r#"
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
"#;

const V9_STATUS: &str = ddl::STATUS_INDEXES;

const V10_SETTINGS: &str = r#"
-- A conversation's own choices (/model, /persona, /prompt); NULL: the default. A
-- change bumps the conversation's version in the same transaction (fresh).
CREATE TABLE conversation_settings (
    conversation_id INTEGER PRIMARY KEY REFERENCES conversations (id),
    model           TEXT,
    persona         TEXT,
    prompt          TEXT,
    updated_at      INTEGER NOT NULL
);
"#;

const V11_ACKS: &str = r#"
-- Ack reactions (LULL_ACK_REACTION): the one message of each pending burst that
-- carries lull's reaction. A burst is the messages pending after one answered_version:
-- once per burst, whichever process stored them. Taken (deleted) when the reply
-- covering the message is delivered, by the process that clears the reaction.
CREATE TABLE acks (
    conversation_id     INTEGER NOT NULL REFERENCES conversations (id),
    burst               INTEGER NOT NULL,
    platform_message_id TEXT    NOT NULL,
    PRIMARY KEY (conversation_id, burst)
);
CREATE INDEX acks_message ON acks (conversation_id, platform_message_id);
"#;

const V12_COMMAND_CLAIMS: &str = r#"
-- Command messages acted on (SettingStore::claim_command): a redelivered command acts
-- once. Kept for a week (deleted by the next claim after that).
CREATE TABLE command_claims (
    platform   TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    message_id TEXT    NOT NULL,
    claimed_at INTEGER NOT NULL,
    PRIMARY KEY (platform, key, message_id)
);
CREATE INDEX command_claims_age ON command_claims (claimed_at);
"#;

const V13_RHYTHM: &str = r#"
-- A conversation's rhythm (`rhythm::Rhythm`), learned when a reply is committed and
-- read by ingest with the version bump, to pick the adaptive wait: bursts learned
-- from, an upper estimate of the gaps inside bursts (ms), the share of bursts with
-- more than one message (per mille), and when the last burst learned from ended.
ALTER TABLE conversations ADD COLUMN rhythm_bursts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE conversations ADD COLUMN rhythm_gap_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE conversations ADD COLUMN rhythm_multi INTEGER NOT NULL DEFAULT 0;
ALTER TABLE conversations ADD COLUMN rhythm_last_at INTEGER;
-- The two waits it allows (`rhythm::Waits`), worked out when it is learned; NULL while
-- it is not known (the full window).
ALTER TABLE conversations ADD COLUMN rhythm_first_ms INTEGER;
ALTER TABLE conversations ADD COLUMN rhythm_burst_ms INTEGER;
"#;

const V14_OVERHEARD: &str = r#"
-- Group context (LULL_GROUP_CONTEXT): recent group messages not addressed to lull,
-- shown to the model when it is addressed. Never pending: no version, no timer.
-- Bounded per conversation by the write that adds one; /reset deletes them.
CREATE TABLE overheard (
    id                  INTEGER PRIMARY KEY,
    conversation_id     INTEGER NOT NULL REFERENCES conversations (id),
    platform_message_id TEXT    NOT NULL,
    author              TEXT    NOT NULL,
    text                TEXT    NOT NULL,
    received_at         INTEGER NOT NULL,
    UNIQUE (conversation_id, platform_message_id)
);
CREATE INDEX overheard_newest ON overheard (conversation_id, id);
"#;

const V15_THREADS: &str = r#"
-- The Discord threads lull opened (LULL_DISCORD_AUTO_THREAD): messages there need no
-- mention. By platform and key, so remembered before the thread has a conversation.
CREATE TABLE threads (
    platform  TEXT    NOT NULL,
    key       TEXT    NOT NULL,
    opened_at INTEGER NOT NULL,
    PRIMARY KEY (platform, key)
);
"#;

const V17_INSTANCE: &str = r#"
-- This database's own salt: the idempotency keys sent to tool servers are derived from
-- it, so two deployments sharing an MCP server (or a restored backup, whose copy gets a
-- salt of its own) never send the same key for different calls. One row.
CREATE TABLE instance (
    id   INTEGER PRIMARY KEY CHECK (id = 1),
    salt TEXT    NOT NULL
);
INSERT INTO instance (id, salt) VALUES (1, lower(hex(randomblob(16))));
"#;

/// Every migration, oldest first. The schema version (`user_version`) counts them.
const ALL: &[&str] = &[
    V1_CORE,
    V2_LEASE_CONVERSATION,
    V3_INDEXED_SCHEDULING,
    V4_WALLET,
    V5_MESSAGE_MEDIA,
    V6_EDITS,
    V7_TOKEN_RESERVATIONS,
    V8_ACTIONS,
    V9_STATUS,
    V10_SETTINGS,
    V11_ACKS,
    V12_COMMAND_CLAIMS,
    V13_RHYTHM,
    V14_OVERHEARD,
    V15_THREADS,
    ddl::TOKEN_USAGE_BY_DAY,
    V17_INSTANCE,
    ddl::OUTBOX_QUICK_REPLIES,
];

/// The schema version this build migrates to.
pub(crate) const LATEST: i64 = ALL.len() as i64;

/// All migrations, oldest first.
pub(super) fn migrations() -> Migrations<'static> {
    Migrations::new(ALL.iter().map(|sql| M::up(sql)).collect())
}

/// Bring the schema up to date. Several processes starting on a fresh file race
/// here: the loser's migration fails (the tables exist by then) and it tries again,
/// finding the schema current.
pub(super) fn migrate(conn: &mut Connection) -> Result<(), rusqlite_migration::Error> {
    let migrations = migrations();
    let mut attempt = 0;
    loop {
        match migrations.to_latest(conn) {
            Ok(()) => return Ok(()),
            Err(e) if attempt < 10 => {
                attempt += 1;
                tracing::debug!(error = %e, attempt, "schema migration raced another process; retrying");
                std::thread::sleep(Duration::from_millis(50 * attempt));
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;

    #[test]
    fn migrations_are_valid() {
        super::migrations().validate().unwrap();
    }

    #[test]
    fn conversation_leases_of_version_1_learn_their_conversation() {
        let mut conn = Connection::open_in_memory().unwrap();
        let migrations = super::migrations();
        migrations.to_version(&mut conn, 1).unwrap();
        conn.execute_batch(
            "INSERT INTO leases (resource, holder, token, expires_at) VALUES
                 ('conversation/7', 'a', 3, 100), ('conversation/12', NULL, 1, 0),
                 ('poller/telegram', 'b', 9, 200);",
        )
        .unwrap();
        migrations.to_latest(&mut conn).unwrap();
        let rows: Vec<(String, Option<i64>, i64)> = conn
            .prepare("SELECT resource, conversation_id, token FROM leases ORDER BY resource")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(
            rows,
            [
                ("conversation/12".to_owned(), Some(12), 1),
                ("conversation/7".to_owned(), Some(7), 3),
                ("poller/telegram".to_owned(), None, 9),
            ]
        );
    }
}
