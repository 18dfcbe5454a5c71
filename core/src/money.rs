//! Money: dollars as whole nano-dollars, the price list (`LULL_PRICES`) and what a
//! model call, a summary or a transcription costs at it.
//!
//! Every amount is an integer count of nano-dollars (10⁻⁹ $), so sums across
//! processes are exact and a database adds them without rounding. A cost is rounded
//! **up** to the next nano-dollar once per call (never down: a budget is never
//! undercounted). Prices are parsed from decimal text without floating point.

use std::collections::BTreeMap;
use std::fmt;

use crate::domain::TokenUsage;

/// Nano-dollars in a dollar.
pub const NANOS_PER_USD: u64 = 1_000_000_000;

/// An amount of dollars, as whole nano-dollars (0: none; as a budget, no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Usd(pub u64);

impl Usd {
    pub const ZERO: Usd = Usd(0);

    /// Parse a dollar amount as a user writes it (`0.50`, `$2`, `12.5`), for the
    /// variable `name`; at most nine decimals, never negative. The error names the
    /// variable and the expected form.
    pub fn parse(name: &str, text: &str) -> Result<Usd, String> {
        let t = text.trim();
        let t = t.strip_prefix('$').unwrap_or(t);
        decimal_nanos(t).map(Usd).ok_or_else(|| {
            format!("{name}={text:?}: expected dollars as a decimal number such as 0.50 or 20 (0: no limit)")
        })
    }

    /// Whether this is a budget that limits (not zero).
    pub fn is_set(self) -> bool {
        self.0 > 0
    }

    /// The amount in dollars, for metrics and charts (exact to about 15 digits).
    pub fn dollars(self) -> f64 {
        self.0 as f64 / NANOS_PER_USD as f64
    }
}

impl serde::Serialize for Usd {
    /// As dollars (a JSON number): what `/api/status` shows.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(self.dollars())
    }
}

impl fmt::Display for Usd {
    /// `$12.50` from ten dollars up; `$0.42`, `$0.039`, `$2.0125` (up to four
    /// decimals) from a cent; under a cent, two significant digits (`$0.0031`,
    /// `$0.000042`), so a cheap model's costs do not read as nothing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 || self.0 >= 10 * NANOS_PER_USD {
            // Cents: rounded to the nearest.
            let cents = (self.0 + 5_000_000) / 10_000_000;
            return write!(f, "${}.{:02}", cents / 100, cents % 100);
        }
        if self.0 >= 10_000_000 {
            // Four decimals, rounded; trailing zeros dropped down to cents.
            let units = (self.0 + 50_000) / 100_000;
            let decimals = format!("{:04}", units % 10_000);
            let decimals = decimals.trim_end_matches('0');
            return write!(f, "${}.{:0<2}", units / 10_000, decimals);
        }
        // Under a cent: two significant digits, trailing zeros dropped.
        let digits = format!("{:09}", self.0);
        let first = digits.find(|c| c != '0').unwrap_or(8);
        let keep = (first + 2).min(9);
        let shown = digits[..keep].trim_end_matches('0');
        write!(f, "$0.{shown}")
    }
}

/// Nano-dollars of a decimal text (`2.5` → 2 500 000 000), `None` when it is not a
/// non-negative decimal with at most nine decimals.
fn decimal_nanos(text: &str) -> Option<u64> {
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    if !digits(whole) || !digits(frac) || frac.len() > 9 {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let frac: u64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<9}").parse().ok()?
    };
    whole.checked_mul(NANOS_PER_USD)?.checked_add(frac)
}

/// `n × per_unit ÷ units`, rounded up, in nano-dollars.
fn priced(n: u64, per_unit: u64, units: u64) -> u64 {
    let exact = u128::from(n) * u128::from(per_unit);
    u64::try_from(exact.div_ceil(u128::from(units))).unwrap_or(u64::MAX)
}

/// A chat model's price: nano-dollars per million tokens of input, of output, and of
/// cached input (what the server reports as read from its prompt cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenPrice {
    pub input: u64,
    pub output: u64,
    /// The cached input's price; `None`: cached input costs what other input costs.
    pub cached: Option<u64>,
}

impl TokenPrice {
    /// What `input` prompt tokens and `output` completion tokens cost, none cached:
    /// the worst case a reservation holds.
    pub fn worst(&self, input: u64, output: u64) -> Usd {
        Usd(priced(input, self.input, 1_000_000).saturating_add(priced(
            output,
            self.output,
            1_000_000,
        )))
    }

    /// What a call cost as the server reported it: the cached part of the prompt at
    /// the cached price, the rest at the input price, the completion at the output
    /// price; rounded up once.
    pub fn cost(&self, usage: &TokenUsage) -> Usd {
        let cached = usage.cached.min(usage.prompt);
        let fresh = usage.prompt - cached;
        let nanos_times_million = u128::from(fresh) * u128::from(self.input)
            + u128::from(cached) * u128::from(self.cached.unwrap_or(self.input))
            + u128::from(usage.completion) * u128::from(self.output);
        Usd(u64::try_from(nanos_times_million.div_ceil(1_000_000)).unwrap_or(u64::MAX))
    }

