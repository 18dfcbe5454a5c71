//! The memories area on SQLite: rows of their scope, inserted and deleted one by one.

use async_trait::async_trait;
use lull_port::Platform;
use rusqlite::{Connection, params};

use super::SqliteStore;
use super::sql::Context;
use crate::domain::Timestamp;
use crate::store::memory_rows::{self as rules, RawMemory};
use crate::store::{
    Erased, MEMORIES_PER_SCOPE, Memory, MemoryApplied, MemoryChange, MemoryCounts, MemoryStore,
    MemoryWrites, Remember, Scope, StoreError,
};

const COLUMNS: &str = "id, scope, platform, owner, text, author, source, created_at, version";

#[async_trait]
impl MemoryStore for SqliteStore {
    async fn memories(&self, scopes: &[Scope], limit: usize) -> Result<Vec<Memory>, StoreError> {
        let scopes = scopes.to_vec();
        self.with_conn(move |conn| {
            let mut all = Vec::new();
            for scope in &scopes {
                all.extend(of_scope(conn, scope, limit)?);
            }
            Ok(rules::newest_memories(all, limit))
        })
        .await
    }

    async fn forget_memory(&self, scope: &Scope, id: i64) -> Result<bool, StoreError> {
        let scope = scope.clone();
        self.write("forgetting a memory", move |tx| forget(tx, &scope, id))
            .await
    }

    async fn clear_memories(&self, scope: &Scope) -> Result<u64, StoreError> {
        let scope = scope.clone();
        self.write("clearing memories", move |tx| {
            fence(tx, scope.platform, scope.kind.as_str(), &scope.owner)?;
            let deleted = tx
                .prepare_cached(
                    "DELETE FROM memories WHERE scope = ?1 AND platform = ?2 AND owner = ?3",
                )
                .ctx("preparing a statement")?
                .execute(params![
                    scope.kind.as_str(),
                    scope.platform.as_str(),
                    scope.owner
                ])
                .ctx("clearing memories")?;
            Ok(deleted as u64)
        })
        .await
    }

    async fn erase_person(
        &self,
        platform: Platform,
        user_id: &str,
        now: Timestamp,
    ) -> Result<Erased, StoreError> {
        let user = user_id.to_owned();
        let erased = self
            .write("erasing a person", move |tx| {
                erase(tx, platform, &user, now)
            })
            .await?;
        // The old texts may still be in the write-ahead log's frames: copied into the
        // main file (where `secure_delete` zeroed them) and the log truncated. Another
        // process reading at this moment can keep it from completing; the log is then
        // overwritten as it is reused.
        if let Err(error) = self.writer.checkpoint().await {
            tracing::warn!(%error, "erased texts may stay in the write-ahead log until its next checkpoint");
        }
        Ok(erased)
    }

    async fn memory_counts(&self) -> Result<MemoryCounts, StoreError> {
        self.with_conn(|conn| {
            let count = |kind: &str| -> Result<u64, StoreError> {
                conn.prepare_cached("SELECT COUNT(*) FROM memories WHERE scope = ?1")
                    .ctx("preparing a statement")?
                    .query_row([kind], |r| r.get::<_, i64>(0))
                    .ctx("counting memories")
                    .map(|n| n as u64)
            };
            Ok(MemoryCounts {
                person: count("person")?,
                chat: count("chat")?,
            })
        })
        .await
    }
}

/// The newest `limit` memories of `scope`.
fn of_scope(conn: &Connection, scope: &Scope, limit: usize) -> Result<Vec<Memory>, StoreError> {
    let sql = format!(
        "SELECT {COLUMNS} FROM memories WHERE scope = ?1 AND platform = ?2 AND owner = ?3
         ORDER BY id DESC LIMIT ?4"
    );
    let mut statement = conn.prepare_cached(&sql).ctx("preparing a statement")?;
    let rows = statement
        .query_map(
            params![
                scope.kind.as_str(),
                scope.platform.as_str(),
                scope.owner,
                limit as i64
            ],
            |r| {
                Ok(RawMemory {
                    id: r.get(0)?,
                    scope: r.get(1)?,
                    platform: r.get(2)?,
                    owner: r.get(3)?,
                    text: r.get(4)?,
                    author: r.get(5)?,
                    source: r.get(6)?,
                    created_at: r.get(7)?,
                    version: r.get(8)?,
                })
            },
        )
        .ctx("reading memories")?
        .collect::<Result<Vec<_>, _>>()
        .ctx("reading memories")?;
    rows.into_iter().map(rules::memory_row).collect()
}

