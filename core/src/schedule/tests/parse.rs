//! Every WHEN form, read on Tuesday 1 December 2026 at 11:00 in Berlin (10:00 UTC),
//! and what each bad WHEN answers.

use jiff::civil::Weekday;

use super::*;

fn berlin() -> TimeZone {
    zone("Europe/Berlin")
}

fn now() -> Timestamp {
    utc("2026-12-01T10:00:00Z")
}

/// The schedule and the rest `input` reads as.
fn read(input: &str) -> (Schedule, &str) {
    parse(input, now(), &berlin()).unwrap_or_else(|e| panic!("{input}: {e}"))
}

fn once(instant: &str) -> Schedule {
    Schedule::Once(utc(instant))
}

fn every(seconds: u64) -> Schedule {
    Schedule::Every(Duration::from_secs(seconds))
}

fn weekly(days: &[Weekday], hour: u8, minute: u8) -> Schedule {
    Schedule::Weekly(
        Weekdays::of(days.iter().copied()).unwrap(),
        ClockTime::new(hour, minute).unwrap(),
    )
}

fn refused(input: &str) -> ScheduleError {
    match parse(input, now(), &berlin()) {
        Ok((schedule, rest)) => panic!("{input}: read as {schedule:?} and {rest:?}"),
        Err(e) => e,
    }
}

#[test]
fn relative_times_and_the_rest_as_written() {
    assert_eq!(
        read("in 20m buy milk"),
        (once("2026-12-01T10:20:00Z"), "buy milk")
    );
    assert_eq!(
        read("IN 20M Buy Milk"),
        (once("2026-12-01T10:20:00Z"), "Buy Milk")
    );
    for (when, at) in [
        ("in 2h", "2026-12-01T12:00:00Z"),
        ("in 1h30m", "2026-12-01T11:30:00Z"),
        ("in 2h30m", "2026-12-01T12:30:00Z"),
        ("in 1h 30m", "2026-12-01T11:30:00Z"),
        ("in 90 minutes", "2026-12-01T11:30:00Z"),
        ("in 1 hour and 30 minutes", "2026-12-01T11:30:00Z"),
        ("in an hour", "2026-12-01T11:00:00Z"),
        ("in 45s", "2026-12-01T10:00:45Z"),
        ("in 3 days", "2026-12-04T10:00:00Z"),
        ("in 1 week", "2026-12-08T10:00:00Z"),
        ("in 2d", "2026-12-03T10:00:00Z"),
    ] {
        assert_eq!(
            read(&format!("{when} stretch")),
            (once(at), "stretch"),
            "{when}"
        );
    }
}

#[test]
fn a_time_of_day_is_today_while_ahead_else_tomorrow() {
    for (when, at) in [
        ("at 18:00", "2026-12-01T17:00:00Z"),
        ("18:00", "2026-12-01T17:00:00Z"),
        ("at 10:00", "2026-12-02T09:00:00Z"),
        ("at 9", "2026-12-02T08:00:00Z"),
        ("at 9am", "2026-12-02T08:00:00Z"),
        ("6:30pm", "2026-12-01T17:30:00Z"),
        ("at 6 pm", "2026-12-01T17:00:00Z"),
        ("noon", "2026-12-01T11:00:00Z"),
        ("at midnight", "2026-12-01T23:00:00Z"),
        ("12am", "2026-12-01T23:00:00Z"),
        ("at 18:00,", "2026-12-01T17:00:00Z"),
    ] {
        assert_eq!(
            read(&format!("{when} call Bob")),
            (once(at), "call Bob"),
            "{when}"
        );
    }
}

#[test]
fn days_with_and_without_a_time() {
    for (when, at) in [
        ("tomorrow 9:00", "2026-12-02T08:00:00Z"),
        ("tomorrow at 9:00", "2026-12-02T08:00:00Z"),
        ("Tomorrow", "2026-12-02T08:00:00Z"),
        ("today 18:00", "2026-12-01T17:00:00Z"),
        ("2026-12-24 18:00", "2026-12-24T17:00:00Z"),
        ("2026-12-24 at 18:00", "2026-12-24T17:00:00Z"),
        ("on 2026-12-24", "2026-12-24T08:00:00Z"),
        ("monday 9:00", "2026-12-07T08:00:00Z"),
        ("on monday at 9", "2026-12-07T08:00:00Z"),
        ("next friday 17:30", "2026-12-04T16:30:00Z"),
        ("tuesday 12:00", "2026-12-01T11:00:00Z"),
        ("tuesday 9:00", "2026-12-08T08:00:00Z"),
        ("once at 18:00", "2026-12-01T17:00:00Z"),
    ] {
        assert_eq!(
            read(&format!("{when} pay rent")),
            (once(at), "pay rent"),
            "{when}"
        );
    }
    assert_eq!(
        read("tomorrow 9 apples"),
        (once("2026-12-02T08:00:00Z"), "9 apples"),
        "a bare number is an hour only after `at`"
    );
}

