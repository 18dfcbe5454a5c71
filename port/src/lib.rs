//! The port: what lull's core and its platform adapters agree on, and nothing else.
//!
//! An adapter translates between its platform and these types. Inbound, it hands
//! each update to the core's [`Intake`] (and, for a platform connection only one
//! process may hold, runs one [`Session`] at a time that the core hands it); outbound,
//! it implements [`Outbound`]. It never sees the store, the dispatcher or the model.
//! Platform types (teloxide's, serenity's, JSON bodies) never cross this boundary.
//!
//! # Layout
//!
//! - [`command`]: every chat command declared once (name, argument, who may use it,
//!   help line, menu entry, whether it acts); parsing, the help and the menus derive
//!   from it.
//! - [`domain`]: the shared words (platform, conversation, version, outbox row).
//! - [`intake`]: [`Incoming`] updates, the [`Intake`] port, what it answers.
//! - [`media`]: media references stored with messages, and fetching their bytes
//!   within a size limit.
//! - [`menu`]: the command menus adapters register with their platform, derived from
//!   the command table.
//! - [`outbound`]: the [`Outbound`] trait (replies, "typing…", live drafts) and what a
//!   send can fail with.
//! - [`session`]: [`Inbound`] adapters and the [`Session`] the core hands them.
//! - [`health`]: what adapters report about their connection (`/healthz`).
//! - [`retry`]: the one backoff policy and `Retry-After` parser.
//! - [`secrets`]: keeping tokens and keys out of logs, errors and messages.
//! - [`split`]: cutting a reply to a platform's length limit.

pub mod command;
pub mod domain;
pub mod health;
pub mod intake;
pub mod media;
pub mod menu;
pub mod outbound;
pub mod retry;
pub mod secrets;
pub mod session;
pub mod split;

pub use command::{Command, CommandSpec, Who};
pub use domain::{ConversationRef, DraftId, OutboxId, OutboxKind, Platform, Timestamp};
pub use health::{AdapterState, Health};
pub use intake::{
    Accepted, Content, Incoming, IncomingKind, IngestError, Intake, RecentConversation,
};
pub use media::{Media, MediaBytes, MediaError, MediaKind};
pub use menu::{MenuCommand, Menus};
pub use outbound::{Outbound, OutgoingPart, QuickReply, SendError};
pub use retry::Backoff;
pub use session::{Inbound, Session, SessionEnd, Shard};