    /// The most output tokens `left` dollars buy after `input` tokens of prompt;
    /// `u64::MAX` when output is free.
    pub fn output_within(&self, left: Usd, input: u64) -> u64 {
        let after = left.0.saturating_sub(self.worst(input, 0).0);
        if self.output == 0 {
            return u64::MAX;
        }
        u64::try_from(u128::from(after) * 1_000_000 / u128::from(self.output)).unwrap_or(u64::MAX)
    }
}

/// One entry of `LULL_PRICES`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Price {
    /// A chat (or summary) model, priced per token.
    Tokens(TokenPrice),
    /// A transcription model, priced per second of audio (nano-dollars a second,
    /// from `DOLLARS/min` or `DOLLARS/s`).
    Audio { per_minute: u64 },
}

impl Price {
    /// What `secs` seconds of audio cost at an audio price (zero for a token price:
    /// a chat model that transcribes is charged through its tokens, if at all).
    pub fn audio(&self, secs: u64) -> Usd {
        match self {
            Price::Audio { per_minute } => Usd(priced(secs, *per_minute, 60)),
            Price::Tokens(_) => Usd::ZERO,
        }
    }

    /// The token price, if this is one.
    pub fn tokens(&self) -> Option<&TokenPrice> {
        match self {
            Price::Tokens(price) => Some(price),
            Price::Audio { .. } => None,
        }
    }
}

/// `LULL_PRICES`: each model's price. A model with no entry costs nothing as far as
/// lull counts (and a dollar budget does not bound it: `lull` warns at start).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prices {
    by_model: BTreeMap<String, Price>,
}

/// The expected form, as errors say it.
const PRICES_FORM: &str = "expected MODEL=IN/OUT in dollars per million input/output tokens \
(gpt-4o-mini=0.15/0.6), MODEL=IN/OUT/CACHED with the cached input's price, or MODEL=DOLLARS/min \
(or /s) for a transcription model (whisper-1=0.006/min), comma-separated";

