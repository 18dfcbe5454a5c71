//! The wallet: what a round may spend, decided under the conversation's lease.
//!
//! 1. **Who pays** ([`members_over`]). A batch is charged to its authors, in equal
//!    shares, each against their own `LULL_USER_DAILY_TOKENS` (admins excepted), and
//!    the whole of it to the bot's `LULL_DAILY_TOKENS`. In a group, a member whose
//!    budget cannot pay their share of even the shortest reply is left out of the
//!    batch: the others are answered, and the member's messages are answered by a
//!    notice that says how much of their budget is used ([`HeldOut`], stored in the
//!    commit's transaction: one delivered row covers each message, so no loss and no
//!    duplicate, and a stale reply stores neither). Why not keep their messages
//!    pending until midnight: a conversation has one timer and one version line; held
//!    messages would hold the timer (and the cap, which counts from the oldest
//!    pending message) for every member, which is the freeze this avoids, and a reply
//!    a day later to a group's talk would answer a conversation that has moved on.
//!    When no member can pay, the batch is ended the same way, by one notice that
//!    covers it ([`Store::give_up`](crate::store::Store::give_up)): a member over
//!    budget writing alone holds nobody either. When the bot's budget cannot pay, or
//!    in a private chat, the messages stay pending and the conversation is held until
//!    the budget resets, with a notice once. Who is over is read before the round's own reservation;
//!    another process spending the same member's budget in between can still make
//!    that reservation fail, and then the batch is held like this (rare: the member
//!    must be spending in two conversations at that moment).
//! 2. **Reserve** ([`reserve`]), before the model is asked: the prompt as estimated
//!    ([`prompt_tokens`]) plus the most the reply may take: `LULL_MAX_TOKENS`, or what
//!    the budgets have left when that is less (the request's `max_tokens` is capped
//!    to it, [`Reserved::max_tokens`]). A remainder below the shortest reply is
//!    refused by the store, which checks every budget in the same transaction as the
//!    charge, so processes answering at once never spend past a budget together. The
//!    reservation is recorded in the database under the lease's token and the day:
//!    a round that never settles gives it back at the next claim.
//! 3. **Settle** ([`settle`]), after the model answered or failed: the reservation
//!    becomes what the model reported, on the reservation's day (a round that runs
//!    past midnight is charged to the day it reserved on). A model that reports more
//!    than was reserved is charged what it reported: the completion was bounded by
//!    the request's `max_tokens`, only the prompt's estimate can fall short, and the
//!    next round finds the budget spent and refuses, saying so.
//!
//! Transcriptions are charged as they happen ([`charge_transcription`]), against the
//! sender's and the bot's budgets; over budget, a voice message is not transcribed.
//!
//! **Dollars** ride in the same charges as tokens: each charge carries its cost at
//! the model's price (`LULL_PRICES`, [`crate::money`]) beside its tokens, per person,
//! chat and day, and on the bot's month ([`limits::BOT_MONTH_SCOPE`]). A reservation
//! holds the worst case in dollars too (the estimated prompt and the reply's
//! `max_tokens`, none of it cached), the reply's `max_tokens` is capped by what the
//! dollar budgets have left as by the token budgets, and the settle turns it into
//! the reported usage's cost (cached prompt tokens at the cached price). A round held
//! by the month's budget is looked at again each day (the hold is a day's), its
//! notice sent once a month.
//!
//! Split by job: [`spent`] (what calls spent, the prompt's estimate), [`members`]
//! (who pays in a group), [`charges`] (the scopes of a charge, the plain charges).

mod charges;
mod members;
mod spent;

pub(super) use charges::{
    Amount, charge_summary, charge_transcription, count_dropped, refund_transcription,
};
pub(super) use members::{members_over, refusal_text};
pub(super) use spent::{Spent, authors, model_of, price_of, prompt_tokens};

use charges::{ChargeOf, charge_under};

use super::notices::Notice;
use super::{Dispatcher, Event};
use crate::domain::{Lease, Timestamp};
use crate::limits::{self, Limits, Spending};
use crate::llm::Prompt;
use crate::metrics as names;
use crate::money::Usd;
use crate::store::{Batch, Charged, OutboxRow, Period, Reservation, StoreError, Used};
use crate::texts;

