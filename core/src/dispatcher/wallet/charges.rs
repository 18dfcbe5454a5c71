//! The wallet's charges: who a charge lands on (each author's scope, the chat's, the
//! bot's day and month) and the plain charges beside a round's reservation
//! (transcriptions, summaries, what a dropped generation spent).

use super::super::Dispatcher;
use super::Reserved;
use super::spent::Spent;
use crate::domain::{ConversationRef, Lease, Timestamp};
use crate::limits;
use crate::metrics as names;
use crate::money::Usd;
use crate::store::{
    Charged, LeaseCharge, Period, Reservation, ScopeCharge, StoreError, TokenCharge,
};

/// Tokens and nano-dollars a charge adds (negative: gives back).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(in crate::dispatcher) struct Amount {
    pub tokens: i64,
    pub cost: i64,
}

impl Amount {
    /// `tokens` costing `cost`.
    pub(in crate::dispatcher) fn new(tokens: u64, cost: Usd) -> Amount {
        Amount {
            tokens: tokens as i64,
            cost: cost.0 as i64,
        }
    }

    /// One of `n` equal shares: rounded up when spending (the shares never sum to
    /// less than the whole), toward zero when giving back.
    pub(in crate::dispatcher) fn share(self, n: usize) -> Amount {
        let n = n.max(1) as i64;
        let part = |x: i64| if x > 0 { (x + n - 1) / n } else { x / n };
        Amount {
            tokens: part(self.tokens),
            cost: part(self.cost),
        }
    }

    /// `self - other`.
    pub(in crate::dispatcher) fn minus(self, other: Amount) -> Amount {
        Amount {
            tokens: self.tokens - other.tokens,
            cost: self.cost - other.cost,
        }
    }

    /// The same amount given back.
    pub(in crate::dispatcher) fn negated(self) -> Amount {
        Amount {
            tokens: -self.tokens,
            cost: -self.cost,
        }
    }

    fn is_zero(self) -> bool {
        self.tokens == 0 && self.cost == 0
    }
}

/// A charge on `day`: `per_author` to each of `authors` (against their own budgets,
/// admins excepted), `total` to the conversation (no budget), to the whole bot's day
/// and to its month; with `check`, against the budgets.
pub(super) struct ChargeOf<'a> {
    pub conversation: &'a ConversationRef,
    pub authors: &'a [String],
    pub per_author: Amount,
    pub total: Amount,
    pub check: bool,
    pub hold_until: Option<Timestamp>,
    pub reservation: Reservation,
    pub day: String,
}

impl ChargeOf<'_> {
    /// The store's charge: a scope for each author, the conversation, the bot's day
    /// and the bot's month ([`limits::BOT_MONTH_SCOPE`]), each with its limits.
    pub(super) fn build(self, d: &Dispatcher) -> TokenCharge {
        let limits = &d.settings.limits;
        let platform = self.conversation.platform;
        let tokens = |n: u64| (self.check && n > 0).then_some(n);
        let usd = |usd: Usd| (self.check && usd.is_set()).then_some(usd.0);
        let mut scopes: Vec<ScopeCharge> = self
            .authors
            .iter()
            .map(|user| {
                let admin = d.settings.access.admins.contains(platform, user);
                ScopeCharge {
                    scope: limits::user_scope(platform, user),
                    period: Period::Day,
                    tokens: self.per_author.tokens,
                    cost: self.per_author.cost,
                    limit: tokens(limits.user_daily_tokens).filter(|_| !admin),
                    cost_limit: usd(limits.user_daily_usd).filter(|_| !admin),
                }
            })
            .collect();
        let whole = |scope: &str, period, limit, cost_limit| ScopeCharge {
            scope: scope.to_owned(),
            period,
            tokens: self.total.tokens,
            cost: self.total.cost,
            limit,
            cost_limit,
        };
        scopes.push(whole(
            &limits::conversation_scope(self.conversation),
            Period::Day,
            None,
            None,
        ));
        scopes.push(whole(
            limits::BOT_SCOPE,
            Period::Day,
            tokens(limits.daily_tokens),
            usd(limits.daily_usd),
        ));
        scopes.push(whole(
            limits::BOT_MONTH_SCOPE,
            Period::Month,
            None,
            usd(limits.monthly_usd),
        ));
        TokenCharge {
            day: self.day,
            scopes,
            hold_until: self.hold_until,
            reservation: self.reservation,
        }
    }
}

/// Charge `charge` under `lease` at `now` ([`LimitStore::charge_tokens`](crate::store::LimitStore::charge_tokens)):
/// all its scopes or none, fenced by the lease like the final check.
pub(super) async fn charge_under(
    d: &Dispatcher,
    lease: &Lease,
    charge: &TokenCharge,
    now: Timestamp,
) -> Result<Charged, StoreError> {
    d.store
        .charge_tokens(LeaseCharge { lease, charge, now })
        .await
}

