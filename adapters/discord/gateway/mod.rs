//! Receiving from Discord: the gateway connection, each shard held by one process at a
//! time.
//!
//! The core runs the election: the process holding a shard's *poller lease* gets a
//! [`Session`] for that shard and connects it to the gateway (serenity's
//! `start_shard(index, total)`); the others stand by and one of them takes over within
//! the lease TTL when the holder dies. A session whose lease is lost disconnects at
//! once. With one shard (the default) that is the whole gateway.
//!
//! Platform facts this relies on, and what it does about them:
//!
//! - **serenity dispatches events concurrently** (each event handler call is its own
//!   task), so two messages sent close together may reach the handler out of order.
//!   The handler only queues events; one intake task stores them one at a time,
//!   ordered by message id (snowflakes grow with time), after letting events that
//!   arrived together settle.
//! - **The gateway does not replay messages sent while no session was connected.**
//!   After every READY (a fresh session: first start, take-over, re-IDENTIFY), the
//!   channels with recent activity whose events belong to this shard are read back
//!   from history after the last stored message, before live events are stored. A resumed session gets the missed events
//!   replayed by Discord and needs no catch-up.
//! - **Discord has no acknowledgement per message**, and the core stores a message id
//!   once. A message is handed to the core until it is stored: a failing store is
//!   retried with backoff, never skipped, because a later message stored in its place
//!   would move the catch-up point past it. Whatever is still queued when the session
//!   ends (a crash, a lost lease) is read back by the next session's catch-up.
//! - **A button click is an interaction** (`INTERACTION_CREATE`, type 3), sent to one
//!   connection only (the shard of its guild, DMs on shard 0), to be answered within
//!   3 s or the user sees "This interaction failed". The handler answers it at once
//!   with `DEFERRED_UPDATE_MESSAGE` (type 6: nothing changes on screen) on a task of
//!   its own, before and apart from storing, so a slow database never makes Discord
//!   time out and a failed answer never holds the click back; the click itself is
//!   queued like a message and stored as the message its button spells.
//! - serenity resumes or re-identifies after a dropped connection by itself (waiting
//!   five seconds between IDENTIFYs, as Discord requires).
//!
//! # Layout
//!
//! This file holds a session: connecting under the lease, and what ends it (the
//! lease lost, the connection failed, the token or intents refused). Its parts:
//!
//! - `events`: serenity's event handler, which queues events and answers
//!   interactions at once.
//! - `feeder`: hands the queue to the core, in order, each update until it is stored.
//! - `catch_up`: after READY, reads back from history what was sent while no session
//!   was connected.

mod catch_up;
mod events;
mod feeder;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use serenity::all::{ClientBuilder, GatewayError};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::outbound::from_serenity;
use super::translate::BotIdentity;
use super::{ChannelKinds, Rest, Shards, intents};
use events::Handler;
use feeder::Feeder;
use lull_port::domain::Platform;
use lull_port::health::AdapterState;
use lull_port::{Inbound, Intake, SendError, Session, SessionEnd};

/// The receiving half of the Discord adapter. It connects a shard only inside
/// [`Inbound::session`], that is while this process holds the shard's poller lease,
/// and leaves the gateway before `session` returns (a shard still reconnecting then
/// is stopped when it comes back).
pub struct DiscordInbound {
    rest: Rest,
    channels: Arc<ChannelKinds>,
    shards: Shards,
    /// `LULL_GROUP_CONTEXT` is on: guild messages not addressed to lull are passed on.
    overhear: bool,
    /// `LULL_DISCORD_AUTO_THREAD`: mentions in guild channels are answered in a thread.
    auto_thread: bool,
}

impl DiscordInbound {
    pub(crate) fn new(
        rest: Rest,
        channels: Arc<ChannelKinds>,
        shards: Shards,
        overhear: bool,
        auto_thread: bool,
    ) -> Self {
        Self {
            rest,
            channels,
            shards,
            overhear,
            auto_thread,
        }
    }
}

#[async_trait]
impl Inbound for DiscordInbound {
    fn platform(&self) -> Platform {
        Platform::Discord
    }

    /// `LULL_DISCORD_SHARDS`; for `auto`, the count Discord recommends for the bot
    /// (`GET /gateway/bot`), read once at start.
    async fn shards(&self) -> Result<u32, SessionEnd> {
        match self.shards {
            Shards::Fixed(n) => Ok(n),
            Shards::Auto => {
                let gateway =
                    self.rest.http.get_bot_gateway().await.map_err(|e| {
                        self.rest_failure("asking for the recommended shard count", &e)
                    })?;
                tracing::info!(
                    shards = gateway.shards,
                    "Discord recommends this many shards (LULL_DISCORD_SHARDS=auto)"
                );
                Ok(gateway.shards.max(1))
            }
        }
    }

    async fn session(&self, intake: &dyn Intake, session: &Session) -> SessionEnd {
        let (end, ready) = self.connected(intake, session).await;
        match end {
            SessionEnd::Failed { reason, .. } => SessionEnd::Failed {
                reason,
                connected: ready,
            },
            other => other,
        }
    }
}

