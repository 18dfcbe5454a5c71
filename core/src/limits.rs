//! What the bot may spend: messages per minute per user (`LULL_RATE_PER_MIN`), tokens
//! per day per user (`LULL_USER_DAILY_TOKENS`) and for the whole bot
//! (`LULL_DAILY_TOKENS`), dollars per day per user (`LULL_USER_DAILY_USD`), for the
//! whole bot (`LULL_DAILY_USD`) and per month (`LULL_MONTHLY_USD`) at the prices of
//! `LULL_PRICES` ([`crate::money`]), days counted in `LULL_TIMEZONE`.
//!
//! Dollars go through the same two steps as tokens, in the same charges: the worst
//! case at the chat's model's price is reserved with the tokens (and caps the reply's
//! `max_tokens` the same way), and settled to what the server reported.
//!
//! Every count lives in the database, so limits hold across restarts and across every
//! process on it. A limit never drops a message: a limited conversation's messages
//! stay stored and pending, its timer held until the limit lifts (the rate window has
//! room again, the budget's day ends); then they are answered together, once.
//!
//! Budgets are charged in two steps, both under the conversation's lease: before the
//! model is asked, the most the reply can cost is reserved and checked against every
//! budget: the prompt as estimated ([`text_tokens`]: the system prompt, the history,
//! the batch, the notes, [`IMAGE_TOKENS`] an image), plus the most the reply may take,
//! `reply_tokens` or, when a budget has less left, what remains (the request's
//! `max_tokens` is capped to it, so the reply cannot cost more). A remainder below
//! [`MIN_REPLY_TOKENS`] refuses the reply, and the user is told how much is used.
//! After the model answered, the reservation is settled to what the model reported
//! (even when it reported more than was reserved: what was spent is charged, and the
//! next round finds the budget spent). So processes answering the same user at once
//! cannot spend past a budget together, and a budget smaller than `LULL_MAX_TOKENS`
//! still answers. Reservations are kept in the database: one whose round never
//! settled (a lost lease, a stop, a crash) is given back at the next claim.
//! Transcriptions are charged as they happen ([`AUDIO_TOKENS_PER_SECOND`]).

use std::fmt;
use std::time::Duration;

use crate::domain::{ConversationRef, Platform, Timestamp};
use crate::money::{Prices, Usd};
use crate::store::{Period, Unit};

/// The limits in force; zero means "no limit".
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Messages one user may send per minute before their conversation is held.
    pub rate_per_min: u32,
    /// Tokens one user may spend per day.
    pub user_daily_tokens: u64,
    /// Tokens the whole bot may spend per day.
    pub daily_tokens: u64,
    /// Where a budget's day begins and ends.
    pub timezone: TimeZone,
    /// The most tokens a reply may take (`LULL_MAX_TOKENS`): reserved before the model
    /// is asked, so a reply that starts fits its budgets (less when a budget has less
    /// left, and the request asks for no more).
    pub reply_tokens: u64,
    /// The system prompt's tokens (`LULL_SYSTEM_PROMPT`, estimated): part of every
    /// prompt, so part of every reservation.
    pub system_tokens: u64,
    /// Dollars one user may spend per day (`LULL_USER_DAILY_USD`; 0: no limit).
    pub user_daily_usd: Usd,
    /// Dollars the whole bot may spend per day (`LULL_DAILY_USD`).
    pub daily_usd: Usd,
    /// Dollars the whole bot may spend per calendar month (`LULL_MONTHLY_USD`).
    pub monthly_usd: Usd,
    /// `LULL_PRICES`: what each model costs; an unpriced model costs nothing here.
    pub prices: Prices,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            rate_per_min: 0,
            user_daily_tokens: 0,
            daily_tokens: 0,
            timezone: TimeZone::utc(),
            reply_tokens: 1024,
            system_tokens: 0,
            user_daily_usd: Usd::ZERO,
            daily_usd: Usd::ZERO,
            monthly_usd: Usd::ZERO,
            prices: Prices::default(),
        }
    }
}

/// The rate limit's window: a minute. In builds with the `test-switches` feature
/// (tests only), `LULL_TEST_RATE_WINDOW_MS` shortens it, so a test sees it reopen.
pub fn rate_window() -> Duration {
    #[cfg(feature = "test-switches")]
    if let Some(ms) = std::env::var("LULL_TEST_RATE_WINDOW_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        return Duration::from_millis(ms);
    }
    Duration::from_secs(60)
}

