//! The domain words the core and the adapters share, as types: platform, conversation,
//! version, timestamp, outbox row. Each newtype exists so that a value of one kind
//! cannot be passed where another is expected (a version where a row id belongs, a
//! platform's chat id where the store's conversation id belongs).

use std::fmt;
use std::num::NonZeroU32;
use std::str::FromStr;

/// A chat platform lull talks to. Timers are only taken by processes that serve the
/// timer's platform, so this is part of every conversation's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Platform {
    /// The local terminal (`lull chat`).
    Console,
    /// The generic JSON adapter (`POST /api/messages`, replies to a webhook).
    Http,
    Telegram,
    Discord,
}

impl Platform {
    pub const ALL: [Platform; 4] = [
        Platform::Console,
        Platform::Http,
        Platform::Telegram,
        Platform::Discord,
    ];

    /// The stable name stored in the database and used in `LULL_ALLOWED_USERS`.
    pub fn as_str(self) -> &'static str {
        match self {
            Platform::Console => "console",
            Platform::Http => "http",
            Platform::Telegram => "telegram",
            Platform::Discord => "discord",
        }
    }

    /// Platforms whose users are on the machine (or trusted app) running lull; they are
    /// allowed by default, the public chat platforms are not.
    pub fn is_local(self) -> bool {
        matches!(self, Platform::Console | Platform::Http)
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Platform {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Platform::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                format!("unknown platform '{s}' (expected one of console, http, telegram, discord)")
            })
    }
}

/// The store's row id of a conversation. Only the store creates these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConversationId(pub i64);

impl fmt::Display for ConversationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where a conversation lives on its platform: a private chat, a group, a forum
/// topic, a Discord channel or thread. The key is the adapter's own encoding (for
/// example `-1001234:42` for topic 42 of a Telegram supergroup); the core treats it
/// as opaque.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConversationRef {
    pub platform: Platform,
    pub key: String,
}

impl ConversationRef {
    pub fn new(platform: Platform, key: impl Into<String>) -> Self {
        Self {
            platform,
            key: key.into(),
        }
    }
}

impl fmt::Display for ConversationRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.platform, self.key)
    }
}

/// A conversation's version counter. It grows by one with every stored message or
/// edit, in the same transaction that stores it, and never goes down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Version(pub i64);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// Which live draft of a conversation a preview belongs to. Updates of one draft
/// replace each other (Telegram animates them); a new id starts a new draft. Derived
/// from the version of the batch it previews, so the draft of a newer batch never
/// reuses the id of an older one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DraftId(NonZeroU32);

impl DraftId {
    /// The draft previewing the reply to the messages up to `version`.
    pub fn for_version(version: Version) -> DraftId {
        // Bot API integers: kept within 31 bits and never zero (Telegram refuses 0),
        // wrapping after 2^31 - 1 versions of one conversation.
        let id = (version.0 - 1).rem_euclid(i64::from(i32::MAX)) + 1;
        DraftId(NonZeroU32::new(id as u32).expect("1 ..= i32::MAX is not zero"))
    }

    pub fn get(self) -> u32 {
        self.0.get()
    }
}

impl fmt::Display for DraftId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Milliseconds since the Unix epoch. Every process on one database compares these,
/// so they come from the wall clock (see the core's `clock` module).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Timestamp(pub i64);

impl Timestamp {
    /// The wall clock now. Processes on one database compare these, so this is the
    /// clock they share (one host for SQLite; see the core's `clock` module).
    pub fn now() -> Timestamp {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp(since_epoch.as_millis() as i64)
    }

    pub fn plus(self, d: std::time::Duration) -> Timestamp {
        Timestamp(self.0.saturating_add(millis(d)))
    }

    pub fn minus(self, d: std::time::Duration) -> Timestamp {
        Timestamp(self.0.saturating_sub(millis(d)))
    }

    /// Time from `self` until `later`, zero if `later` is not after `self`.
    pub fn until(self, later: Timestamp) -> std::time::Duration {
        std::time::Duration::from_millis(later.0.saturating_sub(self.0).max(0) as u64)
    }
}

/// A duration in whole milliseconds, as the database stores it.
pub fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The id of a row in the reply outbox (replies and notices). Sent to webhooks as
/// `reply_id` and used to derive Discord nonces, so it is stable across retries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OutboxId(pub i64);

impl fmt::Display for OutboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What an outbox row is: a reply generated by the model, or a notice (help text, an
/// access denial, a failure notice, a give-up) that never enters the model's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboxKind {
    Reply,
    Notice,
}

impl OutboxKind {
    /// The name stored in the database and sent to webhooks as `kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            OutboxKind::Reply => "reply",
            OutboxKind::Notice => "notice",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn platform_names_round_trip() {
        for p in Platform::ALL {
            assert_eq!(p.as_str().parse::<Platform>().unwrap(), p);
        }
        assert!("irc".parse::<Platform>().is_err());
    }

    #[test]
    fn draft_ids_follow_versions_and_are_never_zero() {
        assert_eq!(DraftId::for_version(Version(1)).get(), 1);
        assert_eq!(DraftId::for_version(Version(42)).get(), 42);
        assert_eq!(
            DraftId::for_version(Version(i64::from(i32::MAX))).get(),
            i32::MAX as u32
        );
        assert_eq!(
            DraftId::for_version(Version(i64::from(i32::MAX) + 1)).get(),
            1
        );
        assert_eq!(DraftId::for_version(Version(0)).get(), i32::MAX as u32);
    }

    #[test]
    fn timestamps_never_go_negative_in_until() {
        assert_eq!(Timestamp(10).until(Timestamp(5)).as_millis(), 0);
        assert_eq!(Timestamp(5).until(Timestamp(10)).as_millis(), 5);
    }
}
