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
//!   the core's intake returned `Ok`: a database error or a crash between
//!   fetching and storing loses nothing, the update comes again and the core
//!   deduplicates it by message id. The first poll sends no offset, so updates left
//!   unconfirmed by an earlier process (or a crash) are fetched, never dropped.
//! - A webhook, if one is set, blocks `getUpdates`; it is deleted without dropping
//!   pending updates.
//! - teloxide's client gives a request 17 s in all, so polls wait at most
//!   [`POLL_TIMEOUT`] on the server.

use std::time::Duration;

use async_trait::async_trait;
use teloxide::payloads::{DeleteWebhookSetters, GetUpdatesSetters};
use teloxide::requests::{Request, Requester};
use teloxide::types::Update;
use teloxide::{ApiError, Bot, RequestError};

use super::translate::{BotIdentity, Translator};
use super::{ALLOWED_UPDATES, BACKOFF, Redactor, answer_tap, request_error};
use lull_port::domain::{Platform, Timestamp};
use lull_port::health::AdapterState;
use lull_port::{Accepted, Inbound, IngestError, Intake, Session, SessionEnd};

/// The longest a poll waits on the server for updates.
pub(super) const POLL_TIMEOUT: Duration = Duration::from_secs(10);
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
    /// `LULL_MAX_IMAGE_BYTES`: which size of a photo is kept.
    max_image_bytes: u64,
    /// `LULL_GROUP_CONTEXT` is on: group messages not addressed to lull are passed on.
    overhear: bool,
}

/// Why an update could not be stored.
enum Unstored {
    /// The database failed (busy, full, unreachable): fetch it again after a pause.
    Retry(String),
    /// The process is miswired: stop the adapter.
    Fatal(String),
}

/// The message of a rejected token: trying again cannot help.
const REJECTED: &str = "Telegram rejected the bot token (TELEGRAM_BOT_TOKEN)";

impl TelegramInbound {
    pub(super) fn new(bot: Bot, redactor: Redactor, max_image_bytes: u64, overhear: bool) -> Self {
        Self {
            bot,
            redactor,
            max_image_bytes,
            overhear,
        }
    }

    /// Who the bot is (for mentions and commands), retried until it answers. A
    /// rejected token is fatal.
    async fn identify(&self, session: &Session) -> Result<BotIdentity, SessionEnd> {
        let mut failures = 0;
        loop {
            let attempt = tokio::select! {
                r = self.bot.get_me().send() => r,
                end = session.ended() => return Err(end),
            };
            let wait = match attempt {
                Ok(me) => {
                    let username = me.user.username.clone().unwrap_or_default();
                    tracing::info!(bot = %username, "connected to Telegram");
                    session.report(AdapterState::Up);
                    return Ok(BotIdentity {
                        id: me.user.id.0,
                        username,
                    });
                }
                Err(RequestError::Api(ApiError::InvalidToken)) => {
                    return Err(SessionEnd::Fatal(REJECTED.into()));
                }
                Err(RequestError::RetryAfter(wait)) => wait.duration(),
                Err(e) => {
                    let reason = request_error(&self.redactor, e);
                    tracing::warn!(error = %reason, "cannot reach the Telegram Bot API; retrying");
                    session.report(AdapterState::Down(reason));
                    failures += 1;
                    BACKOFF.delay(failures)
                }
            };
            if let Some(end) = session.pause(wait).await {
                return Err(end);
            }
        }
    }

