//! The round's side of the budget, its stages **pay** (who pays, before anything is
//! read), **reserve** (before the model is asked) and **settle** (after). The rules themselves (shares, the
//! estimate, what a reservation holds) are the wallet's ([`crate::dispatcher::wallet`]);
//! here they are applied under this round's lease.

use super::{Answering, Ending, Flow, Interrupt, Reservation, Round};
use crate::dispatcher::wallet::{self, Reserved, Spent};
use crate::domain::Timestamp;
use crate::llm::Prompt;
use crate::metrics as names;
use crate::store::{Batch, GiveUp, HeldOut, OutboxRow};
use crate::texts::NoticeText;

impl Round<'_> {
    /// The `pay` stage: the batch without the members over their budget (their
    /// notices go with the reply); ends when every member who wrote is over theirs.
    pub(super) async fn pay(&self, a: &mut Answering) -> Result<Flow, Interrupt> {
        let now = self.dispatcher.clock.now();
        let paid = self
            .who_pays(a.batch.clone(), &mut a.rows, &a.approvals.report, now)
            .await?;
        let Some((batch, held_out)) = paid else {
            return Ok(Flow::End(Ending::Quiet));
        };
        a.batch = batch;
        a.held_out = held_out;
        Ok(Flow::Go)
    }

    /// The `reserve` stage: over a budget, the messages wait, held until it resets
    /// (what the batch's approvals did is said now); else the reply may take no more
    /// than was reserved for it.
    pub(super) async fn reserve_budget(&self, a: &mut Answering) -> Result<Flow, Interrupt> {
        // The tools' definitions go with every request that offers them: the worst
        // case counts them. The round's toolbox is built here, once (the tool loop
        // offers from it).
        a.toolbox = self.toolbox_for(&a.batch, &a.memory);
        if let Some(toolbox) = &a.toolbox {
            a.prompt.tools = self.offered(toolbox.as_ref(), &a.batch).into();
        }
        let reserved = match self.reserve(&a.batch, &a.prompt, &mut a.rows).await? {
            wallet::Reserve::Reserved(reserved) => reserved,
            wallet::Reserve::Held => {
                a.rows
                    .extend(self.approvals_held(&a.batch, &a.approvals).await?);
                return Ok(Flow::End(Ending::Quiet));
            }
            // Tried again in a moment: what the approvals did is said with the reply.
            wallet::Reserve::Busy => return Ok(Flow::End(Ending::Quiet)),
        };
        a.prompt.max_tokens = reserved.max_tokens();
        a.reservation = Reservation::Open(reserved);
        Ok(Flow::Go)
    }

    /// The `settle` stage: spent whether or not the reply is committed, so charged
    /// before the final check.
    pub(super) async fn settle_spent(&self, a: &mut Answering) -> Result<Flow, Interrupt> {
        if let Reservation::Open(reserved) = &a.reservation {
            self.settle(&a.batch, reserved, a.spent).await?;
            a.reservation = Reservation::Settled(reserved.clone());
        }
        Ok(Flow::Go)
    }

    /// Who pays: in a group, a member whose budget cannot pay their share of a reply
    /// is left out, and a notice answers their messages with the reply (see `wallet`);
    /// what they sent is neither transcribed nor fetched. Returns the batch without
    /// them and those notices; `None` when every member who wrote is over their
    /// budget: then one notice ended the batch (it joins `rows`), ending with `taken`
    /// (the report of the actions the batch's approvals took, if any).
    pub(super) async fn who_pays(
        &self,
        collected: Batch,
        rows: &mut Vec<OutboxRow>,
        taken: &NoticeText,
        now: Timestamp,
    ) -> Result<Option<(Batch, Vec<HeldOut>)>, Interrupt> {
        let d = self.dispatcher;
        let over = wallet::members_over(
            d,
            &collected,
            |messages| self.prompt_of(&collected, messages),
            now,
        )
        .await?;
        let held_out: Vec<_> = over
            .iter()
            .map(|member| member.held_out(d, &collected, now))
            .collect();
        let mut batch = collected.clone();
        batch
            .pending
            .retain(|m| !over.iter().any(|o| o.user_id == m.user_id));
        if batch.pending.is_empty() {
            // Every member who wrote is over their budget: each is told, and the
            // notice ends the batch, so the group is not held for them.
            metrics::counter!(names::LIMITED, "reason" => "user_budget").increment(1);
            let notice =
                NoticeText::from(wallet::refusal_text(d, &over, now)).followed_by(taken.clone());
            rows.extend(
                d.store
                    .give_up(GiveUp {
                        lease: &self.keeper.lease(),
                        batch: &collected,
                        notice: &notice.text,
                        quick_replies: &notice.quick_replies,
                        now: d.clock.now(),
                    })
                    .await?,
            );
            return Ok(None);
        }
        Ok(Some((batch, held_out)))
    }

    /// Reserve the prompt and the most the reply may take, under the lease; `None`:
    /// over a budget, the messages are held until it resets (a notice, if queued now,
    /// joins `rows`).
    pub(super) async fn reserve(
        &self,
        batch: &Batch,
        prompt: &Prompt,
        rows: &mut Vec<OutboxRow>,
    ) -> Result<wallet::Reserve, Interrupt> {
        let d = self.dispatcher;
        let lease = self.keeper.lease();
        Ok(wallet::reserve(d, &lease, batch, prompt, rows, d.clock.now()).await?)
    }

    /// Count what a generation whose reply never went out spent, under the lease. Only
    /// a figure for `/usage` and the metrics: a failure to record it is logged and the
    /// round goes on (its drop was already settled).
    pub(super) async fn count_dropped(
        &self,
        reserved: &Reserved,
        spent: Spent,
    ) -> Result<(), Interrupt> {
        let d = self.dispatcher;
        let counted =
            wallet::count_dropped(d, &self.keeper.lease(), reserved, spent, d.clock.now()).await;
        if let Err(e) = counted {
            tracing::warn!(conversation = %self.conversation, error = %e, "could not count the tokens of a dropped generation");
        }
        Ok(())
    }

    /// Turn the reservation into what was spent, under the lease.
    pub(super) async fn settle(
        &self,
        batch: &Batch,
        reserved: &Reserved,
        spent: Spent,
    ) -> Result<(), Interrupt> {
        let d = self.dispatcher;
        wallet::settle(
            d,
            &self.keeper.lease(),
            batch,
            reserved,
            spent,
            d.clock.now(),
        )
        .await?;
        Ok(())
    }
}
