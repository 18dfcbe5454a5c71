//! The round's stages as one ordered list over one state ([`Answering`]), and the
//! runner that walks it. Each stage returns [`Flow::Go`] or [`Flow::End`]; the runner
//! does once what every stage would otherwise repeat:
//!
//! - the guard: a stage that waits on the outside (a platform's file server, a
//!   transcription) is abandoned when the lease is lost or lull stops; `generate`
//!   guards itself, because an action already running may be left only by the hard
//!   stop (its result is a fact to record); the stages that write are fenced by the
//!   lease in the store itself and never abandoned mid-write;
//! - the end: a reservation not yet settled is settled on every early end (only what
//!   a server reported, or the estimate of a request stopped mid-way, is charged); a
//!   model that failed is told once (the messages kept pending, or the batch ended
//!   when retrying cannot help); a round that a newer message overtook is counted.
//!
//! A new behaviour of the round lands as one stage in [`STAGES`], and in the list of
//! the round's module doc, which names them in the same order (a test checks it).

use super::approvals::Approvals;
use super::media::AudioNotes;
use super::{Answering, Ending, Flow, Interrupt, Reservation, Round};
use crate::dispatcher::memory::Recalled;
use crate::dispatcher::wallet::Spent;
use crate::llm::FailureKind;
use crate::store::{Batch, OutboxRow};

/// One stage of a round, in [`STAGES`] order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stage {
    /// Is the batch due? An empty one disarms its timer; one not due yet waits.
    Due,
    /// The batch's `/approve` and `/cancel` decided, approved calls run once.
    Approvals,
    /// Who pays: group members over their budget are left out, with a notice.
    Pay,
    /// Voice messages transcribed, each transcript stored before the next.
    Transcribe,
    /// The prompt: history, the chat's settings (read after `v0`), group context.
    Context,
    /// What the model remembers in this chat, into the system prompt; the memory
    /// tools' staging.
    Recall,
    /// The batch's images fetched within the round's bounds.
    Images,
    /// The prompt and the most the reply may take, reserved from the budgets.
    Reserve,
    /// The model asked once, answering its tool calls in between (the tool loop).
    Generate,
    /// The reservation turned into what was spent.
    Settle,
    /// The reply bounded, its transcripts quoted, the actions it took reported.
    Report,
    /// The final check: lease still ours and nothing new since `v0` (or the cap).
    Commit,
}

/// Every stage of a round, in the order it runs them.
pub(super) const STAGES: [Stage; 12] = [
    Stage::Due,
    Stage::Approvals,
    Stage::Pay,
    Stage::Transcribe,
    Stage::Context,
    Stage::Recall,
    Stage::Images,
    Stage::Reserve,
    Stage::Generate,
    Stage::Settle,
    Stage::Report,
    Stage::Commit,
];

/// How the runner guards a stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guard {
    /// Waits on the outside: abandoned when the lease is lost or lull stops.
    LeaseAndStop,
    /// Guards itself (an action already running is left only by the hard stop).
    Own,
    /// Writes fenced by the lease in the store: never abandoned mid-write.
    Fenced,
}

impl Stage {
    /// The stage's name, as the round's module doc lists it.
    pub(super) fn name(self) -> &'static str {
        match self {
            Stage::Due => "due",
            Stage::Approvals => "approvals",
            Stage::Pay => "pay",
            Stage::Transcribe => "transcribe",
            Stage::Context => "context",
            Stage::Recall => "recall",
            Stage::Images => "images",
            Stage::Reserve => "reserve",
            Stage::Generate => "generate",
            Stage::Settle => "settle",
            Stage::Report => "report",
            Stage::Commit => "commit",
        }
    }

    fn guard(self) -> Guard {
        match self {
            Stage::Transcribe | Stage::Images => Guard::LeaseAndStop,
            Stage::Generate => Guard::Own,
            _ => Guard::Fenced,
        }
    }
}

