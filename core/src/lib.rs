//! lull's core: the engine that waits for a lull in a conversation and answers
//! **once**. It names no chat platform and no HTTP server; adapters reach it through
//! the port ([`lull_port`]), and the binary wires it up.
//!
//! # Layout
//!
//! - [`domain`]: the domain words as types (the port's, plus lease, holder, token).
//! - [`timing`]: the timing rules (capped debounce, cap, lease pacing) as pure functions.
//! - [`rhythm`]: a conversation's learned rhythm and the adaptive wait picked from it.
//! - [`clock`]: this process's time (on SQLite, the one clock every process compares;
//!   on PostgreSQL the store compares deadlines on the database's clock).
//! - [`store`]: the shared state behind one trait; [`store::SqliteStore`] implements it
//!   on one SQLite file (processes on one host), [`store::PostgresStore`] on one
//!   PostgreSQL database (replicas on several hosts).
//! - [`dispatcher`]: the intake (ingest, commands), the scheduler, rounds (lease claim,
//!   collect, generate, final check), live drafts, outbox delivery and platform
//!   sessions.
//! - [`llm`]: the responder seam (`echo`, `openai`; the reply shown as it is written,
//!   images of the pending batch as image parts), retries, prompt fitting, and the
//!   transcription of voice messages.
//! - [`schedule`]: the schedule language of jobs (the WHEN of `/remind` and
//!   `/schedule`: `in 20m`, `every weekday 8:30`, `cron "0 8 * * 1-5"`) and the
//!   instants it names in a chat's time zone, daylight-saving changes included.
//! - [`texts`]: every sentence the bot says to users or to the model (ready for
//!   translation).
//! - [`access`]: who may talk to the bot and who administers it (`LULL_ALLOWED_USERS`,
//!   `LULL_ALLOWED_CHATS`, `LULL_ADMINS`, and admins' `/allow` and `/deny` kept in the
//!   store).
//! - [`limits`]: what the bot may spend (messages per minute per user, tokens per day
//!   per user and in all), counted in the store so limits hold across restarts and
//!   processes.
//! - [`money`]: dollars as whole nano-dollars, the price list (`LULL_PRICES`) and
//!   what a call, a summary or a transcription costs at it.
//! - [`tools`]: the tools seam (MCP servers), whose calls that act the dispatcher
//!   reserves in the store's journal before they run.
//! - [`controls`]: what a conversation chooses for its replies (`/model`, `/persona`,
//!   `/prompt`, kept in the store) resolved against `LULL_MODELS` and `LULL_PERSONAS`.
//! - [`metrics`]: metric names, a contract with users' dashboards.
//! - [`refreshed`]: a value read from elsewhere (access decisions, the model list, the
//!   status snapshot) and kept for a while, read at most once per its age.
//! - `switches`: the test-only switches (`LULL_TEST_*`, feature `test-switches`) that
//!   turn one protection off for a counter-test; every other build keeps them all.
//!
//! # Invariants
//!
//! - **No duplicate:** every user message is covered by at most one delivered reply.
//! - **No loss:** every accepted message is covered by a delivered reply within
//!   `max_wait` plus generation time (plus the lease TTL after a crash), unless the
//!   model keeps failing (then the user is told once and the messages stay pending)
//!   or a limit holds the conversation (then they are answered together when it
//!   lifts, and the user is told once when that is).
//! - **Fresh:** a delivered reply was generated from every message that existed when
//!   it was committed, and with the conversation's settings in force then (a change of
//!   a setting, or `/stop`, moves the version like a message), unless the cap forced
//!   delivery (never for messages `/stop` closed).
//! - **Exclusive:** at most one live lease holder per conversation; fencing tokens
//!   only grow.
//!
//! They rest on three pillars: a version counter bumped in the transaction that
//! stores each message; timers in their own table with a capped debounce; and a
//! lease with an expiry, claimed by compare-and-swap and held (renewed) for the whole
//! generation and delivery, whose fencing token every later write checks.

pub mod access;
pub mod clock;
pub mod controls;
pub mod dispatcher;
pub mod domain;
pub mod limits;
pub mod llm;
pub mod metrics;
pub mod money;
pub mod refreshed;
pub mod rhythm;
pub mod schedule;
pub mod store;
mod switches;
pub mod texts;
pub mod timing;
pub mod tools;
