//! Versioned schema migrations (tracked in SQLite's `user_version`). Migrations only
//! ever get appended; an applied one is never edited.
//!
//! Times are integer milliseconds since the Unix epoch. SQL stays portable where it
//! costs nothing (no SQLite-only types), so a Postgres schema can mirror it.

use std::time::Duration;

use rusqlite::Connection;
use rusqlite_migration::{M, Migrations};

use crate::store::ddl;

/// Every migration, oldest first. The schema version (`user_version`) counts them. One
/// form: a file of `migrations/` (numbered by its version), or a statement both
/// backends share (`ddl`).
const ALL: &[&str] = &[
    // 1: conversations, messages, timers, leases, the outbox.
    include_str!("migrations/v01_core.sql"),
    // 2: a conversation lease names its conversation in a column of its own.
    include_str!("migrations/v02_lease_conversation.sql"),
    // 3: scheduling by index (due outbox rows, held leases) and the pending gauge.
    include_str!("migrations/v03_indexed_scheduling.sql"),
    // 4: rate limits, token budgets, access decisions.
    include_str!("migrations/v04_wallet.sql"),
    // 5: media sent with a message, and its transcript.
    include_str!("migrations/v05_message_media.sql"),
    // 6: every applied edit, which rate limits count.
    include_str!("migrations/v06_edits.sql"),
    // 7: reservations of rounds not yet settled.
    include_str!("migrations/v07_token_reservations.sql"),
    // 8: the journal of tool calls that act.
    include_str!("migrations/v08_actions.sql"),
    // 9: the status page's indexes.
    ddl::STATUS_INDEXES,
    // 10: a conversation's own settings (`/model`, `/persona`, `/prompt`).
    include_str!("migrations/v10_settings.sql"),
    // 11: one ack reaction per pending burst.
    include_str!("migrations/v11_acks.sql"),
    // 12: a redelivered command acts once.
    include_str!("migrations/v12_command_claims.sql"),
    // 13: a conversation's rhythm, learned at commit, read by ingest.
    include_str!("migrations/v13_rhythm.sql"),
    // 14: group context, bounded per conversation.
    include_str!("migrations/v14_overheard.sql"),
    // 15: the Discord threads lull opened.
    include_str!("migrations/v15_threads.sql"),
    // 16: token usage by day, for the status page.
    ddl::TOKEN_USAGE_BY_DAY,
    // 17: this database's own salt for the idempotency keys of tool calls.
    include_str!("migrations/v17_instance.sql"),
    // 18: the quick replies a notice offers, stored with it.
    ddl::OUTBOX_QUICK_REPLIES,
    // 19: jobs (reminders, scheduled tasks), their occurrences, a chat's time zone.
    include_str!("migrations/v19_jobs.sql"),
    // 20: memories as rows of their scope, erased messages' tombstones, who wrote an
    // overheard message.
    include_str!("migrations/v20_memories.sql"),
    // 21: summaries as derived rows; retention's tombstones of delivered replies.
    include_str!("migrations/v21_summaries.sql"),
    // 22: costs in dollars beside the tokens, and their reservations.
    ddl::COSTS,
    // 23: a chat's name as its platform shows it, for the console.
    ddl::CHAT_TITLES,
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
