//! The limits area of the contract: the rate hold, the token wallet, access decisions.

use async_trait::async_trait;

use crate::domain::{ConversationId, Lease, Timestamp};
use crate::store::{AccessRule, StoreError};
/// A rate limit as [`LimitStore::hold_over_rate`] applies it: at most `max` messages of one
/// user per `window`, across every conversation on the platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateWindow {
    pub max: u32,
    pub window: std::time::Duration,
}

/// A conversation held by a rate limit: its timer is not due before `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateHold {
    /// When the window has room again and the held messages are answered together.
    pub until: Timestamp,
    /// Whether this call began the hold (tell the user once, then).
    pub began: bool,
}

/// One scope's part of a charge ([`LimitStore::charge_tokens`]). A scope names who
/// spent: `user:<platform>:<id>`, `conversation:<id>`, `bot`, `month:bot`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeCharge {
    pub scope: String,
    /// Which row of the scope the charge lands on: the charge's day, or its month.
    pub period: Period,
    /// Tokens to add (negative: give back part of a reservation).
    pub tokens: i64,
    /// Nano-dollars to add ([`crate::money::Usd`]; negative: give back).
    pub cost: i64,
    /// The scope's token budget for the period, if it has one and this charge must fit it.
    pub limit: Option<u64>,
    /// The scope's dollar budget for the period (nano-dollars), likewise.
    pub cost_limit: Option<u64>,
}

impl ScopeCharge {
    /// A charge of tokens alone on the charge's day.
    pub fn tokens(scope: impl Into<String>, tokens: i64, limit: Option<u64>) -> Self {
        ScopeCharge {
            scope: scope.into(),
            tokens,
            limit,
            ..ScopeCharge::default()
        }
    }

    /// The key of the row this part lands on, for a charge on `day`.
    pub fn row_day(&self, day: &str) -> String {
        self.period.key(day)
    }
}

/// The period a scope's row counts: a day (`2026-12-05`) or a month (`2026-12`; the
/// bot's `LULL_MONTHLY_USD`). Month rows have scopes of their own (`month:bot`), so a
/// range of days never reads one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Period {
    #[default]
    Day,
    Month,
}

impl Period {
    /// The row key of this period for a charge on `day` (`YYYY-MM-DD`).
    pub fn key(self, day: &str) -> String {
        match self {
            Period::Day => day.to_owned(),
            Period::Month => day.get(..7).unwrap_or(day).to_owned(),
        }
    }
}

/// What a scope used in a period: tokens and dollars.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Used {
    pub tokens: u64,
    pub cost: crate::money::Usd,
}

/// What a budget counts: tokens, or dollars (nano-dollars).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Tokens,
    Usd,
}

/// A token charge: what several scopes spend on one day, all or nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenCharge {
    /// The day the tokens count for, as the deployment's time zone names it
    /// (`2026-12-01`). A settle names the day of its reservation, whenever it runs.
    pub day: String,
    pub scopes: Vec<ScopeCharge>,
    /// When a budget would be exceeded: the moment it resets (the next day), until
    /// which the conversation's timer is held; `None`: a refused charge holds nothing
    /// (the round answers the rest of a group without the member over budget).
    pub hold_until: Option<Timestamp>,
    /// What the charge does to the lease's reservation.
    pub reservation: Reservation,
}

/// A charge's part in a round's reservation. A reservation is recorded in the
/// database, keyed by the conversation, the lease token and the day, so a round that
/// never settles (its lease lost, a stop, a crash) gives it back at the next claim of
/// the conversation ([`RoundStore::claim_round`](crate::store::RoundStore::claim_round)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    /// A plain charge: spent, nothing to give back.
    None,
    /// The most a round may spend, before the model is asked: recorded as the
    /// lease's reservation (added to one recorded earlier under the same lease).
    Reserve,
    /// The round's reservation turned into what was spent: the charge is the
    /// difference, and the lease's recorded reservation is forgotten.
    Settle,
}