impl Limits {
    /// Whether any budget is set, of tokens or dollars (else nothing is reserved;
    /// what was spent is still counted).
    pub fn has_budget(&self) -> bool {
        self.user_daily_tokens > 0
            || self.daily_tokens > 0
            || self.user_daily_usd.is_set()
            || self.daily_usd.is_set()
            || self.monthly_usd.is_set()
    }

    /// Whether any dollar budget is set.
    pub fn has_dollar_budget(&self) -> bool {
        !self.dollar_budgets().is_empty()
    }

    /// Whether a person has a budget of their own (tokens or dollars a day).
    pub fn has_user_budget(&self) -> bool {
        self.user_daily_tokens > 0 || self.user_daily_usd.is_set()
    }

    /// The dollar budgets that are set, by variable name, for warnings and checks.
    pub fn dollar_budgets(&self) -> Vec<(&'static str, Usd)> {
        [
            ("LULL_USER_DAILY_USD", self.user_daily_usd),
            ("LULL_DAILY_USD", self.daily_usd),
            ("LULL_MONTHLY_USD", self.monthly_usd),
        ]
        .into_iter()
        .filter(|(_, usd)| usd.is_set())
        .collect()
    }

    /// Refuse dollar budgets that cannot hold one reply of `model` (the shortest
    /// reply after the system prompt, at its price): they would hold messages for
    /// ever. The error names the variable.
    pub fn check_dollars(&self, model: &str) -> Result<(), String> {
        let price = self.prices.tokens_of(model);
        let least = price.worst(
            self.system_tokens + MESSAGE_TOKENS * 2,
            self.min_reply_tokens(),
        );
        for (name, budget) in self.dollar_budgets() {
            if budget < least {
                return Err(format!(
                    "{name}={} cannot hold one reply of {model}: the system prompt and the shortest reply lull asks for cost {least} at its price (LULL_PRICES) (0: no limit)",
                    budget.plain()
                ));
            }
        }
        Ok(())
    }

    /// The shortest reply a round asks for: [`MIN_REPLY_TOKENS`], or `reply_tokens`
    /// when that is smaller.
    pub fn min_reply_tokens(&self) -> u64 {
        self.reply_tokens.clamp(1, MIN_REPLY_TOKENS)
    }

    /// Refuse budgets that cannot hold one reply: the system prompt and the shortest
    /// reply lull asks for. A budget above that always answers (the reply's
    /// `max_tokens` is capped to what remains), so it can never hold messages for
    /// good. The error names the variables.
    pub fn check(&self) -> Result<(), String> {
        let least = self.system_tokens + MESSAGE_TOKENS * 2 + self.min_reply_tokens();
        for (name, budget) in [
            ("LULL_USER_DAILY_TOKENS", self.user_daily_tokens),
            ("LULL_DAILY_TOKENS", self.daily_tokens),
        ] {
            if budget > 0 && budget < least {
                return Err(format!(
                    "{name}={budget} cannot hold one reply: the system prompt (LULL_SYSTEM_PROMPT) takes about {} tokens and the shortest reply lull asks for is {} tokens (LULL_MAX_TOKENS, at most {MIN_REPLY_TOKENS}), so at least {least} are needed (0: no limit)",
                    self.system_tokens,
                    self.min_reply_tokens()
                ));
            }
        }
        Ok(())
    }

    /// The limits as `lull check` prints them.
    pub fn describe(&self) -> String {
        let or_none = |n: u64, unit: &str| {
            if n == 0 {
                "no limit".to_owned()
            } else {
                format!("{n} {unit}")
            }
        };
        let usd_or_none = |usd: Usd, per: &str| {
            if usd.is_set() {
                format!("{usd} {per}")
            } else {
                "no limit".to_owned()
            }
        };
        let mut text = format!(
            "messages per user: {}; tokens per user: {}; tokens for the bot: {}; dollars per user: {}; dollars for the bot: {}; dollars for the bot's month: {}; days in {}",
            or_none(u64::from(self.rate_per_min), "a minute"),
            or_none(self.user_daily_tokens, "a day"),
            or_none(self.daily_tokens, "a day"),
            usd_or_none(self.user_daily_usd, "a day"),
            usd_or_none(self.daily_usd, "a day"),
            usd_or_none(self.monthly_usd, "a month"),
            self.timezone
        );
        if self.has_budget() {
            text.push_str(&format!(
                "; a reply takes at most {} tokens, less when a budget has less left (at least {}); the system prompt counts as {}",
                self.reply_tokens,
                self.min_reply_tokens(),
                self.system_tokens
            ));
        }
        text
    }
}

