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

use lull_port::MediaKind;

use super::notices::Notice;
use super::{Dispatcher, Event};
use crate::domain::{ConversationRef, Lease, Timestamp};
use crate::limits::{self, Limits};
use crate::llm::{Generation, Prompt};
use crate::metrics as names;
use crate::store::{
    Batch, Charged, HeldOut, LeaseCharge, OutboxRow, PendingMessage, Reservation, ScopeCharge,
    StoreError, TokenCharge,
};
use crate::texts;

/// A group member left out of a batch: their budget cannot pay their share of the
/// shortest reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MemberOver {
    pub user_id: String,
    pub author: String,
    pub used: u64,
    pub limit: u64,
}

impl MemberOver {
    /// The notice that answers this member's messages of `batch` (the whole batch as
    /// collected), instead of the reply.
    pub(super) fn held_out(&self, d: &Dispatcher, batch: &Batch, now: Timestamp) -> HeldOut {
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
                self.used,
                self.limit,
                &tz.show(tz.next_day(now), now),
            ),
            reply_to: theirs.last().map(|m| m.message_id.clone()),
        }
    }
}

/// What a group is told when every author of its batch is over their budget: one
/// line each (the notice ends the batch: a group is never held for one member).
pub(super) fn refusal_text(d: &Dispatcher, over: &[MemberOver], now: Timestamp) -> String {
    let tz = &d.settings.limits.timezone;
    let resets = tz.show(tz.next_day(now), now);
    over.iter()
        .map(|m| texts::over_budget_text(&m.author, m.used, m.limit, &resets))
        .collect::<Vec<_>>()
        .join("\n")
}

/// What a round reserved, to be settled once the model answered (or failed).
#[derive(Debug, Clone)]
pub(super) struct Reserved {
    /// The authors charged (user ids, sorted, each once).
    authors: Vec<String>,
    /// Tokens reserved in all (0: no budget is set, nothing was reserved).
    tokens: u64,
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

/// Tokens a generation spent, by kind (`lull_tokens_total`).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Spent {
    prompt: u64,
    completion: u64,
    estimated: u64,
}

impl std::ops::AddAssign for Spent {
    /// A round of several model turns (tool calls) spends what each turn spent.
    fn add_assign(&mut self, other: Spent) {
        self.prompt += other.prompt;
        self.completion += other.completion;
        self.estimated += other.estimated;
    }
}

impl Spent {
    /// An estimate of `tokens`, for a generation stopped before the server reported
    /// its usage.
    pub(super) fn estimated(tokens: u64) -> Spent {
        Spent {
            estimated: tokens,
            ..Spent::default()
        }
    }

    /// What `generation` spent: the model's reported usage, else an estimate from the
    /// prompt and the reply's text.
    pub(super) fn of(limits: &Limits, prompt: &Prompt, generation: &Generation) -> Spent {
        match generation.usage {
            Some(usage) => Spent {
                prompt: usage.prompt,
                completion: usage.completion,
                estimated: 0,
            },
            None => Spent {
                estimated: prompt_tokens(limits, prompt) + limits::text_tokens(&generation.text),
                ..Spent::default()
            },
        }
    }

    pub(super) fn total(self) -> u64 {
        self.prompt + self.completion + self.estimated
    }
}