/// After a generation whose reply never went out (dropped as stale, or stopped when a
/// newer message overtook it): count what it spent (`lull_tokens_dropped_total`, and
/// the day's [`limits::DROPPED_SCOPE`] for `/usage`), under the lease. Settled as
/// usual apart from this: the budgets were charged already.
pub(in crate::dispatcher) async fn count_dropped(
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
            cost: spent.cost().0 as i64,
            ..ScopeCharge::tokens(limits::DROPPED_SCOPE, tokens as i64, None)
        }],
        hold_until: None,
        reservation: Reservation::None,
    };
    charge_under(d, lease, &charge, now).await?;
    Ok(())
}

/// What transcribing `secs` seconds costs: [`limits::AUDIO_TOKENS_PER_SECOND`] in the
/// token budgets, and the transcription model's price per second in dollars.
fn transcription(d: &Dispatcher, secs: u64) -> (Amount, String) {
    let model = d
        .transcriber
        .as_ref()
        .map(|t| t.model().to_owned())
        .unwrap_or_default();
    let secs = secs.max(1);
    let cost = d.settings.limits.prices.audio_of(&model, secs);
    (
        Amount::new(secs * limits::AUDIO_TOKENS_PER_SECOND, cost),
        model,
    )
}

/// A transcription's charge of `amount` to `user_id` and the bot, on `now`'s day:
/// against the budgets with `check`.
fn transcription_charge(
    d: &Dispatcher,
    conversation: &ConversationRef,
    user_id: &str,
    amount: Amount,
    check: bool,
    now: Timestamp,
) -> TokenCharge {
    ChargeOf {
        conversation,
        authors: &[user_id.to_owned()],
        per_author: amount,
        total: amount,
        check,
        hold_until: None,
        reservation: Reservation::None,
        day: d.settings.limits.timezone.day(now),
    }
    .build(d)
}

/// Before a voice message of `user_id` is transcribed: charge its `secs` seconds
/// ([`transcription`]) to the sender's and the bot's budgets. `false`: a budget has
/// not that much left; nothing was charged and nothing is held (the message is
/// answered without its transcript, or held with the batch).
pub(in crate::dispatcher) async fn charge_transcription(
    d: &Dispatcher,
    lease: &Lease,
    conversation: &ConversationRef,
    user_id: &str,
    secs: u64,
    now: Timestamp,
) -> Result<bool, StoreError> {
    let (amount, model) = transcription(d, secs);
    let check = d.settings.limits.has_budget();
    let charge = transcription_charge(d, conversation, user_id, amount, check, now);
    let charged = charge_under(d, lease, &charge, now).await? == Charged::Charged;
    if charged {
        metrics::counter!(names::TOKENS, "kind" => "transcription").increment(amount.tokens as u64);
        names::record_cost(&model, Usd(amount.cost as u64));
    }
    Ok(charged)
}

/// Give back a transcription's charge ([`charge_transcription`]): it failed. `charged_at`
/// is the charge's own time, so the same day's (and month's) rows get it back.
pub(in crate::dispatcher) async fn refund_transcription(
    d: &Dispatcher,
    lease: &Lease,
    conversation: &ConversationRef,
    user_id: &str,
    secs: u64,
    charged_at: Timestamp,
) -> Result<(), StoreError> {
    let (amount, _) = transcription(d, secs);
    let charge = transcription_charge(
        d,
        conversation,
        user_id,
        amount.negated(),
        false,
        charged_at,
    );
    // Fenced now (the lease must still be held); booked on the charge's day.
    charge_under(d, lease, &charge, d.clock.now()).await?;
    Ok(())
}

/// A summary's charge of `amount` (negative: given back) under its summary lease, on
/// `day`: shared among the people whose reply asked for it, and the bot's; with
/// `check`, against their budgets (`false`: a budget has not that much left, nothing
/// was charged). Plain charges, not a reservation: a maker that dies between the
/// worst case and the settle leaves the worst case charged, never less.
pub(in crate::dispatcher) async fn charge_summary(
    d: &Dispatcher,
    lease: &Lease,
    asked: &super::super::summaries::SummaryAsked,
    amount: Amount,
    check: bool,
    day: String,
) -> Result<bool, StoreError> {
    if amount.is_zero() {
        return Ok(true);
    }
    let charge = ChargeOf {
        conversation: &asked.chat,
        authors: &asked.payers,
        per_author: amount.share(asked.payers.len()),
        total: amount,
        check: check && d.settings.limits.has_budget(),
        hold_until: None,
        reservation: Reservation::None,
        day,
    }
    .build(d);
    Ok(charge_under(d, lease, &charge, d.clock.now()).await? == Charged::Charged)
}
