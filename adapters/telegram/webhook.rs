//! Receiving from Telegram by webhook (`LULL_TELEGRAM_WEBHOOK_URL`): Telegram POSTs
//! each update to a public HTTPS URL, so every replica behind a load balancer can
//! receive, and no poller lease is needed (no process polls).
//!
//! Telegram facts this relies on (Bot API `setWebhook`):
//! - `setWebhook` takes `url`, `secret_token` (1–256 characters `A-Z a-z 0-9 _ -`),
//!   `allowed_updates` and `drop_pending_updates`; every update is then POSTed to the
//!   URL as JSON with the header `X-Telegram-Bot-Api-Secret-Token: <secret_token>`.
//!   Setting the same webhook again is harmless, so every replica registers it at
//!   start, with the same secret (derived from the bot token, see [`webhook_secret`]).
//! - An update answered with anything but a 2xx is delivered again later (Telegram
//!   gives up after a number of attempts). So an update is answered 200 only once the
//!   core's intake stored it; a database failure answers 503 and the redelivery is
//!   stored once (the core deduplicates by message id).
//! - While a webhook is set `getUpdates` is refused: webhook and long polling exclude
//!   each other for one bot. A process in polling mode deletes the webhook (keeping
//!   pending updates), so all replicas of one bot must use the same mode.
//! - Updates may arrive concurrently (up to `max_connections`, 40 by default) and on
//!   any replica, so their order is not guaranteed; the core's version counter and
//!   debounce make a burst one reply however it was split.

use std::sync::{Arc, Mutex, OnceLock};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use sha2::Sha256;
use teloxide::payloads::SetWebhookSetters;
use teloxide::requests::{Request, Requester};
use teloxide::types::Update;
use teloxide::{ApiError, Bot, RequestError};
use tokio_util::sync::CancellationToken;

use super::translate::{BotIdentity, Translator};
use super::{ALLOWED_UPDATES, BACKOFF, Redactor, answer_tap, request_error};
use lull_port::domain::Platform;
use lull_port::health::{AdapterState, Health};
use lull_port::{Accepted, IngestError, Intake};

/// The header Telegram sends the `secret_token` in.
pub const SECRET_HEADER: &str = "x-telegram-bot-api-secret-token";

/// The `secret_token` of this bot's webhook: an HMAC-SHA256 of the bot token, in hex
/// (64 characters, all allowed by Telegram). Every replica derives the same one, and
/// it reveals nothing of the token.
pub fn webhook_secret(token: &SecretString) -> SecretString {
    let mut mac = Hmac::<Sha256>::new_from_slice(token.expose_secret().as_bytes())
        .expect("HMAC takes keys of any length");
    mac.update(b"lull telegram webhook secret_token v1");
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    SecretString::from(hex)
}

/// The webhook half of the Telegram adapter: registers the webhook, then serves its
/// route on the binary's HTTP server.
pub struct TelegramWebhook {
    /// Never printed: its `Debug` shows the token.
    bot: Bot,
    redactor: Redactor,
    url: url::Url,
    receiver: Arc<Receiver>,
}

/// What the route needs to take an update.
struct Receiver {
    /// Answers tapped buttons (`answerCallbackQuery`). Never printed: its `Debug`
    /// shows the token.
    bot: Bot,
    redactor: Redactor,
    secret: SecretString,
    /// `LULL_MAX_IMAGE_BYTES`: which size of a photo is kept.
    max_image_bytes: u64,
    /// `LULL_GROUP_CONTEXT` is on: group messages not addressed to lull are passed on.
    overhear: bool,
    /// Who the bot is (`getMe`), known once registration got that far: updates
    /// arriving before are answered 503 (Telegram delivers them again).
    me: OnceLock<BotIdentity>,
    /// Group filtering remembers recent albums and senders. A std mutex: held for one
    /// translation, never across an await.
    translator: Mutex<Option<Translator>>,
}

/// The message of a rejected token: trying again cannot help.
const REJECTED: &str = "Telegram rejected the bot token (TELEGRAM_BOT_TOKEN)";

impl TelegramWebhook {
    pub(super) fn new(
        bot: Bot,
        redactor: Redactor,
        url: url::Url,
        secret: SecretString,
        max_image_bytes: u64,
        overhear: bool,
    ) -> Self {
        lull_port::secrets::register(&secret);
        let receiver = Arc::new(Receiver {
            bot: bot.clone(),
            redactor: redactor.clone(),
            secret,
            max_image_bytes,
            overhear,
            me: OnceLock::new(),
            translator: Mutex::new(None),
        });
        Self {
            bot,
            redactor,
            url,
            receiver,
        }
    }

    /// The path Telegram POSTs to: the path of `LULL_TELEGRAM_WEBHOOK_URL` (a reverse
    /// proxy in front must keep it).
    pub fn path(&self) -> &str {
        self.url.path()
    }

    /// The route for the binary's HTTP server. A request without the right secret
    /// token is answered 401 and nothing is stored; an update is answered 200 only
    /// once `intake` stored it (or deliberately did not), 503 when it could not be
    /// stored, so Telegram delivers it again.
    pub fn routes(&self, intake: Arc<dyn Intake>) -> Router {
        Router::new()
            .route(self.path(), post(receive))
            .with_state((self.receiver.clone(), intake))
    }