/// The prompt's tokens, estimated from above ([`limits::text_tokens`]): the system
/// prompt and what the model remembers, each message's text and framing (history,
/// the batch, the note), the offered tools' definitions, and [`limits::IMAGE_TOKENS`]
/// for each image.
pub(super) fn prompt_tokens(limits: &Limits, prompt: &Prompt) -> u64 {
    let said = |author: &str, text: &str| {
        limits::text_tokens(author) + limits::text_tokens(text) + 1 // ": " and the line
    };
    let history: u64 = prompt
        .history
        .iter()
        .map(|e| {
            e.user.iter().map(|s| said(&s.author, &s.text)).sum::<u64>()
                + limits::text_tokens(&e.reply)
                + 2 * limits::MESSAGE_TOKENS
        })
        .sum();
    let batch: u64 = prompt.batch.iter().map(|s| said(&s.author, &s.text)).sum();
    let note = prompt.note.as_deref().map_or(0, limits::text_tokens);
    // What the model remembers and the summary, with the system prompt.
    let memories = prompt.memories.as_deref().map_or(0, limits::text_tokens)
        + prompt.summary.as_deref().map_or(0, limits::text_tokens);
    // The offered tools' definitions, sent with the request.
    let tools: u64 = prompt
        .tools
        .iter()
        .map(|t| {
            limits::text_tokens(&t.name)
                + limits::text_tokens(&t.description)
                + limits::text_tokens(&t.parameters.to_string())
        })
        .sum();
    // Group context is a message of its own.
    let context = prompt
        .context_turn()
        .map_or(0, |c| limits::text_tokens(&c) + limits::MESSAGE_TOKENS);
    limits.system_tokens
        + limits::MESSAGE_TOKENS * 2
        + context
        + history
        + batch
        + note
        + memories
        + tools
        + prompt.images.len() as u64 * limits::IMAGE_TOKENS
}

/// What the media of `messages` will add to the prompt once read, before they are:
/// each image (at most [`limits::MAX_IMAGES_PER_PROMPT`], with vision on), and the
/// transcript of each voice message not transcribed yet.
pub(super) fn media_tokens(d: &Dispatcher, messages: &[PendingMessage]) -> u64 {
    let images = if d.settings.vision {
        messages
            .iter()
            .flat_map(|m| &m.media)
            .filter(|m| m.kind == MediaKind::Image)
            .count()
            .min(limits::MAX_IMAGES_PER_PROMPT) as u64
    } else {
        0
    };
    let speech: u64 = messages
        .iter()
        .filter(|m| m.transcript.is_none())
        .filter_map(|m| m.media.iter().find(|m| m.kind.is_audio()))
        .map(|a| {
            u64::from(
                a.duration_secs
                    .unwrap_or(d.settings.max_audio_seconds)
                    .min(d.settings.max_audio_seconds),
            ) * limits::TRANSCRIPT_TOKENS_PER_SECOND
        })
        .sum();
    images * limits::IMAGE_TOKENS + speech
}

/// The authors a batch is charged to: user ids, sorted, each once.
/// The batch's authors (user ids), each once, sorted.
pub(super) fn authors(messages: &[PendingMessage]) -> Vec<String> {
    let mut authors: Vec<String> = messages.iter().map(|m| m.user_id.clone()).collect();
    authors.sort_unstable();
    authors.dedup();
    authors
}

/// The group members whose budget cannot pay their share of the shortest reply to
/// the batch (see the module docs); `prompt_of` builds the prompt of a part of the
/// batch. Every author, when none can pay: then the batch is ended with a notice
/// ([`refusal_text`]), so a member over budget who writes alone holds nobody either.
/// Empty in a private chat, without a per-user budget, and when the bot's budget
/// cannot pay: then the whole batch is refused by [`reserve`] and held.
pub(super) async fn members_over(
    d: &Dispatcher,
    batch: &Batch,
    prompt_of: impl Fn(&[PendingMessage]) -> Prompt,
    now: Timestamp,
) -> Result<Vec<MemberOver>, StoreError> {
    let limits = &d.settings.limits;
    let platform = batch.conversation.platform;
    let all = authors(&batch.pending);
    if !batch.is_group || limits.user_daily_tokens == 0 {
        return Ok(Vec::new());
    }
    let limited: Vec<&String> = all
        .iter()
        .filter(|u| !d.settings.access.admins.contains(platform, u))
        .collect();
    if limited.is_empty() {
        return Ok(Vec::new());
    }
    let day = limits.timezone.day(now);
    let mut scopes: Vec<String> = limited
        .iter()
        .map(|u| limits::user_scope(platform, u))
        .collect();
    scopes.push(limits::BOT_SCOPE.to_owned());
    let used = d.store.token_usage(&day, &scopes).await?;
    let bot_left = if limits.daily_tokens > 0 {
        limits.daily_tokens.saturating_sub(used[limited.len()])
    } else {
        u64::MAX
    };
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
        let least = prompt_tokens(limits, &prompt_of(&included))
            + media_tokens(d, &included)
            + limits.min_reply_tokens();
        if least > bot_left {
            return Ok(Vec::new());
        }
        let share = least.div_ceil(payers.len() as u64);
        let poorest = limited
            .iter()
            .enumerate()
            .filter(|(_, u)| payers.contains(u))
            .map(|(i, u)| (u, used[i], limits.user_daily_tokens.saturating_sub(used[i])))
            .filter(|(_, _, left)| *left < share)
            .min_by_key(|(_, _, left)| *left);
        let Some((user, used, _)) = poorest else {
            return Ok(over);
        };
        let author = batch
            .pending
            .iter()
            .rev()
            .find(|m| &m.user_id == *user)
            .map_or_else(|| (*user).clone(), |m| m.author.clone());
        tracing::info!(conversation = %batch.conversation, user = %user, used, limit = limits.user_daily_tokens, "a group member is over their token budget: the others are answered without their messages");
        over.push(MemberOver {
            user_id: (*user).clone(),
            author,
            used,
            limit: limits.user_daily_tokens,
        });
    }
}

