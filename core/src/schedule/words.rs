//! The words of a WHEN and the small things read from them: the cursor over the
//! words ([`Words`]), lengths of time (`20m`, `1h 30m`, `an hour`), times of day
//! (`18:00`, `9am`, `noon`) and weekdays (`mon`, `mondays`, `mon-fri`). Each reader
//! moves the cursor only when it matched.

use jiff::civil::Weekday;

use super::ClockTime;

/// A word naming weekdays: one (`mon`, `mondays`), a comma list, or a range (`mon-fri`).
pub(crate) fn weekday_group(word: &str) -> Option<Vec<Weekday>> {
    let mut days = Vec::new();
    for item in word.to_ascii_lowercase().split(',') {
        match item.split_once('-') {
            Some((first, last)) => {
                let (first, last) = (weekday(first)?, weekday(last)?);
                let span =
                    (last.to_monday_zero_offset() - first.to_monday_zero_offset()).rem_euclid(7);
                days.extend((0..=span).map(|n| first.wrapping_add(n)));
            }
            None => days.push(weekday(item)?),
        }
    }
    Some(days)
}

/// A weekday's name, short or long, singular or plural (lower case).
pub(crate) fn weekday(word: &str) -> Option<Weekday> {
    let word = word
        .strip_suffix('s')
        .filter(|w| w.len() >= 6)
        .unwrap_or(word);
    Some(match word {
        "mon" | "monday" => Weekday::Monday,
        "tue" | "tues" | "tuesday" => Weekday::Tuesday,
        "wed" | "wednesday" => Weekday::Wednesday,
        "thu" | "thur" | "thurs" | "thursday" => Weekday::Thursday,
        "fri" | "friday" => Weekday::Friday,
        "sat" | "saturday" => Weekday::Saturday,
        "sun" | "sunday" => Weekday::Sunday,
        _ => return None,
    })
}

/// `at TIME` (a bare hour allowed: `at 9`) or `TIME`: `18:00`, `8:30`, `9am`, `6:30
/// pm`, `noon`, `midnight`.
pub(crate) fn clock_at(words: &mut Words<'_>) -> Option<ClockTime> {
    let mut probe = *words;
    let after_at = probe.keyword(&["at"]);
    let at = clock(&mut probe, after_at)?;
    *words = probe;
    Some(at)
}

fn clock(words: &mut Words<'_>, bare_hour: bool) -> Option<ClockTime> {
    let mut probe = *words;
    let word = probe.next()?.to_ascii_lowercase();
    let at = match word.as_str() {
        "noon" => ClockTime::new(12, 0),
        "midnight" => ClockTime::new(0, 0),
        _ => {
            let (digits, half) = match word.strip_suffix("am").or(word.strip_suffix("pm")) {
                Some(digits) => (digits, Some(word.ends_with("pm"))),
                None => (word.as_str(), probe.take(am_pm)),
            };
            let (hour, minute, colon) = hour_minute(digits)?;
            match half {
                Some(pm) => twelve_hour(hour, minute, pm),
                None if colon || bare_hour => ClockTime::new(hour, minute),
                None => None,
            }
        }
    }?;
    *words = probe;
    Some(at)
}

fn am_pm(word: &str) -> Option<bool> {
    match word.to_ascii_lowercase().as_str() {
        "am" | "a.m." => Some(false),
        "pm" | "p.m." => Some(true),
        _ => None,
    }
}

/// `H`, `HH`, `H:MM` or `HH:MM`, and whether it had a colon.
fn hour_minute(text: &str) -> Option<(u8, u8, bool)> {
    let digits = |s: &str| -> Option<u8> {
        (!s.is_empty() && s.len() <= 2 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())?
    };
    match text.split_once(':') {
        Some((hour, minute)) if minute.len() == 2 => Some((digits(hour)?, digits(minute)?, true)),
        Some(_) => None,
        None => Some((digits(text)?, 0, false)),
    }
}

/// `12am` is midnight, `12pm` noon.
fn twelve_hour(hour: u8, minute: u8, pm: bool) -> Option<ClockTime> {
    if !(1..=12).contains(&hour) {
        return None;
    }
    ClockTime::new(hour % 12 + if pm { 12 } else { 0 }, minute)
}

/// A length of time: calendar days (`d`, `w`) and elapsed seconds (`h`, `m`, `s`),
/// kept apart.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Amount {
    pub(crate) days: i64,
    pub(crate) seconds: i64,
}

impl Amount {
    fn plus(self, other: Amount) -> Option<Amount> {
        Some(Amount {
            days: self.days.checked_add(other.days)?,
            seconds: self.seconds.checked_add(other.seconds)?,
        })
    }
}

/// The units of a length of time.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
}

