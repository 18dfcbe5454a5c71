//! The Telegram adapter (Bot API through teloxide's `Bot`, long polling or a webhook).
//!
//! - `inbound`: the poller (the default). One long-poller per bot token is all Telegram allows (a
//!   second `getUpdates` gets 409 Conflict), so only the process holding the
//!   platform's poller lease polls; the others stand by. An update is acknowledged
//!   (the next `getUpdates` carries an `offset` past it) only after
//!   the core's [`lull_port::Intake`] stored it.
//! - `webhook`: [`TelegramWebhook`], with `LULL_TELEGRAM_WEBHOOK_URL`: registers the
//!   webhook and serves its route on the binary's HTTP server, on every replica; no
//!   poller runs. An update is answered 200 only once the intake stored it.
//! - `translate`: Telegram messages to [`lull_port::Incoming`]: which group
//!   messages are addressed to the bot, conversation keys for chats and forum topics,
//!   captions as text, non-text messages named; taps on quick reply buttons
//!   (`callback_query`) as the messages they stand for.
//! - `outbound`: replies as Telegram HTML (`html`), split to 4096 characters,
//!   quoting in groups, "typing…", and Telegram's errors mapped to retry decisions.
//! - [`set_menus`]: the command menus (`setMyCommands`), registered at start.
//! - [`Redactor`]: the bot token is part of every Bot API URL (`/bot<TOKEN>/Method`),
//!   and teloxide's network errors carry that URL: every error text leaving this
//!   module goes through it.
//!
//! Platform types (teloxide's) stay inside this module.

mod html;
mod inbound;
mod outbound;
mod translate;
mod webhook;

use std::fmt;
use std::time::Duration;

use lull_port::Menus;
use secrecy::ExposeSecret;
use teloxide::Bot;
use teloxide::RequestError;
use teloxide::payloads::SetMyCommandsSetters;
use teloxide::requests::{Request, Requester};
use teloxide::types::{AllowedUpdate, BotCommand, BotCommandScope, Update};

use crate::PlatformSettings as PlatformConfig;

pub use inbound::TelegramInbound;
pub use outbound::TelegramOutbound;
pub use webhook::{SECRET_HEADER, TelegramWebhook, webhook_secret};

/// The longest message text Telegram accepts (after entity parsing).
pub const MAX_MESSAGE_CHARS: usize = 4096;

/// Build both halves of the adapter from its configuration. Nothing is sent yet.
pub fn connect(config: &PlatformConfig) -> anyhow::Result<(TelegramOutbound, TelegramInbound)> {
    let (bot, redactor) = bot(config)?;
    Ok((
        TelegramOutbound::new(bot.clone(), redactor.clone()),
        TelegramInbound::new(bot, redactor, config.max_image_bytes, config.overhear),
    ))
}

/// Build the adapter in webhook mode: updates arrive at `url` (a URL checked by the
/// binary's configuration), so there is no poller. Nothing is sent yet.
pub fn connect_webhook(
    config: &PlatformConfig,
    url: url::Url,
) -> anyhow::Result<(TelegramOutbound, TelegramWebhook)> {
    let (bot, redactor) = bot(config)?;
    let secret = webhook_secret(&config.token);
    Ok((
        TelegramOutbound::new(bot.clone(), redactor.clone()),
        TelegramWebhook::new(
            bot,
            redactor,
            url,
            secret,
            config.max_image_bytes,
            config.overhear,
        ),
    ))
}

/// Who the token belongs to (`getMe`), for `lull check`. The error names the
/// variable to fix and never contains the token.
pub async fn whoami(config: &PlatformConfig) -> Result<String, String> {
    let me = get_me(config).await?;
    Ok(format!("@{}", me.user.username.clone().unwrap_or_default()))
}

/// Whether Telegram delivers every group message to the bot (`getMe`'s
/// `can_read_all_group_messages`: its privacy mode is off), for `lull check` when
/// group context is on. With privacy mode on, a bot sees only commands, mentions
/// and replies to it.
pub async fn reads_all_group_messages(config: &PlatformConfig) -> Result<bool, String> {
    Ok(get_me(config).await?.can_read_all_group_messages)
}