impl DiscordInbound {
    /// One gateway session under the lease: connect, store events until the session
    /// ends or the connection fails, then disconnect and store what is still queued.
    /// Also says whether the session got as far as READY.
    async fn connected(&self, intake: &dyn Intake, session: &Session) -> (SessionEnd, bool) {
        session.report(AdapterState::Starting);
        let connect = async {
            let bot = self.whoami().await?;
            let gateway_url = self
                .rest
                .http
                .get_gateway()
                .await
                .map_err(|e| self.rest_failure("reading the gateway URL", &e))?
                .url;
            Ok::<_, SessionEnd>((bot, gateway_url))
        };
        let (bot, gateway_url) = tokio::select! {
            connected = connect => match connected {
                Ok(connected) => connected,
                Err(end) => return (end, false),
            },
            end = session.ended() => return (end, false),
        };

        let (events, mut queue) = mpsc::unbounded_channel();
        let retired = CancellationToken::new();
        let manager = Arc::new(OnceLock::new());
        let handler = Handler {
            rest: self.rest.clone(),
            events,
            retired: retired.clone(),
            manager: manager.clone(),
        };
        let mut client = match ClientBuilder::new_with_http(self.rest.http_for_gateway(), intents())
            .event_handler(handler)
            .await
        {
            Ok(client) => client,
            Err(e) => return (failed(self.rest.redactor.redact(e)), false),
        };
        // serenity asked for the gateway URL again while building, and falls back to
        // Discord's own on failure: use the one read above, from DISCORD_API_URL.
        *client.ws_url.lock().await = gateway_url;
        let shards = client.shard_manager.clone();
        let _ = manager.set(shards.clone());
        // This shard alone, of the total: IDENTIFY carries `shard: [index, total]`, so
        // Discord sends it only its guilds' events.
        let shard = session.shard();
        let mut running =
            tokio::spawn(async move { client.start_shard(shard.index(), shard.total()).await });
        tracing::info!(bot = %bot.name, %shard, "connecting to the Discord gateway");

        let mut feeder = Feeder {
            intake,
            rest: self.rest.clone(),
            channels: self.channels.clone(),
            session,
            bot,
            overhear: self.overhear,
            auto_thread: self.auto_thread,
            ready: false,
        };
        let end = tokio::select! {
            end = session.ended() => end,
            () = feeder.run(&mut queue) => failed("the gateway event stream ended"),
            ended = &mut running => match ended {
                Ok(Ok(())) => failed("the gateway connection closed"),
                Ok(Err(e)) => self.gateway_failure(e),
                Err(e) => failed(format!("the gateway task failed: {e}")),
            },
        };

        // Leave the gateway first, so no second session lingers beside the next
        // holder's. A shard still waiting to reconnect has no runner to stop yet; the
        // handler stops it if it ever connects (see `Handler::retire`).
        retired.cancel();
        if tokio::time::timeout(Duration::from_secs(10), shards.shutdown_all())
            .await
            .is_err()
        {
            tracing::warn!("the Discord gateway did not close in time");
        }
        running.abort();
        feeder.drain(&mut queue).await;
        (end, feeder.ready)
    }

    /// Who the bot is (`GET /users/@me`). A failure ends this attempt; the run loop
    /// tries again after a pause.
    async fn whoami(&self) -> Result<BotIdentity, SessionEnd> {
        let user = self
            .rest
            .http
            .get_current_user()
            .await
            .map_err(|e| self.rest_failure("reading the bot's own user", &e))?;
        Ok(BotIdentity {
            id: user.id,
            name: user.name.clone(),
        })
    }

    fn rest_failure(&self, doing: &str, error: &serenity::Error) -> SessionEnd {
        let status = match error {
            serenity::Error::Http(e) => e.status_code().map(|s| s.as_u16()),
            _ => None,
        };
        let reason = match from_serenity(error, &self.rest.redactor) {
            SendError::RetryAfter(wait) => format!("rate limited for {wait:?}"),
            SendError::Transient(e) | SendError::Permanent(e) => e,
        };
        if status == Some(401) {
            SessionEnd::Fatal(format!(
                "Discord refused DISCORD_BOT_TOKEN while {doing} (HTTP 401); check the bot token"
            ))
        } else {
            failed(format!("{doing}: {reason}"))
        }
    }

    fn gateway_failure(&self, error: serenity::Error) -> SessionEnd {
        match error {
            serenity::Error::Gateway(GatewayError::InvalidAuthentication) => SessionEnd::Fatal(
                "the Discord gateway refused DISCORD_BOT_TOKEN; check the bot token".into(),
            ),
            serenity::Error::Gateway(
                GatewayError::DisallowedGatewayIntents | GatewayError::InvalidGatewayIntents,
            ) => SessionEnd::Fatal(
                "the Discord gateway refused the intents lull needs: enable MESSAGE CONTENT INTENT \
                 under Bot → Privileged Gateway Intents in the Discord developer portal"
                    .into(),
            ),
            other => failed(self.rest.redactor.redact(other)),
        }
    }
}

/// A failed session; whether it got as far as READY is filled in by the caller.
fn failed(reason: impl Into<String>) -> SessionEnd {
    SessionEnd::Failed {
        reason: reason.into(),
        connected: false,
    }
}