/// How much of one budget is used, as the budget notices say it: which budget
/// (`tokens`, `daily dollar budget`, `monthly dollar budget`), the amounts (`74 of
/// 120`, `$0.42 of $0.50`) and the period (`today`, `this month`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spending {
    pub used: u64,
    pub limit: u64,
    pub unit: Unit,
    pub period: Period,
}

impl Spending {
    /// The budget a refusal names: its scope's (`month:bot` counts a month).
    pub fn of(scope: &str, used: u64, limit: u64, unit: Unit) -> Spending {
        let period = if scope == BOT_MONTH_SCOPE {
            Period::Month
        } else {
            Period::Day
        };
        Spending {
            used,
            limit,
            unit,
            period,
        }
    }

    /// Which budget: `tokens`, `daily dollar budget`, `monthly dollar budget`.
    pub fn what(&self) -> &'static str {
        match (self.unit, self.period) {
            (Unit::Tokens, _) => "tokens",
            (Unit::Usd, Period::Day) => "daily dollar budget",
            (Unit::Usd, Period::Month) => "monthly dollar budget",
        }
    }

    /// `74 of 120`, `$0.42 of $0.50`.
    pub fn amounts(&self) -> String {
        match self.unit {
            Unit::Tokens => format!("{} of {}", self.used, self.limit),
            Unit::Usd => format!("{} of {}", Usd(self.used), Usd(self.limit)),
        }
    }

    /// `today`, `this month`.
    pub fn when(&self) -> &'static str {
        match self.period {
            Period::Day => "today",
            Period::Month => "this month",
        }
    }
}

/// The budget scope of a user.
pub fn user_scope(platform: Platform, user_id: &str) -> String {
    format!("user:{platform}:{user_id}")
}

/// The budget scope of a conversation (what `/usage` shows an admin in a group).
pub fn conversation_scope(conversation: &ConversationRef) -> String {
    format!("conversation:{conversation}")
}

/// The budget scope of the whole bot.
pub const BOT_SCOPE: &str = "bot";

/// The budget scope of the whole bot's month (`LULL_MONTHLY_USD`): rows keyed by the
/// month (`2026-12`), charged with every charge of [`BOT_SCOPE`].
pub const BOT_MONTH_SCOPE: &str = "month:bot";

/// Not a budget: the tokens spent on generations whose reply never went out (dropped
/// as stale, or stopped when overtaken), per day, for `/usage` (admins); already in
/// the budgets of those who wrote.
pub const DROPPED_SCOPE: &str = "dropped";

/// Tokens of `chars` characters of text, when the model reports no usage: four
/// characters a token, rounded up (close for English, low for other scripts).
pub fn estimate_tokens(chars: usize) -> u64 {
    (chars as u64).div_ceil(4)
}

/// Tokens of `text`, estimated from above for a reservation: four ASCII characters a
/// token (English runs about that), and one token for every other character: Cyrillic,
/// Greek, CJK or emoji often take one or more tokens a character, and a reservation
/// that is low lets a budget be overspent.
pub fn text_tokens(text: &str) -> u64 {
    let (ascii, other) = text.chars().fold((0u64, 0u64), |(a, o), c| {
        if c.is_ascii() { (a + 1, o) } else { (a, o + 1) }
    });
    ascii.div_ceil(4) + other
}

/// Tokens each message of a prompt adds for the chat format (its role and
/// separators), on top of its text.
pub const MESSAGE_TOKENS: u64 = 4;

/// The shortest reply a round asks for (or `LULL_MAX_TOKENS`, if smaller): a budget
/// with less left than the prompt and this refuses the reply ("not enough left for a
/// reply"), and a budget that cannot hold even the system prompt and this is refused
/// at start.
pub const MIN_REPLY_TOKENS: u64 = 64;

/// What an image is reserved as: OpenAI counts a high-detail image of up to 1024×1024
/// as 765 tokens (85 + 170 a tile); other servers count less. What the model reports
/// is charged in the end.
pub const IMAGE_TOKENS: u64 = 1_000;