/// What a token charge did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Charged {
    /// Every scope was charged.
    Charged,
    /// `scope` would pass its `limit` (it has `used` in the period; both in `unit`):
    /// nothing was charged and the conversation's timer is held until the charge's
    /// `hold_until`.
    Over {
        scope: String,
        used: u64,
        limit: u64,
        unit: Unit,
    },
    /// A [`Reservation::Reserve`] that `scope` refused only because of other rounds'
    /// reservations not yet settled (without them it would fit): nothing was charged,
    /// no budget is spent, and (with the charge's `hold_until`) the conversation's
    /// timer is held for [`BUSY_RETRY`] only, to try again once they settle (most
    /// settle for less than they reserved).
    Busy { scope: String },
}

/// How long a conversation refused as [`Charged::Busy`] waits before it tries again.
pub const BUSY_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// A rate check of `user_id`'s messages, right after one of them was stored in
/// `conversation` ([`LimitStore::hold_over_rate`]).
#[derive(Debug, Clone, Copy)]
pub struct RateCheck<'a> {
    pub conversation: ConversationId,
    pub user_id: &'a str,
    pub rate: RateWindow,
    pub now: Timestamp,
}

/// A token charge under `lease` ([`LimitStore::charge_tokens`]): checked against the
/// lease like the final check, and a hold is put on the lease's conversation.
#[derive(Debug, Clone, Copy)]
pub struct LeaseCharge<'a> {
    pub lease: &'a Lease,
    pub charge: &'a TokenCharge,
    pub now: Timestamp,
}

/// Limits: the rate hold, the token wallet (charges, reservations, usage) and the run-time
/// access decisions.
#[async_trait]
pub trait LimitStore: Send + Sync + 'static {
    /// Rate limit, right after a message of `user_id` was stored (or edited) in
    /// `conversation`: count the user's messages and applied edits on the
    /// conversation's platform within the `rate` window before `now` (the one just
    /// stored included; an edit counts as a message, since it makes the batch stale as
    /// a new message does), and if there are more than
    /// `rate.max`, hold the conversation's timer until the window has room again (the
    /// oldest message past the limit leaves it). A hold already in force is kept, not
    /// extended, so held messages are answered together when it ends; later messages,
    /// `/reset` and a forced commit re-arm the timer no sooner. One transaction; `None`
    /// when the user is within the limit (or nothing is pending any more).
    async fn hold_over_rate(&self, check: RateCheck<'_>) -> Result<Option<RateHold>, StoreError>;

    /// Charge tokens under a conversation's lease, in one transaction that checks
    /// the lease like the final check (holder, token, expiry): every scope of
    /// `charge` is added to, or none is. A scope with a limit that the charge would
    /// pass (its positive tokens on top of what it used that day) refuses the whole
    /// charge and, with `charge.hold_until`, holds the lease's conversation timer
    /// until then. A scope's token and dollar budgets are both checked (each limit
    /// against its own total), on the row of its period. Totals change only by adding
    /// to them (never written back from a read), so concurrent charges of several
    /// processes all count. The scopes' rows are locked in one order (by scope, then
    /// period key), whatever order `charge` names them in, so concurrent charges (and
    /// the give-back of abandoned reservations) queue and never deadlock. A
    /// [`Reservation::Reserve`] that is charged is recorded under the lease's token
    /// and `charge.day`; a [`Reservation::Settle`] forgets the lease's record.
    async fn charge_tokens(&self, charge: LeaseCharge<'_>) -> Result<Charged, StoreError>;

    /// What each of `scopes` used on `day` (or in the month `day` names, `2026-12`, for
    /// a month scope), tokens and dollars (0 for a scope with none), in order.
    async fn token_usage(&self, day: &str, scopes: &[String]) -> Result<Vec<Used>, StoreError> {
        self.usage_between(day, day, scopes).await
    }

    /// What each of `scopes` used on the days from `first` to `last` (inclusive,
    /// `YYYY-MM-DD`) together, in order: a month so far, for `/usage`.
    async fn usage_between(
        &self,
        first: &str,
        last: &str,
        scopes: &[String],
    ) -> Result<Vec<Used>, StoreError>;

    /// Record an admin's run-time access decision (`/allow`, `/deny`), replacing any
    /// earlier one for the same subject. Every process sees it on its next read.
    async fn set_access(&self, rule: &AccessRule) -> Result<(), StoreError>;

    /// Every run-time access decision, oldest first.
    async fn access_rules(&self) -> Result<Vec<AccessRule>, StoreError>;
}
