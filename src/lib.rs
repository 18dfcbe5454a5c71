//! lull: a self-hosted AI chat bot for Telegram and Discord that waits for a lull in
//! the conversation and answers **once**.
//!
//! A user who fires three messages in a row gets one reply covering all three, even
//! with several lull processes on one database and a process killed mid-generation.
//!
//! # Layout
//!
//! - [`config`]: environment variables and flags, validated at start.
//! - [`domain`]: the domain words as types (conversation, version, lease, token…).
//! - [`timing`]: the timing rules (capped debounce, cap, lease pacing) as pure functions.
//! - [`store`]: the shared state behind one trait; [`store::SqliteStore`] implements it
//!   on one SQLite file.
//! - [`dispatcher`]: ingest, the scheduler, rounds (lease claim, collect, generate,
//!   final check) and outbox delivery.
//! - [`llm`]: the responder seam (`echo`, `openai`).
//! - [`platform`]: the contract adapters implement; [`split`] cuts replies to a
//!   platform's length limit.
//! - [`adapters`]: one module per platform: console, http, telegram, discord.
//! - [`commands`], [`access`]: `/help` and `/reset`; who may talk to the bot.
//! - [`secrets`]: keeping bot tokens and keys out of logs and errors.
//! - [`app`]: wiring for `lull run` and `lull chat`; [`check`]: `lull check` and
//!   `lull healthcheck`; [`health`] and [`http`]: `/healthz`, `/metrics`; [`logging`],
//!   [`metrics`].
//!
//! # Invariants
//!
//! - **No duplicate:** every user message is covered by at most one delivered reply.
//! - **No loss:** every accepted message is covered by a delivered reply within
//!   `max_wait` plus generation time (plus the lease TTL after a crash), unless the
//!   model keeps failing; then the user is told once and the messages stay pending.
//! - **Fresh:** a delivered reply was generated from every message that existed when
//!   it was committed, unless the cap forced delivery.
//! - **Exclusive:** at most one live lease holder per conversation; fencing tokens
//!   only grow.
//!
//! They rest on three pillars: a version counter bumped in the transaction that
//! stores each message; timers in their own table with a capped debounce; and a
//! lease with an expiry, claimed by compare-and-swap and held (renewed) for the whole
//! generation and delivery, whose fencing token every later write checks.

pub mod access;
#[path = "../adapters/mod.rs"]
pub mod adapters;
pub mod app;
pub mod check;
pub mod clock;
pub mod commands;
pub mod config;
pub mod dispatcher;
pub mod domain;
pub mod health;
pub mod http;
pub mod llm;
pub mod logging;
pub mod metrics;
pub mod platform;
pub mod secrets;
pub mod split;
pub mod store;
pub mod timing;