/// The most images sent to the model with one batch; more are left out, with a note
/// to the model and the user told once. Bounds what a round costs and fetches.
pub const MAX_IMAGES_PER_PROMPT: usize = 4;

/// The most image bytes one round fetches (all its images together); images past it
/// are left out like those past [`MAX_IMAGES_PER_PROMPT`].
pub const MAX_IMAGE_BYTES_PER_ROUND: u64 = 20 * 1024 * 1024;

/// What a second of audio costs when transcribed, counted against the sender's and
/// the bot's budgets: transcription models count about one audio token per 100 ms.
/// A voice message with no known length is counted from its size
/// ([`AUDIO_BYTES_PER_SECOND`]).
pub const AUDIO_TOKENS_PER_SECOND: u64 = 10;

/// The bytes a second of a voice message takes, for one whose length the platform
/// did not say: Opus voice notes run about 4 kB a second (32 kbit/s), so a file is
/// counted as at least that long.
pub const AUDIO_BYTES_PER_SECOND: u64 = 4_000;

/// Tokens a second of speech adds to the prompt once transcribed (people speak about
/// 2.5 words a second), reserved for a voice message not yet transcribed.
pub const TRANSCRIPT_TOKENS_PER_SECOND: u64 = 5;

/// A `LULL_TIMEZONE`: an IANA time zone name (`Europe/Berlin`), or `UTC`.
#[derive(Clone, PartialEq)]
pub struct TimeZone {
    name: String,
    zone: jiff::tz::TimeZone,
}

impl fmt::Debug for TimeZone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TimeZone({})", self.name)
    }
}

impl fmt::Display for TimeZone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl std::str::FromStr for TimeZone {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim();
        let zone = jiff::tz::TimeZone::get(name).map_err(|_| {
            format!(
                "LULL_TIMEZONE: unknown time zone '{name}' (expected an IANA name such as Europe/Berlin, or UTC)"
            )
        })?;
        Ok(Self {
            name: name.to_owned(),
            zone,
        })
    }
}

impl TimeZone {
    pub fn utc() -> Self {
        Self {
            name: "UTC".into(),
            zone: jiff::tz::TimeZone::UTC,
        }
    }

    /// The zone itself, for the calendar arithmetic of job schedules
    /// (`crate::schedule`), which needs its transitions.
    pub(crate) fn zone(&self) -> &jiff::tz::TimeZone {
        &self.zone
    }

    fn zoned(&self, at: Timestamp) -> jiff::Zoned {
        jiff::Timestamp::from_millisecond(at.0)
            .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
            .to_zoned(self.zone.clone())
    }

    /// The day `at` falls on here (`2026-12-01`): what budgets count by.
    pub fn day(&self, at: Timestamp) -> String {
        self.zoned(at).date().to_string()
    }

    /// When the day `at` falls on began here.
    pub fn day_start(&self, at: Timestamp) -> Timestamp {
        let zoned = self.zoned(at);
        zoned
            .date()
            .to_zoned(self.zone.clone())
            .map_or(at, |z| Timestamp(z.timestamp().as_millisecond()))
    }

    /// The `n` days up to the one `at` falls on, oldest first, as [`TimeZone::day`]
    /// names them.
    pub fn days_up_to(&self, at: Timestamp, n: usize) -> Vec<String> {
        let mut date = self.zoned(at).date();
        let mut days = Vec::with_capacity(n);
        for _ in 0..n {
            days.push(date.to_string());
            match date.yesterday() {
                Ok(before) => date = before,
                Err(_) => break,
            }
        }
        days.reverse();
        days
    }

    /// When the day after the one `at` falls on begins here: when budgets reset.
    pub fn next_day(&self, at: Timestamp) -> Timestamp {
        let zoned = self.zoned(at);
        zoned
            .date()
            .tomorrow()
            .ok()
            .and_then(|d| d.to_zoned(self.zone.clone()).ok())
            .map_or(at.plus(Duration::from_secs(86_400)), |z| {
                Timestamp(z.timestamp().as_millisecond())
            })
    }

    /// The month `at` falls on here (`2026-12`): what the monthly budget counts by.
    pub fn month(&self, at: Timestamp) -> String {
        Period::Month.key(&self.day(at))
    }