// Its own scope only: a forget names its scope with the id, so an id of another
// person's or chat's memory deletes nothing.
fn forget(tx: &Connection, scope: &Scope, id: i64) -> Result<bool, StoreError> {
    let deleted = tx
        .prepare_cached(
            "DELETE FROM memories WHERE id = ?1 AND scope = ?2 AND platform = ?3 AND owner = ?4",
        )
        .ctx("preparing a statement")?
        .execute(params![
            id,
            scope.kind.as_str(),
            scope.platform.as_str(),
            scope.owner
        ])
        .ctx("forgetting a memory")?;
    Ok(deleted == 1)
}

/// Apply a round's staged changes inside its reply's commit transaction: each
/// remembered fact one insert (none if the scope holds that text already), each
/// forgotten one a delete, and the scope's oldest beyond [`MEMORIES_PER_SCOPE`]
/// dropped. Nothing is read and written back — except by the counter-test's switch.
pub(super) fn apply(
    tx: &Connection,
    writes: &MemoryWrites,
    now: Timestamp,
) -> Result<MemoryApplied, StoreError> {
    let mut applied = MemoryApplied::default();
    if crate::switches::memory_write_back() {
        write_back(tx, writes, now)?;
    }
    for change in &writes.changes {
        match change {
            MemoryChange::Remember(fact) => {
                if crate::switches::memory_write_back() {
                    continue; // written with the list
                }
                if fenced(tx, fact, writes.newest_message)? {
                    applied.fenced += 1;
                    continue;
                }
                if insert(tx, fact, now)? {
                    applied.remembered += 1;
                    applied.dropped += drop_oldest(tx, &fact.scope)?;
                }
            }
            MemoryChange::Forget { scope, id } => {
                if forget(tx, scope, *id)? {
                    applied.forgotten += 1;
                }
            }
        }
    }
    Ok(applied)
}

/// Insert `fact` unless its scope holds the same text already; `true` if inserted.
// Rows, never a whole written back: one row inserted, whatever another round inserted
// meanwhile stays. Once per scope: the unique index (platform, scope, owner, text)
// keeps a fact two rounds remember at once a single row.
fn insert(tx: &Connection, fact: &Remember, now: Timestamp) -> Result<bool, StoreError> {
    let inserted = tx
        .prepare_cached(
            "INSERT INTO memories (scope, platform, owner, text, author, source, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (platform, scope, owner, text) DO NOTHING",
        )
        .ctx("preparing a statement")?
        .execute(params![
            fact.scope.kind.as_str(),
            fact.scope.platform.as_str(),
            fact.scope.owner,
            fact.text,
            fact.author,
            fact.source,
            now.0
        ])
        .ctx("remembering")?;
    Ok(inserted == 1)
}

// Fenced: a clear of the fact's scope, or an erase of its author, made after the
// round's newest message was stored (`through_message` at least its row) keeps the
// fact out: a round in flight during `/memory clear` or `/forgetme` writes nothing back.
fn fenced(tx: &Connection, fact: &Remember, newest_message: i64) -> Result<bool, StoreError> {
    if crate::switches::unfenced_memory() {
        return Ok(false);
    }
    tx.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM memory_fences WHERE platform = ?1
           AND ((kind = ?2 AND owner = ?3) OR (kind = 'author' AND owner = ?4))
           AND through_message >= ?5)",
    )
    .ctx("preparing a statement")?
    .query_row(
        params![
            fact.scope.platform.as_str(),
            fact.scope.kind.as_str(),
            fact.scope.owner,
            fact.author,
            newest_message
        ],
        |r| r.get(0),
    )
    .ctx("reading the memory fences")
}

/// Fence the rounds in flight out of `(kind, owner)`: every message stored so far is
/// before the fence.
fn fence(tx: &Connection, platform: Platform, kind: &str, owner: &str) -> Result<(), StoreError> {
    tx.prepare_cached(
        "INSERT INTO memory_fences (platform, kind, owner, through_message)
         VALUES (?1, ?2, ?3, (SELECT COALESCE(MAX(id), 0) FROM messages))
         ON CONFLICT (platform, kind, owner) DO UPDATE SET through_message = excluded.through_message",
    )
    .ctx("preparing a statement")?
    .execute(params![platform.as_str(), kind, owner])
    .ctx("fencing the rounds in flight")?;
    Ok(())
}

