//! Catching up after lull was down: how many occurrences came due, and what is next.

use super::*;

const MINUTE: Duration = Duration::from_secs(60);

#[test]
fn a_one_shot_due_is_one_and_then_done() {
    let utc_zone = TimeZone::utc();
    let once = Schedule::Once(utc("2026-12-24T17:00:00Z"));
    let due = missed(
        &once,
        utc("2026-12-24T17:00:00Z"),
        utc("2026-12-25T09:00:00Z"),
        &utc_zone,
    );
    assert_eq!(
        due,
        Missed {
            count: 1,
            next: None
        }
    );
}

#[test]
fn an_occurrence_not_due_yet_has_nothing_to_catch_up() {
    let scheduled = utc("2026-12-24T17:00:00Z");
    let early = missed(
        &daily(18, 0),
        scheduled,
        utc("2026-12-24T16:59:59Z"),
        &TimeZone::utc(),
    );
    assert_eq!(
        early,
        Missed {
            count: 0,
            next: Some(scheduled)
        }
    );
}

#[test]
fn on_time_is_one_occurrence() {
    let berlin = zone("Europe/Berlin");
    let scheduled = utc("2026-12-24T07:00:00Z");
    let now = scheduled.plus(Duration::from_millis(200));
    assert_eq!(
        missed(&daily(8, 0), scheduled, now, &berlin),
        Missed {
            count: 1,
            next: Some(utc("2026-12-25T07:00:00Z"))
        }
    );
}

/// `every 1m` down for 30 days: counted by division, next on the minute grid.
#[test]
fn every_minute_missed_for_a_month_is_counted_at_once() {
    let scheduled = utc("2026-11-01T00:00:00Z");
    let now = utc("2026-12-01T00:00:30Z");
    let every = Schedule::Every(MINUTE);
    assert_eq!(
        missed(&every, scheduled, now, &TimeZone::utc()),
        Missed {
            count: 30 * 1440 + 1,
            next: Some(utc("2026-12-01T00:01:00Z"))
        }
    );
}

/// `cron "* * * * *"` down for March in Berlin: every minute of the month's local clock
/// once, and the spring-forward day is an hour short.
#[test]
fn every_minute_by_cron_missed_for_a_month_counts_the_short_day() {
    let berlin = zone("Europe/Berlin");
    let scheduled = local(&berlin, "2026-03-01 00:00");
    let now = local(&berlin, "2026-04-01 00:00");
    assert_eq!(
        missed(&cron("* * * * *"), scheduled, now, &berlin),
        Missed {
            count: 1 + 31 * 1440 - 60,
            next: Some(now.plus(MINUTE))
        }
    );
}

#[test]
fn a_daily_job_down_for_ten_days_counts_each_day_once() {
    let berlin = zone("Europe/Berlin");
    let scheduled = local(&berlin, "2026-03-20 08:00");
    let now = local(&berlin, "2026-03-30 12:00");
    assert_eq!(
        missed(&daily(8, 0), scheduled, now, &berlin),
        Missed {
            count: 11,
            next: Some(utc("2026-03-31T06:00:00Z"))
        }
    );
}

/// Stepping one occurrence at a time is the definition; the day-at-a-time count
/// must agree with it over every change in both zones, for schedules with times in
/// the gap and in the fold.
#[test]
fn the_count_agrees_with_stepping_across_every_change() {
    let schedules = [
        daily(2, 30),
        daily(8, 0),
        cron("*/15 * * * *"),
        cron("30 2 * * *"),
        cron("0,30 1-3 * * *"),
        cron("59 1 * * 0"),
        Schedule::Weekly(Weekdays::WEEKEND, ClockTime::new(1, 30).unwrap()),
    ];
    let windows = [
        ("Europe/Berlin", "2026-03-27 00:00", "2026-03-31 00:00"),
        ("Europe/Berlin", "2026-10-23 00:00", "2026-10-27 00:00"),
        ("America/New_York", "2026-03-06 00:00", "2026-03-10 00:00"),
        ("America/New_York", "2026-10-30 00:00", "2026-11-03 00:00"),
    ];
    for (name, from, to) in windows {
        let tz = zone(name);
        let (from, to) = (local(&tz, from), local(&tz, to));
        for schedule in &schedules {
            let scheduled = schedule.first(from, &tz).unwrap();
            let mut stepped = Missed {
                count: 1,
                next: schedule.next_after(scheduled, &tz),
            };
            while let Some(next) = stepped.next.filter(|next| *next <= to) {
                stepped.count += 1;
                stepped.next = schedule.next_after(next, &tz);
            }
            assert_eq!(
                missed(schedule, scheduled, to, &tz),
                stepped,
                "{schedule:?} in {name} from {}",
                show(scheduled)
            );
        }
    }
}
