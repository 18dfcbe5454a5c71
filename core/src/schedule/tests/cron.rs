//! Cron fields, the day rule, and the patterns refused.

use jiff::civil::{Date, date};

use super::*;

fn pattern(text: &str) -> Cron {
    Cron::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn admitted(cron: &Cron, from: Date, days: i32) -> Vec<String> {
    (0..days)
        .filter_map(|n| from.checked_add(jiff::Span::new().days(n)).ok())
        .filter(|day| cron.admits(*day))
        .map(|day| day.to_string())
        .collect()
}

#[test]
fn fields_take_lists_ranges_steps_and_names() {
    let cron = pattern("0,15-17,*/20 8-10/2 1 JAN,jul mon-wed");
    assert_eq!(cron.minutes(), [0, 15, 16, 17, 20, 40]);
    assert_eq!(cron.hours(), [8, 10]);
    assert_eq!(
        pattern("5/20 * * * *").minutes(),
        [5, 25, 45],
        "A/S runs to the end"
    );
    assert_eq!(pattern("* * * * *").hours().len(), 24);
    assert_eq!(cron.pattern(), "0,15-17,*/20 8-10/2 1 JAN,jul mon-wed");
}

#[test]
fn sunday_is_0_and_7() {
    let sundays = ["0 9 * * 0", "0 9 * * 7", "0 9 * * sun", "0 9 * * 5-7"];
    // 2026-12-06 is a Sunday.
    for text in sundays {
        assert!(pattern(text).admits(date(2026, 12, 6)), "{text}");
    }
    assert!(!pattern("0 9 * * 0").admits(date(2026, 12, 7)));
}

/// As in Vixie cron: both day fields restricted, a day matching either fires; one of
/// them `*`-led, a day must match both.
#[test]
fn two_restricted_day_fields_match_either_and_a_star_field_both() {
    let either = pattern("0 0 13 * 5");
    assert_eq!(
        admitted(&either, date(2026, 11, 1), 30),
        ["2026-11-06", "2026-11-13", "2026-11-20", "2026-11-27"],
        "the Fridays, and the 13th (itself a Friday this month)"
    );
    assert_eq!(
        admitted(&pattern("0 0 1 * 2"), date(2026, 12, 1), 15),
        ["2026-12-01", "2026-12-08", "2026-12-15"]
    );
    assert_eq!(
        admitted(&pattern("0 0 */10 * 2"), date(2026, 12, 1), 31),
        ["2026-12-01"],
        "`*/10` names 1, 11, 21, 31; only the 1st is a Tuesday"
    );
    assert_eq!(
        admitted(&pattern("0 0 * dec 2"), date(2026, 11, 29), 8),
        ["2026-12-01"]
    );
}

#[test]
fn the_next_occurrence_skips_to_the_days_it_names() {
    let utc_zone = TimeZone::utc();
    let workdays = Schedule::Cron(pattern("0 8 * * 1-5"));
    // Friday 2026-12-04 09:00: the next is Monday.
    assert_eq!(
        workdays.first(utc("2026-12-04T09:00:00Z"), &utc_zone),
        Some(utc("2026-12-07T08:00:00Z"))
    );
    let leap = Schedule::Cron(pattern("0 0 29 2 *"));
    assert_eq!(
        leap.first(utc("2026-03-01T00:00:00Z"), &utc_zone),
        Some(utc("2028-02-29T00:00:00Z"))
    );
    // The 1st of February on a Monday: 2027, then not until 2038.
    let rare = Schedule::Cron(pattern("0 0 */31 2 1"));
    assert_eq!(
        rare.first(utc("2027-02-02T00:00:00Z"), &utc_zone),
        Some(utc("2038-02-01T00:00:00Z"))
    );
}

#[test]
fn bad_patterns_say_which_field_and_why() {
    for (text, says) in [
        ("* * * *", "4 fields"),
        ("* * * * * *", "6 fields"),
        ("61 * * * *", "minute 61"),
        ("* 24 * * *", "hour 24"),
        ("* * 0 * *", "day-of-month 0"),
        ("* * * 13 *", "month 13"),
        ("* * * * 8", "day-of-week 8"),
        ("*/0 * * * *", "step 0"),
        ("5-1 * * * *", "range 5-1 runs backwards"),
        ("x * * * *", "minute field has x"),
        ("* * * foo *", "month field has foo"),
        ("0 0 31 2 *", "no month it names has the day of month 31"),
        ("0 0 30,31 2 *", "no month"),
    ] {
        let why = Cron::parse(text).unwrap_err();
        assert!(why.contains(says), "{text}: {why}");
    }
    assert!(
        Cron::parse("0 0 31 2 mon").is_ok(),
        "either day field: every Monday of February"
    );
}
