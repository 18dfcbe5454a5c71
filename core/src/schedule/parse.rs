//! Reading a WHEN off the front of a command's text (the forms are listed in the
//! module doc of `schedule`). Words are compared in any case; the rest is returned as
//! written. Each reader takes words from a copy of the cursor and moves the real one
//! only when it matched, so a form that does not match leaves the words to the next.

use std::time::Duration;

use jiff::civil::{Date, Weekday};
use jiff::{ToSpan, Zoned};

use super::calendar::{self, resolve};
use super::words::{Amount, Words, amount, clock_at, unit, weekday, weekday_group};
use super::{ClockTime, Cron, Schedule, ScheduleError, Weekdays};
use crate::domain::Timestamp;
use crate::limits::TimeZone;

/// The time of a day named without one (`tomorrow`, `every monday`, `2026-12-24`).
const MORNING: ClockTime = ClockTime { hour: 9, minute: 0 };

/// Reads the WHEN at the front of `input` (`in 20m buy milk`) as the person at `now`
/// in `tz` meant it, and returns it with the rest of the text (`buy milk`), which
/// must not be empty. A one-shot is always ahead of `now`.
pub fn parse<'a>(
    input: &'a str,
    now: Timestamp,
    tz: &TimeZone,
) -> Result<(Schedule, &'a str), ScheduleError> {
    let now = calendar::to_jiff(now)
        .ok_or(ScheduleError::Unreadable)?
        .to_zoned(tz.zone().clone());
    let mut words = Words::new(input);
    let schedule = when(&mut words, &now)?;
    match words.rest() {
        "" => Err(ScheduleError::NoText),
        rest => Ok((schedule, rest)),
    }
}

/// One WHEN, by its first word.
fn when(words: &mut Words<'_>, now: &Zoned) -> Result<Schedule, ScheduleError> {
    let mut probe = *words;
    let first = probe.next().ok_or(ScheduleError::Unreadable)?;
    let schedule = match first.to_ascii_lowercase().as_str() {
        "in" => once_in(amount(&mut probe).ok_or(ScheduleError::Unreadable)?, now)?,
        "every" => every(&mut probe)?,
        "daily" => Schedule::Daily(clock_or_morning(&mut probe)),
        "hourly" => Schedule::Every(Duration::from_secs(3600)),
        "cron" => cron(&mut probe)?,
        "once" => once(&mut probe, now)?,
        _ => {
            probe = *words;
            once(&mut probe, now)?
        }
    };
    *words = probe;
    Ok(schedule)
}

/// `every …`: a day, weekdays, the weekend, named days (each with an optional time),
/// or an interval (`every 2h`, `every hour`).
fn every(words: &mut Words<'_>) -> Result<Schedule, ScheduleError> {
    if words.keyword(&["day", "days"]) {
        return Ok(Schedule::Daily(clock_or_morning(words)));
    }
    let days = if words.keyword(&["weekday", "weekdays", "workday", "workdays"]) {
        Some(Weekdays::WORKDAYS)
    } else if words.keyword(&["weekend", "weekends"]) {
        Some(Weekdays::WEEKEND)
    } else {
        day_list(words)
    };
    if let Some(days) = days {
        let at = clock_or_morning(words);
        return Ok(match days {
            Weekdays::ALL => Schedule::Daily(at),
            days => Schedule::Weekly(days, at),
        });
    }
    let amount = amount(words)
        .or_else(|| words.take(|word| unit(word).map(|unit| unit.times(1))))
        .ok_or(ScheduleError::Unreadable)?;
    let seconds = amount
        .days
        .saturating_mul(86_400)
        .saturating_add(amount.seconds);
    match u64::try_from(seconds) {
        Ok(seconds) if seconds > 0 => Ok(Schedule::Every(Duration::from_secs(seconds))),
        _ => Err(ScheduleError::Unreadable),
    }
}

/// `cron "0 8 * * 1-5"` (any quotes), or five bare fields.
fn cron(words: &mut Words<'_>) -> Result<Schedule, ScheduleError> {
    let pattern = match words.quoted() {
        Some(pattern) => pattern.to_owned(),
        None => {
            let fields: Vec<&str> = (0..5).map_while(|_| words.next_raw()).collect();
            fields.join(" ")
        }
    };
    Cron::parse(&pattern)
        .map(Schedule::Cron)
        .map_err(ScheduleError::Cron)
}

/// A one-shot at a day and time, or at a time (today if ahead, else tomorrow).
fn once(words: &mut Words<'_>, now: &Zoned) -> Result<Schedule, ScheduleError> {
    if let Some(day) = day(words)? {
        let at = clock_or_morning(words);
        return once_on(day, at, now);
    }
    let at = clock_at(words).ok_or(ScheduleError::Unreadable)?;
    let today = now.date();
    let mut instant = place(today, at, now)?;
    if instant <= now.timestamp() {
        let tomorrow = today.tomorrow().map_err(|_| ScheduleError::Unreadable)?;
        instant = place(tomorrow, at, now)?;
    }
    Ok(Schedule::Once(calendar::from_jiff(instant)))
}

