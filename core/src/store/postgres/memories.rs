//! The memories area on PostgreSQL: rows of their scope, inserted and deleted one by
//! one. Two commits remembering in one scope at once never wait on each other's
//! rows (inserts; the unique index on the text is the only meeting point: the same
//! fact twice is kept once).

use async_trait::async_trait;
use lull_port::Platform;
use tokio_postgres::Row;

use super::PostgresStore;
use super::sql::{Tx, execute, query, query_one};
use crate::domain::Timestamp;
use crate::store::faults::Operation;
use crate::store::memory_rows::{self as rows, RawMemory};
use crate::store::{
    Erased, MEMORIES_PER_SCOPE, Memory, MemoryApplied, MemoryChange, MemoryCounts, MemoryStore,
    MemoryWrites, Remember, Scope, StoreError,
};

const COLUMNS: &str = "id, scope, platform, owner, text, author, source, created_at, version";

#[async_trait]
impl MemoryStore for PostgresStore {
    async fn memories(&self, scopes: &[Scope], limit: usize) -> Result<Vec<Memory>, StoreError> {
        transaction!(self, Operation::Read, "reading memories", |tx| {
            async {
                let mut all = Vec::new();
                for scope in scopes {
                    let sql = format!(
                        "SELECT {COLUMNS} FROM memories WHERE scope = $1 AND platform = $2 AND owner = $3
                         ORDER BY id DESC LIMIT $4"
                    );
                    let found = query(
                        &tx,
                        &sql,
                        &[&scope.kind.as_str(), &scope.platform.as_str(), &scope.owner, &(limit as i64)],
                        "reading memories",
                    )
                    .await?;
                    for row in &found {
                        all.push(memory_row(row)?);
                    }
                }
                Ok(rows::newest_memories(all, limit))
            }
            .await
        })
    }

    async fn forget_memory(&self, scope: &Scope, id: i64) -> Result<bool, StoreError> {
        transaction!(self, Operation::Other, "forgetting a memory", |tx| {
            async { forget(&tx, scope, id).await }.await
        })
    }

    async fn clear_memories(&self, scope: &Scope) -> Result<u64, StoreError> {
        transaction!(self, Operation::Other, "clearing memories", |tx| {
            async {
                let key = fence_key(scope.platform, scope.kind.as_str(), &scope.owner);
                lock_fences(&tx, vec![key], false).await?;
                fence(&tx, scope.platform, scope.kind.as_str(), &scope.owner).await?;
                execute(
                    &tx,
                    "DELETE FROM memories WHERE scope = $1 AND platform = $2 AND owner = $3",
                    &[&scope.kind.as_str(), &scope.platform.as_str(), &scope.owner],
                    "clearing memories",
                )
                .await
            }
            .await
        })
    }

    async fn erase_person(
        &self,
        platform: Platform,
        user_id: &str,
        now: Timestamp,
    ) -> Result<Erased, StoreError> {
        transaction!(self, Operation::Other, "erasing a person", |tx| {
            async {
                let now = self.now(&tx, now).await?;
                erase(&tx, platform, user_id, now.db).await
            }
            .await
        })
    }

    async fn memory_counts(&self) -> Result<MemoryCounts, StoreError> {
        transaction!(self, Operation::Read, "counting memories", |tx| {
            async {
                let found = query(
                    &tx,
                    "SELECT scope, COUNT(*) FROM memories GROUP BY scope",
                    &[],
                    "counting memories",
                )
                .await?;
                let mut counts = MemoryCounts::default();
                for row in &found {
                    let n = row.get::<_, i64>(1) as u64;
                    match row.get::<_, &str>(0) {
                        "person" => counts.person = n,
                        "chat" => counts.chat = n,
                        _ => {}
                    }
                }
                Ok(counts)
            }
            .await
        })
    }
}

fn memory_row(row: &Row) -> Result<Memory, StoreError> {
    rows::memory_row(RawMemory {
        id: row.get(0),
        scope: row.get(1),
        platform: row.get(2),
        owner: row.get(3),
        text: row.get(4),
        author: row.get(5),
        source: row.get(6),
        created_at: row.get(7),
        version: row.get(8),
    })
}

// Its own scope only: a forget names its scope with the id, so an id of another
// person's or chat's memory deletes nothing.
async fn forget(tx: &Tx<'_>, scope: &Scope, id: i64) -> Result<bool, StoreError> {
    let deleted = execute(
        tx,
        "DELETE FROM memories WHERE id = $1 AND scope = $2 AND platform = $3 AND owner = $4",
        &[
            &id,
            &scope.kind.as_str(),
            &scope.platform.as_str(),
            &scope.owner,
        ],
        "forgetting a memory",
    )
    .await?;
    Ok(deleted == 1)
}

