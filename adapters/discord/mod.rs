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
//! - `slash`: the slash commands ([`register_commands`] at start) and the deferred
//!   responses that answer them.
//! - `gateway`: [`DiscordInbound`] holds a gateway shard's connection while this
//!   process holds that shard's poller lease, feeds messages and edits to the core's
//!   intake in order, and catches up from channel history after (re)connecting.
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
//! - Discord delivers every event to every connected session of a token and shard:
//!   only the holder of a shard's lease connects that shard, and the core stores a
//!   message id once.
//! - With sharding, a guild's events go only to shard `(guild_id >> 22) % shards`,
//!   DMs only to shard 0 ([`shard_of`]); every process must use the same count.
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
mod slash;
mod threads;
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
        // Typing holds a pending burst while its author writes (not privileged).
        | GatewayIntents::GUILD_MESSAGE_TYPING
        | GatewayIntents::DIRECT_MESSAGE_TYPING
}

/// How many gateway shards the bot's events are split across (`LULL_DISCORD_SHARDS`).
/// Every process of one bot must be given the same count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shards {
    /// This many (at least 1).
    Fixed(u32),
    /// As many as Discord recommends (`GET /gateway/bot`), asked at start.
    Auto,
}

impl Default for Shards {
    /// One shard: every event on one connection.
    fn default() -> Self {
        Shards::Fixed(1)
    }
}

/// Discord's limit is far lower for any bot lull serves; a larger count is a typo.
const MAX_SHARDS: u32 = 4096;

impl std::str::FromStr for Shards {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("auto") {
            return Ok(Shards::Auto);
        }
        match s.parse::<u32>() {
            Ok(n) if (1..=MAX_SHARDS).contains(&n) => Ok(Shards::Fixed(n)),
            _ => Err(format!(
                "expected `auto` or a number of shards from 1 to {MAX_SHARDS}, got '{s}'"
            )),
        }
    }
}

/// Both halves of the adapter, sharing one REST client and what they learn about
/// channels.
pub struct Discord {
    pub outbound: DiscordOutbound,
    pub inbound: DiscordInbound,
}

impl Discord {
    pub fn new(config: &PlatformConfig, shards: Shards) -> anyhow::Result<Self> {
        let rest = Rest::new(config.token.clone(), config.api_url.clone())?;
        let channels = Arc::new(ChannelKinds::default());
        Ok(Self {
            outbound: DiscordOutbound::new(rest.clone(), channels.clone()),
            inbound: DiscordInbound::new(
                rest,
                channels,
                shards,
                config.overhear,
                config.auto_thread,
            ),
        })
    }
}

/// Register the bot's slash commands (`menus`' everyone's, a bulk overwrite of the
/// global commands): how many. Called once at start by every process; the caller
/// logs a failure and carries on (typed commands work without). Never the token in
/// the error.
pub async fn register_commands(
    config: &PlatformConfig,
    menus: &lull_port::Menus,
) -> Result<usize, String> {
    let rest =
        Rest::new(config.token.clone(), config.api_url.clone()).map_err(|e| e.to_string())?;
    slash::register(&rest, menus).await
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
    /// Slash commands answered "thinking…" and waiting for their answer: shared by
    /// the gateway (which defers them) and the sending half (which answers them).
    pub(crate) deferrals: Arc<slash::Deferrals>,
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
            deferrals: Arc::default(),
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

    /// A freshly signed URL for an attachment URL that expired, or `None` when Discord
    /// gives none (the file is gone, the request fails; said at DEBUG, redacted).
    /// Discord signs attachment URLs (`ex=`, `is=`, `hm=`) for about a day and answers
    /// 404 after; `POST /attachments/refresh-urls` signs them again. A batch can be
    /// held that long: a daily budget, a model down for a day.
    pub(crate) async fn refresh_attachment_url(&self, url: &str) -> Option<String> {
        let endpoint = format!(
            "{}/api/v10/attachments/refresh-urls",
            self.api_url.trim_end_matches('/')
        );
        let answer = self
            .client
            .post(endpoint)
            .header(reqwest::header::AUTHORIZATION, self.http.token())
            .json(&serde_json::json!({ "attachment_urls": [url] }))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status);
        let body: serde_json::Value = match answer {
            Ok(response) => response.json().await.ok()?,
            Err(e) => {
                tracing::debug!(error = %self.redactor.redact(e.without_url()), "refreshing an attachment URL failed");
                return None;
            }
        };
        body["refreshed_urls"]
            .as_array()?
            .iter()
            .find(|r| r["original"].as_str() == Some(url))
            .and_then(|r| r["refreshed"].as_str())
            .map(str::to_owned)
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

/// Where a channel lives: a DM, or a guild (known by id, or only known to be one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    Dm,
    Guild(Option<GuildId>),
}

