//! The two text forms of a schedule. The stored form is one line for the database,
//! read back into the same value (`once 2026-12-24T17:00:00Z`, `every 1h30m`, `daily
//! 08:00`, `weekly mon,wed,fri 09:00`, `cron 0 8 * * 1-5`); rows outlive releases, so
//! a form is never changed, only added. The described form is for people, written in
//! the WHEN language itself (`every weekday at 08:30`, `once at 2026-12-24 18:00`), so
//! what `/jobs` shows can be typed back; like the WHEN grammar it is English, and
//! stays with the grammar rather than in `texts`.

use std::time::Duration;

use jiff::civil::Weekday;

use super::{ClockTime, Cron, Schedule, Weekdays};
use crate::limits::TimeZone;

/// The units of a stored interval, largest first, in nanoseconds: any `Duration`
/// is written exactly.
const UNITS: [(&str, u128); 7] = [
    ("d", 86_400_000_000_000),
    ("h", 3_600_000_000_000),
    ("m", 60_000_000_000),
    ("s", 1_000_000_000),
    ("ms", 1_000_000),
    ("us", 1_000),
    ("ns", 1),
];

/// Short weekday names, Monday first: the stored form's.
const SHORT_DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

pub(crate) fn stored(schedule: &Schedule) -> String {
    match schedule {
        Schedule::Once(at) => match super::calendar::to_jiff(*at) {
            Some(instant) => format!("once {instant}"),
            None => format!("once @{}", at.0),
        },
        Schedule::Every(interval) => format!("every {}", interval_text(*interval)),
        Schedule::Daily(at) => format!("daily {at}"),
        Schedule::Weekly(days, at) => {
            let days: Vec<&str> = days
                .iter()
                .map(|day| SHORT_DAYS[day.to_monday_zero_offset() as usize])
                .collect();
            format!("weekly {} {at}", days.join(","))
        }
        Schedule::Cron(cron) => format!("cron {}", cron.pattern()),
    }
}

/// Reads a stored form; the error says what is wrong with it.
pub(crate) fn from_stored(text: &str) -> Result<Schedule, String> {
    let (kind, rest) = text
        .split_once(' ')
        .ok_or("expected a kind and its value")?;
    match kind {
        "once" => stored_instant(rest).map(Schedule::Once),
        "every" => stored_interval(rest).map(Schedule::Every),
        "daily" => stored_clock(rest).map(Schedule::Daily),
        "weekly" => {
            let (days, at) = rest.split_once(' ').ok_or("expected days and a time")?;
            Ok(Schedule::Weekly(stored_days(days)?, stored_clock(at)?))
        }
        "cron" => Cron::parse(rest).map(Schedule::Cron),
        _ => Err(format!("unknown kind '{kind}'")),
    }
}

fn stored_instant(text: &str) -> Result<crate::domain::Timestamp, String> {
    if let Some(millis) = text.strip_prefix('@') {
        return millis
            .parse()
            .map(crate::domain::Timestamp)
            .map_err(|e| format!("'{text}': {e}"));
    }
    text.parse::<jiff::Timestamp>()
        .map(super::calendar::from_jiff)
        .map_err(|e| format!("'{text}': {e}"))
}

fn stored_interval(text: &str) -> Result<Duration, String> {
    let mut rest = text;
    let mut nanos: u128 = 0;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let n: u128 = rest[..digits]
            .parse()
            .map_err(|_| format!("'{text}' is not an interval"))?;
        rest = &rest[digits..];
        let letters = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (_, size) = UNITS
            .iter()
            .find(|(unit, _)| *unit == &rest[..letters])
            .ok_or_else(|| format!("'{text}' has an unknown unit"))?;
        nanos = n
            .checked_mul(*size)
            .and_then(|more| nanos.checked_add(more))
            .ok_or_else(|| format!("'{text}' is too long"))?;
        rest = &rest[letters..];
    }
    let seconds =
        u64::try_from(nanos / 1_000_000_000).map_err(|_| format!("'{text}' is too long"))?;
    match Duration::new(seconds, (nanos % 1_000_000_000) as u32) {
        Duration::ZERO => Err(format!("'{text}': an interval of zero never ends")),
        interval => Ok(interval),
    }
}

fn stored_clock(text: &str) -> Result<ClockTime, String> {
    let (hour, minute) = text
        .split_once(':')
        .filter(|(hour, minute)| hour.len() == 2 && minute.len() == 2)
        .ok_or_else(|| format!("'{text}' is not HH:MM"))?;
    let number = |s: &str| {
        s.parse::<u8>()
            .map_err(|_| format!("'{text}' is not HH:MM"))
    };
    ClockTime::new(number(hour)?, number(minute)?).ok_or_else(|| format!("'{text}' is not a time"))
}

fn stored_days(text: &str) -> Result<Weekdays, String> {
    let days = text
        .split(',')
        .map(|name| {
            SHORT_DAYS
                .iter()
                .position(|short| *short == name)
                .and_then(|i| Weekday::from_monday_zero_offset(i as i8).ok())
                .ok_or_else(|| format!("'{name}' is not a day"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Weekdays::of(days).ok_or_else(|| "no days".to_owned())
}

/// An interval in the largest units that write it exactly: `1h30m`, `45s`, `0s`.
fn interval_text(interval: Duration) -> String {
    let mut left = interval.as_nanos();
    let mut text = String::new();
    for (unit, size) in UNITS {
        if left >= size {
            text.push_str(&format!("{}{unit}", left / size));
            left %= size;
        }
    }
    if text.is_empty() {
        text.push_str("0s");
    }
    text
}

pub(crate) fn describe(schedule: &Schedule, tz: &TimeZone) -> String {
    match schedule {
        Schedule::Once(at) => match super::calendar::to_jiff(*at) {
            Some(instant) => {
                let local = instant.to_zoned(tz.zone().clone());
                format!("once at {}", local.strftime("%Y-%m-%d %H:%M"))
            }
            None => format!("once at @{}", at.0),
        },
        Schedule::Every(interval) => match interval.as_secs() {
            _ if interval.subsec_nanos() != 0 => format!("every {}", interval_text(*interval)),
            3600 => "every hour".to_owned(),
            60 => "every minute".to_owned(),
            1 => "every second".to_owned(),
            _ => format!("every {}", interval_text(*interval)),
        },
        Schedule::Daily(at) => format!("every day at {at}"),
        Schedule::Weekly(days, at) => format!("every {} at {at}", days_text(*days)),
        Schedule::Cron(cron) => format!("cron \"{}\"", cron.pattern()),
    }
}

/// `weekday`, `weekend`, `monday`, `monday and friday`, `monday, wednesday and friday`.
fn days_text(days: Weekdays) -> String {
    match days {
        Weekdays::WORKDAYS => return "weekday".to_owned(),
        Weekdays::WEEKEND => return "weekend".to_owned(),
        _ => {}
    }
    const NAMES: [&str; 7] = [
        "monday",
        "tuesday",
        "wednesday",
        "thursday",
        "friday",
        "saturday",
        "sunday",
    ];
    let names: Vec<&str> = days
        .iter()
        .map(|day| NAMES[day.to_monday_zero_offset() as usize])
        .collect();
    match names.split_last() {
        Some((last, [])) => (*last).to_owned(),
        Some((last, others)) => format!("{} and {last}", others.join(", ")),
        None => String::new(),
    }
}