    /// Learn who the bot is and register the webhook (`setWebhook` with the URL, the
    /// secret token and the update types lull reads; pending updates are kept),
    /// retrying until Telegram answers. `Ok` once registered or when `shutdown` fired
    /// first; an error when trying again cannot help (a rejected token, a URL Telegram
    /// refuses), naming what to fix.
    pub async fn register(
        &self,
        health: &Health,
        shutdown: &CancellationToken,
    ) -> Result<(), String> {
        health.set(Platform::Telegram, AdapterState::Starting);
        let mut failures = 0;
        loop {
            let attempt = tokio::select! {
                attempt = self.try_register() => attempt,
                () = shutdown.cancelled() => return Ok(()),
            };
            let wait = match attempt {
                Ok(()) => {
                    tracing::info!(url = %self.url, "Telegram webhook registered; updates arrive by HTTP, no process polls");
                    health.set(Platform::Telegram, AdapterState::Up);
                    return Ok(());
                }
                Err(RequestError::Api(ApiError::InvalidToken)) => {
                    health.set(Platform::Telegram, AdapterState::Down(REJECTED.into()));
                    return Err(REJECTED.into());
                }
                Err(RequestError::Api(e)) => {
                    let reason = format!(
                        "Telegram refused the webhook (check LULL_TELEGRAM_WEBHOOK_URL): {}",
                        self.redactor.redact(&e)
                    );
                    health.set(Platform::Telegram, AdapterState::Down(reason.clone()));
                    return Err(reason);
                }
                Err(RequestError::RetryAfter(wait)) => wait.duration(),
                Err(e) => {
                    let reason = request_error(&self.redactor, e);
                    tracing::warn!(error = %reason, "cannot register the Telegram webhook yet; retrying");
                    health.set(Platform::Telegram, AdapterState::Down(reason));
                    failures += 1;
                    BACKOFF.delay(failures)
                }
            };
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = shutdown.cancelled() => return Ok(()),
            }
        }
    }

    async fn try_register(&self) -> Result<(), RequestError> {
        if self.receiver.me.get().is_none() {
            let me = self.bot.get_me().send().await?;
            let me = BotIdentity {
                id: me.user.id.0,
                username: me.user.username.clone().unwrap_or_default(),
            };
            *self
                .receiver
                .translator
                .lock()
                .expect("translator poisoned") = Some(
                Translator::new(me.clone(), self.receiver.max_image_bytes)
                    .overhearing(self.receiver.overhear),
            );
            let _ = self.receiver.me.set(me);
        }
        self.bot
            .set_webhook(self.url.clone())
            .secret_token(self.receiver.secret.expose_secret())
            .allowed_updates(ALLOWED_UPDATES)
            .drop_pending_updates(false)
            .send()
            .await?;
        Ok(())
    }
}

/// `POST <path of LULL_TELEGRAM_WEBHOOK_URL>`: one update.
async fn receive(
    State((receiver, intake)): State<(Arc<Receiver>, Arc<dyn Intake>)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let given = headers
        .get(SECRET_HEADER)
        .map(|v| v.as_bytes())
        .unwrap_or_default();
    if !crate::http::same_secret(given, receiver.secret.expose_secret().as_bytes()) {
        tracing::debug!("a webhook request without the right secret token; refused");
        return StatusCode::UNAUTHORIZED.into_response();
    }
    if receiver.me.get().is_none() {
        // Not registered yet (getMe pending): Telegram delivers it again.
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    }
    let update: Update = match serde_json::from_slice(&body) {
        Ok(update) => update,
        Err(e) => {
            tracing::warn!(error = %e, "a webhook request that is no Telegram update; refused");
            return StatusCode::BAD_REQUEST.into_response();
        }
    };
    let incoming = {
        let mut translator = receiver.translator.lock().expect("translator poisoned");
        translator
            .as_mut()
            .and_then(|translator| translator.translate(&update))
    };
    // A tapped button is answered once its update is taken (answered 200).
    let taken = || answer_tap(&receiver.bot, &receiver.redactor, &update);
    let Some(incoming) = incoming else {
        tracing::debug!(update = update.id.0, "update ignored");
        taken();
        return StatusCode::OK.into_response();
    };
    let conversation = incoming.conversation.clone();
    match intake.ingest(incoming).await {
        Ok(accepted) => {
            if accepted == Accepted::Denied {
                tracing::debug!(%conversation, "message from a user not allowed");
            }
            taken();
            StatusCode::OK.into_response()
        }
        Err(e @ (IngestError::Empty | IngestError::TooLong { .. })) => {
            tracing::info!(%conversation, error = %e, "message refused");
            taken();
            StatusCode::OK.into_response()
        }
        Err(e @ IngestError::NotStored(_)) => {
            tracing::warn!(%conversation, error = %e, "could not store an update; answering 503 so Telegram delivers it again");
            StatusCode::SERVICE_UNAVAILABLE.into_response()
        }
        Err(e @ IngestError::UnknownPlatform(_)) => {
            tracing::error!(error = %e, "the core serves no Telegram adapter");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_is_derived_from_the_token_in_telegrams_alphabet() {
        let a = webhook_secret(&SecretString::from("123:abc"));
        let again = webhook_secret(&SecretString::from("123:abc"));
        let b = webhook_secret(&SecretString::from("123:abd"));
        assert_eq!(
            a.expose_secret(),
            again.expose_secret(),
            "every replica sends the same"
        );
        assert_ne!(a.expose_secret(), b.expose_secret());
        let secret = a.expose_secret();
        assert!((1..=256).contains(&secret.len()));
        assert!(
            secret
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        );
        assert!(!secret.contains("abc"));
    }
}
