//! Handing a session's gateway events to the core: one at a time, events that
//! arrived together sorted by message id, each update retried until it is stored
//! (never skipped: a later message stored in its place would move the catch-up
//! point past it).
//!
//! What each event becomes: a message or edit translated and stored (opened in a
//! thread of its own with `LULL_DISCORD_AUTO_THREAD`), a click or slash command
//! stored as the message it spells, typing applied best effort, and READY the
//! catch-up from history (in `catch_up`) before any live event after it is stored.

use std::sync::Arc;
use std::time::Duration;

use serenity::all::Message;
use tokio::sync::mpsc;

use super::events::GatewayEvent;
use crate::discord::translate::{self, BotIdentity};
use crate::discord::{ChannelKinds, Place, Rest, slash, threads};
use lull_port::health::AdapterState;
use lull_port::{Accepted, Backoff, Incoming, IncomingKind, IngestError, Intake, Session};

/// Events that arrive within this window are stored in message-id order.
const SETTLE: Duration = Duration::from_millis(10);
/// How long queued events may still be stored after the session ended.
const DRAIN_FOR: Duration = Duration::from_secs(2);
/// Waits before handing the core an update it could not store yet.
pub(super) const STORE_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(5));

/// Hands gateway events to the core one at a time, in order, each until it is stored.
pub(super) struct Feeder<'a> {
    pub(super) intake: &'a dyn Intake,
    pub(super) rest: Rest,
    pub(super) channels: Arc<ChannelKinds>,
    pub(super) session: &'a Session,
    pub(super) bot: BotIdentity,
    /// `LULL_GROUP_CONTEXT` is on: guild messages not addressed to lull are passed on.
    pub(super) overhear: bool,
    /// `LULL_DISCORD_AUTO_THREAD`: mentions in guild channels are answered in a
    /// thread; unaddressed messages are passed on (the core answers those in its
    /// threads).
    pub(super) auto_thread: bool,
    /// Whether the session got as far as READY.
    pub(super) ready: bool,
}

impl Feeder<'_> {
    /// Runs until the queue closes; the session ends it by dropping the future.
    pub(super) async fn run(&mut self, queue: &mut mpsc::UnboundedReceiver<GatewayEvent>) {
        while let Some(first) = queue.recv().await {
            tokio::time::sleep(SETTLE).await;
            let mut batch = vec![first];
            while let Ok(event) = queue.try_recv() {
                batch.push(event);
            }
            batch.sort_by_key(GatewayEvent::order);
            for event in batch {
                self.handle(event).await;
            }
        }
    }

    /// Store what is still queued, briefly and without catch-up: the next session's
    /// catch-up reads back anything left.
    pub(super) async fn drain(&mut self, queue: &mut mpsc::UnboundedReceiver<GatewayEvent>) {
        let mut batch = Vec::new();
        while let Ok(event) = queue.try_recv() {
            if !matches!(event, GatewayEvent::Ready | GatewayEvent::Resumed) {
                batch.push(event);
            }
        }
        if batch.is_empty() {
            return;
        }
        batch.sort_by_key(GatewayEvent::order);
        let drained = async {
            for event in batch {
                self.handle(event).await;
            }
        };
        if tokio::time::timeout(DRAIN_FOR, drained).await.is_err() {
            tracing::warn!(
                "not every queued Discord message was stored before disconnecting; the next session reads them back"
            );
        }
    }

    async fn handle(&mut self, event: GatewayEvent) {
        match event {
            GatewayEvent::Ready => {
                tracing::info!(bot = %self.bot.name, "connected to the Discord gateway");
                self.ready = true;
                self.session.report(AdapterState::Up);
                self.catch_up().await;
            }
            GatewayEvent::Resumed => {
                tracing::info!("Discord gateway session resumed");
                self.session.report(AdapterState::Up);
            }
            GatewayEvent::Message(message) => {
                let in_guild = message.guild_id.is_some();
                let place = match message.guild_id {
                    Some(guild) => Place::Guild(Some(guild)),
                    None => Place::Dm,
                };
                self.channels.remember(message.channel_id, place);
                match self.translated(&message, in_guild) {
                    // Opened in a thread's channel, the thread is refused and the
                    // mention answered where it is.
                    Some(incoming)
                        if self.auto_thread && in_guild && incoming.kind == IncomingKind::New =>
                    {
                        let incoming = threads::open(&self.rest, &message, incoming).await;
                        self.store(incoming).await;
                    }
                    Some(incoming) => self.store(incoming).await,
                    None => {}
                }
            }
            GatewayEvent::Edit(event) => {
                if let Some(incoming) = translate::edit(&event, &self.bot) {
                    self.store(incoming).await;
                }
            }
            GatewayEvent::Typing(event) => {
                let (conversation, user) = translate::typing(&event);
                // Best effort: a typing event that is not heard only costs a wait.
                if let Err(e) = self.intake.typing(conversation, user).await {
                    tracing::debug!(error = %e, "a Discord typing event was not applied");
                }
            }
            GatewayEvent::Tap(click) => {
                let place = match click.guild_id {
                    Some(guild) => Place::Guild(Some(guild)),
                    None => Place::Dm,
                };
                self.channels.remember(click.channel_id, place);
                match translate::tapped(&click, &self.bot) {
                    Some(incoming) => self.store(incoming).await,
                    None => tracing::debug!(
                        interaction = click.id.get(),
                        "a button click that is no quick reply of lull's; ignored"
                    ),
                }
            }
            GatewayEvent::Slash(command) => {
                let place = command
                    .guild_id
                    .map_or(Place::Dm, |g| Place::Guild(Some(g)));
                self.channels.remember(command.channel_id, place);
                if let Some(incoming) = slash::incoming(&command, &self.bot) {
                    self.store(incoming).await;
                }
            }
        }
    }

    /// A message for the core: addressed to lull, or overheard when the core may want
    /// it (group context, lull's threads, where no mention is needed).
    pub(super) fn translated(&self, message: &Message, in_guild: bool) -> Option<Incoming> {
        translate::new_message(message, &self.bot, in_guild).or_else(|| {
            let heard = translate::overheard(message, &self.bot, in_guild);
            heard.filter(|_| self.overhear || self.auto_thread)
        })
    }

    /// Hand one update to the core until it is stored (or refused for good).
    pub(super) async fn store(&self, incoming: Incoming) {
        let mut failures = 0;
        loop {
            match self.intake.ingest(incoming.clone()).await {
                Ok(accepted) => {
                    if !matches!(accepted, Accepted::Stored { .. }) {
                        tracing::debug!(conversation = %incoming.conversation, message = %incoming.message_id, ?accepted, "Discord message handled");
                    }
                    return;
                }
                Err(e @ IngestError::NotStored(_)) => {
                    failures += 1;
                    let wait = STORE_BACKOFF.delay(failures);
                    tracing::warn!(conversation = %incoming.conversation, message = %incoming.message_id, error = %e, retry_in_ms = wait.as_millis() as u64, "cannot store a Discord message yet; retrying");
                    tokio::time::sleep(wait).await;
                }
                Err(e) => {
                    tracing::warn!(conversation = %incoming.conversation, message = %incoming.message_id, error = %e, "Discord message refused");
                    return;
                }
            }
        }
    }
}
