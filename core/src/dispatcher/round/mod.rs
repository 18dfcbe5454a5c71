//! One round for one conversation: claim the lease, then the stages over one state
//! ([`stages::Answering`]), then deliver what the outbox holds and release. Every
//! step after the claim runs under the lease; a lost lease abandons the round wherever
//! it is (an action already running is left only by the hard stop).
//!
//! The stages, in the order they run ([`stages::STAGES`]); each returns go or end:
//!
//! 1. **due**: an empty batch disarms its timer; a batch not due yet waits.
//! 2. **approvals**: the batch's `/approve` and `/cancel` decided, approved calls run
//!    once (`approvals`), before anyone pays: an answer costs no tokens.
//! 3. **pay**: who pays; in a group, members over their budget are left out with a
//!    notice (`budget`, the rules in the wallet).
//! 4. **transcribe**: voice messages transcribed, each stored before the next (`media`).
//! 5. **context**: the prompt: history, the chat's settings read after `v0`, the group
//!    context, the notes to the model (`generate`).
//! 6. **recall**: what the model remembers in this chat (the person's memories in a
//!    private chat, the chat's in a group) into the system prompt, and the staging
//!    its memory tools write into (`recall`).
//! 7. **images**: the batch's images fetched within the round's bounds (`media`).
//! 8. **reserve**: the prompt and the most the reply may take reserved (`budget`).
//! 9. **generate**: the model asked once, its tool calls answered in between, a call
//!    that acts reserved before it runs, a memory staged (`generate`, `tools`,
//!    `actions`).
//! 10. **settle**: the reservation turned into what was spent (`budget`).
//! 11. **report**: the reply bounded, transcripts quoted, the actions taken reported
//!     (`commit`).
//! 12. **commit**: the final check, one transaction: lease still ours and nothing new
//!     since `v0`, or the cap; the staged memories written in it, or none (`commit`).
//!     A committed reply that fills the history's window asks for a summary, made
//!     after the round (`summaries`), once its rows are delivered and its lease
//!     released.
//!
//! The runner and the state are `stages`. Its other rooms: `budget` (who pays, the
//! reservation, the settle), `media` (voice messages and images), `generate` (the
//! prompt, the model call shown as a draft or "typing…", what a failure leaves),
//! `tools` (the tool loop), `actions` (a call that acts reserved and run once, the
//! report of what a batch's calls did), `approvals`, `recall` and `commit`.

mod actions;
mod approvals;
mod budget;
mod commit;
mod generate;
mod media;
mod recall;
mod stages;
mod tools;

pub(super) use actions::batch_report;
pub(super) use tools::own_tools;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::delivery::Delivery;
use super::interrupt::Interrupt;
use super::lease_keeper::LeaseKeeper;
use super::notices::Notice;
use super::{Dispatcher, Event};
use crate::dispatcher::wallet::{Reserved, Spent};
use crate::domain::ConversationId;
use crate::domain::Version;
use crate::llm::Prompt;
use crate::llm::{Generation, LlmError};
use crate::metrics as names;
use crate::store::{Batch, Claimed, HeldOut, OutboxRow, RoundClaim, StoreError};
use approvals::Approvals;
use media::AudioNotes;
use std::time::Duration;

// The state the stages share, and what they say (here, in the parent, so the stages'
// rooms and the runner all read it without naming each other).

/// What a stage says: go on to the next, or end the round's answer here.
enum Flow {
    Go,
    End(Ending),
}

/// Why a round's answer ended before its commit (or at it).
enum Ending {
    /// Nothing more to do now: not due, held over a budget, or a notice ended the
    /// batch (the stage queued what it had to say).
    Quiet,
    /// Reading the batch's media failed transiently: the messages stay pending, with
    /// the model-down notice, and the round is retried with backoff.
    Unread(LlmError),
    /// The model failed: kept pending (transient) or the batch given up, told once.
    Failed(LlmError),
    /// A newer message arrived: nothing acted on the old picture, and the next round
    /// covers everything.
    Stale { version: Version, at: StaleAt },
}

/// Where a round found itself overtaken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StaleAt {
    /// Before a call that acts (or while the model wrote): nothing acted.
    BeforeAction,
    /// At the final check: the reply is dropped.
    Commit,
}

