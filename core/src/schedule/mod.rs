//! The schedule language of jobs: the WHEN of `/remind WHEN TEXT` and
//! `/schedule WHEN PROMPT`, read into a [`Schedule`], and the instants it names.
//! Pure functions of their inputs (the time now and the chat's time zone are
//! arguments): no store, no clock, no dispatcher.
//!
//! # Layout
//!
//! - `parse`: reading a WHEN (English, any case) off the front of a command's text,
//!   leaving the rest (the reminder's text, the task's prompt).
//! - `words`: the cursor over a WHEN's words and the small things read from them:
//!   lengths of time, times of day, weekdays.
//! - `cron`: five-field cron patterns (`cron "0 8 * * 1-5"`), evaluated over jiff's
//!   civil dates and times.
//! - `calendar`: the days-and-local-times view shared by daily, weekly and cron
//!   schedules: where a local time falls in a zone, the next occurrence, and how many
//!   occurrences lie between two instants.
//! - `forms`: the stored form (one line in the database, read back exactly) and the
//!   form people read (`every weekday at 08:30`).
//!
//! # The forms a WHEN takes
//!
//! - relative: `in 20m`, `in 2h30m`, `in 1h 30m`, `in 90 minutes`, `in 3 days`, `in an
//!   hour`, `in 1 week`. Hours, minutes and seconds are elapsed time; days and weeks
//!   are calendar days, so `in 3 days` at 10:00 lands at 10:00 local time even across a
//!   daylight-saving change.
//! - absolute: `at 18:00` or `18:00` (today if still ahead, else tomorrow), `at 9`,
//!   `9am`, `6:30 pm`, `noon`; `today 18:00`, `tomorrow 9:00`, `tomorrow at 9:00`,
//!   `monday 9:00` (the next Monday 9:00 still ahead, today included), `2026-12-24
//!   18:00`. A day without a time is at 09:00 (`tomorrow`, `monday`, `2026-12-24`,
//!   `every day`): a reminder for a day is wanted in the morning, not at midnight. A
//!   bare number is an hour only after `at` (`tomorrow 9` would eat `9 apples`).
//! - recurring: `every day 8:00`, `every day at 8:00`, `daily 8:00`, `every monday
//!   9:00`, `every mon,wed,fri 9:00`, `every monday and friday 9:00`, `every weekday
//!   8:30` (Monday to Friday), `every weekend 10:00`, `every 2h`, `every 30m`, `every
//!   hour`, `hourly`, `cron "0 8 * * 1-5"` (quoted with `"…"`, `'…'` or typographic
//!   quotes, or five bare fields). `every 2h`, `every 3d` are elapsed time from the
//!   first occurrence; `every day` is a local time each calendar day.
//!
//! # Daylight saving
//!
//! Daily, weekly and cron schedules name local times; a one-shot's date and time is
//! read in the zone too. A local time is placed by one rule ([`calendar`]'s
//! `resolve`), everywhere:
//! - it stays a local time: a daily 08:00 fires at 08:00 before and after a change;
//! - a local time the day does not have (02:30 on Berlin's spring-forward day) fires
//!   at the next valid instant, the change itself (03:00 CEST). jiff's `compatible`
//!   disambiguation would move it by the gap's length (to 03:30), which is not the
//!   next valid instant, so it is not used for gaps;
//! - a local time the day has twice (02:30 on the fall-back day) fires once, at the
//!   earlier instant.
//!
//! `every` intervals are elapsed time and ignore the change (`every 2h` from 00:00 CET
//! on the spring-forward day fires at 03:00 CEST).
//!
//! # Why lull evaluates cron itself
//!
//! Of the crates that work with jiff, `croner` (with its `jiff` feature) fires a
//! wildcard or stepped pattern on both passes of a repeated hour (its documented
//! OCPS behaviour), where lull promises each local time once, and keeps the parsed
//! fields to itself, which the interval check and the cheap count of missed
//! occurrences need; `jiff-cron` (a fork of `cron`) wants a seconds field. Five fields
//! over jiff's civil dates take a couple of hundred lines, placed by the one rule
//! above.

mod calendar;
mod cron;
mod forms;
mod parse;
#[cfg(test)]
mod tests;
mod words;

use std::fmt;
use std::time::Duration;

use jiff::civil::Weekday;

use crate::domain::{Timestamp, millis};
use crate::limits::TimeZone;
use crate::texts;

use calendar::{Calendar, Days};
pub use cron::Cron;
pub use parse::parse;

/// When a job fires. Made by [`parse`] from what a person wrote, or by
/// [`Schedule::from_stored`] from the database; both give the same value for the same
/// schedule (`from_stored(s.to_stored()) == s`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Schedule {
    /// Once, at this instant.
    Once(Timestamp),
    /// Every interval of elapsed time, from the first occurrence on (a daylight-saving
    /// change does not move it). A zero interval steps by a millisecond, and
    /// [`Schedule::interval_at_least`] refuses it.
    Every(Duration),
    /// Every day at this local time.
    Daily(ClockTime),
    /// On these weekdays at this local time.
    Weekly(Weekdays, ClockTime),
    /// A five-field cron pattern, in local time.
    Cron(Cron),
}