    /// Poll while this process holds the poller lease.
    async fn poll(&self, intake: &dyn Intake, session: &Session) -> SessionEnd {
        let me = match self.identify(session).await {
            Ok(me) => me,
            Err(end) => return end,
        };
        let mut translator = Translator::new(me, self.max_image_bytes).overhearing(self.overhear);
        // None: start at the earliest unconfirmed update.
        let mut offset: Option<i32> = None;
        let mut failures = 0;
        loop {
            // Every poll must end before the lease it runs under could expire.
            let left = Timestamp::now().until(session.expires_at());
            let Some(room) = left.checked_sub(LEASE_MARGIN).filter(|r| !r.is_zero()) else {
                // The renewal is late: wait for it (or for the lease to be lost).
                if let Some(end) = session.pause(Duration::from_millis(50)).await {
                    return end;
                }
                continue;
            };
            let timeout = room.min(POLL_TIMEOUT).as_secs() as u32;
            let mut request = self
                .bot
                .get_updates()
                .timeout(timeout)
                .allowed_updates(ALLOWED_UPDATES);
            if let Some(offset) = offset {
                request = request.offset(offset);
            }
            let polled = tokio::select! {
                r = request.send() => r,
                // The updates stored since the last poll stay unconfirmed: the next
                // poller fetches them again and the core deduplicates them.
                end = session.ended() => return end,
            };
            let wait = match polled {
                Ok(updates) => {
                    session.report(AdapterState::Up);
                    failures = 0;
                    let empty = updates.is_empty();
                    match self
                        .ingest_all(intake, &mut translator, updates, &mut offset)
                        .await
                    {
                        Ok(()) if empty && timeout == 0 => SHORT_POLL_PAUSE,
                        Ok(()) => continue,
                        Err(Unstored::Fatal(e)) => return SessionEnd::Fatal(e),
                        Err(Unstored::Retry(e)) => {
                            tracing::warn!(error = %e, "could not store an update; it stays unconfirmed and is fetched again");
                            failures += 1;
                            BACKOFF.delay(failures)
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
                    failures += 1;
                    BACKOFF.delay(failures)
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
                    failures += 1;
                    BACKOFF.delay(failures)
                }
                Err(RequestError::Api(ApiError::InvalidToken)) => {
                    return SessionEnd::Fatal(REJECTED.into());
                }
                Err(e) => {
                    let reason = request_error(&self.redactor, e);
                    tracing::warn!(error = %reason, "polling Telegram failed; retrying");
                    session.report(AdapterState::Down(reason));
                    failures += 1;
                    BACKOFF.delay(failures)
                }
            };
            if let Some(end) = session.pause(wait).await {
                return end;
            }
        }
    }

    /// Hand every update to the core, in order, moving `offset` past each one it
    /// stored (or deliberately skipped). Stops at the first that could not be
    /// stored.
    async fn ingest_all(
        &self,
        intake: &dyn Intake,
        translator: &mut Translator,
        updates: Vec<Update>,
        offset: &mut Option<i32>,
    ) -> Result<(), Unstored> {
        for update in updates {
            let next = update.id.0 as i32 + 1;
            let Some(incoming) = translator.translate(&update) else {
                tracing::debug!(update = update.id.0, "update ignored");
                answer_tap(&self.bot, &self.redactor, &update);
                *offset = Some(next);
                continue;
            };
            let conversation = incoming.conversation.clone();
            match intake.ingest(incoming).await {
                Ok(accepted) => {
                    if accepted == Accepted::Denied {
                        tracing::debug!(%conversation, "message from a user not allowed");
                    }
                }
                Err(e @ (IngestError::Empty | IngestError::TooLong { .. })) => {
                    tracing::info!(%conversation, error = %e, "message refused");
                }
                Err(IngestError::UnknownPlatform(p)) => {
                    return Err(Unstored::Fatal(format!("the core serves no {p} adapter")));
                }
                Err(e @ IngestError::NotStored(_)) => return Err(Unstored::Retry(e.to_string())),
            }
            answer_tap(&self.bot, &self.redactor, &update);
            *offset = Some(next);
        }
        Ok(())
    }
}

#[async_trait]
impl Inbound for TelegramInbound {
    fn platform(&self) -> Platform {
        Platform::Telegram
    }

    async fn session(&self, intake: &dyn Intake, session: &Session) -> SessionEnd {
        session.report(AdapterState::Starting);
        self.poll(intake, session).await
    }
}
