//! lull's platform adapters. Each translates between one platform and the core's port
//! ([`lull_port`]): inbound updates become [`lull_port::Incoming`] for the core's
//! [`lull_port::Intake`], and deliveries arrive through [`lull_port::Outbound`].
//! Adapters hold no conversation logic and never see the store; this crate depends on
//! the port only, so cargo keeps it that way.
//!
//! - [`console`]: `lull chat`, standard input and output.
//! - [`http`]: generic JSON in (`POST /api/messages`), signed webhooks out.
//! - [`telegram`]: the Bot API through teloxide, long polling or a webhook.
//! - [`discord`]: the gateway and REST through serenity.
//! - `media`: the one download the platforms share for pictures and voice (size-limited,
//!   errors sorted for the core, never a URL in an error).

pub mod console;
pub mod discord;
pub mod http;
mod media;
pub mod telegram;

use secrecy::SecretString;

/// How to reach a chat platform: its bot token and the API base URL (the
/// platform's own, a self-hosted Bot API server, or a test's fake).
#[derive(Debug, Clone)]
pub struct PlatformSettings {
    pub token: SecretString,
    pub api_url: String,
    /// `LULL_MAX_IMAGE_BYTES`: Telegram offers each photo in several sizes; the
    /// largest one under this is the one kept.
    pub max_image_bytes: u64,
    /// `LULL_GROUP_CONTEXT` is on: group messages not addressed to lull are passed
    /// on as [`lull_port::IncomingKind::Overheard`] (the core keeps those of admitted
    /// groups as context) instead of being dropped here.
    pub overhear: bool,
    /// `LULL_DISCORD_AUTO_THREAD`: a mention in a guild channel is answered in a
    /// thread opened on it (Discord only).
    pub auto_thread: bool,
}