/// Why a WHEN (or a stored schedule) cannot be read. The variants a person can cause
/// say so in one line from [`texts`]; [`ScheduleError::Stored`] is for operators.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// No form of WHEN matches: the message lists the forms that work.
    #[error("{}", texts::WHEN_FORMS_TEXT)]
    Unreadable,
    /// `cron "…"` with a pattern that is not five valid fields (why, in English).
    #[error("{}", texts::when_cron_text(.0))]
    Cron(String),
    /// A date the calendar does not have (`2026-02-30`).
    #[error("{}", texts::when_no_such_date_text(.0))]
    NoSuchDate(String),
    /// A one-shot whose time is not ahead (`today 8:00` at noon, a past date).
    #[error("{}", texts::WHEN_PASSED_TEXT)]
    Passed,
    /// Nothing after the WHEN: no text to remind of, no prompt to answer.
    #[error("{}", texts::WHEN_NO_TEXT)]
    NoText,
    /// A stored schedule that is not in the stored form (a damaged row).
    #[error("the stored schedule '{stored}' cannot be read: {why}")]
    Stored { stored: String, why: String },
}

/// A time of day on the local clock, to the minute. Always valid (00:00 to 23:59).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClockTime {
    hour: u8,
    minute: u8,
}

impl ClockTime {
    /// The time `hour:minute`, if it is one (hour below 24, minute below 60).
    pub fn new(hour: u8, minute: u8) -> Option<Self> {
        (hour < 24 && minute < 60).then_some(Self { hour, minute })
    }

    pub fn hour(self) -> u8 {
        self.hour
    }

    pub fn minute(self) -> u8 {
        self.minute
    }
}

impl fmt::Display for ClockTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02}:{:02}", self.hour, self.minute)
    }
}

/// A set of weekdays, never empty (so a weekly schedule always fires).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Weekdays(u8);

impl Weekdays {
    /// Monday to Friday (`every weekday`).
    pub const WORKDAYS: Weekdays = Weekdays(0b001_1111);
    /// Saturday and Sunday (`every weekend`).
    pub const WEEKEND: Weekdays = Weekdays(0b110_0000);
    /// Every day of the week.
    pub const ALL: Weekdays = Weekdays(0b111_1111);

    /// The set of `days`; `None` when there are none.
    pub fn of(days: impl IntoIterator<Item = Weekday>) -> Option<Self> {
        let bits = days
            .into_iter()
            .fold(0u8, |bits, day| bits | Self::bit(day));
        (bits != 0).then_some(Self(bits))
    }

    pub fn contains(self, day: Weekday) -> bool {
        self.0 & Self::bit(day) != 0
    }

    /// The days, Monday first.
    pub fn iter(self) -> impl Iterator<Item = Weekday> {
        (0..7)
            .map(Weekday::from_monday_zero_offset)
            .filter_map(Result::ok)
            .filter(move |day| self.contains(*day))
    }

    /// The fewest days from one of these days to the next (7 for a single day).
    fn shortest_gap_days(self) -> u8 {
        let days: Vec<i8> = self.iter().map(Weekday::to_monday_zero_offset).collect();
        let wrap = days.first().map_or(7, |first| first + 7) - days.last().copied().unwrap_or(0);
        let gaps = days.windows(2).map(|pair| pair[1] - pair[0]);
        gaps.chain([wrap]).min().unwrap_or(7) as u8
    }

    fn bit(day: Weekday) -> u8 {
        1 << day.to_monday_zero_offset()
    }
}

/// What a job that waited past its occurrence has to catch up on (see [`missed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Missed {
    /// Occurrences due from the scheduled one to now, both included: 0 when the
    /// scheduled one is not due yet, 1 when only it is (on time or late), more when
    /// later ones passed too. The caller fires one (late, saying so) or none for all
    /// of them, never one per occurrence.
    pub count: u64,
    /// The first occurrence after now: what to arm next (`None`: a one-shot, done).
    pub next: Option<Timestamp>,
}

impl Schedule {
    /// The first occurrence of a schedule made at `now`: a one-shot's instant, `now`
    /// plus an `every` interval, else the first local time after `now`. `None` only
    /// for a calendar schedule with no occurrence left before the year 9999 (a parsed
    /// cron pattern always has one: one that names no date is refused).
    pub fn first(&self, now: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        match self {
            Schedule::Once(at) => Some(*at),
            Schedule::Every(interval) => Some(now.plus(step(*interval))),
            _ => self.next_after(now, tz),
        }
    }

    /// The occurrence after `previous` (the instant the last occurrence was scheduled
    /// for, not when it fired, so lateness never shifts the schedule): `None` for a
    /// one-shot. Strictly after `previous`, so an occurrence never repeats.
    pub fn next_after(&self, previous: Timestamp, tz: &TimeZone) -> Option<Timestamp> {
        match self {
            Schedule::Once(_) => None,
            Schedule::Every(interval) => Some(previous.plus(step(*interval))),
            _ => {
                let calendar = self.calendar()?;
                let next = calendar.next_after(calendar::to_jiff(previous)?, tz.zone())?;
                Some(calendar::from_jiff(next))
            }
        }
    }

