//! Loopback stand-ins for the services lull talks to, each recording what it was sent
//! and able to fail on demand: the Telegram Bot API, Discord (REST, CDN and gateway),
//! an OpenAI-compatible model server, and a receiver of the http adapter's webhooks.

pub(crate) mod discord;
pub(crate) mod openai;
pub(crate) mod telegram;
pub(crate) mod webhook;