/// `getMe`, its errors naming the variable to fix and never the token.
async fn get_me(config: &PlatformConfig) -> Result<teloxide::types::Me, String> {
    let (bot, redactor) = bot(config).map_err(|e| e.to_string())?;
    match bot.get_me().send().await {
        Ok(me) => Ok(me),
        Err(RequestError::Api(teloxide::ApiError::InvalidToken)) => {
            Err("Telegram refused the token (check TELEGRAM_BOT_TOKEN)".into())
        }
        // Not reached at all: the network, not a setting (TELEGRAM_API_URL matters
        // only for a self-hosted Bot API server).
        Err(e @ RequestError::Network(_)) => Err(format!(
            "cannot reach the Telegram Bot API at {}: {} (is this machine online? TELEGRAM_API_URL is only for a self-hosted Bot API server)",
            config.api_url,
            request_error(&redactor, e)
        )),
        Err(e) => Err(format!(
            "getMe failed: {} (check TELEGRAM_BOT_TOKEN, and TELEGRAM_API_URL if you run your own Bot API server)",
            request_error(&redactor, e)
        )),
    }
}

/// Register lull's command menus with `setMyCommands`: everyone's in private chats
/// (scope `all_private_chats`), the commands any member may use in every group
/// (`all_group_chats`: `/status`, `/usage`, `/help`…), and everyone's with the admins'
/// for the administrators of every group (`all_chat_administrators`, which Telegram
/// prefers for them over `all_group_chats`). Called once at start by every process
/// (the same menus each time: the calls are idempotent). The error names the scope
/// that failed, without the token; the caller logs it and carries on.
pub async fn set_menus(config: &PlatformConfig, menus: &Menus) -> Result<(), String> {
    let (bot, redactor) = bot(config).map_err(|e| e.to_string())?;
    let scopes = [
        (BotCommandScope::AllPrivateChats, menus.everyone.clone()),
        (BotCommandScope::AllGroupChats, menus.for_group_members()),
        (BotCommandScope::AllChatAdministrators, menus.for_admins()),
    ];
    for (scope, commands) in scopes {
        let commands = commands
            .iter()
            .map(|c| BotCommand::new(c.name, c.description));
        bot.set_my_commands(commands)
            .scope(scope.clone())
            .send()
            .await
            .map_err(|e| format!("setMyCommands ({scope:?}): {}", request_error(&redactor, e)))?;
    }
    Ok(())
}

/// The Bot API client, pointed at `TELEGRAM_API_URL`, and the token's redactor.
fn bot(config: &PlatformConfig) -> anyhow::Result<(Bot, Redactor)> {
    let redactor = Redactor::new(&config.token);
    let api_url = url::Url::parse(&config.api_url)
        .map_err(|e| anyhow::anyhow!("TELEGRAM_API_URL: '{}' is not a URL: {e}", config.api_url))?;
    if api_url.cannot_be_a_base() {
        anyhow::bail!(
            "TELEGRAM_API_URL: '{}' cannot be a base URL",
            config.api_url
        );
    }
    // teloxide's own client settings (5 s connect, 17 s total), built here rather than
    // by `Bot::new`, which reads TELOXIDE_PROXY and panics on a bad value. The total
    // limit must exceed the long-poll timeout (see `inbound::POLL_TIMEOUT`).
    let client = teloxide::net::default_reqwest_settings()
        .build()
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot build the Telegram HTTP client: {}",
                redactor.error(&e)
            )
        })?;
    let bot = Bot::with_client(config.token.expose_secret(), client).set_api_url(api_url);
    Ok((bot, redactor))
}

pub use lull_port::secrets::Redactor;

