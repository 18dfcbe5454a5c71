//! The stored form round-trips exactly; the described form reads well and reads back.

use super::*;

fn now() -> Timestamp {
    utc("2026-12-01T10:00:00Z")
}

fn read(when: &str) -> Schedule {
    let berlin = zone("Europe/Berlin");
    parse(&format!("{when} x"), now(), &berlin)
        .unwrap_or_else(|e| panic!("{when}: {e}"))
        .0
}

/// A WHEN, from its parts at random: every form, in mixed case and spacing.
fn random_when(rng: &mut fastrand::Rng) -> String {
    let time = format!("{}:{:02}", rng.u8(0..24), rng.u8(0..60));
    let days = ["mon", "tuesday", "wed", "thu", "fridays", "sat", "sun"];
    let some_days: Vec<&str> = days.iter().copied().filter(|_| rng.bool()).collect();
    let list = if some_days.is_empty() {
        "mon".to_owned()
    } else {
        some_days.join(",")
    };
    let units = ["s", "m", "h", "d", " minutes", " hours"];
    let amount = format!("{}{}", rng.u32(1..500), units[rng.usize(..units.len())]);
    let field = |rng: &mut fastrand::Rng, max: u8| match rng.u8(0..4) {
        0 => "*".to_owned(),
        1 => format!("*/{}", rng.u8(1..=max.min(12))),
        2 => format!("{}-{}", rng.u8(0..=max / 2), rng.u8(max / 2 + 1..=max)),
        _ => format!("{},{}", rng.u8(0..max / 2), rng.u8(max / 2..=max)),
    };
    let cron = format!(
        "{} {} * * {}",
        field(rng, 59),
        field(rng, 23),
        field(rng, 6)
    );
    let when = match rng.u8(0..10) {
        0 => format!("in {amount}"),
        1 => format!("at {time}"),
        2 => format!("tomorrow {time}"),
        3 => format!("2027-0{}-1{} {time}", rng.u8(1..10), rng.u8(0..10)),
        4 => format!("every day at {time}"),
        5 => format!("every {list} {time}"),
        6 => format!("every weekday {time}"),
        7 => format!("every {amount}"),
        8 => format!("cron \"{cron}\""),
        _ => format!("{} {time}", days[rng.usize(..7)]),
    };
    if rng.bool() {
        when.to_uppercase()
    } else {
        when
    }
}

#[test]
fn the_stored_form_of_each_kind() {
    for (when, stored) in [
        ("2026-12-24 18:00", "once 2026-12-24T17:00:00Z"),
        ("in 90s", "once 2026-12-01T10:01:30Z"),
        ("every 2h", "every 2h"),
        ("every 90 minutes", "every 1h30m"),
        ("every 3d", "every 3d"),
        ("every day 8:00", "daily 08:00"),
        ("every mon,wed,fri 9:00", "weekly mon,wed,fri 09:00"),
        ("every weekend 10:30", "weekly sat,sun 10:30"),
        ("cron \"0  8 * * 1-5\"", "cron 0 8 * * 1-5"),
    ] {
        assert_eq!(read(when).to_stored(), stored, "{when}");
    }
    for at in [1_796_000_000_123, i64::MAX, -1] {
        let once = Schedule::Once(Timestamp(at));
        assert_eq!(Schedule::from_stored(&once.to_stored()), Ok(once), "{at}");
    }
    assert_eq!(
        Schedule::Once(Timestamp(1_796_000_000_123)).to_stored(),
        "once 2026-11-30T00:53:20.123Z"
    );
    let odd = Schedule::Every(Duration::from_millis(1500));
    assert_eq!(odd.to_stored(), "every 1s500ms");
    assert_eq!(Schedule::from_stored("every 1s500ms"), Ok(odd));
}

/// Parse, store, read back: the same schedule, and the same stored form again.
#[test]
fn the_stored_form_round_trips_for_random_whens() {
    let mut rng = fastrand::Rng::with_seed(39);
    for _ in 0..2000 {
        let when = random_when(&mut rng);
        let schedule = read(&when);
        let stored = schedule.to_stored();
        let back = Schedule::from_stored(&stored).unwrap_or_else(|e| panic!("{when}: {e}"));
        assert_eq!(back, schedule, "{when} stored as {stored}");
        assert_eq!(back.to_stored(), stored, "{when}");
    }
}

#[test]
fn a_damaged_stored_form_is_refused_naming_it() {
    for stored in [
        "",
        "soon",
        "daily 8:00",
        "daily 24:00",
        "weekly  09:00",
        "weekly mon,funday 09:00",
        "every 0s",
        "every 2x",
        "every h",
        "once yesterday",
        "cron 61 * * * *",
    ] {
        let e = Schedule::from_stored(stored).unwrap_err();
        assert!(matches!(e, ScheduleError::Stored { .. }), "{stored}");
        assert!(e.to_string().contains(&format!("'{stored}'")), "{e}");
    }
}

#[test]
fn described_for_people() {
    let berlin = zone("Europe/Berlin");
    for (when, described) in [
        ("every weekday 8:30", "every weekday at 08:30"),
        ("2026-12-24 18:00", "once at 2026-12-24 18:00"),
        ("every day 8:00", "every day at 08:00"),
        ("every weekend 10:00", "every weekend at 10:00"),
        ("every monday 9:00", "every monday at 09:00"),
        ("every fri,mon 9:00", "every monday and friday at 09:00"),
        (
            "every mon,wed,fri 9:00",
            "every monday, wednesday and friday at 09:00",
        ),
        ("hourly", "every hour"),
        ("every 1m", "every minute"),
        ("every 90m", "every 1h30m"),
        ("cron \"0 8 * * 1-5\"", "cron \"0 8 * * 1-5\""),
    ] {
        assert_eq!(read(when).describe(&berlin), described, "{when}");
    }
}

/// What `/jobs` shows can be typed back as the same schedule.
#[test]
fn the_description_reads_back_as_the_schedule() {
    let berlin = zone("Europe/Berlin");
    let mut rng = fastrand::Rng::with_seed(4);
    for _ in 0..500 {
        let when = random_when(&mut rng);
        let schedule = read(&when);
        if matches!(schedule, Schedule::Once(at) if at.0 % 60_000 != 0) {
            continue; // `in 90s`: described to the minute
        }
        let described = schedule.describe(&berlin);
        assert_eq!(
            read(&described),
            schedule,
            "{when} described as {described}"
        );
    }
}