/// Apply a round's staged changes inside its reply's commit transaction (see the
/// SQLite twin): one insert per fact, one delete per forgotten one, the scope's oldest
/// beyond [`MEMORIES_PER_SCOPE`] dropped. Nothing is read and written back — except by
/// the counter-test's switch.
pub(super) async fn apply(
    tx: &Tx<'_>,
    writes: &MemoryWrites,
    now: Timestamp,
) -> Result<MemoryApplied, StoreError> {
    let mut applied = MemoryApplied::default();
    let write_back = crate::switches::memory_write_back();
    let keys: Vec<String> = writes
        .changes
        .iter()
        .filter_map(|change| match change {
            MemoryChange::Remember(f) => Some([
                fence_key(f.scope.platform, f.scope.kind.as_str(), &f.scope.owner),
                fence_key(f.scope.platform, "author", &f.author),
            ]),
            MemoryChange::Forget { .. } => None,
        })
        .flatten()
        .collect();
    lock_fences(tx, keys, true).await?;
    if write_back {
        for scope in rows::remembered_scopes(writes) {
            execute(
                tx,
                "DELETE FROM memories WHERE scope = $1 AND platform = $2 AND owner = $3",
                &[&scope.kind.as_str(), &scope.platform.as_str(), &scope.owner],
                "writing memories back",
            )
            .await?;
            for fact in rows::written_back(writes, &scope) {
                insert(tx, &fact, now).await?;
            }
        }
    }
    for change in &writes.changes {
        match change {
            MemoryChange::Remember(_) if write_back => {}
            MemoryChange::Remember(fact) => {
                if fenced(tx, fact, writes.newest_message).await? {
                    applied.fenced += 1;
                    continue;
                }
                if insert(tx, fact, now).await? {
                    applied.remembered += 1;
                    applied.dropped += drop_oldest(tx, &fact.scope).await?;
                }
            }
            MemoryChange::Forget { scope, id } => {
                if forget(tx, scope, *id).await? {
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
async fn insert(tx: &Tx<'_>, fact: &Remember, now: Timestamp) -> Result<bool, StoreError> {
    let inserted = execute(
        tx,
        "INSERT INTO memories (scope, platform, owner, text, author, source, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (platform, scope, owner, text) DO NOTHING",
        &[
            &fact.scope.kind.as_str(),
            &fact.scope.platform.as_str(),
            &fact.scope.owner,
            &fact.text,
            &fact.author,
            &fact.source,
            &now.0,
        ],
        "remembering",
    )
    .await?;
    Ok(inserted == 1)
}

// Fenced: a clear of the fact's scope, or an erase of its author, made after the
// round's newest message was stored keeps the fact out (see the SQLite twin). A commit
// and a clear of one key hold its advisory lock (shared, exclusive) for the rest of
// their transactions (`lock_fences`, every key of the transaction at once, in one
// order), so they never overlap: a clear that came first is read by the commit's
// check, a commit that came first has its row deleted by the clear.
async fn fenced(tx: &Tx<'_>, fact: &Remember, newest_message: i64) -> Result<bool, StoreError> {
    if crate::switches::unfenced_memory() {
        return Ok(false);
    }
    let row = query_one(
        tx,
        "SELECT EXISTS (SELECT 1 FROM memory_fences WHERE platform = $1
           AND ((kind = $2 AND owner = $3) OR (kind = 'author' AND owner = $4))
           AND through_message >= $5)",
        &[
            &fact.scope.platform.as_str(),
            &fact.scope.kind.as_str(),
            &fact.scope.owner,
            &fact.author,
            &newest_message,
        ],
        "reading the memory fences",
    )
    .await?;
    Ok(row.get(0))
}

/// Fence the rounds in flight out of `(kind, owner)`: every message stored so far is
/// before the fence.
async fn fence(tx: &Tx<'_>, platform: Platform, kind: &str, owner: &str) -> Result<(), StoreError> {
    execute(
        tx,
        "INSERT INTO memory_fences (platform, kind, owner, through_message)
         VALUES ($1, $2, $3, (SELECT COALESCE(MAX(id), 0) FROM messages))
         ON CONFLICT (platform, kind, owner) DO UPDATE SET through_message = excluded.through_message",
        &[&platform.as_str(), &kind, &owner],
        "fencing the rounds in flight",
    )
    .await?;
    Ok(())
}

/// Take the transaction-scoped advisory locks of fence keys `(platform, kind, owner)`
/// — shared for a commit's facts, exclusive for a clear — all at once and sorted, so
/// two transactions never wait on each other in a circle.
pub(super) async fn lock_fences(
    tx: &Tx<'_>,
    mut keys: Vec<String>,
    shared: bool,
) -> Result<(), StoreError> {
    keys.sort();
    keys.dedup();
    let sql = if shared {
        "SELECT pg_advisory_xact_lock_shared(hashtextextended($1, 0))"
    } else {
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))"
    };
    for key in &keys {
        query_one(tx, sql, &[key], "locking a memory fence").await?;
    }
    Ok(())
}

/// The advisory lock key of a fence.
pub(super) fn fence_key(platform: Platform, kind: &str, owner: &str) -> String {
    format!("lull.memory_fence/{}/{kind}/{owner}", platform.as_str())
}

/// Drop the oldest memories of `scope` beyond [`MEMORIES_PER_SCOPE`]; how many.
// Bounded per scope: a concurrent insert may leave one over the bound until the next
// insert (each statement sees its own snapshot); never the newest row dropped.
async fn drop_oldest(tx: &Tx<'_>, scope: &Scope) -> Result<u16, StoreError> {
    let dropped = execute(
        tx,
        "DELETE FROM memories WHERE scope = $1 AND platform = $2 AND owner = $3
           AND id NOT IN (SELECT id FROM memories WHERE scope = $1 AND platform = $2
                          AND owner = $3 ORDER BY id DESC LIMIT $4)",
        &[
            &scope.kind.as_str(),
            &scope.platform.as_str(),
            &scope.owner,
            &(MEMORIES_PER_SCOPE as i64),
        ],
        "dropping the oldest memories",
    )
    .await?;
    Ok(dropped as u16)
}

/// The conversations (ids, as fence owners) in which `user` wrote on `platform`.
async fn chats_of(tx: &Tx<'_>, platform: Platform, user: &str) -> Result<Vec<String>, StoreError> {
    Ok(query(
        tx,
        "SELECT DISTINCT m.conversation_id::text FROM messages m
         JOIN conversations c ON c.id = m.conversation_id
         WHERE m.user_id = $2 AND c.platform = $1",
        &[&platform.as_str(), &user],
        "finding the person's chats",
    )
    .await?
    .iter()
    .map(|r| r.get(0))
    .collect())
}

/// `/forgetme` in one transaction (see [`MemoryStore::erase_person`]).
async fn erase(
    tx: &Tx<'_>,
    platform: Platform,
    user: &str,
    now: Timestamp,
) -> Result<Erased, StoreError> {
    // The chats the person wrote in: their summaries being made are fenced too.
    let chats = chats_of(tx, platform, user).await?;
    let mut keys = vec![
        fence_key(platform, "person", user),
        fence_key(platform, "author", user),
    ];
    keys.extend(
        chats
            .iter()
            .map(|chat| fence_key(platform, "summary", chat)),
    );
    lock_fences(tx, keys, false).await?;
    // A maker whose picture was read before now stores nothing
    // (`SummaryStore::store_summary`), so their words never come back in a summary.
    for chat in &chats {
        fence(tx, platform, "summary", chat).await?;
    }
    fence(tx, platform, "person", user).await?;
    fence(tx, platform, "author", user).await?;
    let platform = platform.as_str();
    let memories = execute(
        tx,
        "DELETE FROM memories WHERE platform = $1
           AND ((scope = 'person' AND owner = $2) OR author = $2)",
        &[&platform, &user],
        "erasing memories",
    )
    .await?;
    let messages = execute(
        tx,
        "UPDATE messages SET text = '', transcript = NULL, media = NULL, erased_at = $3
         WHERE user_id = $2 AND erased_at IS NULL
           AND conversation_id IN (SELECT id FROM conversations WHERE platform = $1)",
        &[&platform, &user, &now.0],
        "erasing messages",
    )
    .await?;
    let overheard = execute(
        tx,
        "DELETE FROM overheard WHERE user_id = $2
           AND conversation_id IN (SELECT id FROM conversations WHERE platform = $1)",
        &[&platform, &user],
        "erasing overheard messages",
    )
    .await?;
    let summaries = execute(
        tx,
        "DELETE FROM summaries WHERE conversation_id IN (
             SELECT m.conversation_id FROM messages m JOIN conversations c ON c.id = m.conversation_id
             WHERE m.user_id = $2 AND c.platform = $1)",
        &[&platform, &user],
        "erasing summaries",
    )
    .await?;
    Ok(Erased {
        memories,
        messages,
        overheard,
        summaries,
    })
}