impl Round<'_> {
    /// Answer the pending messages, if any are due: the [`STAGES`] in order. What is
    /// queued for delivery (notices, the reply) is returned, oldest first.
    pub(super) async fn answer(&self, batch: Batch) -> Result<Vec<OutboxRow>, Interrupt> {
        let mut answering = Answering {
            prompt: self.prompt(&batch),
            batch,
            rows: Vec::new(),
            approvals: Approvals::default(),
            held_out: Vec::new(),
            audio: AudioNotes::default(),
            reservation: Reservation::None,
            spent: Spent::default(),
            generation: None,
            reply: None,
            memory: Recalled::default(),
            toolbox: None,
        };
        for stage in STAGES {
            let flow = match stage.guard() {
                Guard::LeaseAndStop => self.guarded(self.stage(stage, &mut answering)).await?,
                Guard::Own | Guard::Fenced => self.stage(stage, &mut answering).await?,
            };
            if let Flow::End(ending) = flow {
                tracing::trace!(conversation = %self.conversation, stage = stage.name(), "the round's answer ends here");
                self.end(&mut answering, ending).await?;
                break;
            }
        }
        Ok(answering.rows)
    }

    /// Run one stage.
    async fn stage(&self, stage: Stage, a: &mut Answering) -> Result<Flow, Interrupt> {
        match stage {
            Stage::Due => self.due(&a.batch).await,
            Stage::Approvals => self.approvals(a).await,
            Stage::Pay => self.pay(a).await,
            Stage::Transcribe => self.transcribe_batch(a).await,
            Stage::Context => self.context(a).await,
            Stage::Recall => self.recall(a).await,
            Stage::Images => self.images(a).await,
            Stage::Reserve => self.reserve_budget(a).await,
            Stage::Generate => self.generate_reply(a).await,
            Stage::Settle => self.settle_spent(a).await,
            Stage::Report => self.report(a).await,
            Stage::Commit => self.commit(a).await,
        }
    }

    /// What every early end does: settle what was reserved, then say why it ended.
    async fn end(&self, a: &mut Answering, ending: Ending) -> Result<(), Interrupt> {
        if let Reservation::Open(reserved) = &a.reservation {
            // Only what a server reported (earlier tool turns), or the estimate of a
            // request stopped mid-way, was spent.
            self.settle(&a.batch, reserved, a.spent).await?;
            a.reservation = Reservation::Settled(reserved.clone());
        }
        match ending {
            Ending::Quiet => {}
            Ending::Unread(error) => a
                .rows
                .extend(self.generation_failed(&a.batch, error).await?),
            Ending::Failed(error) if error.kind() == FailureKind::Transient => {
                a.rows
                    .extend(self.generation_failed(&a.batch, error).await?);
            }
            Ending::Failed(error) => a.rows.extend(self.give_up(&a.batch, error).await?),
            Ending::Stale { version, at } => {
                if let Reservation::Settled(reserved) = &a.reservation {
                    self.count_dropped(reserved, a.spent).await?;
                }
                self.stopped_stale(&a.batch, version, at);
            }
        }
        Ok(())
    }

    /// The `due` stage: an empty batch disarms its timer (nothing to answer), and a
    /// batch whose timer is not due yet waits for it.
    async fn due(&self, batch: &Batch) -> Result<Flow, Interrupt> {
        let d = self.dispatcher;
        let now = d.clock.now();
        if batch.pending.is_empty() {
            if batch.timer.is_some() {
                d.store
                    .disarm_idle_timer(crate::store::IdleDisarm {
                        lease: &self.keeper.lease(),
                        v0: batch.v0,
                        now,
                    })
                    .await?;
            }
            return Ok(Flow::End(Ending::Quiet));
        }
        if batch.timer.is_some_and(|t| t.due_at > now) {
            return Ok(Flow::End(Ending::Quiet));
        }
        Ok(Flow::Go)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The round's module doc names the stages one-to-one, in the order they run: a
    /// stage added to the list without its line there (or the other way) fails here.
    #[test]
    fn the_round_doc_names_the_stages_in_order() {
        let doc: Vec<&str> = include_str!("mod.rs")
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .filter_map(|l| l.strip_prefix("//! ")?.strip_prefix(char::is_numeric))
            .filter_map(|l| {
                let l = l
                    .trim_start_matches(char::is_numeric)
                    .strip_prefix(". **")?;
                l.split("**").next()
            })
            .collect();
        let stages: Vec<&str> = STAGES.iter().map(|s| s.name()).collect();
        assert_eq!(doc, stages);
    }
}