    /// The first day of the month `at` falls on here (`2026-12-01`).
    pub fn month_start_day(&self, at: Timestamp) -> String {
        format!("{}-01", self.month(at))
    }

    /// When the month after the one `at` falls on begins here: when the monthly
    /// budget resets.
    pub fn next_month(&self, at: Timestamp) -> Timestamp {
        let date = self.zoned(at).date().first_of_month();
        date.checked_add(jiff::Span::new().months(1))
            .ok()
            .and_then(|d| d.to_zoned(self.zone.clone()).ok())
            .map_or(self.next_day(at), |z| {
                Timestamp(z.timestamp().as_millisecond())
            })
    }

    /// `at` as a user reads it: `14:05 (Europe/Berlin)`, with the date when it is not
    /// on the same day as `now`.
    pub fn show(&self, at: Timestamp, now: Timestamp) -> String {
        let zoned = self.zoned(at);
        let time = zoned.strftime("%H:%M:%S");
        if self.day(at) == self.day(now) {
            format!("{time} ({})", self.name)
        } else {
            format!("{} {time} ({})", zoned.date(), self.name)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_back_and_the_start_of_today_follow_the_time_zone() {
        // 2026-12-01 23:30 UTC is 2026-12-02 00:30 in Berlin.
        let at = Timestamp(1_796_167_800_000);
        let berlin: TimeZone = "Europe/Berlin".parse().unwrap();
        assert_eq!(
            berlin.days_up_to(at, 3),
            ["2026-11-30", "2026-12-01", "2026-12-02"]
        );
        assert_eq!(berlin.day_start(at), Timestamp(at.0 - 30 * 60_000));
        assert_eq!(TimeZone::utc().days_up_to(at, 1), ["2026-12-01"]);
        assert_eq!(berlin.month(at), "2026-12");
        assert_eq!(berlin.month_start_day(at), "2026-12-01");
        // 2027-01-01 00:00 in Berlin is 2026-12-31 23:00 UTC.
        assert_eq!(berlin.next_month(at).0, 1_798_758_000_000);
    }

    #[test]
    fn days_and_their_ends_follow_the_time_zone() {
        // 2026-12-01 23:30 UTC is already 2026-12-02 in Berlin (UTC+1 in winter).
        let at = Timestamp(1_796_167_800_000);
        let utc = TimeZone::utc();
        let berlin: TimeZone = "Europe/Berlin".parse().unwrap();
        assert_eq!(utc.day(at), "2026-12-01");
        assert_eq!(berlin.day(at), "2026-12-02");
        assert_eq!(utc.next_day(at).0, 1_796_169_600_000, "midnight UTC");
        assert_eq!(
            berlin.next_day(at).0,
            1_796_252_400_000,
            "midnight in Berlin of the 3rd is 23:00 UTC of the 2nd"
        );
        assert!(berlin.show(at, at).ends_with("(Europe/Berlin)"));
    }

    #[test]
    fn an_unknown_time_zone_names_the_variable() {
        let e = "Mars/Olympus".parse::<TimeZone>().unwrap_err();
        assert!(e.contains("LULL_TIMEZONE"), "{e}");
    }

    #[test]
    fn other_scripts_count_a_token_a_character() {
        assert_eq!(text_tokens("hello world!"), 3);
        assert_eq!(text_tokens("привет"), 6, "Cyrillic: one a character");
        assert_eq!(text_tokens("你好吗"), 3);
        assert_eq!(text_tokens("hi 👋"), 2);
    }

    #[test]
    fn a_budget_that_cannot_hold_one_reply_is_refused_naming_the_variable() {
        let limits = Limits {
            user_daily_tokens: 100,
            reply_tokens: 4096,
            system_tokens: 40,
            ..Limits::default()
        };
        let e = limits.check().unwrap_err();
        assert!(
            e.contains("LULL_USER_DAILY_TOKENS=100") && e.contains("LULL_MAX_TOKENS"),
            "{e}"
        );
        let enough = Limits {
            user_daily_tokens: 2000,
            daily_tokens: 112,
            ..limits
        };
        assert_eq!(enough.check(), Ok(()), "2000 and 112 hold a 64-token reply");
    }

    #[test]
    fn estimates_round_up() {
        assert_eq!(estimate_tokens(0), 0);
        assert_eq!(estimate_tokens(1), 1);
        assert_eq!(estimate_tokens(8), 2);
    }
}