/// Before the model is asked: reserve the prompt (as estimated) and the most the
/// reply may take in every budget the batch counts against, under the lease
/// (`Some`; nothing is reserved when no budget is set). The reply may take
/// `LULL_MAX_TOKENS`, or what the budgets have left after the prompt when that is
/// less, down to the shortest reply. `None`: a budget cannot hold that; nothing was
/// charged, the store holds the conversation until the budget resets, and the user is
/// told once how much is used (the notice, if queued now, joins `rows`).
pub(super) async fn reserve(
    d: &Dispatcher,
    lease: &Lease,
    batch: &Batch,
    prompt: &Prompt,
    rows: &mut Vec<OutboxRow>,
    now: Timestamp,
) -> Result<Option<Reserved>, StoreError> {
    let limits = &d.settings.limits;
    let day = limits.timezone.day(now);
    let authors = authors(&batch.pending);
    if !limits.has_budget() {
        return Ok(Some(Reserved {
            authors,
            tokens: 0,
            day,
            max_tokens: None,
        }));
    }
    let estimate = prompt_tokens(limits, prompt);
    let left = room(d, batch, &authors, &day).await?;
    let reply = limits
        .reply_tokens
        .min(left.saturating_sub(estimate))
        .max(limits.min_reply_tokens());
    let tokens = estimate + reply;
    let n = authors.len().max(1) as u64;
    let charge = charge(
        d,
        &batch.conversation,
        &authors,
        tokens.div_ceil(n) as i64,
        tokens as i64,
        true,
        Some(limits.timezone.next_day(now)),
        Reservation::Reserve,
        day.clone(),
    );
    let (scope, used, limit) = match charge_under(d, lease, &charge, now).await? {
        Charged::Charged => {
            if reply < limits.reply_tokens {
                tracing::debug!(conversation = %batch.conversation, max_tokens = reply, "the reply is capped to what the token budget has left");
            }
            return Ok(Some(Reserved {
                authors,
                tokens,
                day,
                max_tokens: Some(reply),
            }));
        }
        Charged::Over { scope, used, limit } => (scope, used, limit),
    };
    let until = limits.timezone.next_day(now);
    let reason = if scope == limits::BOT_SCOPE {
        "bot_budget"
    } else {
        "user_budget"
    };
    metrics::counter!(names::LIMITED, "reason" => reason).increment(1);
    let conversation = batch.conversation_id;
    tracing::info!(%conversation, %scope, used, limit, needed = tokens, until = until.0, "not enough left of a token budget for a reply: messages held until it resets");
    d.emit(Event::Limited {
        conversation,
        reason,
        until,
    });
    let text = texts::budget_text(
        reason == "user_budget",
        used,
        limit,
        &limits.timezone.show(until, now),
    );
    let dedupe_key = format!("budget/{scope}/{day}/{}", batch.conversation);
    rows.extend(
        Notice::answering_batch(batch)
            .queue(d, text, dedupe_key, now)
            .await?,
    );
    Ok(None)
}