/// A teloxide request error as text, without the token. teloxide's `Bot` derives
/// `Debug` (printing the token) and its network errors print the request URL, which
/// contains it: neither may reach a log line. Network errors lose their URL first
/// where teloxide lets go of the `reqwest::Error`; the redaction covers the rest.
pub fn request_error(redactor: &Redactor, error: RequestError) -> String {
    match error {
        RequestError::Network(e) => match std::sync::Arc::try_unwrap(e) {
            Ok(e) => format!("network error: {}", redactor.error(&e.without_url())),
            Err(shared) => format!("network error: {}", redactor.error(shared.as_ref())),
        },
        RequestError::InvalidJson { raw, .. } => {
            // A proxy's error page or a server error: the raw body says which.
            let raw: String = raw.chars().take(200).collect();
            format!(
                "unexpected response from the Bot API: {}",
                redactor.redact(&raw)
            )
        }
        other => redactor.error(&other),
    }
}
/// Where a conversation lives on Telegram: a chat, or a forum topic inside one.
///
/// The key is `<chat id>` or `<chat id>:<topic thread id>`. Private chats have
/// positive ids, groups and supergroups negative ones (a Bot API fact the sending
/// half relies on to decide whether to quote).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChatKey {
    pub chat: i64,
    /// The forum topic (`message_thread_id` of a topic message), if any.
    pub topic: Option<i32>,
}

impl ChatKey {
    pub fn is_group(&self) -> bool {
        self.chat < 0
    }

    pub fn parse(key: &str) -> Option<ChatKey> {
        let (chat, topic) = match key.split_once(':') {
            Some((chat, topic)) => (chat, Some(topic.parse().ok()?)),
            None => (key, None),
        };
        Some(ChatKey {
            chat: chat.parse().ok()?,
            topic,
        })
    }
}

impl fmt::Display for ChatKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.topic {
            Some(topic) => write!(f, "{}:{topic}", self.chat),
            None => write!(f, "{}", self.chat),
        }
    }
}

/// The update types lull reads, for `getUpdates` and `setWebhook` alike (Telegram
/// remembers the last list it was given; a type left out is never delivered).
const ALLOWED_UPDATES: [AllowedUpdate; 3] = [
    AllowedUpdate::Message,
    AllowedUpdate::EditedMessage,
    AllowedUpdate::CallbackQuery,
];

/// Answer the callback query of `update`, if it is one (a tapped button), so the
/// client stops its spinner; the tap itself is the update's message, stored by the
/// caller. Called once the update was taken (stored, or deliberately not), so an
/// update delivered again after a failed store is answered then. Runs on its own
/// task: it never delays storing or the next update, and a failure (the query too
/// old, the Bot API down) is logged once and not retried, as the spinner ends by
/// itself.
fn answer_tap(bot: &Bot, redactor: &Redactor, update: &Update) {
    let Some(query) = translate::callback_query(update) else {
        return;
    };
    let request = bot.answer_callback_query(query.id.clone());
    let redactor = redactor.clone();
    let update_id = update.id.0;
    tokio::spawn(async move {
        if let Err(e) = request.send().await {
            tracing::warn!(update = update_id, error = %request_error(&redactor, e), "could not answer a tapped button (answerCallbackQuery); its spinner stops by itself");
        }
    });
}

/// Pauses between failed Bot API requests of the poller: 0.5 s doubling to 30 s.
const BACKOFF: lull_port::Backoff =
    lull_port::Backoff::new(Duration::from_millis(500), Duration::from_secs(30));

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "123456:AAHsecretSECRETsecret";

    #[tokio::test]
    async fn network_errors_lose_the_url() {
        // Nothing listens on port 9 of loopback: the request fails at connect.
        let r = Redactor::new(&secrecy::SecretString::from(TOKEN));
        let client = reqwest::Client::new();
        let e = client
            .post(format!("http://127.0.0.1:9/bot{TOKEN}/GetMe"))
            .send()
            .await
            .unwrap_err();
        assert!(
            format!("{e}").contains(TOKEN),
            "the raw error carries the URL"
        );
        let described = request_error(&r, RequestError::from(e));
        assert!(!described.contains("secret"), "{described}");
        assert!(described.starts_with("network error"), "{described}");
    }

    #[test]
    fn chat_keys_round_trip() {
        for key in ["42", "-1001234", "-1001234:17"] {
            assert_eq!(ChatKey::parse(key).unwrap().to_string(), key);
        }
        assert!(ChatKey::parse("x").is_none());
        assert!(ChatKey::parse("-1:x").is_none());
        assert!(ChatKey::parse("-100").unwrap().is_group());
        assert!(!ChatKey::parse("100").unwrap().is_group());
    }
}
