//! Calendar schedules: on the days a rule admits, at a set of local times. Daily,
//! weekly and cron schedules are all this shape, so they share one search for the
//! next occurrence, one count of occurrences, and one rule for placing a local time
//! in a zone ([`resolve`]).
//!
//! Placed by [`resolve`], a day's local times in ascending order give instants in
//! ascending (not always strictly: a gap's times meet at its end) order, and a later
//! day's come after an earlier day's. Both searches rest on that order: the next
//! occurrence is found by bisecting one day's times, and a day is counted whole when
//! no transition falls among its times.

use jiff::civil::{Date, DateTime};
use jiff::tz::{AmbiguousOffset, TimeZone};
use jiff::{SignedDuration, ToSpan};

use super::{Cron, Weekdays};
use crate::domain::Timestamp;

/// How far ahead the next occurrence is looked for: 30 years of days. A cron pattern
/// that names a date at all names one within that (February 29th comes every 4 or 8
/// years; the first of a month on a given weekday within 12).
const SEARCH_DAYS: usize = 366 * 30;

/// Which days a calendar schedule fires on.
pub(crate) enum Days<'a> {
    All,
    Weekdays(Weekdays),
    Cron(&'a Cron),
}

impl Days<'_> {
    fn admit(&self, date: Date) -> bool {
        match self {
            Days::All => true,
            Days::Weekdays(days) => days.contains(date.weekday()),
            Days::Cron(cron) => cron.admits(date),
        }
    }
}

/// On each day `days` admits, at every local time `hour:minute` with the hour from
/// `hours` and the minute from `minutes` (both ascending, distinct, in range).
pub(crate) struct Calendar<'a> {
    days: Days<'a>,
    hours: Vec<i8>,
    minutes: Vec<i8>,
}

impl<'a> Calendar<'a> {
    pub(crate) fn new(days: Days<'a>, hours: Vec<i8>, minutes: Vec<i8>) -> Self {
        Self {
            days,
            hours,
            minutes,
        }
    }

    /// How many local times a day has.
    fn times(&self) -> usize {
        self.hours.len() * self.minutes.len()
    }

    /// The `i`th local time of `date` (ascending), placed in `tz`.
    fn instant(&self, date: Date, i: usize, tz: &TimeZone) -> Option<jiff::Timestamp> {
        let per_hour = self.minutes.len();
        let local = date.at(self.hours[i / per_hour], self.minutes[i % per_hour], 0, 0);
        resolve(tz, local)
    }

    /// The first occurrence strictly after `after`. Starts the day before `after`'s
    /// local date (a time on it may fall after `after` when a gap spans midnight) and
    /// looks [`SEARCH_DAYS`] ahead.
    pub(crate) fn next_after(
        &self,
        after: jiff::Timestamp,
        tz: &TimeZone,
    ) -> Option<jiff::Timestamp> {
        let times = self.times();
        if times == 0 {
            return None;
        }
        let mut date = after.to_zoned(tz.clone()).date().yesterday().ok()?;
        for _ in 0..SEARCH_DAYS {
            if self.days.admit(date) {
                let passed = self.passed(date, after, tz);
                if passed < times {
                    return self.instant(date, passed, tz);
                }
            }
            date = date.tomorrow().ok()?;
        }
        None
    }

    /// How many of `date`'s times fall at or before `after`: they come first, as
    /// instants ascend with the local times, so a bisection finds them.
    fn passed(&self, date: Date, after: jiff::Timestamp, tz: &TimeZone) -> usize {
        let (mut low, mut high) = (0, self.times());
        while low < high {
            let middle = low + (high - low) / 2;
            if self.instant(date, middle, tz).is_some_and(|at| at <= after) {
                low = middle + 1;
            } else {
                high = middle;
            }
        }
        low
    }