/// A round's reservation from the budgets, as far as it got.
enum Reservation {
    /// Nothing reserved yet.
    None,
    /// Reserved, not yet turned into what was spent.
    Open(Reserved),
    /// Settled: what was spent is charged.
    Settled(Reserved),
}

/// What a round carries from stage to stage.
struct Answering {
    /// The batch: the pending messages, less the members `pay` left out.
    batch: Batch,
    /// What this round queued for delivery (notices, the reply), in order.
    rows: Vec<OutboxRow>,
    /// What the batch's approvals did.
    approvals: Approvals,
    /// Members left out by `pay` (their notices are stored after the reply).
    held_out: Vec<HeldOut>,
    /// What transcribing left to tell the model.
    audio: AudioNotes,
    /// The prompt, built by `context` (until then: the batch's, without settings).
    prompt: Prompt,
    reservation: Reservation,
    /// What the model calls of this round spent so far.
    spent: Spent,
    /// The model's reply and how long it took, from `generate`.
    generation: Option<(Generation, Duration)>,
    /// The reply's text as it will be committed, from `report`.
    reply: Option<String>,
    /// What `recall` read and the memory tools staged, written by `commit`.
    memory: crate::dispatcher::memory::Recalled,
    /// The tools this round offers (the MCP servers', then lull's own), built once by
    /// `reserve`, whose estimate counts their definitions; `None`: no tools.
    toolbox: Option<Arc<dyn crate::tools::Toolbox>>,
}

/// Add `note` to what the model is told after the batch (each note once).
fn add_note(prompt: &mut Prompt, note: &str) {
    match &mut prompt.note {
        Some(notes) if notes.contains(note) => {}
        Some(notes) => {
            notes.push('\n');
            notes.push_str(note);
        }
        None => prompt.note = Some(note.to_owned()),
    }
}

/// Run one round for `conversation`. `stop` is the hard stop of shutdown: the round
/// abandons its work and hands the lease back. `Err` only for unexpected database
/// trouble, after which the scheduler cools the conversation down; another process
/// holding the lease, a lost lease, a deferred delivery or a stop are all `Ok`.
pub(super) async fn run(
    dispatcher: &Arc<Dispatcher>,
    conversation: ConversationId,
    stop: &CancellationToken,
) -> Result<(), StoreError> {
    let d = dispatcher;
    let claimed_at = d.clock.now();
    let Some(Claimed {
        lease,
        batch,
        owed,
        held_back,
    }) = claim(d, conversation, claimed_at).await?
    else {
        return Ok(());
    };
    d.emit(Event::Claimed {
        conversation,
        token: lease.token,
    });
    let keeper = LeaseKeeper::keep(d, lease, claimed_at);
    let round = Round {
        dispatcher: d,
        conversation,
        keeper: &keeper,
        stop,
        summary_due: std::sync::Mutex::new(None),
    };
    let delivery = Delivery::new(d, conversation, &keeper, stop);
    let result = match round.under_lease(batch, owed, held_back, &delivery).await {
        Ok(()) | Err(Interrupt::Stopped | Interrupt::Deferred) => Ok(()),
        Err(Interrupt::LeaseLost) => {
            keeper.mark_lost();
            tracing::warn!(%conversation, "lease lost mid-round; abandoning");
            d.emit(Event::LeaseLost { conversation });
            Ok(())
        }
        Err(Interrupt::Store(e)) => {
            tracing::error!(%conversation, error = %e, "round failed");
            Err(e)
        }
    };
    // The last part delivered is recorded with the release (one write, not two), and
    // the release is retried until it is recorded: a delivered part is a fact.
    let last_sent = delivery.take_last_sent();
    let due = round
        .summary_due
        .lock()
        .expect("summary mutex poisoned")
        .take();
    // The round and its delivery borrow the keeper, which the release consumes.
    let _ = (delivery, round);
    keeper.release_recording(last_sent, stop).await;
    d.emit(Event::RoundEnded { conversation });
    // The summary a committed reply found due, made now that its reply is delivered
    // and the lease released (the person does not wait for it).
    if let Some(asked) = due {
        super::summaries::make_later(d, asked);
    }
    result
}

