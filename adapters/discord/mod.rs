//! The Discord adapter (serenity): the gateway for receiving, REST for sending.
//!
//! A sample exchange in a guild channel (lull answers only when addressed):
//!
//! ```text
//! ana:  @lull what's the capital of Australia
//! ana:  and why not Sydney?
//! lull: ↪ ana — Canberra. It was built as a compromise between Sydney and Melbourne…
//! bob:  nice (no mention, no reply to lull: not answered)
//! ```
//!
//! # Layout
//!
//! - `translate`: which Discord messages lull answers and the text the core sees
//!   (mentions, replies, threads, attachments); pure functions.
//! - `outbound`: [`DiscordOutbound`] sends replies over REST with a nonce and
//!   `enforce_nonce`, and shows "typing…".
//! - `gateway`: [`DiscordInbound`] holds the gateway connection while this process
//!   holds the platform's poller lease, feeds messages and edits to the core's intake in
//!   order, and catches up from channel history after (re)connecting.
//!
//! # Conversations
//!
//! The conversation key is the channel id: a DM channel, a guild text channel, or a
//! thread (threads are channels of their own in Discord, so each thread is its own
//! conversation). In guilds lull answers only messages that mention it or reply to one
//! of its messages, and the leading mention is stripped (so `@lull /reset` works).
//!
//! # Platform facts relied on
//!
//! - Discord delivers every event to every connected session of a token: only the
//!   holder of the gateway lease connects, and the core stores a message id once.
//! - The gateway does **not** replay messages sent while no session was connected
//!   (it replays only into a resumed session), so after a fresh IDENTIFY the channels
//!   with recent activity are read back from history.
//! - A message created with a `nonce` and `enforce_nonce: true` by the same author
//!   within a few minutes of an earlier one with that nonce is not created again;
//!   Discord returns the earlier message. That makes a retried send exactly-once.
//! - REST works from any process: sends never need the gateway.
//!
//! # Secrets
//!
//! The token only travels in the `Authorization` header and the IDENTIFY payload.
//! Every error text this adapter logs or hands to the core passes through
//! [`Redactor`] first, in case a library puts a header or URL into an error.

mod gateway;
mod outbound;
mod translate;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serenity::all::{ChannelId, GatewayIntents, GuildId};
use serenity::http::{Http, HttpBuilder, LightMethod, Request, Route};

pub use gateway::DiscordInbound;
pub use outbound::DiscordOutbound;

use crate::PlatformSettings as PlatformConfig;

/// Discord's limit on a message's length, in characters.
pub const MAX_MESSAGE_CHARS: usize = 2000;

/// One REST request's time limit. serenity's own client has none, and a send that
/// hangs would hold the conversation's lease forever.
const REST_TIMEOUT: Duration = Duration::from_secs(15);

/// The gateway intents lull asks for. `MESSAGE_CONTENT` is privileged: it must be
/// switched on for the bot in the developer portal, or Discord refuses the
/// connection (DMs and mentions carry their text even without it, other guild
/// messages do not).
pub fn intents() -> GatewayIntents {
    GatewayIntents::GUILD_MESSAGES
        | GatewayIntents::DIRECT_MESSAGES
        | GatewayIntents::MESSAGE_CONTENT
}

/// Both halves of the adapter, sharing one REST client and what they learn about
/// channels.
pub struct Discord {
    pub outbound: DiscordOutbound,
    pub inbound: DiscordInbound,
}

impl Discord {
    pub fn new(config: &PlatformConfig) -> anyhow::Result<Self> {
        let rest = Rest::new(config.token.clone(), config.api_url.clone())?;
        let channels = Arc::new(ChannelKinds::default());
        Ok(Self {
            outbound: DiscordOutbound::new(rest.clone(), channels.clone()),
            inbound: DiscordInbound::new(rest, channels),
        })
    }
}

/// Who the token belongs to (`GET /users/@me`), for `lull check`. The error names
/// the variable to fix and never contains the token.
pub async fn whoami(config: &PlatformConfig) -> Result<String, String> {
    let rest =
        Rest::new(config.token.clone(), config.api_url.clone()).map_err(|e| e.to_string())?;
    match rest.http.get_current_user().await {
        Ok(user) => Ok(user.name.clone()),
        Err(e) => {
            let status = match &e {
                serenity::Error::Http(http) => http.status_code().map(|s| s.as_u16()),
                _ => None,
            };
            Err(match status {
                Some(401) => "Discord refused the token (check DISCORD_BOT_TOKEN)".into(),
                Some(status) => {
                    format!("GET /users/@me answered HTTP {status} (check DISCORD_API_URL)")
                }
                None => format!(
                    "cannot reach Discord: {} (check DISCORD_API_URL)",
                    rest.redactor.redact(e)
                ),
            })
        }
    }
}

/// Everything needed to talk to Discord's REST API (or a stand-in at
/// `DISCORD_API_URL`).
#[derive(Clone)]
pub(crate) struct Rest {
    pub(crate) http: Arc<Http>,
    /// The same client serenity uses, for requests whose response headers matter
    /// (a 429's retry hint).
    pub(crate) client: reqwest::Client,
    token: SecretString,
    api_url: String,
    pub(crate) redactor: Redactor,
}