/// Drop the oldest memories of `scope` beyond [`MEMORIES_PER_SCOPE`]; how many.
// Bounded per scope: a concurrent insert may leave one over the bound until the next
// insert (each statement sees its own snapshot); never the newest row dropped.
fn drop_oldest(tx: &Connection, scope: &Scope) -> Result<u16, StoreError> {
    let dropped = tx
        .prepare_cached(
            "DELETE FROM memories WHERE scope = ?1 AND platform = ?2 AND owner = ?3
               AND id NOT IN (SELECT id FROM memories WHERE scope = ?1 AND platform = ?2
                              AND owner = ?3 ORDER BY id DESC LIMIT ?4)",
        )
        .ctx("preparing a statement")?
        .execute(params![
            scope.kind.as_str(),
            scope.platform.as_str(),
            scope.owner,
            MEMORIES_PER_SCOPE as i64
        ])
        .ctx("dropping the oldest memories")?;
    Ok(dropped as u16)
}

/// The counter-test's switch: each scope a fact is remembered in is written back
/// whole — its rows deleted, then the list the round read plus the new facts
/// inserted — as a memory file is rewritten. What another round added since the read
/// is lost.
fn write_back(tx: &Connection, writes: &MemoryWrites, now: Timestamp) -> Result<(), StoreError> {
    for scope in rules::remembered_scopes(writes) {
        tx.execute(
            "DELETE FROM memories WHERE scope = ?1 AND platform = ?2 AND owner = ?3",
            params![scope.kind.as_str(), scope.platform.as_str(), scope.owner],
        )
        .ctx("writing memories back")?;
        for fact in rules::written_back(writes, &scope) {
            insert(tx, &fact, now)?;
        }
    }
    Ok(())
}

/// `/forgetme` in one transaction (see [`MemoryStore::erase_person`]).
fn erase(
    tx: &Connection,
    platform: Platform,
    user: &str,
    now: Timestamp,
) -> Result<Erased, StoreError> {
    fence(tx, platform, "person", user)?;
    fence(tx, platform, "author", user)?;
    let memories = tx
        .prepare_cached(
            "DELETE FROM memories WHERE platform = ?1
               AND ((scope = 'person' AND owner = ?2) OR author = ?2)",
        )
        .ctx("preparing a statement")?
        .execute(params![platform.as_str(), user])
        .ctx("erasing memories")?;
    let messages = tx
        .prepare_cached(
            "UPDATE messages SET text = '', transcript = NULL, media = NULL, erased_at = ?3
             WHERE user_id = ?2 AND erased_at IS NULL
               AND conversation_id IN (SELECT id FROM conversations WHERE platform = ?1)",
        )
        .ctx("preparing a statement")?
        .execute(params![platform.as_str(), user, now.0])
        .ctx("erasing messages")?;
    let overheard = tx
        .prepare_cached(
            "DELETE FROM overheard WHERE user_id = ?2
               AND conversation_id IN (SELECT id FROM conversations WHERE platform = ?1)",
        )
        .ctx("preparing a statement")?
        .execute(params![platform.as_str(), user])
        .ctx("erasing overheard messages")?;
    let summaries = erase_summaries(tx, platform, user)?;
    Ok(Erased {
        memories: memories as u64,
        messages: messages as u64,
        overheard: overheard as u64,
        summaries,
    })
}

/// `/forgetme`'s part in summaries: fence the summaries being made of the chats the
/// person wrote in, and delete theirs; how many were deleted.
fn erase_summaries(tx: &Connection, platform: Platform, user: &str) -> Result<u64, StoreError> {
    // `/forgetme` fences the summaries being made of the chats the person wrote in: a
    // maker whose picture was read before now (its newest message at or below the
    // fence) stores nothing, so their words never come back in a summary.
    tx.prepare_cached(
        "INSERT INTO memory_fences (platform, kind, owner, through_message)
         SELECT DISTINCT ?1, 'summary', CAST(m.conversation_id AS TEXT),
                (SELECT COALESCE(MAX(id), 0) FROM messages)
         FROM messages m JOIN conversations c ON c.id = m.conversation_id
         WHERE m.user_id = ?2 AND c.platform = ?1
         ON CONFLICT (platform, kind, owner) DO UPDATE SET through_message = excluded.through_message",
    )
    .ctx("preparing a statement")?
    .execute(params![platform.as_str(), user])
    .ctx("fencing the summaries in flight")?;
    let deleted = tx
        .prepare_cached(
            "DELETE FROM summaries WHERE conversation_id IN (
                 SELECT m.conversation_id FROM messages m JOIN conversations c ON c.id = m.conversation_id
                 WHERE m.user_id = ?2 AND c.platform = ?1)",
        )
        .ctx("preparing a statement")?
        .execute(params![platform.as_str(), user])
        .ctx("erasing summaries")?;
    Ok(deleted as u64)
}
