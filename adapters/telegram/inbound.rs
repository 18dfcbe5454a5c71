//! Receiving from Telegram: one long-poller per bot token, elected among processes.
//!
//! Telegram facts this relies on:
//! - Only one `getUpdates` may be open per token; a concurrent one gets 409 Conflict.
//!   So a process polls only while it holds the platform's poller lease, and every
//!   poll ends before that lease would expire unrenewed: its `timeout` is cut to the
//!   lease's remaining time, and no poll starts on a lease about to lapse. A standby
//!   process can therefore take over as soon as the lease is free without meeting a
//!   poll of the old holder. (`timeout` is in whole seconds and a lease is renewed
//!   when a third of its TTL is gone, so with `LULL_LEASE_TTL_MS` under about 2.3 s
//!   no poll can wait on the server: they become short polls, 250 ms apart.)
//! - An update is *confirmed* (never delivered again) once `getUpdates` is called
//!   with an `offset` above its id. The offset moves past an update only after
//!   [`Dispatcher::ingest`] returned `Ok`: a database error or a crash between
//!   fetching and storing loses nothing, the update comes again and the core
//!   deduplicates it by message id. The first poll sends no offset, so updates left
//!   unconfirmed by an earlier process (or a crash) are fetched, never dropped.
//! - A webhook, if one is set, blocks `getUpdates`; it is deleted without dropping
//!   pending updates.
//! - teloxide's client gives a request 17 s in all, so polls wait at most
//!   [`POLL_TIMEOUT`] on the server.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use teloxide::payloads::{DeleteWebhookSetters, GetUpdatesSetters};
use teloxide::requests::{Request, Requester};
use teloxide::types::{AllowedUpdate, Update};
use teloxide::{ApiError, Bot, RequestError};
use tokio_util::sync::CancellationToken;

use super::translate::{BotIdentity, Translator};
use super::{Backoff, Redactor, request_error};
use crate::clock::{Clock, SystemClock};
use crate::dispatcher::{Accepted, Dispatcher, IngestError, LeaseKeeper};
use crate::domain::Platform;
use crate::health::{AdapterState, Health};
use crate::platform::Inbound;

/// The longest a poll waits on the server for updates.
pub const POLL_TIMEOUT: Duration = Duration::from_secs(10);
/// Time kept between the end of a poll and the expiry of the lease it runs under
/// (the response's way back, a renewal landing late).
const LEASE_MARGIN: Duration = Duration::from_millis(500);
/// Pause after an empty poll that could not wait on the server (a lease too short
/// for long polling), so such polls do not spin.
const SHORT_POLL_PAUSE: Duration = Duration::from_millis(250);

/// The receiving half: polls only while this process holds the Telegram poller
/// lease (standing by otherwise), and moves the offset past an update only once the
/// core has stored it.
pub struct TelegramInbound {
    /// Never printed: its `Debug` shows the token.
    bot: Bot,
    redactor: Redactor,
}

/// Why an update could not be stored.
enum Unstored {
    /// The database failed (busy, full, unreachable): fetch it again after a pause.
    Retry(String),
    /// The process is miswired: stop the adapter.
    Fatal(anyhow::Error),
}

/// Why a polling session ended.
enum Stop {
    Shutdown,
    LeaseLost,
}

impl TelegramInbound {
    pub(super) fn new(bot: Bot, redactor: Redactor) -> Self {
        Self { bot, redactor }
    }