/// What [`reserve`] did.
#[derive(Debug)]
pub(super) enum Reserve {
    /// Reserved: ask the model, then settle.
    Reserved(Reserved),
    /// A budget is spent: the messages wait until it resets, and the conversation is
    /// told once (the notice joined the round's rows).
    Held,
    /// Other rounds' reservations fill a budget for now: the conversation tries again
    /// in a moment ([`crate::store::BUSY_RETRY`]); nobody is told anything.
    Busy,
}

/// What a round reserved, to be settled once the model answered (or failed).
#[derive(Debug, Clone)]
pub(super) struct Reserved {
    /// The authors charged (user ids, sorted, each once).
    authors: Vec<String>,
    /// Tokens and dollars reserved in all (zero: no budget is set, nothing was
    /// reserved).
    amount: Amount,
    /// The model asked, whose price the settle charges at (`lull_cost_usd_total`).
    model: String,
    /// The day the reservation counts for: the settle lands on it.
    day: String,
    /// The most tokens the reply may take: the request's `max_tokens`.
    max_tokens: Option<u64>,
}

impl Reserved {
    /// The cap for the request's `max_tokens` (`None`: `LULL_MAX_TOKENS` alone).
    pub(super) fn max_tokens(&self) -> Option<u64> {
        self.max_tokens
    }
}

/// What the whole bot spent in the month `now` falls on (its month row), for
/// `LULL_MONTHLY_USD`; nothing is read without that budget (a round's hot path).
pub(super) async fn bot_month(d: &Dispatcher, now: Timestamp) -> Result<Used, StoreError> {
    if !d.settings.limits.monthly_usd.is_set() {
        return Ok(Used::default());
    }
    let month = d.settings.limits.timezone.month(now);
    Ok(d.store
        .token_usage(&month, &[limits::BOT_MONTH_SCOPE.to_owned()])
        .await?[0])
}

/// What the bot has left today and this month, tokens and nano-dollars (`u64::MAX`
/// for a budget not set).
pub(super) fn bot_left(limits: &Limits, today: Used, month: Used) -> (u64, u64) {
    let tokens = if limits.daily_tokens > 0 {
        limits.daily_tokens.saturating_sub(today.tokens)
    } else {
        u64::MAX
    };
    let mut usd = u64::MAX;
    if limits.daily_usd.is_set() {
        usd = usd.min(limits.daily_usd.0.saturating_sub(today.cost.0));
    }
    if limits.monthly_usd.is_set() {
        usd = usd.min(limits.monthly_usd.0.saturating_sub(month.cost.0));
    }
    (tokens, usd)
}

/// Before the model is asked: reserve the prompt (as estimated) and the most the
/// reply may take, in tokens and in dollars at the model's price, in every budget the
/// batch counts against, under the lease ([`Reserve::Reserved`]; nothing is reserved
/// when no budget is set). The reply may take `LULL_MAX_TOKENS`, or what the budgets
/// have left after the prompt when that is less, down to the shortest reply.
/// [`Reserve::Held`]: a budget cannot hold that; nothing was charged, the store holds
/// the conversation until the budget resets, and the user is told once how much is
/// used (the notice, if queued now, joins `rows`). [`Reserve::Busy`]: a budget filled
/// only by other rounds' reservations not yet settled ([`Charged::Busy`]); nothing
/// was charged, nobody is told, the store holds the conversation a moment and the
/// round tries again once they settle.
pub(super) async fn reserve(
    d: &Dispatcher,
    lease: &Lease,
    batch: &Batch,
    prompt: &Prompt,
    rows: &mut Vec<OutboxRow>,
    now: Timestamp,
) -> Result<Reserve, StoreError> {
    let limits = &d.settings.limits;
    let day = limits.timezone.day(now);
    let authors = authors(&batch.pending);
    let model = model_of(d, prompt);
    if !limits.has_budget() {
        return Ok(Reserve::Reserved(Reserved {
            authors,
            amount: Amount::default(),
            model,
            day,
            max_tokens: None,
        }));
    }
    let left = room(d, batch, &authors, now).await?;
    let (reply, amount) = worst_case(limits, &model, prompt, left);
    let charge = ChargeOf {
        conversation: &batch.conversation,
        authors: &authors,
        per_author: amount.share(authors.len()),
        total: amount,
        check: true,
        hold_until: Some(limits.timezone.next_day(now)),
        reservation: Reservation::Reserve,
        day: day.clone(),
    }
    .build(d);
    match charge_under(d, lease, &charge, now).await? {
        Charged::Charged => {
            if reply < limits.reply_tokens {
                tracing::debug!(conversation = %batch.conversation, max_tokens = reply, "the reply is capped to what the budget has left");
            }
            Ok(Reserve::Reserved(Reserved {
                authors,
                amount,
                model,
                day,
                max_tokens: Some(reply),
            }))
        }
        Charged::Busy { scope } => {
            // Not spent: other rounds' reservations fill it for now. The store holds
            // the conversation for a moment; nobody is told anything.
            tracing::debug!(conversation = %batch.conversation, %scope, "a budget is reserved to the brim by other rounds: trying again once they settle");
            Ok(Reserve::Busy)
        }
        Charged::Over {
            scope,
            used,
            limit,
            unit,
        } => {
            let spending = Spending::of(&scope, used, limit, unit);
            held(d, batch, &scope, spending, rows, now).await?;
            Ok(Reserve::Held)
        }
    }
}

