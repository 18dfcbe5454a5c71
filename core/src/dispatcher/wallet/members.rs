//! Who pays in a group: the members whose budget (tokens or dollars) cannot pay their
//! share of the shortest reply are left out of the batch and told so.

use super::super::Dispatcher;
use super::spent::{authors, media_tokens, price_of, prompt_tokens};
use crate::domain::Timestamp;
use crate::limits::Spending;
use crate::llm::Prompt;
use crate::money::Usd;
use crate::store::{Batch, HeldOut, PendingMessage, StoreError, Unit, Used};
use crate::texts;

/// A group member left out of a batch: their budget cannot pay their share of the
/// shortest reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::dispatcher) struct MemberOver {
    pub user_id: String,
    pub author: String,
    /// The budget they cannot pay from, and how much of it is used.
    pub spending: Spending,
}

impl MemberOver {
    /// The notice that answers this member's messages of `batch` (the whole batch as
    /// collected), instead of the reply.
    pub(in crate::dispatcher) fn held_out(
        &self,
        d: &Dispatcher,
        batch: &Batch,
        now: Timestamp,
    ) -> HeldOut {
        let tz = &d.settings.limits.timezone;
        let theirs: Vec<&PendingMessage> = batch
            .pending
            .iter()
            .filter(|m| m.user_id == self.user_id)
            .collect();
        HeldOut {
            rows: theirs.iter().map(|m| m.row).collect(),
            text: texts::held_out_text(
                &self.author,
                &self.spending,
                &tz.show(tz.next_day(now), now),
            ),
            reply_to: theirs.last().map(|m| m.message_id.clone()),
        }
    }
}

/// What a group is told when every author of its batch is over their budget: one
/// line each (the notice ends the batch: a group is never held for one member).
pub(in crate::dispatcher) fn refusal_text(
    d: &Dispatcher,
    over: &[MemberOver],
    now: Timestamp,
) -> String {
    let tz = &d.settings.limits.timezone;
    let resets = tz.show(tz.next_day(now), now);
    over.iter()
        .map(|m| texts::over_budget_text(&m.author, &m.spending, &resets))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What the shortest reply to some messages costs: tokens and dollars.
#[derive(Debug, Clone, Copy)]
struct Least {
    tokens: u64,
    cost: Usd,
}

impl Least {
    /// One of `n` equal shares, rounded up.
    fn share(self, n: u64) -> Least {
        Least {
            tokens: self.tokens.div_ceil(n),
            cost: Usd(self.cost.0.div_ceil(n)),
        }
    }
}

/// What the shortest reply to `messages` (asked with `prompt`) costs: the prompt as
/// estimated, their media, and the shortest reply, at the prompt's model's price.
fn least_reply(d: &Dispatcher, prompt: &Prompt, messages: &[PendingMessage]) -> Least {
    let limits = &d.settings.limits;
    let input = prompt_tokens(limits, prompt) + media_tokens(d, messages);
    Least {
        tokens: input + limits.min_reply_tokens(),
        cost: price_of(d, prompt).worst(input, limits.min_reply_tokens()),
    }
}

/// The budget a member over it cannot pay `share` from (tokens first), if any.
fn short_of(d: &Dispatcher, used: Used, share: Least) -> Option<Spending> {
    let limits = &d.settings.limits;
    let (tokens, usd) = super::user_left(limits, used);
    if tokens < share.tokens {
        return Some(Spending::of(
            "user",
            used.tokens,
            limits.user_daily_tokens,
            Unit::Tokens,
        ));
    }
    (usd < share.cost.0)
        .then(|| Spending::of("user", used.cost.0, limits.user_daily_usd.0, Unit::Usd))
}

/// The group members whose budget cannot pay their share of the shortest reply to
/// the batch (see the module docs); `prompt_of` builds the prompt of a part of the
/// batch. Every author, when none can pay: then the batch is ended with a notice
/// ([`refusal_text`]), so a member over budget who writes alone holds nobody either.
/// Empty in a private chat, without a per-user budget, and when the bot's budget
/// cannot pay: then the whole batch is refused by [`super::reserve`] and held.
pub(in crate::dispatcher) async fn members_over(
    d: &Dispatcher,
    batch: &Batch,
    prompt_of: impl Fn(&[PendingMessage]) -> Prompt,
    now: Timestamp,
) -> Result<Vec<MemberOver>, StoreError> {
    let limits = &d.settings.limits;
    let platform = batch.conversation.platform;
    if !batch.is_group || !limits.has_user_budget() {
        return Ok(Vec::new());
    }
    let weighed = super::weigh(d, platform, &authors(&batch.pending), now).await?;
    if weighed.limited.is_empty() {
        return Ok(Vec::new());
    }
    let bot = weighed.bot;
    let mut over: Vec<MemberOver> = Vec::new();
    loop {
        let included: Vec<PendingMessage> = batch
            .pending
            .iter()
            .filter(|m| !over.iter().any(|o| o.user_id == m.user_id))
            .cloned()
            .collect();
        let payers = authors(&included);
        if payers.is_empty() {
            // Every member is over their own budget: each is told, nobody waits.
            return Ok(over);
        }
        let least = least_reply(d, &prompt_of(&included), &included);
        if least.tokens > bot.0 || least.cost.0 > bot.1 {
            return Ok(Vec::new());
        }
        let share = least.share(payers.len() as u64);
        // The poorest member short of their share goes first: without them the
        // others' shares grow, and the loop looks again.
        let Some((user, spending, _)) = weighed
            .limited
            .iter()
            .filter(|(u, _)| payers.contains(u))
            .filter_map(|(u, used)| {
                let left = super::user_left(limits, *used);
                short_of(d, *used, share).map(|s| (u, s, left))
            })
            .min_by_key(|(_, _, left)| *left)
        else {
            return Ok(over);
        };
        let author = batch
            .pending
            .iter()
            .rev()
            .find(|m| &m.user_id == user)
            .map_or_else(|| user.clone(), |m| m.author.clone());
        tracing::info!(conversation = %batch.conversation, user = %user, budget = spending.what(), used = %spending.amounts(), "a group member is over their budget: the others are answered without their messages");
        over.push(MemberOver {
            user_id: user.clone(),
            author,
            spending,
        });
    }
}
