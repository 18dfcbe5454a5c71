//! Five-field cron patterns: minute (0-59), hour (0-23), day of month (1-31), month
//! (1-12 or `jan`-`dec`), day of week (0-7 or `sun`-`sat`, 0 and 7 both Sunday). Each
//! field is `*` or a comma list of `N`, `A-B`, `*/S`, `A-B/S` or `A/S` (from A to the
//! field's end). As in Vixie cron, when both day fields are restricted (neither
//! starts with `*`) a day matching either fires; otherwise a day must match both.
//! Times are local (placed by the calendar's one rule for daylight saving).
//!
//! A pattern that names no date at all (`0 0 31 2 *`) is refused when read, so every
//! pattern this module returns fires.

use std::time::Duration;

use jiff::civil::Date;

/// A parsed cron pattern: the set each field names, as bits, and the pattern as
/// written (fields joined by one space), which is its stored form.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Cron {
    pattern: String,
    minutes: u64,
    hours: u64,
    days: u64,
    months: u64,
    /// Bit 0 is Sunday (a 7 in the pattern is folded into it).
    weekdays: u64,
    days_restricted: bool,
    weekdays_restricted: bool,
}

/// One field's name (for errors), its range and the names it takes (the first
/// name is `min`'s).
struct Field {
    name: &'static str,
    min: u8,
    max: u8,
    names: &'static [&'static str],
}

const MINUTE: Field = Field {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
};
const HOUR: Field = Field {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
};
const DAY: Field = Field {
    name: "day-of-month",
    min: 1,
    max: 31,
    names: &[],
};
const MONTH: Field = Field {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ],
};
const WEEKDAY: Field = Field {
    name: "day-of-week",
    min: 0,
    max: 7,
    names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
};

impl Cron {
    /// Reads a pattern of five fields; the error says which field is wrong and why.
    pub(crate) fn parse(text: &str) -> Result<Cron, String> {
        let fields: Vec<&str> = text.split_whitespace().collect();
        let [minute, hour, day, month, weekday] = fields[..] else {
            return Err(format!(
                "it has {} fields, not the 5 minute hour day-of-month month day-of-week",
                fields.len()
            ));
        };
        let mut weekdays = bits(weekday, &WEEKDAY)?;
        if weekdays & 1 << 7 != 0 {
            weekdays = (weekdays | 1) & !(1 << 7);
        }
        let cron = Cron {
            pattern: fields.join(" "),
            minutes: bits(minute, &MINUTE)?,
            hours: bits(hour, &HOUR)?,
            days: bits(day, &DAY)?,
            months: bits(month, &MONTH)?,
            weekdays,
            days_restricted: !day.starts_with('*'),
            weekdays_restricted: !weekday.starts_with('*'),
        };
        if !cron.names_a_date() {
            return Err(format!("no month it names has the day of month {day}"));
        }
        Ok(cron)
    }

    /// The pattern as written, fields joined by one space.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// Whether the pattern fires on `date`.
    pub(crate) fn admits(&self, date: Date) -> bool {
        if !has(self.months, date.month()) {
            return false;
        }
        let day = has(self.days, date.day());
        let weekday = has(self.weekdays, date.weekday().to_sunday_zero_offset());
        if self.days_restricted && self.weekdays_restricted {
            day || weekday
        } else {
            day && weekday
        }
    }

    /// The hours it fires in, ascending.
    pub(crate) fn hours(&self) -> Vec<i8> {
        members(self.hours)
    }

    /// The minutes of an hour it fires at, ascending.
    pub(crate) fn minutes(&self) -> Vec<i8> {
        members(self.minutes)
    }

    /// The smallest gap between two of its local times, as if every day matched (the
    /// day fields only spread them out): the last time of a day is followed by the
    /// first of the next.
    pub(crate) fn shortest_gap(&self) -> Duration {
        let minutes = self.minutes();
        let times: Vec<u32> = self
            .hours()
            .iter()
            .flat_map(|hour| {
                minutes
                    .iter()
                    .map(move |minute| (*hour as u32) * 60 + *minute as u32)
            })
            .collect();
        let wrap = match (times.first(), times.last()) {
            (Some(first), Some(last)) => first + 24 * 60 - last,
            _ => 24 * 60,
        };
        let shortest = times
            .windows(2)
            .map(|pair| pair[1] - pair[0])
            .chain([wrap])
            .min()
            .unwrap_or(wrap);
        Duration::from_secs(u64::from(shortest) * 60)
    }

    /// Whether some date matches: when both day fields are restricted, any day of
    /// the week it names does (every month has each); otherwise some month it names
    /// must have a day of month it names (February with its 29th). A day field
    /// starting with `*` names the 1st, and the 1st falls on every weekday in time.
    fn names_a_date(&self) -> bool {
        const LONGEST: [i8; 12] = [31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
        if self.days_restricted && self.weekdays_restricted {
            return true;
        }
        (1..=12).any(|month: i8| {
            has(self.months, month)
                && (1..=LONGEST[month as usize - 1]).any(|day| has(self.days, day))
        })
    }
}

fn has(bits: u64, value: i8) -> bool {
    (0..64).contains(&value) && bits & 1 << value != 0
}

fn members(bits: u64) -> Vec<i8> {
    (0..64).filter(|value| has(bits, *value)).collect()
}

/// The values a field names, as bits (bit N for value N).
fn bits(text: &str, field: &Field) -> Result<u64, String> {
    text.split(',')
        .try_fold(0u64, |bits, item| Ok(bits | item_bits(item, field)?))
}

/// One item of a list: `*`, `N`, `A-B`, each with an optional `/S`.
fn item_bits(item: &str, field: &Field) -> Result<u64, String> {
    let (range, step) = match item.split_once('/') {
        Some((range, step)) => (range, Some(step_of(step, field)?)),
        None => (item, None),
    };
    let (low, high) = if range == "*" {
        (field.min, field.max)
    } else if let Some((low, high)) = range.split_once('-') {
        (value(low, field)?, value(high, field)?)
    } else {
        let low = value(range, field)?;
        (low, if step.is_some() { field.max } else { low })
    };
    if low > high {
        return Err(format!("the {} range {range} runs backwards", field.name));
    }
    let step = usize::from(step.unwrap_or(1));
    Ok((low..=high).step_by(step).fold(0, |bits, v| bits | 1 << v))
}

fn step_of(text: &str, field: &Field) -> Result<u8, String> {
    match text.parse::<u8>() {
        Ok(step) if step > 0 && step <= field.max => Ok(step),
        _ => Err(format!(
            "the {} step {text} is not between 1 and {}",
            field.name, field.max
        )),
    }
}

/// A number in the field's range, or one of its names (`mon`, `jan`; any case).
fn value(text: &str, field: &Field) -> Result<u8, String> {
    let lower = text.to_ascii_lowercase();
    if let Some(i) = field.names.iter().position(|name| *name == lower) {
        return Ok(field.min + i as u8);
    }
    match text.parse::<u8>() {
        Ok(n) if (field.min..=field.max).contains(&n) => Ok(n),
        Ok(_) => Err(format!(
            "the {} {text} is not between {} and {}",
            field.name, field.min, field.max
        )),
        Err(_) => Err(format!("the {} field has {text}, not a number", field.name)),
    }
}
