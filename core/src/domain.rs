//! The core's own domain words: lease, holder, fencing token. The words shared with
//! the adapters (platform, conversation, version, timestamp, outbox row) come from
//! the port and are re-exported here, so the core speaks one vocabulary.

use std::fmt;

pub use lull_port::domain::*;

/// A fencing token: bumped by every successful lease claim, so a later holder always
/// has a larger token than any earlier one, and every write of a holder is checked
/// against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseToken(pub i64);

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// The identity of one running process as a lease holder. Unique per process start,
/// so a restarted process never mistakes its predecessor's lease for its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HolderId(String);

impl HolderId {
    /// `host:pid:random`, readable in the database when debugging who holds what.
    pub fn generate() -> Self {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "local".into());
        Self(format!(
            "{host}:{}:{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ))
    }

    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for HolderId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a lease protects. Conversations are leased for a whole round (generation and
/// delivery); a platform connection is leased per shard (its index) by the one process
/// that may hold it: Telegram's poller, each of Discord's gateway shards.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LeaseKey {
    Conversation(ConversationId),
    Poller(Platform, u32),
    /// A replica's slot among the processes serving a sharded platform: the replica in
    /// slot N is the one shard N is handed to, so replicas split the shards.
    Replica(Platform, u32),
    /// The making of a conversation's next summary: one process at a time writes it,
    /// and a summary whose maker lost this lease is not stored (`SummaryStore`).
    Summary(ConversationId),
    /// The retention sweep: one process at a time removes old texts.
    Retention,
}

impl LeaseKey {
    /// The name of the lease row, built here and nowhere else. Backends store the
    /// conversation of a conversation lease in a column of its own
    /// ([`LeaseKey::conversation`]) and never build this string themselves.
    pub fn resource(&self) -> String {
        match self {
            LeaseKey::Conversation(id) => format!("conversation/{}", id.0),
            // Shard 0 keeps the name of the one unsharded connection, so a process
            // of an earlier version and one of this version never hold it at once.
            LeaseKey::Poller(p, 0) => format!("poller/{}", p.as_str()),
            LeaseKey::Poller(p, shard) => format!("poller/{}/shard-{shard}", p.as_str()),
            LeaseKey::Replica(p, slot) => format!("replica/{}/{slot}", p.as_str()),
            LeaseKey::Summary(id) => format!("summary/{}", id.0),
            LeaseKey::Retention => "retention".to_owned(),
        }
    }

    /// The conversation a conversation lease protects; `None` for the others.
    pub fn conversation(&self) -> Option<ConversationId> {
        match self {
            LeaseKey::Conversation(id) => Some(*id),
            LeaseKey::Poller(..)
            | LeaseKey::Replica(..)
            | LeaseKey::Summary(_)
            | LeaseKey::Retention => None,
        }
    }
}

impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.resource())
    }
}

/// A lease this process holds: the proof it must present (holder and token) with
/// every write it makes under the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub key: LeaseKey,
    pub holder: HolderId,
    pub token: LeaseToken,
    pub expires_at: Timestamp,
}

/// One message as the model is shown it: who wrote it, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Said {
    pub author: String,
    pub text: String,
}

impl Said {
    pub fn new(author: impl Into<String>, text: impl Into<String>) -> Self {
        Self {
            author: author.into(),
            text: text.into(),
        }
    }
}

/// One earlier exchange: the messages a reply covered, oldest first, and the reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exchange {
    pub user: Vec<Said>,
    pub reply: String,
}

/// Token counts a model reported for one reply (stored with it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenUsage {
    pub prompt: u64,
    pub completion: u64,
    /// Of `prompt`, the tokens the server read from its prompt cache (0 when it does
    /// not say): priced at the cached input's price, if the price list has one.
    pub cached: u64,
}
