//! Platform connections. Telegram allows one long-poller per bot token and Discord
//! delivers every event to every connected session, so with several processes on one
//! database only one may hold a platform's connection. The core elects it (the
//! platform's poller lease, the same compare-and-swap row with expiry as a
//! conversation's) and hands the adapter one [`Session`] at a time; the adapter
//! connects, feeds updates to the [`Intake`] and returns a [`SessionEnd`] when the
//! session is over. The election loop, its backoff and its standby reporting exist
//! once, in the core.
//!
//! A platform that splits its events across several connections (Discord's shards)
//! says how many it wants ([`Inbound::shards`]); the core then elects a holder per
//! [`Shard`], each under a lease of its own, so several processes share the shards
//! and take over a dead one's within the lease TTL.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use crate::domain::{Platform, Timestamp};
use crate::health::{AdapterState, Health};
use crate::intake::Intake;

/// One of the connections a platform's events are split across: `index` of `total`.
/// A platform without sharding has one, [`Shard::ONLY`].
///
/// Invariant: `index < total` (and so `total >= 1`); [`Shard::new`] refuses anything
/// else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shard {
    index: u32,
    total: u32,
}

impl Shard {
    /// The one connection of a platform that is not sharded.
    pub const ONLY: Shard = Shard { index: 0, total: 1 };

    /// Shard `index` of `total`; `None` unless `index < total`.
    pub fn new(index: u32, total: u32) -> Option<Shard> {
        (index < total).then_some(Shard { index, total })
    }

    pub fn index(self) -> u32 {
        self.index
    }

    pub fn total(self) -> u32 {
        self.total
    }

    /// Every shard of `total` (at least one).
    pub fn all(total: u32) -> impl Iterator<Item = Shard> {
        let total = total.max(1);
        (0..total).map(move |index| Shard { index, total })
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.index, self.total)
    }
}

/// This process's right to hold a platform connection, for as long as it lasts.
///
/// Invariant: while [`Session::is_lost`] is false, no other process holds the
/// platform's connection; once it turns true (the lease could not be renewed, or was
/// taken over), the adapter must stop using the connection at once.
#[derive(Debug, Clone)]
pub struct Session {
    platform: Platform,
    shard: Shard,
    lost: CancellationToken,
    shutdown: CancellationToken,
    /// The lease's expiry in milliseconds since the epoch, moved on by each renewal.
    expires_at: Arc<AtomicI64>,
    health: Health,
}

impl Session {
    /// A session of `shard` under a lease the core holds: `lost` fires when the lease
    /// is lost, `expires_at` follows its renewals.
    pub fn new(
        platform: Platform,
        shard: Shard,
        lost: CancellationToken,
        shutdown: CancellationToken,
        expires_at: Arc<AtomicI64>,
        health: Health,
    ) -> Self {
        Self {
            platform,
            shard,
            lost,
            shutdown,
            expires_at,
            health,
        }
    }

    pub fn platform(&self) -> Platform {
        self.platform
    }

    /// The shard this session connects, and only it: while the session lasts no other
    /// process holds this shard's connection (other shards may be held anywhere).
    pub fn shard(&self) -> Shard {
        self.shard
    }

    /// Completes when the lease is lost: another process may hold the connection now.
    pub async fn lost(&self) {
        self.lost.cancelled().await
    }

    pub fn is_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Completes when the process is shutting down.
    pub async fn shutting_down(&self) {
        self.shutdown.cancelled().await
    }

    /// Completes when the session must end, saying why.
    pub async fn ended(&self) -> SessionEnd {
        tokio::select! {
            biased;
            () = self.lost() => SessionEnd::LeaseLost,
            () = self.shutting_down() => SessionEnd::Shutdown,
        }
    }

    /// Sleep for `wait` unless the session ends first (then say why).
    pub async fn pause(&self, wait: Duration) -> Option<SessionEnd> {
        tokio::select! {
            () = tokio::time::sleep(wait) => None,
            end = self.ended() => Some(end),
        }
    }

    /// When the lease expires unless renewed: a request made under it (a long poll)
    /// must end before then, or a successor could meet it.
    pub fn expires_at(&self) -> Timestamp {
        Timestamp(self.expires_at.load(Ordering::SeqCst))
    }

    /// Report the state of this shard's connection (`/healthz` shows the platform's
    /// worst shard).
    pub fn report(&self, state: AdapterState) {
        self.health
            .set_shard(self.platform, self.shard.index(), state);
    }
}

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnd {
    /// The process is shutting down: the lease is handed over at once.
    Shutdown,
    /// The lease was lost: the process stands by and tries to win it again.
    LeaseLost,
    /// The connection failed; worth another session after a pause (the lease is handed
    /// to another process meanwhile). `connected`: it got as far as a working
    /// connection, so the backoff starts over.
    Failed { reason: String, connected: bool },
    /// Trying again cannot help (a rejected token, refused intents): the process
    /// stops, with this message naming what to fix.
    Fatal(String),
}

/// The receiving half of an adapter that holds a platform connection.
#[async_trait]
pub trait Inbound: Send + Sync + 'static {
    fn platform(&self) -> Platform;

    /// How many shards the platform's connection is split into, asked once before
    /// the first election (it may ask the platform: Discord's recommended count). A
    /// `Failed` answer is asked again after a backoff, a `Fatal` one stops the
    /// adapter. One shard unless the adapter says otherwise.
    async fn shards(&self) -> Result<u32, SessionEnd> {
        Ok(1)
    }

    /// One session: connect, hand every update to `intake` until `session` ends or the
    /// connection fails, then disconnect. An update is acknowledged to the platform
    /// only after `intake` stored it.
    async fn session(&self, intake: &dyn Intake, session: &Session) -> SessionEnd;
}
