//! `lull backup`: a consistent copy of a SQLite database while lull runs.
//!
//! `VACUUM INTO` copies the database as one read transaction sees it: in WAL mode a
//! reader never blocks the writers and never sees half a transaction, so the copy holds
//! every transaction committed before it began (every message acknowledged by then)
//! and nothing of one committed after, whatever other processes write meanwhile. The
//! copy is a complete file of its own (no `-wal` beside it), checked before it is
//! reported, with an idempotency salt of its own (a restored copy never sends a tool
//! server the keys its original sent). PostgreSQL has its own tool for this, `pg_dump`
//! (a restored dump keeps its salt: see docs/tools.md).

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OpenFlags};

use super::DatabaseUrl;

/// What a backup holds, read back from the copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupReport {
    pub path: PathBuf,
    pub conversations: u64,
    pub messages: u64,
    pub bytes: u64,
}

/// Why there is no backup.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error(
        "lull backup copies SQLite databases; for PostgreSQL use its own tool, e.g. `pg_dump --format=custom --file=lull.dump \"$DATABASE_URL\"` (restore with pg_restore)"
    )]
    Postgres,
    #[error("there is no database at {0} (check DATABASE_URL)")]
    NoDatabase(PathBuf),
    #[error("{0} exists already; a backup never overwrites a file (choose a new name)")]
    TargetExists(PathBuf),
    #[error("cannot back up {from} to {to}: {reason}")]
    Failed {
        from: PathBuf,
        to: PathBuf,
        reason: String,
    },
    #[error("the copy at {path} does not pass SQLite's integrity check: {reason}")]
    Damaged { path: PathBuf, reason: String },
}

/// Copy the database `url` names to `target` (a new file), consistently, while other
/// processes may be writing to it; the copy is checked and counted.
pub fn backup(url: &DatabaseUrl, target: &Path) -> Result<BackupReport, BackupError> {
    let source = match url {
        DatabaseUrl::Sqlite(path) => path,
        DatabaseUrl::Postgres(_) => return Err(BackupError::Postgres),
    };
    if !source.is_file() {
        return Err(BackupError::NoDatabase(source.clone()));
    }
    if target.exists() {
        return Err(BackupError::TargetExists(target.to_owned()));
    }
    let failed = |reason: String| BackupError::Failed {
        from: source.clone(),
        to: target.to_owned(),
        reason,
    };
    let target_text = target
        .to_str()
        .ok_or_else(|| failed("the target path is not valid UTF-8".into()))?;
    // Read-only: a backup never writes to the database it copies.
    let conn = Connection::open_with_flags(
        source,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| failed(e.to_string()))?;
    // A writer's checkpoint may hold the lock for a moment; wait it out.
    conn.busy_timeout(std::time::Duration::from_secs(30))
        .map_err(|e| failed(e.to_string()))?;
    conn.execute("VACUUM INTO ?1", [target_text])
        .map_err(|e| failed(e.to_string()))?;
    drop(conn);
    new_salt(target).map_err(|e| failed(format!("giving the copy its own salt: {e}")))?;
    check_copy(target)
}

/// Give the copy an idempotency salt of its own: a restored backup runs again from an
/// earlier point, reusing row ids the original went on to use, so the keys it sends
/// tool servers must differ from the original's (`ActionKey::for_server`). A database
/// from before the salt (no `instance` table) is left as it is: it gets one when it is
/// migrated.
fn new_salt(copy: &Path) -> rusqlite::Result<()> {
    let conn = Connection::open(copy)?;
    let has_instance: bool = conn.query_row(
        "SELECT COUNT(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'instance'",
        [],
        |r| r.get(0),
    )?;
    if has_instance {
        conn.execute(
            "UPDATE instance SET salt = lower(hex(randomblob(16))) WHERE id = 1",
            [],
        )?;
    }
    Ok(())
}

/// Open the copy, run SQLite's integrity check and count what it holds.
fn check_copy(path: &Path) -> Result<BackupReport, BackupError> {
    let damaged = |reason: String| BackupError::Damaged {
        path: path.to_owned(),
        reason,
    };
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| damaged(e.to_string()))?;
    let verdict: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .map_err(|e| damaged(e.to_string()))?;
    if verdict != "ok" {
        return Err(damaged(verdict));
    }
    let count = |table: &str| -> Result<u64, BackupError> {
        conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| {
            r.get::<_, i64>(0)
        })
        .map(|n| n as u64)
        .map_err(|e| damaged(format!("no {table} table ({e}): not a lull database?")))
    };
    Ok(BackupReport {
        path: path.to_owned(),
        conversations: count("conversations")?,
        messages: count("messages")?,
        bytes: std::fs::metadata(path).map(|m| m.len()).unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backup_refuses_postgres_a_missing_database_and_an_existing_target() {
        let dir = tempfile::tempdir().unwrap();
        let postgres = DatabaseUrl::parse("postgres://db.internal/lull").unwrap();
        let e = backup(&postgres, &dir.path().join("x.db")).unwrap_err();
        assert!(e.to_string().contains("pg_dump"), "{e}");

        let missing = DatabaseUrl::Sqlite(dir.path().join("none.db"));
        let e = backup(&missing, &dir.path().join("x.db")).unwrap_err();
        assert!(matches!(e, BackupError::NoDatabase(_)), "{e}");

        let source = dir.path().join("lull.db");
        let conn = Connection::open(&source).unwrap();
        conn.execute_batch(
            "CREATE TABLE conversations (id INTEGER); CREATE TABLE messages (id INTEGER);
             INSERT INTO messages VALUES (1), (2);",
        )
        .unwrap();
        let target = dir.path().join("copy.db");
        std::fs::write(&target, b"keep me").unwrap();
        let url = DatabaseUrl::Sqlite(source);
        let e = backup(&url, &target).unwrap_err();
        assert!(matches!(e, BackupError::TargetExists(_)), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep me");

        std::fs::remove_file(&target).unwrap();
        let report = backup(&url, &target).unwrap();
        assert_eq!((report.messages, report.conversations), (2, 0));
    }
}