impl Prices {
    /// Parse `LULL_PRICES` (see [`PRICES_FORM`]). Every malformed entry refuses,
    /// naming the variable, the entry and the expected form; a model named twice too.
    pub fn parse(text: &str) -> Result<Prices, String> {
        let mut by_model = BTreeMap::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = |why: &str| format!("LULL_PRICES: {entry:?} {why}: {PRICES_FORM}");
            let (model, price) = entry
                .split_once('=')
                .map(|(m, p)| (m.trim(), p.trim()))
                .ok_or_else(|| bad("has no '='"))?;
            if model.is_empty() || model.chars().any(char::is_whitespace) {
                return Err(bad("does not name a model"));
            }
            let price = parse_price(price).ok_or_else(|| bad("is not a price"))?;
            if by_model.insert(model.to_owned(), price).is_some() {
                return Err(bad("names a model priced earlier in the list"));
            }
        }
        Ok(Prices { by_model })
    }

    /// The price of `model`, if listed.
    pub fn of(&self, model: &str) -> Option<&Price> {
        self.by_model.get(model)
    }

    /// The token price of `model`; a model without one costs nothing.
    pub fn tokens_of(&self, model: &str) -> TokenPrice {
        self.of(model)
            .and_then(Price::tokens)
            .copied()
            .unwrap_or(TokenPrice {
                input: 0,
                output: 0,
                cached: None,
            })
    }

    /// What `secs` seconds of audio transcribed by `model` cost (nothing unpriced).
    pub fn audio_of(&self, model: &str, secs: u64) -> Usd {
        self.of(model).map_or(Usd::ZERO, |p| p.audio(secs))
    }

    /// Whether no model is priced.
    pub fn is_empty(&self) -> bool {
        self.by_model.is_empty()
    }

    /// The list as `lull check` prints it.
    pub fn describe(&self) -> String {
        if self.by_model.is_empty() {
            return "no prices (LULL_PRICES unset): costs count as $0".to_owned();
        }
        let per_m = |n: u64| Usd(n).plain();
        self.by_model
            .iter()
            .map(|(model, price)| match price {
                Price::Tokens(p) => match p.cached {
                    Some(c) => format!(
                        "{model} ${}/${} (cached ${}) per million tokens in/out",
                        per_m(p.input),
                        per_m(p.output),
                        per_m(c)
                    ),
                    None => format!(
                        "{model} ${}/${} per million tokens in/out",
                        per_m(p.input),
                        per_m(p.output)
                    ),
                },
                Price::Audio { per_minute } => {
                    format!("{model} ${} per minute of audio", per_m(*per_minute))
                }
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl Usd {
    /// The amount as a plain decimal with no trailing zeros (`2.5`, `0.15`): prices.
    pub fn plain(self) -> String {
        let whole = self.0 / NANOS_PER_USD;
        let frac = format!("{:09}", self.0 % NANOS_PER_USD);
        let frac = frac.trim_end_matches('0');
        if frac.is_empty() {
            whole.to_string()
        } else {
            format!("{whole}.{frac}")
        }
    }
}

/// One entry's price text: `IN/OUT`, `IN/OUT/CACHED`, `D/min` or `D/s`.
fn parse_price(text: &str) -> Option<Price> {
    let parts: Vec<&str> = text.split('/').map(str::trim).collect();
    match parts.as_slice() {
        [d, "min"] => Some(Price::Audio {
            per_minute: decimal_nanos(d)?,
        }),
        [d, "s"] => Some(Price::Audio {
            per_minute: decimal_nanos(d)?.checked_mul(60)?,
        }),
        [input, output] => Some(Price::Tokens(TokenPrice {
            input: decimal_nanos(input)?,
            output: decimal_nanos(output)?,
            cached: None,
        })),
        [input, output, cached] => Some(Price::Tokens(TokenPrice {
            input: decimal_nanos(input)?,
            output: decimal_nanos(output)?,
            cached: Some(decimal_nanos(cached)?),
        })),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dollars_parse_exactly_and_refuse_naming_the_variable() {
        assert_eq!(Usd::parse("X", "0.50"), Ok(Usd(500_000_000)));
        assert_eq!(Usd::parse("X", "$2"), Ok(Usd(2 * NANOS_PER_USD)));
        assert_eq!(Usd::parse("X", ".000000001"), Ok(Usd(1)));
        for bad in ["-1", "1e3", "", "0.0000000001", "ten", "1.2.3"] {
            let e = Usd::parse("LULL_DAILY_USD", bad).unwrap_err();
            assert!(e.starts_with("LULL_DAILY_USD="), "{e}");
        }
    }

    #[test]
    fn amounts_read_in_cents_or_in_significant_digits_under_a_cent() {
        assert_eq!(Usd(0).to_string(), "$0.00");
        assert_eq!(Usd(420_000_000).to_string(), "$0.42");
        assert_eq!(Usd(12_504_000_000).to_string(), "$12.50");
        assert_eq!(Usd(39_000_000).to_string(), "$0.039");
        assert_eq!(Usd(2_012_500_000).to_string(), "$2.0125");
        assert_eq!(Usd(2_500_000_000).to_string(), "$2.50");
        assert_eq!(Usd(3_100_000).to_string(), "$0.0031");
        assert_eq!(Usd(42_000).to_string(), "$0.000042");
        assert_eq!(Usd(1).to_string(), "$0.000000001");
    }

    #[test]
    fn a_price_list_parses_token_cached_and_audio_prices() {
        let prices =
            Prices::parse("gpt-4o=2.5/10/1.25, mini=0.15/0.6,whisper-1=0.006/min,free=0/0")
                .unwrap();
        let big = prices.tokens_of("gpt-4o");
        assert_eq!(
            (big.input, big.output, big.cached),
            (2_500_000_000, 10_000_000_000, Some(1_250_000_000))
        );
        assert_eq!(prices.audio_of("whisper-1", 60), Usd(6_000_000));
        assert_eq!(prices.audio_of("whisper-1", 1), Usd(100_000));
        assert_eq!(prices.tokens_of("free").worst(1_000_000, 1_000_000), Usd(0));
        assert_eq!(prices.tokens_of("unknown").worst(10, 10), Usd(0));
    }

    #[test]
    fn malformed_prices_refuse_naming_the_variable_and_the_entry() {
        for bad in [
            "gpt-4o",
            "=1/2",
            "gpt-4o=1",
            "gpt-4o=a/b",
            "gpt-4o=1/2/3/4",
            "gpt-4o=-1/2",
            "a=1/2,a=2/3",
            "whisper=1/hour",
        ] {
            let e = Prices::parse(bad).unwrap_err();
            assert!(e.starts_with("LULL_PRICES: "), "{e}");
            assert!(e.contains("MODEL=IN/OUT"), "{e}");
        }
        assert_eq!(Prices::parse(""), Ok(Prices::default()));
    }

    #[test]
    fn a_cost_prices_cached_input_apart_and_rounds_up_once() {
        let price = TokenPrice {
            input: 2_500_000_000,
            output: 10_000_000_000,
            cached: Some(1_250_000_000),
        };
        let usage = TokenUsage {
            prompt: 1000,
            completion: 100,
            cached: 400,
        };
        // 600 × 2.5 + 400 × 1.25 + 100 × 10 dollars per million.
        assert_eq!(price.cost(&usage), Usd(1_500_000 + 500_000 + 1_000_000));
        let cheap = TokenPrice {
            input: 100_000,
            output: 0,
            cached: None,
        };
        assert_eq!(
            cheap.cost(&TokenUsage {
                prompt: 3,
                completion: 0,
                cached: 0
            }),
            Usd(1),
            "0.3 nano-dollars is charged as 1"
        );
        assert_eq!(price.output_within(Usd(2_500_000 + 1_000_000), 1000), 100);
        assert_eq!(cheap.output_within(Usd(1), 0), u64::MAX);
    }
}