impl Unit {
    /// `n` of this unit (`n` is at most a million, see [`number`], so this fits).
    pub(crate) fn times(self, n: i64) -> Amount {
        let (days, seconds) = match self {
            Unit::Second => (0, n),
            Unit::Minute => (0, n * 60),
            Unit::Hour => (0, n * 3600),
            Unit::Day => (n, 0),
            Unit::Week => (n * 7, 0),
        };
        Amount { days, seconds }
    }
}

/// A unit's name, short or long (any case).
pub(crate) fn unit(word: &str) -> Option<Unit> {
    Some(match word.to_ascii_lowercase().as_str() {
        "s" | "sec" | "secs" | "second" | "seconds" => Unit::Second,
        "m" | "min" | "mins" | "minute" | "minutes" => Unit::Minute,
        "h" | "hr" | "hrs" | "hour" | "hours" => Unit::Hour,
        "d" | "day" | "days" => Unit::Day,
        "w" | "wk" | "wks" | "week" | "weeks" => Unit::Week,
        _ => return None,
    })
}

/// One or more parts (`1h30m`, `1h 30m`, `1 hour and 30 minutes`), added up.
pub(crate) fn amount(words: &mut Words<'_>) -> Option<Amount> {
    let mut total = amount_part(words)?;
    loop {
        let mut probe = *words;
        probe.keyword(&["and"]);
        match amount_part(&mut probe).and_then(|more| total.plus(more)) {
            Some(sum) => {
                total = sum;
                *words = probe;
            }
            None => return Some(total),
        }
    }
}

/// One part: a word of numbers and units (`20m`, `1h30m`), or a number (`90`, `a`,
/// `an`) and a unit word.
fn amount_part(words: &mut Words<'_>) -> Option<Amount> {
    if let Some(amount) = words.take(glued_amount) {
        return Some(amount);
    }
    let mut probe = *words;
    let n = match probe.next()?.to_ascii_lowercase().as_str() {
        "a" | "an" | "one" => 1,
        word => number(word)?,
    };
    let amount = unit(probe.next()?)?.times(n);
    *words = probe;
    Some(amount)
}

/// `20m`, `1h30m`, `2d`: digits and a unit, repeated.
fn glued_amount(word: &str) -> Option<Amount> {
    if word.is_empty() {
        return None;
    }
    let mut rest = word;
    let mut total = Amount::default();
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let n = number(&rest[..digits])?;
        rest = &rest[digits..];
        let letters = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        total = total.plus(unit(&rest[..letters])?.times(n))?;
        rest = &rest[letters..];
    }
    Some(total)
}

/// A count of units: digits, at most a million (a bound that keeps sums in range).
fn number(text: &str) -> Option<i64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse::<i64>().ok().filter(|n| *n <= 1_000_000)
}

/// The words of the text, as a cursor that copies cheaply (a reader tries a form on
/// a copy and keeps it only when the form matched).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Words<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Words<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        Self { text, at: 0 }
    }

    /// The next word as written (split at whitespace).
    pub(crate) fn next_raw(&mut self) -> Option<&'a str> {
        let rest = &self.text[self.at..];
        let start = rest.len() - rest.trim_start().len();
        let len = rest[start..]
            .find(char::is_whitespace)
            .unwrap_or(rest.len() - start);
        if len == 0 {
            return None;
        }
        self.at += start + len;
        Some(&rest[start..start + len])
    }

    /// The next word without a trailing `,` or `:` (`at 18:00, call Bob`).
    pub(crate) fn next(&mut self) -> Option<&'a str> {
        let word = self.next_raw()?;
        Some(word.strip_suffix([',', ':']).unwrap_or(word))
    }

    /// Takes the next word if `read` makes something of it.
    pub(crate) fn take<T>(&mut self, read: impl FnOnce(&str) -> Option<T>) -> Option<T> {
        let mut probe = *self;
        let value = read(probe.next()?)?;
        *self = probe;
        Some(value)
    }

    /// Takes the next word if it is one of `keywords` (any case).
    pub(crate) fn keyword(&mut self, keywords: &[&str]) -> bool {
        self.take(|word| {
            keywords
                .iter()
                .any(|k| word.eq_ignore_ascii_case(k))
                .then_some(())
        })
        .is_some()
    }

    /// A quoted string next (`"…"`, `'…'`, `“…”`, `‘…’`): its inside.
    pub(crate) fn quoted(&mut self) -> Option<&'a str> {
        let rest = self.text[self.at..].trim_start();
        let open = rest.chars().next()?;
        let close = match open {
            '"' | '\'' | '`' => open,
            '“' => '”',
            '‘' => '’',
            '„' => '“',
            _ => return None,
        };
        let inside = &rest[open.len_utf8()..];
        let end = inside.find(close)?;
        self.at = self.text.len() - inside.len() + end + close.len_utf8();
        Some(&inside[..end])
    }

    /// What is left, trimmed.
    pub(crate) fn rest(&self) -> &'a str {
        self.text[self.at..].trim()
    }
}
