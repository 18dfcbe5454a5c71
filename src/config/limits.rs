//! Limits: messages per minute per user, tokens per day per user and for the whole
//! bot, dollars per day per user, per day and per month for the whole bot at the
//! prices of `LULL_PRICES`, and the time zone whose midnight resets the day. 0 is no
//! limit, as in [`Limits::default`].

use clap::Args;
use lull_core::limits::{Limits, TimeZone};
use lull_core::money::{Prices, Usd};

use super::{ConfigError, LlmConfig};

/// `LULL_RATE_PER_MIN`, `LULL_USER_DAILY_TOKENS`, `LULL_DAILY_TOKENS`, `LULL_TIMEZONE`,
/// and the money: `LULL_PRICES`, `LULL_USER_DAILY_USD`, `LULL_DAILY_USD`,
/// `LULL_MONTHLY_USD`.
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
    /// Prices per model: MODEL=IN/OUT dollars per million input/output tokens (gpt-4o-mini=0.15/0.6), MODEL=IN/OUT/CACHED, or MODEL=DOLLARS/min for a transcription model; comma-separated
    #[arg(long, global = true, env = "LULL_PRICES", default_value = "")]
    pub prices: String,
    /// Dollars one user may spend per day at LULL_PRICES (0: no limit)
    #[arg(long, global = true, env = "LULL_USER_DAILY_USD", default_value = "0")]
    pub user_daily_usd: String,
    /// Dollars the whole bot may spend per day at LULL_PRICES (0: no limit)
    #[arg(long, global = true, env = "LULL_DAILY_USD", default_value = "0")]
    pub daily_usd: String,
    /// Dollars the whole bot may spend per calendar month at LULL_PRICES (0: no limit)
    #[arg(long, global = true, env = "LULL_MONTHLY_USD", default_value = "0")]
    pub monthly_usd: String,
}

impl LimitsArgs {
    /// The limits for replies of `llm` (at most `max_reply_chars` long); a budget
    /// that cannot hold one reply is refused, since it would hold messages for ever.
    pub(crate) fn limits(
        &self,
        llm: &LlmConfig,
        max_reply_chars: usize,
        default_model: &str,
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
            user_daily_usd: Usd::parse("LULL_USER_DAILY_USD", &s.user_daily_usd)
                .map_err(ConfigError)?,
            daily_usd: Usd::parse("LULL_DAILY_USD", &s.daily_usd).map_err(ConfigError)?,
            monthly_usd: Usd::parse("LULL_MONTHLY_USD", &s.monthly_usd).map_err(ConfigError)?,
            prices: Prices::parse(&s.prices).map_err(ConfigError)?,
        };
        // A budget that cannot hold one reply would hold messages for ever.
        limits.check().map_err(ConfigError)?;
        limits.check_dollars(default_model).map_err(ConfigError)?;
        Ok(limits)
    }
}

/// What `lull run` and `lull check` warn of the price list, once money is counted (a
/// price list or a dollar budget is set): each model lull may ask (`models`: the
/// model and the variable that names it) with no price counts as $0, so no dollar
/// budget bounds it; a dollar budget with no price list bounds nothing.
pub(crate) fn price_warnings(limits: &Limits, models: &[(&str, &str)]) -> Vec<String> {
    let budgets: Vec<&str> = limits.dollar_budgets().iter().map(|(n, _)| *n).collect();
    if limits.prices.is_empty() {
        return budgets
            .iter()
            .map(|name| format!("{name} is set but LULL_PRICES prices no model: every call counts as $0, so it bounds nothing"))
            .collect();
    }
    let bounds = if budgets.is_empty() {
        String::new()
    } else {
        format!(", so {} cannot bound them", budgets.join(" and "))
    };
    let mut warned: Vec<&str> = Vec::new();
    let mut warnings = Vec::new();
    for (model, named_by) in models {
        if model.is_empty() || warned.contains(model) || limits.prices.of(model).is_some() {
            continue;
        }
        warned.push(model);
        warnings.push(format!(
            "LULL_PRICES has no price for {model} ({named_by}): its calls count as $0{bounds}"
        ));
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::super::tests::assert_errors_name;
    use super::{Prices, Usd};

    #[test]
    fn a_budget_that_cannot_hold_one_reply_is_refused() {
        assert_errors_name(&[(&["--daily-tokens", "10"], "LULL_DAILY_TOKENS")]);
    }

    #[test]
    fn malformed_money_is_refused_naming_the_variable() {
        assert_errors_name(&[
            (&["--prices", "gpt-4o=2.5"], "LULL_PRICES"),
            (&["--daily-usd=-3"], "LULL_DAILY_USD"),
            (&["--user-daily-usd", "ten"], "LULL_USER_DAILY_USD"),
            (&["--monthly-usd", "1e3"], "LULL_MONTHLY_USD"),
        ]);
    }

    #[test]
    fn each_unpriced_model_is_named_once() {
        let limits = lull_core::limits::Limits {
            prices: Prices::parse("small=0.1/0.2").unwrap(),
            daily_usd: Usd(1_000_000_000),
            ..Default::default()
        };
        let warnings = super::price_warnings(
            &limits,
            &[
                ("small", "LULL_MODELS"),
                ("big", "LULL_MODELS"),
                ("big", "LULL_SUMMARY_MODEL"),
            ],
        );
        assert_eq!(
            warnings,
            [
                "LULL_PRICES has no price for big (LULL_MODELS): its calls count as $0, so LULL_DAILY_USD cannot bound them"
            ]
        );
        let unpriced = lull_core::limits::Limits {
            prices: Prices::default(),
            ..limits
        };
        assert!(
            super::price_warnings(&unpriced, &[])[0]
                .contains("LULL_DAILY_USD is set but LULL_PRICES")
        );
    }
}