    pub fn is_recurring(&self) -> bool {
        !matches!(self, Schedule::Once(_))
    }

    /// The shortest time between two occurrences, as the schedule is written: the
    /// interval of `every`, a day for daily, the fewest days between two of the
    /// weekdays, and for cron the smallest gap between two of its local times, taking
    /// every day as matching (conservative: its day fields only spread them out).
    /// `None` for a one-shot. Local times are measured on the local clock: a
    /// daylight-saving change moves one occurrence (a skipped time fires at the
    /// change), it never adds one.
    pub fn shortest_interval(&self) -> Option<Duration> {
        const DAY: Duration = Duration::from_secs(86_400);
        match self {
            Schedule::Once(_) => None,
            Schedule::Every(interval) => Some(*interval),
            Schedule::Daily(_) => Some(DAY),
            Schedule::Weekly(days, _) => Some(DAY * u32::from(days.shortest_gap_days())),
            Schedule::Cron(cron) => Some(cron.shortest_gap()),
        }
    }

    /// Whether the schedule fires no more often than every `min`
    /// (`LULL_JOB_MIN_INTERVAL` refuses `every 10s`); a one-shot always passes.
    pub fn interval_at_least(&self, min: Duration) -> bool {
        self.shortest_interval()
            .is_none_or(|shortest| shortest >= min)
    }

    /// The stored form: one line, read back exactly by [`Schedule::from_stored`]
    /// (`once 2026-12-24T17:00:00Z`, `every 2h`, `daily 08:00`, `weekly mon,fri
    /// 09:00`, `cron 0 8 * * 1-5`). A contract with existing rows: never change a form,
    /// only add one.
    pub fn to_stored(&self) -> String {
        forms::stored(self)
    }

    /// A schedule from its stored form.
    pub fn from_stored(stored: &str) -> Result<Schedule, ScheduleError> {
        forms::from_stored(stored).map_err(|why| ScheduleError::Stored {
            stored: stored.to_owned(),
            why,
        })
    }

    /// The schedule as people read it, in the WHEN language itself (so it could be
    /// typed back): `every weekday at 08:30`, `once at 2026-12-24 18:00` (in `tz`).
    pub fn describe(&self, tz: &TimeZone) -> String {
        forms::describe(self, tz)
    }

    /// The days-and-times view of a daily, weekly or cron schedule.
    fn calendar(&self) -> Option<Calendar<'_>> {
        let (days, hours, minutes) = match self {
            Schedule::Once(_) | Schedule::Every(_) => return None,
            Schedule::Daily(at) => (Days::All, vec![at.hour as i8], vec![at.minute as i8]),
            Schedule::Weekly(days, at) => (
                Days::Weekdays(*days),
                vec![at.hour as i8],
                vec![at.minute as i8],
            ),
            Schedule::Cron(cron) => (Days::Cron(cron), cron.hours(), cron.minutes()),
        };
        Some(Calendar::new(days, hours, minutes))
    }
}

/// What a job scheduled for `scheduled_at` has to catch up on at `now`: how many
/// occurrences came due (see [`Missed::count`]) and the first one after `now`. Cheap
/// however long lull was down: `every` is counted by division, calendar schedules a day
/// at a time (a whole day without a daylight-saving change counts all its local times
/// at once), so `every 1m` or `cron "* * * * *"` missed for a month costs a month of
/// days, not 43,000 steps.
pub fn missed(
    schedule: &Schedule,
    scheduled_at: Timestamp,
    now: Timestamp,
    tz: &TimeZone,
) -> Missed {
    if scheduled_at > now {
        return Missed {
            count: 0,
            next: Some(scheduled_at),
        };
    }
    match schedule {
        Schedule::Once(_) => Missed {
            count: 1,
            next: None,
        },
        Schedule::Every(interval) => {
            let step = millis(step(*interval));
            let passed = now.0.saturating_sub(scheduled_at.0) / step;
            Missed {
                count: passed as u64 + 1,
                next: Some(Timestamp(
                    scheduled_at
                        .0
                        .saturating_add((passed + 1).saturating_mul(step)),
                )),
            }
        }
        _ => Missed {
            count: 1 + later_occurrences(schedule, scheduled_at, now, tz),
            next: schedule.next_after(now, tz),
        },
    }
}

/// Occurrences of a calendar schedule after `after`, up to `until` included.
fn later_occurrences(
    schedule: &Schedule,
    after: Timestamp,
    until: Timestamp,
    tz: &TimeZone,
) -> u64 {
    let (Some(calendar), Some(after), Some(until)) = (
        schedule.calendar(),
        calendar::to_jiff(after),
        calendar::to_jiff(until),
    ) else {
        return 0;
    };
    calendar.count(after, until, tz.zone())
}

/// An `every` interval as a step: at least a millisecond, so the next occurrence is
/// always later than the one before.
fn step(interval: Duration) -> Duration {
    interval.max(Duration::from_millis(1))
}