/// The claim of `conversation`'s round at `claimed_at`, in one transaction: the lease,
/// the batch and the rows owed. `None`: another process holds the lease (counted).
async fn claim(
    d: &Dispatcher,
    conversation: ConversationId,
    claimed_at: crate::domain::Timestamp,
) -> Result<Option<Claimed>, StoreError> {
    let claimed = d
        .store
        .claim_round(RoundClaim {
            conversation,
            holder: &d.holder,
            ttl: d.settings.lease.ttl(),
            history: d.settings.history,
            summaries: d.settings.summary.is_some(),
            now: claimed_at,
        })
        .await;
    match claimed {
        Ok(Some(claimed)) => Ok(Some(claimed)),
        Ok(None) => {
            metrics::counter!(names::LEASE_CONTENDED).increment(1);
            tracing::debug!(%conversation, "lease contended: another process is answering");
            d.emit(Event::Contended { conversation });
            Ok(None)
        }
        Err(e) => {
            tracing::warn!(%conversation, error = %e, "could not claim a lease");
            Err(e)
        }
    }
}

/// One round under a conversation's lease.
struct Round<'a> {
    dispatcher: &'a Dispatcher,
    conversation: ConversationId,
    keeper: &'a LeaseKeeper,
    stop: &'a CancellationToken,
    /// Set by `commit` when the committed reply filled the history's window: the
    /// summary to make after the round. A std mutex: held to set or take it only.
    summary_due: std::sync::Mutex<Option<super::summaries::SummaryAsked>>,
}

impl Round<'_> {
    async fn under_lease(
        &self,
        batch: Batch,
        owed: Vec<OutboxRow>,
        held_back: bool,
        delivery: &Delivery<'_>,
    ) -> Result<(), Interrupt> {
        // Rows owed from earlier (a crashed holder, a deferred send, notices) come
        // first, in outbox order; then what this round adds, unless a row waiting for
        // its retry holds the outbox back (a later round delivers them, in order).
        let added = self.answer(batch).await?;
        let mut rows = owed;
        if !held_back {
            rows.extend(added);
        }
        delivery.deliver(rows).await
    }

    /// Do `work` unless the lease is lost or lull stops first (then `work` is dropped
    /// where it waits). Only for work that waits on the outside: an action already
    /// running is left only by the hard stop ([`Round::until_stop`]).
    async fn guarded<T>(
        &self,
        work: impl Future<Output = Result<T, Interrupt>>,
    ) -> Result<T, Interrupt> {
        tokio::select! {
            done = work => done,
            () = self.keeper.lost() => Err(Interrupt::LeaseLost),
            () = self.stop.cancelled() => Err(Interrupt::Stopped),
        }
    }

    /// Do `work` unless lull stops first: for an action already running, whose result
    /// is a fact to record even after the lease was lost.
    async fn until_stop<T>(&self, work: impl Future<Output = T>) -> Result<T, Interrupt> {
        tokio::select! {
            done = work => Ok(done),
            () = self.stop.cancelled() => Err(Interrupt::Stopped),
        }
    }

    /// The round stopped because a newer message arrived (`at` an action: nothing
    /// acted on the old picture; `at` the final check: the reply is dropped), and the
    /// next round covers everything.
    fn stopped_stale(&self, batch: &Batch, version: crate::domain::Version, at: StaleAt) {
        let conversation = self.conversation;
        metrics::counter!(names::REPLIES_DROPPED_STALE).increment(1);
        match at {
            StaleAt::BeforeAction => {
                tracing::debug!(%conversation, v0 = batch.v0.0, version = version.0, "round stopped before an action: a newer message arrived");
            }
            StaleAt::Commit => {
                tracing::debug!(%conversation, v0 = batch.v0.0, version = version.0, "stale reply dropped: a newer message arrived");
            }
        }
        self.dispatcher.emit(Event::DroppedStale {
            conversation,
            v0: batch.v0,
            version,
        });
    }

    /// Queue a notice for this batch's conversation, at most once per `dedupe_key`;
    /// the row is returned if it was queued now (this round delivers it).
    async fn notice(
        &self,
        batch: &Batch,
        text: impl Into<crate::texts::NoticeText>,
        dedupe_key: String,
    ) -> Result<Option<OutboxRow>, Interrupt> {
        let d = self.dispatcher;
        Ok(Notice::to_batch(batch)
            .queue(d, text, dedupe_key, d.clock.now())
            .await?)
    }
}