/// The most the reply may take and the worst case of the call, tokens and dollars at
/// `model`'s price, given what the budgets have `left` (tokens, nano-dollars): the
/// reply takes `LULL_MAX_TOKENS`, or what the prompt's estimate leaves of either
/// when that is less, down to the shortest reply.
fn worst_case(limits: &Limits, model: &str, prompt: &Prompt, left: (u64, u64)) -> (u64, Amount) {
    let price = limits.prices.tokens_of(model);
    let estimate = prompt_tokens(limits, prompt);
    let unreserved = crate::switches::unreserved_dollars();
    let by_dollars = if unreserved {
        u64::MAX
    } else {
        price.output_within(Usd(left.1), estimate)
    };
    let reply = limits
        .reply_tokens
        .min(left.0.saturating_sub(estimate))
        .min(by_dollars)
        .max(limits.min_reply_tokens());
    let worst = price.worst(estimate, reply);
    // Counter-test only: check that a nano-dollar is left, reserve nothing more.
    let worst = if unreserved { worst.min(Usd(1)) } else { worst };
    (reply, Amount::new(estimate + reply, worst))
}

/// A batch refused by `scope`'s budget: counted, and the conversation told once per
/// the budget's period (the store holds its timer until the next day).
async fn held(
    d: &Dispatcher,
    batch: &Batch,
    scope: &str,
    spending: Spending,
    rows: &mut Vec<OutboxRow>,
    now: Timestamp,
) -> Result<(), StoreError> {
    let tz = &d.settings.limits.timezone;
    let until = match spending.period {
        Period::Day => tz.next_day(now),
        Period::Month => tz.next_month(now),
    };
    let yours = scope.starts_with("user:");
    let reason = if yours { "user_budget" } else { "bot_budget" };
    metrics::counter!(names::LIMITED, "reason" => reason).increment(1);
    let conversation = batch.conversation_id;
    tracing::info!(%conversation, %scope, budget = spending.what(), used = %spending.amounts(), until = until.0, "not enough left of a budget for a reply: messages held until it resets");
    d.emit(Event::Limited {
        conversation,
        reason,
        until,
    });
    let text = texts::budget_text(yours, &spending, &tz.show(until, now));
    let period = spending.period.key(&tz.day(now));
    let dedupe_key = format!("budget/{scope}/{period}/{}", batch.conversation);
    rows.extend(
        Notice::answering_batch(batch)
            .queue(d, text, dedupe_key, now)
            .await?,
    );
    Ok(())
}

/// What the bot's budgets and the budgets of `authors` leave for a reply to them
/// (each author pays an equal share): tokens and nano-dollars, `u64::MAX` when
/// none limits it.
async fn room(
    d: &Dispatcher,
    batch: &Batch,
    authors: &[String],
    now: Timestamp,
) -> Result<(u64, u64), StoreError> {
    let weighed = weigh(d, batch.conversation.platform, authors, now).await?;
    let n = authors.len().max(1) as u64;
    let (mut tokens, mut usd) = weighed.bot;
    for (_, used) in &weighed.limited {
        let (left, left_usd) = user_left(&d.settings.limits, *used);
        tokens = tokens.min(left.saturating_mul(n));
        usd = usd.min(left_usd.saturating_mul(n));
    }
    Ok((tokens, usd))
}