/// Whether a channel is in a guild (replies quote there) or a DM, and which guild
/// (the shard its events arrive on). Learnt from inbound messages; a process that
/// needs what it has not seen asks Discord once (`GET /channels/{id}`).
#[derive(Default)]
pub(crate) struct ChannelKinds {
    /// A std mutex: held for one map operation, never across an await.
    known: Mutex<HashMap<ChannelId, Place>>,
}

impl ChannelKinds {
    /// Record where `channel` lives; a guild id learnt earlier is not forgotten for a
    /// report that only says "a guild".
    pub(crate) fn remember(&self, channel: ChannelId, place: Place) {
        let mut known = self.known.lock().expect("channel kinds poisoned");
        let keep = matches!(
            (known.get(&channel), place),
            (Some(Place::Guild(Some(_))), Place::Guild(None))
        );
        if !keep {
            known.insert(channel, place);
        }
    }

    fn known(&self, channel: ChannelId) -> Option<Place> {
        self.known
            .lock()
            .expect("channel kinds poisoned")
            .get(&channel)
            .copied()
    }

    /// Whether `channel` is a guild channel or thread. If Discord cannot say, assume a
    /// guild: a quoted reply in a DM is harmless, a lost quote in a busy channel is not.
    pub(crate) async fn in_guild(&self, rest: &Rest, channel: ChannelId) -> bool {
        if let Some(place) = self.known(channel) {
            return place != Place::Dm;
        }
        match self.look_up(rest, channel).await {
            Ok(place) => place != Place::Dm,
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

    /// Where `channel` lives, with its guild id: from memory, else asked of Discord.
    pub(crate) async fn place(&self, rest: &Rest, channel: ChannelId) -> Result<Place, String> {
        match self.known(channel) {
            Some(place @ (Place::Dm | Place::Guild(Some(_)))) => Ok(place),
            _ => self.look_up(rest, channel).await,
        }
    }

    /// `GET /channels/{id}`, remembered.
    async fn look_up(&self, rest: &Rest, channel: ChannelId) -> Result<Place, String> {
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
        let body: serde_json::Value = response
            .json()
            .await
            .map_err(|e| rest.redactor.redact(e.without_url()))?;
        // Types 1 (DM) and 3 (group DM) are the only channels outside guilds.
        let place = if matches!(body["type"].as_u64(), Some(1 | 3)) {
            Place::Dm
        } else {
            Place::Guild(
                body["guild_id"]
                    .as_str()
                    .and_then(|id| id.parse::<u64>().ok())
                    .filter(|id| *id != 0)
                    .map(GuildId::new),
            )
        };
        self.remember(channel, place);
        Ok(place)
    }
}

/// The shard a guild's events arrive on, of `total`: Discord routes a guild's events
/// to shard `(guild_id >> 22) % total` and DMs (no guild) to shard 0.
pub(crate) fn shard_of(guild: Option<GuildId>, total: u32) -> u32 {
    match guild {
        Some(guild) if total > 1 => ((guild.get() >> 22) % u64::from(total)) as u32,
        _ => 0,
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
    fn shard_counts_parse() {
        assert_eq!("auto".parse(), Ok(Shards::Auto));
        assert_eq!(" 3 ".parse(), Ok(Shards::Fixed(3)));
        assert!("0".parse::<Shards>().is_err());
        assert!("many".parse::<Shards>().is_err());
        assert!("5000".parse::<Shards>().is_err());
    }

    #[test]
    fn guilds_are_spread_over_shards_by_their_id() {
        // Discord's own example: guild 41771983423143937 on 2 shards is on shard 0
        // ((id >> 22) = 9959216934, even).
        let guild = GuildId::new(41_771_983_423_143_937);
        assert_eq!(shard_of(Some(guild), 2), 0);
        assert_eq!(
            shard_of(Some(GuildId::new((9_959_216_934 + 1) << 22)), 2),
            1
        );
        assert_eq!(shard_of(Some(guild), 1), 0);
        assert_eq!(shard_of(None, 4), 0, "DMs arrive on shard 0");
    }

    #[test]
    fn conversation_keys_are_channel_ids() {
        assert_eq!(channel_of("42"), Some(ChannelId::new(42)));
        assert_eq!(channel_of("0"), None);
        assert_eq!(channel_of("dm:42"), None);
    }
}
