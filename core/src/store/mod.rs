//! The store: the only shared state between lull processes.
//!
//! The dispatcher talks to it through the [`Store`] trait alone, so both backends
//! (SQLite for one host, PostgreSQL for several) run the same test suite. Every method
//! is one short transaction; none writes back a row it read earlier, each changes
//! only its own fields. Methods that act under a lease take the
//! [`Lease`](crate::domain::Lease) and check
//! holder, fencing token and expiry inside the same transaction as their writes.
//!
//! - The contract is spelled once, by area, in `contract/` (one file per area, each
//!   with its row types and its trait): [`MessageStore`], [`LeaseStore`],
//!   [`RoundStore`], [`OutboxStore`], [`WorkStore`], [`LimitStore`], [`ActionStore`],
//!   [`StatusStore`] (the status page's read-only aggregates), [`SettingStore`] (a
//!   conversation's own choices, `/stop`), [`ReactionStore`] (which message carries
//!   a burst's ack reaction), [`RhythmStore`] (how a conversation's bursts go),
//!   [`OverheardStore`] (group context), [`ThreadStore`] (the Discord threads lull
//!   opened), [`JobStore`] (reminders and scheduled tasks), [`MemoryStore`]
//!   (remembered facts as rows of their scope) and [`SummaryStore`] (summaries as
//!   derived rows, retention); [`Store`] is their sum. A backend is opened with the deployment's
//!   [`TimerPolicy`](crate::timing::TimerPolicy) and reports failures as a
//!   backend-neutral [`StoreError`] (`error.rs`).
//! - `rules`: each decision both backends make once their rows are read, written once
//!   (the final check's verdict, the outbox rows of a reply, a notice and a give-up,
//!   the rate hold's and the budget's verdicts, due-work folding, history grouping,
//!   access rows, the order budget rows are locked in, the media and quick-reply
//!   codecs, what a reservation of an action and an approval's answer write). A
//!   backend holds the SQL and its bindings.
//! - `memory_rows`: a memory row of its columns, the newest of several scopes, and
//!   what the counter-test's write-back switch writes.
//! - `summary_rows`: a summary of its columns, the exchanges a summary may cover
//!   grouped from their rows, and the one rule of storing one (covers more, same
//!   context).
//! - `ddl`: the DDL both dialects write byte for byte alike, named by both migration
//!   lists; `lease_rows`: which lease row a holder claims, renews, releases and is
//!   fenced by, so the counter-test's switch means the same on every backend.
//! - `conformance` (feature `conformance`): the contract as one test body every
//!   backend runs, split by the same areas.
//! - `FaultPlan` (feature `test-switches`): faults a test injects into a real backend.
//! - [`SqliteStore`] (`sqlite`): the backend on one SQLite file (schema migrations,
//!   condition tracking and fault hooks are its private parts).
//! - [`PostgresStore`] (`postgres`): the backend on one PostgreSQL database, for
//!   replicas on several hosts (its isolation per method, its clock and its wake-ups
//!   are in its module docs).
//! - [`open()`]: the store a `DATABASE_URL` names ([`DatabaseUrl`]; `open.rs`, with the
//!   counter-test's switch).
//! - [`backup`]: `lull backup`, a consistent copy of a SQLite database while it runs.
//!
//! # Time
//! Every method is given `now`, and deadlines (lease expiry, timer and retry due
//! times) are compared in the store. On SQLite every process is on one host and reads
//! one clock, so the callers' `now` is that clock. On PostgreSQL the processes are on
//! several hosts whose clocks may disagree, so in production the database's clock
//! decides ([`TimeSource::Database`]): the caller's `now` only moves the times it
//! passes in and gets back between its timeline and the database's. Tests that drive
//! time themselves (the conformance checks) open it with [`TimeSource::Caller`].

/// The journal's columns an `ActionRow` is read from, in the order both backends'
/// `action_row` reads them (a macro, so statements are `concat!`ed at compile time).
macro_rules! action_columns {
    () => {
        "id, key, conversation_id, batch, tool, arguments, state, result, is_error, token, \
         expires_at, requested_by, created_at"
    };
}

pub mod backup;
mod condition;
#[cfg(feature = "conformance")]
pub mod conformance;
mod contract;
mod ddl;
mod error;
mod faults;
mod lease_rows;
mod memory_rows;
mod open;
mod postgres;
mod rules;
mod sqlite;
mod summary_rows;

pub use crate::access::{AccessRule, Subject};
pub use crate::domain::{Exchange, OutboxKind, TokenUsage};
pub use lull_port::RecentConversation;

pub use contract::{
    actions::*, jobs::*, leases::*, limits::*, memories::*, messages::*, outbox::*, overheard::*,
    reactions::*, rhythm::*, rounds::*, settings::*, status::*, summaries::*, threads::*, work::*,
};
pub use error::StoreError;
#[cfg(feature = "test-switches")]
pub use faults::FaultPlan;
pub use open::{DatabaseUrl, open};
pub use postgres::{PostgresInspection, PostgresStore, TimeSource};
/// The PostgreSQL schema version this build migrates to.
pub const POSTGRES_SCHEMA: i64 = postgres::schema::LATEST;
/// The SQLite schema version (`user_version`) this build migrates to.
pub const SQLITE_SCHEMA: i64 = sqlite::SCHEMA;
pub use rules::{decode_media, encode_media, said_text};
pub use sqlite::{Inspection, SqliteStore};

/// The shared state lull runs on: the sum of its areas, so the dispatcher holds one
/// `Arc<dyn Store>` and calls every method on it. A backend implements each area
/// (`sqlite/<area>.rs`, `postgres/<area>.rs`) and is a `Store` by the blanket impl.
/// See the module docs for the rules every method keeps.
pub trait Store:
    MessageStore
    + LeaseStore
    + RoundStore
    + OutboxStore
    + WorkStore
    + LimitStore
    + ActionStore
    + StatusStore
    + SettingStore
    + ReactionStore
    + RhythmStore
    + OverheardStore
    + ThreadStore
    + JobStore
    + MemoryStore
    + SummaryStore
{
}

impl<T> Store for T where
    T: MessageStore
        + LeaseStore
        + RoundStore
        + OutboxStore
        + WorkStore
        + LimitStore
        + ActionStore
        + StatusStore
        + SettingStore
        + ReactionStore
        + RhythmStore
        + OverheardStore
        + ThreadStore
        + JobStore
        + MemoryStore
        + SummaryStore
{
}

/// The area traits, imported unnamed: `use lull_core::store::prelude::*` makes every
/// store method callable on a concrete backend (`SqliteStore`, `PostgresStore`), as
/// `Store` alone does on `dyn Store`.
pub mod prelude {
    pub use super::{
        ActionStore as _, JobStore as _, LeaseStore as _, LimitStore as _, MemoryStore as _,
        MessageStore as _, OutboxStore as _, OverheardStore as _, ReactionStore as _,
        RhythmStore as _, RoundStore as _, SettingStore as _, StatusStore as _, Store,
        SummaryStore as _, ThreadStore as _, WorkStore as _,
    };
}