impl Rest {
    fn new(token: SecretString, api_url: String) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .use_rustls_tls()
            .timeout(REST_TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .build()?;
        let redactor = Redactor::new(&token);
        let rest = Self {
            http: Arc::new(Self::build_http(&token, &api_url, client.clone())),
            client,
            token,
            api_url,
            redactor,
        };
        Ok(rest)
    }

    /// A serenity HTTP client pointed at `DISCORD_API_URL`. serenity's rate limiter is
    /// off: it would bypass the proxy base URL, and lull's delivery loop waits out a
    /// 429 itself (while renewing the conversation's lease).
    fn build_http(token: &SecretString, api_url: &str, client: reqwest::Client) -> Http {
        HttpBuilder::new(token.expose_secret())
            .client(client)
            .proxy(api_url)
            .ratelimiter_disabled(true)
            .build()
    }

    /// A fresh serenity client for a gateway session (serenity takes it by value).
    pub(crate) fn http_for_gateway(&self) -> Http {
        Self::build_http(&self.token, &self.api_url, self.client.clone())
    }

    /// Build a raw request with serenity's routing and authorization. The error (a
    /// malformed `DISCORD_API_URL`) comes redacted.
    pub(crate) fn request(&self, request: Request<'_>) -> Result<reqwest::RequestBuilder, String> {
        request
            .build(&self.client, self.http.token(), self.http.proxy.as_deref())
            .map_err(|e| self.redactor.redact(e))
    }
}

pub use lull_port::secrets::Redactor;

/// `GET /channels/{id}`: the channel object, errors redacted.
async fn fetch_channel(rest: &Rest, channel: ChannelId) -> Result<serde_json::Value, String> {
    let response = rest
        .request(Request::new(
            Route::Channel {
                channel_id: channel,
            },
            LightMethod::Get,
        ))?
        .send()
        .await
        .map_err(|e| rest.redactor.redact(e.without_url()))?
        .error_for_status()
        .map_err(|e| rest.redactor.redact(e.without_url()))?;
    response
        .json()
        .await
        .map_err(|e| rest.redactor.redact(e.without_url()))
}

/// Whether a channel is in a guild (replies quote there) or a DM. Learnt from
/// inbound messages; a process that sends without having seen the channel asks
/// Discord once (`GET /channels/{id}`).
#[derive(Default)]
pub(crate) struct ChannelKinds {
    /// A std mutex: held for one map operation, never across an await.
    known: Mutex<HashMap<ChannelId, bool>>,
    /// The server of each guild channel seen (what `LULL_ALLOWED_CHATS` may name).
    guilds: Mutex<HashMap<ChannelId, GuildId>>,
}

impl ChannelKinds {
    pub(crate) fn remember_guild(&self, channel: ChannelId, guild: GuildId) {
        self.guilds
            .lock()
            .expect("channel guilds poisoned")
            .insert(channel, guild);
    }

    /// The server `channel` belongs to: messages read back over REST carry no
    /// `guild_id`, so catch-up asks here (Discord once per channel, `GET
    /// /channels/{id}`), else a member admitted by their server would be refused.
    pub(crate) async fn guild(&self, rest: &Rest, channel: ChannelId) -> Option<GuildId> {
        if let Some(guild) = self
            .guilds
            .lock()
            .expect("channel guilds poisoned")
            .get(&channel)
        {
            return Some(*guild);
        }
        match fetch_channel(rest, channel).await {
            Ok(body) => {
                let guild = body["guild_id"]
                    .as_str()
                    .and_then(|g| g.parse::<u64>().ok())
                    .filter(|g| *g != 0)
                    .map(GuildId::new)?;
                self.remember_guild(channel, guild);
                Some(guild)
            }
            Err(error) => {
                tracing::debug!(
                    channel = channel.get(),
                    error,
                    "cannot read a channel's server"
                );
                None
            }
        }
    }

    pub(crate) fn remember(&self, channel: ChannelId, in_guild: bool) {
        self.known
            .lock()
            .expect("channel kinds poisoned")
            .insert(channel, in_guild);
    }

    fn known(&self, channel: ChannelId) -> Option<bool> {
        self.known
            .lock()
            .expect("channel kinds poisoned")
            .get(&channel)
            .copied()
    }

    /// Whether `channel` is a guild channel or thread. If Discord cannot say, assume a
    /// guild: a quoted reply in a DM is harmless, a lost quote in a busy channel is not.
    pub(crate) async fn in_guild(&self, rest: &Rest, channel: ChannelId) -> bool {
        if let Some(known) = self.known(channel) {
            return known;
        }
        // Types 1 (DM) and 3 (group DM) are the only channels outside guilds.
        let lookup = fetch_channel(rest, channel)
            .await
            .map(|body| !matches!(body["type"].as_u64(), Some(1 | 3)));
        match lookup {
            Ok(in_guild) => {
                self.remember(channel, in_guild);
                in_guild
            }
            Err(error) => {
                tracing::debug!(
                    channel = channel.get(),
                    error,
                    "cannot tell whether a channel is a DM; quoting the reply"
                );
                true
            }
        }
    }
}

/// The channel a conversation lives in.
pub(crate) fn channel_of(key: &str) -> Option<ChannelId> {
    key.parse::<u64>()
        .ok()
        .filter(|id| *id != 0)
        .map(ChannelId::new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversation_keys_are_channel_ids() {
        assert_eq!(channel_of("42"), Some(ChannelId::new(42)));
        assert_eq!(channel_of("0"), None);
        assert_eq!(channel_of("dm:42"), None);
    }
}
