//! What both backends decide about memory rows once they are read, written once: a
//! row of its raw columns, the newest of several scopes, and what the counter-test's
//! write-back switch writes.

use super::{Memory, MemoryChange, MemoryWrites, Remember, Scope, ScopeKind, StoreError};
use crate::domain::Timestamp;

/// A memory's columns as a backend reads them, before [`memory_row`] checks them.
pub(crate) struct RawMemory {
    pub(crate) id: i64,
    pub(crate) scope: String,
    pub(crate) platform: String,
    pub(crate) owner: String,
    pub(crate) text: String,
    pub(crate) author: String,
    pub(crate) source: Option<String>,
    pub(crate) created_at: i64,
    pub(crate) version: i64,
}

/// A memory of its raw columns; a scope or platform this build cannot read is
/// [`StoreError::Corrupt`] (never guessed: a person's memory read as a chat's would
/// reach a group).
pub(crate) fn memory_row(raw: RawMemory) -> Result<Memory, StoreError> {
    let platform = raw.platform.parse().map_err(StoreError::Corrupt)?;
    let kind = ScopeKind::parse(&raw.scope)
        .ok_or_else(|| StoreError::Corrupt(format!("memory scope '{}'", raw.scope)))?;
    Ok(Memory {
        id: raw.id,
        scope: Scope {
            kind,
            platform,
            owner: raw.owner,
        },
        text: raw.text,
        author: raw.author,
        source: raw.source,
        created_at: Timestamp(raw.created_at),
        version: raw.version,
    })
}

/// The newest `limit` of `all` (memories of several scopes), newest first: ids grow
/// with every insert, so the newest is the highest.
pub(crate) fn newest_memories(mut all: Vec<Memory>, limit: usize) -> Vec<Memory> {
    all.sort_by_key(|m| std::cmp::Reverse(m.id));
    all.truncate(limit);
    all
}

/// The scopes `writes` remembers a fact in, each once, in order.
pub(crate) fn remembered_scopes(writes: &MemoryWrites) -> Vec<Scope> {
    let mut scopes: Vec<Scope> = Vec::new();
    for change in &writes.changes {
        if let MemoryChange::Remember(fact) = change
            && !scopes.contains(&fact.scope)
        {
            scopes.push(fact.scope.clone());
        }
    }
    scopes
}

/// What the counter-test's switch writes back for `scope`: the memories the round
/// read, oldest first, then the facts it remembers there.
pub(crate) fn written_back(writes: &MemoryWrites, scope: &Scope) -> Vec<Remember> {
    let mut seen: Vec<&Memory> = writes.seen.iter().filter(|m| &m.scope == scope).collect();
    seen.sort_by_key(|m| m.id);
    let old = seen.into_iter().map(|m| Remember {
        scope: m.scope.clone(),
        text: m.text.clone(),
        author: m.author.clone(),
        source: m.source.clone(),
    });
    let new = writes.changes.iter().filter_map(|change| match change {
        MemoryChange::Remember(fact) if &fact.scope == scope => Some(fact.clone()),
        _ => None,
    });
    old.chain(new).collect()
}