/// A day a one-shot names.
enum Day {
    Today,
    Tomorrow,
    Next(Weekday),
    On(Date),
}

/// `today`, `tomorrow`, `[next] monday`, `2026-12-24`, each after an optional `on`
/// or `at` (`once at 2026-12-24 18:00` is how a one-shot is described).
fn day(words: &mut Words<'_>) -> Result<Option<Day>, ScheduleError> {
    let mut probe = *words;
    probe.keyword(&["on", "at"]);
    let next = probe.keyword(&["next"]);
    let Some(word) = probe.next() else {
        return Ok(None);
    };
    let day = match word.to_ascii_lowercase().as_str() {
        "today" if !next => Day::Today,
        "tomorrow" | "tmrw" if !next => Day::Tomorrow,
        lower => match (weekday(lower), iso_date(word)) {
            (Some(weekday), _) => Day::Next(weekday),
            (None, Some(date)) if !next => Day::On(date?),
            _ => return Ok(None),
        },
    };
    *words = probe;
    Ok(Some(day))
}

/// The one-shot at `at` on `day`, which must be ahead of `now`. A weekday is the next
/// one whose time is ahead, today included.
fn once_on(day: Day, at: ClockTime, now: &Zoned) -> Result<Schedule, ScheduleError> {
    let today = now.date();
    let date = match day {
        Day::Today => today,
        Day::Tomorrow => today.tomorrow().map_err(|_| ScheduleError::Unreadable)?,
        Day::On(date) => date,
        Day::Next(weekday) => {
            let ahead = (0..8)
                .filter_map(|days| today.checked_add(days.days()).ok())
                .filter(|date| date.weekday() == weekday)
                .find(|date| place(*date, at, now).is_ok_and(|t| t > now.timestamp()));
            ahead.ok_or(ScheduleError::Unreadable)?
        }
    };
    let instant = place(date, at, now)?;
    if instant <= now.timestamp() {
        return Err(ScheduleError::Passed);
    }
    Ok(Schedule::Once(calendar::from_jiff(instant)))
}

/// `in …`: hours, minutes and seconds of elapsed time after calendar days, so `in 3
/// days` keeps the clock time across a daylight-saving change.
fn once_in(amount: Amount, now: &Zoned) -> Result<Schedule, ScheduleError> {
    let base = if amount.days == 0 {
        now.timestamp()
    } else {
        let local = jiff::Span::new()
            .try_days(amount.days)
            .and_then(|days| now.datetime().checked_add(days))
            .map_err(|_| ScheduleError::Unreadable)?;
        resolve(now.time_zone(), local).ok_or(ScheduleError::Unreadable)?
    };
    let at = base
        .checked_add(jiff::SignedDuration::from_secs(amount.seconds))
        .map_err(|_| ScheduleError::Unreadable)?;
    if at <= now.timestamp() {
        return Err(ScheduleError::Unreadable);
    }
    Ok(Schedule::Once(calendar::from_jiff(at)))
}

/// `at` on `date` in `now`'s zone, by the calendar's rule for gaps and folds.
fn place(date: Date, at: ClockTime, now: &Zoned) -> Result<jiff::Timestamp, ScheduleError> {
    let local = date.at(at.hour as i8, at.minute as i8, 0, 0);
    resolve(now.time_zone(), local).ok_or(ScheduleError::Unreadable)
}

/// `YYYY-MM-DD`: `None` when the word is not of that shape, an error when it is but
/// the calendar has no such date.
fn iso_date(word: &str) -> Option<Result<Date, ScheduleError>> {
    let b = word.as_bytes();
    let shaped = b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 4 || i == 7 || c.is_ascii_digit());
    if !shaped {
        return None;
    }
    let number = |range: std::ops::Range<usize>| word[range].parse::<i16>().unwrap_or(0);
    let (year, month, day) = (number(0..4), number(5..7), number(8..10));
    Some(
        i8::try_from(month)
            .ok()
            .zip(i8::try_from(day).ok())
            .and_then(|(month, day)| Date::new(year, month, day).ok())
            .ok_or_else(|| ScheduleError::NoSuchDate(word.to_owned())),
    )
}

/// One or more weekdays: `monday`, `mondays`, `mon,wed,fri`, `mon-fri`, `monday and
/// friday`, `monday, friday`. Every day of the week is [`Weekdays::ALL`].
fn day_list(words: &mut Words<'_>) -> Option<Weekdays> {
    let mut days = words.take(weekday_group)?;
    loop {
        let mut probe = *words;
        probe.keyword(&["and"]);
        match probe.take(weekday_group) {
            Some(more) => {
                days.extend(more);
                *words = probe;
            }
            None => return Weekdays::of(days),
        }
    }
}

/// `[at] TIME`, or 09:00 when there is none.
fn clock_or_morning(words: &mut Words<'_>) -> ClockTime {
    clock_at(words).unwrap_or(MORNING)
}
