//! The round's last two stages: **report** (the reply as it may be committed:
//! transcripts quoted, bounded, the actions it took reported whatever the model
//! wrote) and **commit** (the final check, one transaction: the lease still ours and
//! nothing new since `v0`, or the cap reached; else the reply is dropped).

use super::{Answering, Ending, Flow, Interrupt, Reservation, Round, StaleAt, media};
use crate::dispatcher::summaries::{self, SummaryAsked};
use crate::dispatcher::{Event, wallet};
use crate::metrics as names;
use crate::store::{CommitOutcome, NewReply, ReplyCommit};

impl Round<'_> {
    /// The `report` stage: a reply that acted says what it did, whatever the model
    /// wrote; the report is never cut, the model's text is cut to leave it room.
    pub(super) async fn report(&self, a: &mut Answering) -> Result<Flow, Interrupt> {
        let Some((generation, _)) = &mut a.generation else {
            return Ok(Flow::End(Ending::Quiet));
        };
        // A reply offers no quick replies: only the report's words go with it.
        let report = self
            .actions_report(&a.batch, &a.approvals.decided)
            .await?
            .text;
        let text = self.bounded_leaving(
            media::quote_transcripts(&a.batch, std::mem::take(&mut generation.text)),
            lull_port::split::char_len(&report),
        );
        a.reply = Some(text + &lull_port::secrets::redact(report));
        Ok(Flow::Go)
    }

    /// The `commit` stage: the final check. Committed, the reply (and the notices of
    /// the members left out, after it) join the rows to deliver; stale, it is dropped.
    pub(super) async fn commit(&self, a: &mut Answering) -> Result<Flow, Interrupt> {
        let d = self.dispatcher;
        let conversation = self.conversation;
        let (Some((generation, llm_time)), Some(text)) = (&a.generation, a.reply.take()) else {
            return Ok(Flow::End(Ending::Quiet));
        };
        let summary = self.summary_asked(a, &text);
        let reply = NewReply {
            text,
            usage: generation.usage,
            llm_ms: llm_time.as_millis() as u64,
            held_out: std::mem::take(&mut a.held_out),
            memories: a.memory.writes(),
        };
        let lease = self.keeper.lease();
        let commit = ReplyCommit {
            lease: &lease,
            batch: &a.batch,
            reply,
            now: d.clock.now(),
        };
        let (outbox, forced, notices) = match d.store.commit_reply(commit).await? {
            CommitOutcome::Committed {
                outbox,
                forced,
                notices,
                memories,
            } => {
                crate::dispatcher::memory::count_applied(memories);
                (outbox, forced, notices)
            }
            CommitOutcome::Stale { version } => {
                debug_assert!(matches!(a.reservation, Reservation::Settled(_)));
                return Ok(Flow::End(Ending::Stale {
                    version,
                    at: StaleAt::Commit,
                }));
            }
        };
        let batch = &a.batch;
        metrics::histogram!(names::BATCH_MESSAGES).record(batch.pending.len() as f64);
        tracing::info!(
            %conversation,
            version = batch.v0.0,
            batch = batch.pending.len(),
            token = lease.token.0,
            llm_ms = llm_time.as_millis() as u64,
            prompt_tokens = generation.usage.map(|u| u.prompt),
            completion_tokens = generation.usage.map(|u| u.completion),
            forced,
            "reply committed"
        );
        d.emit(Event::Committed {
            conversation,
            outbox: outbox.id,
            v0: batch.v0,
            batch: batch.pending.len(),
            forced,
        });
        a.rows.push(outbox);
        // The notices of members left out, stored after the reply.
        a.rows.extend(notices);
        // Asked for once the reply is committed; made after the round.
        *self.summary_due.lock().expect("summary mutex poisoned") = summary;
        Ok(Flow::Go)
    }

    /// The summary to make after the round if the reply `text` fills the history's
    /// window (`LULL_SUMMARY=on`): paid by the people it answers, by the chat's model
    /// unless `LULL_SUMMARY_MODEL` names one.
    fn summary_asked(&self, a: &Answering, text: &str) -> Option<SummaryAsked> {
        let settings = self.dispatcher.settings.summary.as_ref()?;
        let batch = &a.batch;
        summaries::due(settings, batch, text).then(|| SummaryAsked {
            conversation: self.conversation,
            chat: batch.conversation.clone(),
            is_group: batch.is_group,
            payers: wallet::authors(&batch.pending),
            chat_model: a.prompt.choices.model.clone(),
        })
    }
}
