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

/// Every migration, oldest first; the schema version counts them. One form: a file of
/// `migrations/` (numbered by its version), or a statement both backends share
/// (`ddl`). Each line says what it adds, and its SQLite twin.
const ALL: &[&str] = &[
    // 1: the whole schema SQLite reached in its first three migrations, in one.
    include_str!("migrations/v01_core.sql"),
    // 2 (SQLite 4): rate limits, token budgets, access decisions.
    include_str!("migrations/v02_wallet.sql"),
    // 3 (SQLite 5): media sent with a message, and its transcript.
    include_str!("migrations/v03_message_media.sql"),
    // 4 (SQLite 6): every applied edit, which rate limits count.
    include_str!("migrations/v04_edits.sql"),
    // 5 (SQLite 7): reservations of rounds not yet settled.
    include_str!("migrations/v05_token_reservations.sql"),
    // 6 (SQLite 8): the journal of tool calls that act.
    include_str!("migrations/v06_actions.sql"),
    // 7 (SQLite 9): the status page's indexes.
    ddl::STATUS_INDEXES,
    // 8 (SQLite 10): a conversation's own settings (`/model`, `/persona`, `/prompt`).
    include_str!("migrations/v08_settings.sql"),
    // 9 (SQLite 11): one ack reaction per pending burst.
    include_str!("migrations/v09_acks.sql"),
    // 10 (SQLite 12): a redelivered command acts once.
    include_str!("migrations/v10_command_claims.sql"),
    // 11 (SQLite 13): a conversation's rhythm (`rhythm::Rhythm`), learned at commit,
    // read by ingest with the version bump.
    include_str!("migrations/v11_rhythm.sql"),
    // 12 (SQLite 14): group context, bounded per conversation.
    include_str!("migrations/v12_overheard.sql"),
    // 13 (SQLite 15): the Discord threads lull opened.
    include_str!("migrations/v13_threads.sql"),
    // 14: the ingest as one call (one round trip, one transaction), and the
    // announcement of a timer only when it is earlier than every future timer of its
    // platform.
    include_str!("migrations/v14_one_round_trip.sql"),
    // 15: messages that reach one process together stored in one call
    // (`postgres::ingest`).
    include_str!("migrations/v15_ingest_together.sql"),
    // 16: messages stored together as sets: `lull_ingest_many` replaced, same
    // arguments and results, a few statements a group instead of about ten a message
    // (the file's header states the invariants and the lock order it keeps).
    include_str!("migrations/v16_ingest_as_sets.sql"),
    // 17 (SQLite 16): token usage by day, for the status page.
    ddl::TOKEN_USAGE_BY_DAY,
    // 18 (SQLite 17): this database's own salt for the idempotency keys of tool calls.
    include_str!("migrations/v18_instance.sql"),
    // 19 (SQLite 18): the quick replies a notice offers, stored with it.
    ddl::OUTBOX_QUICK_REPLIES,
    // 20 (SQLite 19): jobs (reminders, scheduled tasks), their occurrences, a chat's
    // time zone.
    include_str!("migrations/v20_jobs.sql"),
    // 21 (SQLite 20): memories as rows of their scope, erased messages' tombstones,
    // who wrote an overheard message.
    include_str!("migrations/v21_memories.sql"),
    // 22 (SQLite 21): summaries as derived rows; retention's tombstones of delivered
    // replies.
    include_str!("migrations/v22_summaries.sql"),
    // 23 (SQLite 22): costs in dollars beside the tokens, and their reservations.
    ddl::COSTS,
    // 24 (SQLite 23): a chat's name as its platform shows it, for the console.
    ddl::CHAT_TITLES,
];

/// The schema version this build migrates to.
pub(crate) const LATEST: i64 = ALL.len() as i64;

/// The advisory lock key migrations are applied under (an arbitrary constant of
/// lull's: "lull" in ASCII).
const MIGRATION_LOCK: i64 = 0x6c75_6c6c;

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
