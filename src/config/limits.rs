//! Limits: messages per minute per user, tokens per day per user and for the whole
//! bot, and the time zone whose midnight resets the day. 0 is no limit, as in
//! [`Limits::default`].

use clap::Args;
use lull_core::limits::{Limits, TimeZone};

use super::{ConfigError, LlmConfig};

/// `LULL_RATE_PER_MIN`, `LULL_USER_DAILY_TOKENS`, `LULL_DAILY_TOKENS`, `LULL_TIMEZONE`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Limits")]
pub(crate) struct LimitsArgs {
    /// Messages one user may send per minute; more are kept and answered together once the minute has room (0: no limit)
    #[arg(long, global = true, env = "LULL_RATE_PER_MIN", default_value_t = 0)]
    pub rate_per_min: u32,
    /// Tokens one user may spend per day (0: no limit)
    #[arg(
        long,
        global = true,
        env = "LULL_USER_DAILY_TOKENS",
        default_value_t = 0
    )]
    pub user_daily_tokens: u64,
    /// Tokens the whole bot may spend per day (0: no limit)
    #[arg(long, global = true, env = "LULL_DAILY_TOKENS", default_value_t = 0)]
    pub daily_tokens: u64,
    /// Time zone whose midnight resets the daily budgets: an IANA name such as Europe/Berlin
    #[arg(long, global = true, env = "LULL_TIMEZONE", default_value = "UTC")]
    pub timezone: TimeZone,
}

impl LimitsArgs {
    /// The limits for replies of `llm` (at most `max_reply_chars` long); a budget
    /// that cannot hold one reply is refused, since it would hold messages for ever.
    pub(crate) fn limits(
        &self,
        llm: &LlmConfig,
        max_reply_chars: usize,
    ) -> Result<Limits, ConfigError> {
        let s = self;
        // Reserved before each reply: the most a reply may take, after the system
        // prompt (part of every prompt; the echo responder sends none).
        let (reply_tokens, system_tokens) = match &llm {
            LlmConfig::OpenAi(settings) => (
                u64::from(settings.max_tokens),
                lull_core::limits::text_tokens(&settings.system_prompt),
            ),
            LlmConfig::Echo(_) => (lull_core::limits::estimate_tokens(max_reply_chars), 0),
        };
        let limits = Limits {
            rate_per_min: s.rate_per_min,
            user_daily_tokens: s.user_daily_tokens,
            daily_tokens: s.daily_tokens,
            timezone: s.timezone.clone(),
            reply_tokens,
            system_tokens,
        };
        // A budget that cannot hold one reply would hold messages for ever.
        limits.check().map_err(ConfigError)?;
        Ok(limits)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::assert_errors_name;

    #[test]
    fn a_budget_that_cannot_hold_one_reply_is_refused() {
        assert_errors_name(&[(&["--daily-tokens", "10"], "LULL_DAILY_TOKENS")]);
    }
}