    /// Who the bot is (for mentions and commands), retried until it answers. A
    /// rejected token is fatal.
    async fn identify(
        &self,
        health: &Health,
        keeper: &LeaseKeeper,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Result<BotIdentity, Stop>> {
        let mut backoff = Backoff::new();
        loop {
            let attempt = tokio::select! {
                r = self.bot.get_me().send() => r,
                () = keeper.lost() => return Ok(Err(Stop::LeaseLost)),
                () = shutdown.cancelled() => return Ok(Err(Stop::Shutdown)),
            };
            let wait = match attempt {
                Ok(me) => {
                    let username = me.user.username.clone().unwrap_or_default();
                    tracing::info!(bot = %username, "connected to Telegram");
                    health.set(Platform::Telegram, AdapterState::Up);
                    return Ok(Ok(BotIdentity {
                        id: me.user.id.0,
                        username,
                    }));
                }
                Err(RequestError::Api(ApiError::InvalidToken)) => {
                    anyhow::bail!("Telegram rejected the bot token (TELEGRAM_BOT_TOKEN)");
                }
                Err(RequestError::RetryAfter(wait)) => wait.duration(),
                Err(e) => {
                    let reason = request_error(&self.redactor, e);
                    tracing::warn!(error = %reason, "cannot reach the Telegram Bot API; retrying");
                    health.set(Platform::Telegram, AdapterState::Down(reason));
                    backoff.next()
                }
            };
            if let Some(stop) = pause(wait, keeper, shutdown).await {
                return Ok(Err(stop));
            }
        }
    }

    /// Poll while this process holds the poller lease.
    async fn poll(
        &self,
        dispatcher: &Dispatcher,
        health: &Health,
        keeper: &LeaseKeeper,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<Stop> {
        let me = match self.identify(health, keeper, shutdown).await? {
            Ok(me) => me,
            Err(stop) => return Ok(stop),
        };
        let mut translator = Translator::new(me);
        // None: start at the earliest unconfirmed update.
        let mut offset: Option<i32> = None;
        let mut backoff = Backoff::new();
        let clock = SystemClock;
        loop {
            // Every poll must end before the lease it runs under could expire.
            let left = clock.now().until(keeper.lease().expires_at);
            let Some(room) = left.checked_sub(LEASE_MARGIN).filter(|r| !r.is_zero()) else {
                // The renewal is late: wait for it (or for the lease to be lost).
                if let Some(stop) = pause(Duration::from_millis(50), keeper, shutdown).await {
                    return Ok(stop);
                }
                continue;
            };
            let timeout = room.min(POLL_TIMEOUT).as_secs() as u32;
            let mut request = self
                .bot
                .get_updates()
                .timeout(timeout)
                .allowed_updates([AllowedUpdate::Message, AllowedUpdate::EditedMessage]);
            if let Some(offset) = offset {
                request = request.offset(offset);
            }
            let polled = tokio::select! {
                r = request.send() => r,
                () = keeper.lost() => return Ok(Stop::LeaseLost),
                // The updates stored since the last poll stay unconfirmed: the next
                // poller fetches them again and the core deduplicates them.
                () = shutdown.cancelled() => return Ok(Stop::Shutdown),
            };
            let wait = match polled {
                Ok(updates) => {
                    health.set(Platform::Telegram, AdapterState::Up);
                    backoff.reset();
                    let empty = updates.is_empty();
                    match self
                        .ingest_all(dispatcher, &mut translator, updates, &mut offset)
                        .await
                    {
                        Ok(()) if empty && timeout == 0 => SHORT_POLL_PAUSE,
                        Ok(()) => continue,
                        Err(Unstored::Fatal(e)) => return Err(e),
                        Err(Unstored::Retry(e)) => {
                            tracing::warn!(error = %e, "could not store an update; it stays unconfirmed and is fetched again");
                            backoff.next()
                        }
                    }
                }
                Err(RequestError::RetryAfter(wait)) => {
                    tracing::warn!(
                        wait_secs = wait.seconds(),
                        "Telegram asked to slow down (429)"
                    );
                    wait.duration()
                }
                Err(RequestError::Api(ApiError::TerminatedByOtherGetUpdates)) => {
                    // Another process (or another program) polls with this token.
                    tracing::warn!(
                        "Telegram reports another poller for this bot token (409 Conflict); backing off"
                    );
                    backoff.next()
                }
                Err(RequestError::Api(ApiError::CantGetUpdates)) => {
                    tracing::warn!(
                        "a webhook is set for this bot; deleting it (pending updates are kept) to poll"
                    );
                    if let Err(e) = self
                        .bot
                        .delete_webhook()
                        .drop_pending_updates(false)
                        .send()
                        .await
                    {
                        tracing::warn!(error = %request_error(&self.redactor, e), "could not delete the webhook");
                    }
                    backoff.next()
                }
                Err(RequestError::Api(ApiError::InvalidToken)) => {
                    anyhow::bail!("Telegram rejected the bot token (TELEGRAM_BOT_TOKEN)");
                }
                Err(e) => {
                    let reason = request_error(&self.redactor, e);
                    tracing::warn!(error = %reason, "polling Telegram failed; retrying");
                    health.set(Platform::Telegram, AdapterState::Down(reason));
                    backoff.next()
                }
            };
            if let Some(stop) = pause(wait, keeper, shutdown).await {
                return Ok(stop);
            }
        }
    }

    /// Hand every update to the core, in order, moving `offset` past each one it
    /// stored (or deliberately skipped). Stops at the first that could not be
    /// stored.
    async fn ingest_all(
        &self,
        dispatcher: &Dispatcher,
        translator: &mut Translator,
        updates: Vec<Update>,
        offset: &mut Option<i32>,
    ) -> Result<(), Unstored> {
        for update in updates {
            let next = update.id.0 as i32 + 1;
            let Some(incoming) = translator.translate(&update) else {
                tracing::debug!(update = update.id.0, "update ignored");
                *offset = Some(next);
                continue;
            };
            let conversation = incoming.conversation.clone();
            match dispatcher.ingest(incoming).await {
                Ok(accepted) => {
                    if accepted == Accepted::Denied {
                        tracing::debug!(%conversation, "message from a user not allowed");
                    }
                }
                Err(e @ (IngestError::Empty | IngestError::TooLong { .. })) => {
                    tracing::info!(%conversation, error = %e, "message refused");
                }
                Err(IngestError::UnknownPlatform(p)) => {
                    return Err(Unstored::Fatal(anyhow::anyhow!(
                        "the dispatcher has no {p} adapter"
                    )));
                }
                Err(IngestError::Store(e)) => return Err(Unstored::Retry(e.to_string())),
            }
            *offset = Some(next);
        }
        Ok(())
    }
}

/// Sleep, unless the lease is lost or shutdown comes first.
async fn pause(wait: Duration, keeper: &LeaseKeeper, shutdown: &CancellationToken) -> Option<Stop> {
    tokio::select! {
        () = tokio::time::sleep(wait) => None,
        () = keeper.lost() => Some(Stop::LeaseLost),
        () = shutdown.cancelled() => Some(Stop::Shutdown),
    }
}

#[async_trait]
impl Inbound for TelegramInbound {
    fn platform(&self) -> Platform {
        Platform::Telegram
    }

    async fn run(
        self: Box<Self>,
        dispatcher: Arc<Dispatcher>,
        health: Health,
        shutdown: CancellationToken,
    ) -> anyhow::Result<()> {
        loop {
            let elected = dispatcher
                .elect_poller(Platform::Telegram, &health, &shutdown)
                .await;
            let Some(keeper) = elected else {
                return Ok(());
            };
            health.set(Platform::Telegram, AdapterState::Starting);
            let outcome = self.poll(&dispatcher, &health, &keeper, &shutdown).await;
            match outcome {
                Ok(Stop::LeaseLost) => {
                    tracing::warn!("lost the Telegram poller lease; standing by");
                }
                Ok(Stop::Shutdown) => {
                    keeper.release().await;
                    return Ok(());
                }
                Err(e) => {
                    keeper.release().await;
                    return Err(e);
                }
            }
        }
    }
}