/// What the budgets of `authors` and the bot have left today for one reply shared
/// among them (each author pays an equal share): `u64::MAX` when none limits it.
async fn room(
    d: &Dispatcher,
    batch: &Batch,
    authors: &[String],
    day: &str,
) -> Result<u64, StoreError> {
    let limits = &d.settings.limits;
    let platform = batch.conversation.platform;
    let limited: Vec<&String> = if limits.user_daily_tokens > 0 {
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
    let used = d.store.token_usage(day, &scopes).await?;
    let n = authors.len().max(1) as u64;
    let users = used[..limited.len()]
        .iter()
        .map(|u| {
            limits
                .user_daily_tokens
                .saturating_sub(*u)
                .saturating_mul(n)
        })
        .min()
        .unwrap_or(u64::MAX);
    let bot = if limits.daily_tokens > 0 {
        limits.daily_tokens.saturating_sub(used[limited.len()])
    } else {
        u64::MAX
    };
    Ok(users.min(bot))
}

/// After the model answered (or failed): turn the reservation into what was spent,
/// on the reservation's day, under the lease (no budget checked: the reservation
/// was). Reported usage above the reservation is charged all the same: it is what
/// was spent, and the next round finds the budget spent.
pub(super) async fn settle(
    d: &Dispatcher,
    lease: &Lease,
    batch: &Batch,
    reserved: &Reserved,
    spent: Spent,
    now: Timestamp,
) -> Result<(), StoreError> {
    for (kind, tokens) in [
        ("prompt", spent.prompt),
        ("completion", spent.completion),
        ("estimated", spent.estimated),
    ] {
        if tokens > 0 {
            metrics::counter!(names::TOKENS, "kind" => kind).increment(tokens);
        }
    }
    let total = spent.total();
    if reserved.tokens == 0 && total == 0 {
        return Ok(());
    }
    if reserved.tokens > 0 && total > reserved.tokens {
        tracing::warn!(conversation = %batch.conversation, reserved = reserved.tokens, spent = total, "the model reported more tokens than were reserved; charged what it reported (the prompt's estimate was low)");
    }
    let n = reserved.authors.len().max(1) as u64;
    // Each author ends at their share of what was spent, whatever rounding the
    // reservation's share had.
    let per_author = total.div_ceil(n) as i64 - reserved.tokens.div_ceil(n) as i64;
    let charge = charge(
        d,
        &batch.conversation,
        &reserved.authors,
        per_author,
        total as i64 - reserved.tokens as i64,
        false,
        None,
        if reserved.tokens > 0 {
            Reservation::Settle
        } else {
            Reservation::None
        },
        reserved.day.clone(),
    );
    charge_under(d, lease, &charge, now).await?;
    Ok(())
}

/// After a generation whose reply never went out (dropped as stale, or stopped when a
/// newer message overtook it): count what it spent (`lull_tokens_dropped_total`, and
/// the day's [`limits::DROPPED_SCOPE`] for `/usage`), under the lease. Settled as
/// usual apart from this: the budgets were charged already.
pub(super) async fn count_dropped(
    d: &Dispatcher,
    lease: &Lease,
    reserved: &Reserved,
    spent: Spent,
    now: Timestamp,
) -> Result<(), StoreError> {
    let tokens = spent.total();
    if tokens == 0 {
        return Ok(());
    }
    metrics::counter!(names::TOKENS_DROPPED).increment(tokens);
    let charge = TokenCharge {
        day: reserved.day.clone(),
        scopes: vec![ScopeCharge {
            scope: limits::DROPPED_SCOPE.to_owned(),
            tokens: tokens as i64,
            limit: None,
        }],
        hold_until: None,
        reservation: Reservation::None,
    };
    charge_under(d, lease, &charge, now).await?;
    Ok(())
}

/// Before a voice message of `user_id` is transcribed: charge its `secs` seconds
/// ([`limits::AUDIO_TOKENS_PER_SECOND`]) to the sender's and the bot's budgets.
/// `false`: a budget has not that much left; nothing was charged and nothing is held
/// (the message is answered without its transcript, or held with the batch).
pub(super) async fn charge_transcription(
    d: &Dispatcher,
    lease: &Lease,
    conversation: &ConversationRef,
    user_id: &str,
    secs: u64,
    now: Timestamp,
) -> Result<bool, StoreError> {
    let limits = &d.settings.limits;
    let tokens = (secs.max(1) * limits::AUDIO_TOKENS_PER_SECOND) as i64;
    let charge = charge(
        d,
        conversation,
        &[user_id.to_owned()],
        tokens,
        tokens,
        limits.has_budget(),
        None,
        Reservation::None,
        limits.timezone.day(now),
    );
    let charged = charge_under(d, lease, &charge, now).await? == Charged::Charged;
    if charged {
        metrics::counter!(names::TOKENS, "kind" => "transcription").increment(tokens as u64);
    }
    Ok(charged)
}

/// A summary's charge of `tokens` (negative: given back) under its summary lease, on
/// `day`: shared among the people whose reply asked for it, and the bot's; with
/// `check`, against their budgets (`false`: a budget has not that much left, nothing
/// was charged). Plain charges, not a reservation: a maker that dies between the
/// worst case and the settle leaves the worst case charged, never less.
pub(super) async fn charge_summary(
    d: &Dispatcher,
    lease: &Lease,
    asked: &super::summaries::SummaryAsked,
    tokens: i64,
    check: bool,
    day: String,
) -> Result<bool, StoreError> {
    if tokens == 0 {
        return Ok(true);
    }
    let n = asked.payers.len().max(1) as i64;
    let per_payer = if tokens > 0 {
        (tokens + n - 1) / n
    } else {
        tokens / n
    };
    let charge = charge(
        d,
        &asked.chat,
        &asked.payers,
        per_payer,
        tokens,
        check && d.settings.limits.has_budget(),
        None,
        Reservation::None,
        day,
    );
    Ok(charge_under(d, lease, &charge, d.clock.now()).await? == Charged::Charged)
}

/// Give back a transcription's charge ([`charge_transcription`]): it failed.
pub(super) async fn refund_transcription(
    d: &Dispatcher,
    lease: &Lease,
    conversation: &ConversationRef,
    user_id: &str,
    secs: u64,
    now: Timestamp,
) -> Result<(), StoreError> {
    let limits = &d.settings.limits;
    let tokens = -((secs.max(1) * limits::AUDIO_TOKENS_PER_SECOND) as i64);
    let charge = charge(
        d,
        conversation,
        &[user_id.to_owned()],
        tokens,
        tokens,
        false,
        None,
        Reservation::None,
        limits.timezone.day(now),
    );
    charge_under(d, lease, &charge, now).await?;
    Ok(())
}

/// Charge `charge` under `lease` at `now` ([`LimitStore::charge_tokens`](crate::store::LimitStore::charge_tokens)):
/// all its scopes or none, fenced by the lease like the final check.
async fn charge_under(
    d: &Dispatcher,
    lease: &Lease,
    charge: &TokenCharge,
    now: Timestamp,
) -> Result<Charged, StoreError> {
    d.store
        .charge_tokens(LeaseCharge { lease, charge, now })
        .await
}

/// A charge on `day`: `per_author` to each of `authors` (against their own budget,
/// admins excepted), `total` to the conversation (no budget) and to the whole bot;
/// with `check`, against the budgets.
#[allow(clippy::too_many_arguments)]
fn charge(
    d: &Dispatcher,
    conversation: &ConversationRef,
    authors: &[String],
    per_author: i64,
    total: i64,
    check: bool,
    hold_until: Option<Timestamp>,
    reservation: Reservation,
    day: String,
) -> TokenCharge {
    let limits = &d.settings.limits;
    let platform = conversation.platform;
    let limit = |n: u64| (check && n > 0).then_some(n);
    let mut scopes: Vec<ScopeCharge> = authors
        .iter()
        .map(|user| ScopeCharge {
            scope: limits::user_scope(platform, user),
            tokens: per_author,
            limit: if d.settings.access.admins.contains(platform, user) {
                None
            } else {
                limit(limits.user_daily_tokens)
            },
        })
        .collect();
    scopes.push(ScopeCharge {
        scope: limits::conversation_scope(conversation),
        tokens: total,
        limit: None,
    });
    scopes.push(ScopeCharge {
        scope: limits::BOT_SCOPE.to_owned(),
        tokens: total,
        limit: limit(limits.daily_tokens),
    });
    TokenCharge {
        day,
        scopes,
        hold_until,
        reservation,
    }
}
