//! The contract, one file per area, each with its row types and its trait; the
//! backends implement each area in a file of the same name (`sqlite/<area>.rs`,
//! `postgres/<area>.rs`) and the conformance suite checks it in one too.
//!
//! - [`messages`]: what ingest stores (the version bump, the timer) and adapters read
//!   back.
//! - [`leases`]: the compare-and-swap with an expiry (claim, renew, release, fencing).
//! - [`rounds`]: a conversation's round under its lease (the claim of its batch, the
//!   final check, give-ups, failures).
//! - [`outbox`]: rows waiting for delivery, and delivery facts.
//! - [`work`]: what a process asks of the whole database (due work, settled
//!   conversations, health).
//! - [`limits`]: the rate hold, the token wallet, access decisions.
//! - [`actions`]: the journal of tool calls that act, reserved before they run.
//! - [`settings`]: a conversation's own choices (model, persona, prompt) and `/stop`.
//! - [`reactions`]: which message of a pending burst carries the ack reaction.
//! - [`rhythm`]: each conversation's learned rhythm, taught by its committed replies.
//! - [`overheard`]: group context, kept beside a conversation and never answered.
//! - [`threads`]: the Discord threads lull opened, where messages need no mention.
//! - [`status`]: the status page's read-only aggregates over indexed ranges.
//! - [`jobs`]: reminders and scheduled tasks as rows, each occurrence fired once.
//! - [`memories`]: remembered facts as rows of their scope (a person, a chat), written
//!   with the reply or not at all.
//! - [`summaries`]: a long conversation's summary as a derived row, stored under its
//!   lease only if it covers more; retention (old texts removed, rows kept).

pub(super) mod actions;
pub(super) mod jobs;
pub(super) mod leases;
pub(super) mod limits;
pub(super) mod memories;
pub(super) mod messages;
pub(super) mod outbox;
pub(super) mod overheard;
pub(super) mod reactions;
pub(super) mod rhythm;
pub(super) mod rounds;
pub(super) mod settings;
pub(super) mod status;
pub(super) mod summaries;
pub(super) mod threads;
pub(super) mod work;
