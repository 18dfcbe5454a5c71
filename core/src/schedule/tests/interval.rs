//! The `LULL_JOB_MIN_INTERVAL` check: the shortest time between occurrences.

use super::*;

const MINUTE: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(86_400);

fn shortest(when: &str) -> Option<Duration> {
    let berlin = zone("Europe/Berlin");
    let (schedule, _) = parse(&format!("{when} x"), utc("2026-12-01T10:00:00Z"), &berlin)
        .unwrap_or_else(|e| panic!("{when}: {e}"));
    schedule.shortest_interval()
}

#[test]
fn each_form_has_its_shortest_interval() {
    for (when, interval) in [
        ("every 10s", Duration::from_secs(10)),
        ("every 2h", 120 * MINUTE),
        ("every day 8:00", DAY),
        ("every weekday 8:30", DAY),
        ("every weekend 10:00", DAY),
        ("every monday 9:00", 7 * DAY),
        ("every mon,fri 9:00", 3 * DAY),
        ("every tue,thu 9:00", 2 * DAY),
        ("cron \"* * * * *\"", MINUTE),
        ("cron \"*/5 * * * *\"", 5 * MINUTE),
        ("cron \"0,45 * * * *\"", 15 * MINUTE),
        ("cron \"0 8 * * 1-5\"", DAY),
        ("cron \"0 2,22 * * *\"", 4 * 60 * MINUTE),
        ("cron \"30 8 1 * *\"", DAY),
    ] {
        assert_eq!(shortest(when), Some(interval), "{when}");
    }
    assert_eq!(shortest("in 20m"), None);
}

#[test]
fn the_minimum_refuses_what_fires_more_often_and_never_a_one_shot() {
    let every = |seconds| Schedule::Every(Duration::from_secs(seconds));
    assert!(!every(10).interval_at_least(MINUTE), "every 10s");
    assert!(every(60).interval_at_least(MINUTE));
    assert!(!every(0).interval_at_least(Duration::from_millis(1)));
    assert!(daily(8, 0).interval_at_least(DAY));
    assert!(!daily(8, 0).interval_at_least(DAY + MINUTE));
    assert!(!cron("*/5 * * * *").interval_at_least(6 * MINUTE));
    assert!(Schedule::Once(utc("2026-12-24T17:00:00Z")).interval_at_least(DAY * 365));
    assert!(!Schedule::Once(utc("2026-12-24T17:00:00Z")).is_recurring());
    assert!(daily(8, 0).is_recurring() && every(60).is_recurring());
}