#[test]
fn recurring_days() {
    use Weekday::*;
    for (when, schedule) in [
        ("every day 8:00", daily(8, 0)),
        ("every day at 8:00", daily(8, 0)),
        ("daily 8:00", daily(8, 0)),
        ("Every Day", daily(9, 0)),
        ("every monday 9:00", weekly(&[Monday], 9, 0)),
        ("every mondays at 9am", weekly(&[Monday], 9, 0)),
        (
            "every mon,wed,fri 9:00",
            weekly(&[Monday, Wednesday, Friday], 9, 0),
        ),
        (
            "every mon, wed, fri 9:00",
            weekly(&[Monday, Wednesday, Friday], 9, 0),
        ),
        (
            "every monday and friday at 9",
            weekly(&[Monday, Friday], 9, 0),
        ),
        (
            "every weekday 8:30",
            weekly(&[Monday, Tuesday, Wednesday, Thursday, Friday], 8, 30),
        ),
        (
            "every mon-fri 8:30",
            weekly(&[Monday, Tuesday, Wednesday, Thursday, Friday], 8, 30),
        ),
        ("every weekend 10:00", weekly(&[Saturday, Sunday], 10, 0)),
        (
            "every fri-mon 10:00",
            weekly(&[Friday, Saturday, Sunday, Monday], 10, 0),
        ),
        ("every mon-sun 7:00", daily(7, 0)),
    ] {
        assert_eq!(
            read(&format!("{when} plan the day")),
            (schedule, "plan the day"),
            "{when}"
        );
    }
}

#[test]
fn recurring_intervals() {
    for (when, seconds) in [
        ("every 2h", 7200),
        ("every 30m", 1800),
        ("every hour", 3600),
        ("hourly", 3600),
        ("every 2 hours", 7200),
        ("every 1h30m", 5400),
        ("every minute", 60),
        ("every 3d", 3 * 86_400),
        ("every 10s", 10),
    ] {
        assert_eq!(
            read(&format!("{when} drink water")),
            (every(seconds), "drink water"),
            "{when}"
        );
    }
}

#[test]
fn cron_patterns_quoted_or_bare() {
    let workdays = cron("0 8 * * 1-5");
    for when in [
        "cron \"0 8 * * 1-5\"",
        "cron '0 8 * * 1-5'",
        "CRON “0 8 * * 1-5”",
        "cron \"0  8 * *   1-5\"",
        "cron 0 8 * * 1-5",
    ] {
        assert_eq!(
            read(&format!("{when} standup")),
            (workdays.clone(), "standup"),
            "{when}"
        );
    }
}

#[test]
fn a_when_that_cannot_be_read_answers_one_line_of_forms() {
    for input in [
        "",
        "buy milk",
        "in soon buy milk",
        "every 0m drink",
        "in 0m drink",
        "at 25:00 x",
        "at home buy milk",
        "every 10 x",
        "8 apples",
        "every blue moon x",
    ] {
        let e = refused(input);
        assert_eq!(e, ScheduleError::Unreadable, "{input}");
        assert_eq!(e.to_string(), texts::WHEN_FORMS_TEXT);
    }
    assert!(!texts::WHEN_FORMS_TEXT.contains('\n'));
}

#[test]
fn other_refusals_say_what_is_wrong_in_one_line() {
    assert_eq!(refused("in 20m"), ScheduleError::NoText);
    assert_eq!(refused("every day 8:00   "), ScheduleError::NoText);
    assert_eq!(refused("today 8:00 x"), ScheduleError::Passed);
    assert_eq!(refused("2025-12-24 18:00 x"), ScheduleError::Passed);
    assert_eq!(
        refused("2026-02-30 18:00 x"),
        ScheduleError::NoSuchDate("2026-02-30".into())
    );
    let ScheduleError::Cron(why) = refused("cron \"61 * * * *\" x") else {
        panic!("a cron error");
    };
    assert!(why.contains("minute") && why.contains("61"), "{why}");
    for e in [
        refused("in 20m"),
        refused("today 8:00 x"),
        refused("2026-02-30 x"),
        refused("cron \"* * *\" x"),
    ] {
        let line = e.to_string();
        assert!(!line.contains('\n') && !line.is_empty(), "{line}");
    }
}