/// What [`room`] and [`members::members_over`] weigh: the day's use of each of some
/// authors who has a budget of their own (admins have none, nor anyone without a
/// per-person budget), and what the bot's day and month leave.
pub(super) struct Weighed {
    /// The authors with a budget of their own, each with what they used today.
    pub(super) limited: Vec<(String, Used)>,
    /// What the bot's budgets leave (tokens, nano-dollars).
    pub(super) bot: (u64, u64),
}

/// Read what [`Weighed`] holds for `authors` on `platform` (one read of the day's
/// rows, one of the month's when `LULL_MONTHLY_USD` is set).
pub(super) async fn weigh(
    d: &Dispatcher,
    platform: crate::domain::Platform,
    authors: &[String],
    now: Timestamp,
) -> Result<Weighed, StoreError> {
    let limits = &d.settings.limits;
    let limited: Vec<&String> = if limits.has_user_budget() {
        authors
            .iter()
            .filter(|u| !d.settings.access.admins.contains(platform, u))
            .collect()
    } else {
        Vec::new()
    };
    let mut scopes: Vec<String> = limited
        .iter()
        .map(|u| limits::user_scope(platform, u))
        .collect();
    scopes.push(limits::BOT_SCOPE.to_owned());
    let used = d
        .store
        .token_usage(&limits.timezone.day(now), &scopes)
        .await?;
    let month = bot_month(d, now).await?;
    Ok(Weighed {
        bot: bot_left(limits, used[limited.len()], month),
        limited: limited.into_iter().cloned().zip(used).collect(),
    })
}

/// What a person has left today of each of their own budgets, tokens and
/// nano-dollars (`u64::MAX` for a budget not set).
pub(super) fn user_left(limits: &Limits, used: Used) -> (u64, u64) {
    let tokens = if limits.user_daily_tokens > 0 {
        limits.user_daily_tokens.saturating_sub(used.tokens)
    } else {
        u64::MAX
    };
    let usd = if limits.user_daily_usd.is_set() {
        limits.user_daily_usd.0.saturating_sub(used.cost.0)
    } else {
        u64::MAX
    };
    (tokens, usd)
}

/// After the model answered (or failed): turn the reservation into what was spent,
/// tokens and dollars, on the reservation's day, under the lease (no budget checked:
/// the reservation was). Reported usage above the reservation is charged all the
/// same: it is what was spent, and the next round finds the budget spent.
pub(super) async fn settle(
    d: &Dispatcher,
    lease: &Lease,
    batch: &Batch,
    reserved: &Reserved,
    spent: Spent,
    now: Timestamp,
) -> Result<(), StoreError> {
    for (kind, tokens) in spent.by_kind() {
        if tokens > 0 {
            metrics::counter!(names::TOKENS, "kind" => kind).increment(tokens);
        }
    }
    names::record_cost(&reserved.model, spent.cost());
    let total = Amount::new(spent.total(), spent.cost());
    let reserved_any = reserved.amount != Amount::default();
    if !reserved_any && total == Amount::default() {
        return Ok(());
    }
    if reserved_any && total.tokens > reserved.amount.tokens {
        tracing::warn!(conversation = %batch.conversation, reserved = reserved.amount.tokens, spent = total.tokens, "the model reported more tokens than were reserved; charged what it reported (the prompt's estimate was low)");
    }
    let n = reserved.authors.len();
    // Each author ends at their share of what was spent, whatever rounding the
    // reservation's share had.
    let charge = ChargeOf {
        conversation: &batch.conversation,
        authors: &reserved.authors,
        per_author: total.share(n).minus(reserved.amount.share(n)),
        total: total.minus(reserved.amount),
        check: false,
        hold_until: None,
        reservation: if reserved_any {
            Reservation::Settle
        } else {
            Reservation::None
        },
        day: reserved.day.clone(),
    }
    .build(d);
    charge_under(d, lease, &charge, now).await?;
    Ok(())
}
