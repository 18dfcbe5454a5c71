//! The schedule's tests, by area: `parse` (every WHEN form, and what each bad one
//! answers), `cron` (fields, the day rule, refused patterns), `dst` (daylight-saving
//! changes in Europe/Berlin and America/New_York, with explicit instants), `missed`
//! (catching up, checked against stepping one occurrence at a time), `forms` (the
//! stored form round-trips, the described form), `interval` (the
//! `LULL_JOB_MIN_INTERVAL` check).

mod cron;
mod dst;
mod forms;
mod interval;
mod missed;
mod parse;

use super::*;

fn zone(name: &str) -> TimeZone {
    name.parse().expect("a known zone")
}

/// An instant written in UTC (`2026-03-29T01:00:00Z`).
fn utc(text: &str) -> Timestamp {
    calendar::from_jiff(text.parse::<jiff::Timestamp>().expect("an instant"))
}

/// An unambiguous local time in `tz` (`2026-03-27 12:00`).
fn local(tz: &TimeZone, text: &str) -> Timestamp {
    let civil: jiff::civil::DateTime = text.parse().expect("a local time");
    let zoned = civil.to_zoned(tz.zone().clone()).expect("in range");
    calendar::from_jiff(zoned.timestamp())
}

/// An instant as it reads in UTC, for messages.
fn show(at: Timestamp) -> String {
    calendar::to_jiff(at).map_or_else(|| format!("@{}", at.0), |t| t.to_string())
}

fn daily(hour: u8, minute: u8) -> Schedule {
    Schedule::Daily(ClockTime::new(hour, minute).expect("a time"))
}

fn cron(pattern: &str) -> Schedule {
    Schedule::Cron(Cron::parse(pattern).expect("a pattern"))
}

/// The occurrences after `from`, `n` of them, each from the one before.
fn occurrences(schedule: &Schedule, from: Timestamp, tz: &TimeZone, n: usize) -> Vec<String> {
    let mut at = from;
    let mut shown = Vec::new();
    for _ in 0..n {
        at = schedule.next_after(at, tz).expect("a next occurrence");
        shown.push(show(at));
    }
    shown
}