    /// How many distinct occurrences lie after `after`, up to `until` included. A day
    /// a day: one with no transition among its times and all of them in range counts
    /// them all at once; the two ends and the days of a change are counted time by
    /// time, each instant once (the times of a gap meet at its end).
    pub(crate) fn count(
        &self,
        after: jiff::Timestamp,
        until: jiff::Timestamp,
        tz: &TimeZone,
    ) -> u64 {
        if self.times() == 0 || until <= after {
            return 0;
        }
        let (Ok(mut date), Ok(last)) = (
            after.to_zoned(tz.clone()).date().yesterday(),
            until.to_zoned(tz.clone()).date().checked_add(1.day()),
        ) else {
            return 0;
        };
        let mut window = Window {
            after,
            until,
            counted: None,
        };
        let mut count = 0;
        while date <= last {
            if self.days.admit(date) {
                count += self.count_day(date, &mut window, tz);
            }
            let Ok(next) = date.tomorrow() else { break };
            date = next;
        }
        count
    }

    /// The occurrences of one day inside `window`, none at or before the last one
    /// counted.
    fn count_day(&self, date: Date, window: &mut Window, tz: &TimeZone) -> u64 {
        let times = self.times();
        let (Some(first), Some(last)) =
            (self.instant(date, 0, tz), self.instant(date, times - 1, tz))
        else {
            return 0;
        };
        if last <= window.after || first > window.until {
            return 0;
        }
        if window.holds(first) && window.holds(last) && !changes_within(tz, first, last) {
            window.counted = Some(last);
            return times as u64;
        }
        let mut count = 0;
        for i in 0..times {
            if let Some(at) = self.instant(date, i, tz).filter(|at| window.holds(*at)) {
                window.counted = Some(at);
                count += 1;
            }
        }
        count
    }
}

/// The range being counted, and the last instant counted in it.
struct Window {
    after: jiff::Timestamp,
    until: jiff::Timestamp,
    counted: Option<jiff::Timestamp>,
}

impl Window {
    /// Whether `at` is in range and not yet counted (instants come in ascending order,
    /// so "after the last one counted" is "not counted").
    fn holds(&self, at: jiff::Timestamp) -> bool {
        at > self.after && at <= self.until && self.counted.is_none_or(|counted| at > counted)
    }
}

/// Whether the zone's offset changes at or after `from`, up to `to` included.
fn changes_within(tz: &TimeZone, from: jiff::Timestamp, to: jiff::Timestamp) -> bool {
    let Ok(before) = from.checked_sub(SignedDuration::from_nanos(1)) else {
        return true;
    };
    tz.following(before)
        .next()
        .is_some_and(|change| change.timestamp() <= to)
}

/// Where local time `local` falls in `tz`: the one instant it names; for a time the
/// day does not have (in a gap), the next valid instant, the change itself (02:30 on
/// Berlin's spring-forward day is 03:00 CEST); for a time the day has twice (in a
/// fold), the earlier instant. `None` only past jiff's range (the year 9999).
pub(crate) fn resolve(tz: &TimeZone, local: DateTime) -> Option<jiff::Timestamp> {
    let ambiguous = tz.to_ambiguous_timestamp(local);
    match ambiguous.offset() {
        AmbiguousOffset::Unambiguous { offset } => offset.to_timestamp(local).ok(),
        AmbiguousOffset::Fold { before, after } => {
            let one = before.to_timestamp(local).ok()?;
            let other = after.to_timestamp(local).ok()?;
            Some(one.min(other))
        }
        AmbiguousOffset::Gap { before, after } => {
            // Read with either offset, the time lands on each side of the change; the
            // earlier reading is before it, so the change is the next transition.
            let one = before.to_timestamp(local).ok()?;
            let other = after.to_timestamp(local).ok()?;
            tz.following(one.min(other))
                .next()
                .map(|change| change.timestamp())
        }
    }
}

/// A [`Timestamp`] as jiff's (`None` past jiff's range, the year 9999).
pub(crate) fn to_jiff(at: Timestamp) -> Option<jiff::Timestamp> {
    jiff::Timestamp::from_millisecond(at.0).ok()
}

/// jiff's timestamp as lull's, in whole milliseconds.
pub(crate) fn from_jiff(at: jiff::Timestamp) -> Timestamp {
    Timestamp(at.as_millisecond())
}
