//! Wall-clock instants as jobs read them: Unix time, the `YYYY-MM-DD HH:MM` a `/remind`
//! names (UTC, lull's default zone), and the next minute's start as an [`Instant`], so
//! a test or bench can make reminders all due at the same instant and measure from it.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// `YYYY-MM-DD HH:MM` (UTC) of the Unix second `at` (the civil-from-days algorithm).
pub(crate) fn utc_minute(at: u64) -> String {
    let (days, secs) = ((at / 86_400) as i64, at % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}",
        secs / 3600,
        secs % 3600 / 60
    )
}

/// The start of the first minute at least `margin` away: its Unix milliseconds.
pub(crate) fn minute_after(margin: Duration) -> u64 {
    let earliest = unix_ms() + margin.as_millis() as u64;
    earliest.div_ceil(60_000) * 60_000
}

/// The Unix millisecond `at` as an [`Instant`] of this process.
pub(crate) fn instant_of(at_ms: u64) -> Instant {
    let now = unix_ms();
    if at_ms >= now {
        Instant::now() + Duration::from_millis(at_ms - now)
    } else {
        Instant::now() - Duration::from_millis(now - at_ms)
    }
}
