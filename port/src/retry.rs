//! One retry policy for every dependency lull waits on: the model server, the
//! platforms, the webhook, the database. Exponential backoff with jitter and a cap,
//! never shorter than what the other side asked for (`Retry-After`, read by one parser).

use std::time::{Duration, SystemTime};

/// Exponential backoff: `first`, then doubling per attempt up to `max`, each delay
/// drawn within ±25 % so processes that failed together do not retry in lock-step.
///
/// Invariant: every delay lies within `[0.75 · first, 1.25 · max]`, and a delay
/// honouring a server's request is never shorter than that request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    first: Duration,
    max: Duration,
}

impl Backoff {
    /// `first` is raised to at least a millisecond and `max` to at least `first`.
    pub const fn new(first: Duration, max: Duration) -> Self {
        let first = if first.is_zero() {
            Duration::from_millis(1)
        } else {
            first
        };
        let max = if max.as_nanos() < first.as_nanos() {
            first
        } else {
            max
        };
        Self { first, max }
    }

    pub fn first(&self) -> Duration {
        self.first
    }

    pub fn max(&self) -> Duration {
        self.max
    }

    /// The delay before attempt number `attempt + 1`, after `attempt` failures
    /// (`attempt` counts from 1).
    pub fn delay(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(30);
        let base = self
            .first
            .saturating_mul(1u32 << doublings.min(31))
            .min(self.max);
        base.mul_f64(0.75 + fastrand::f64() * 0.5)
    }

    /// [`Backoff::delay`], but never shorter than what the other side asked for.
    pub fn delay_honouring(&self, attempt: u32, asked: Option<Duration>) -> Duration {
        let delay = self.delay(attempt);
        asked.map_or(delay, |asked| delay.max(asked))
    }
}

/// A `Retry-After` value: delay-seconds (`120`, also `1.5` as some servers send) or
/// an HTTP date. `None` for anything else, or a negative or absurd number.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && (0.0..=86_400.0 * 365.0).contains(&seconds))
            .then(|| Duration::from_secs_f64(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn delays_double_with_jitter_up_to_the_cap() {
        let backoff = Backoff::new(ms(500), ms(30_000));
        for _ in 0..200 {
            let first = backoff.delay(1);
            assert!(first >= ms(375) && first <= ms(625), "{first:?}");
            let third = backoff.delay(3);
            assert!(third >= ms(1500) && third <= ms(2500), "{third:?}");
            let late = backoff.delay(40);
            assert!(late >= ms(22_500) && late <= ms(37_500), "{late:?}");
        }
    }

    #[test]
    fn a_servers_request_is_a_floor() {
        let backoff = Backoff::new(ms(100), ms(1000));
        assert!(backoff.delay_honouring(1, Some(ms(7000))) >= ms(7000));
        assert!(backoff.delay_honouring(1, None) <= ms(125));
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after(" 2 ", now), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("1.5", now), Some(ms(1500)));
        let in_a_minute = httpdate::fmt_http_date(now + Duration::from_secs(60));
        assert_eq!(
            parse_retry_after(&in_a_minute, now),
            Some(Duration::from_secs(60))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(60));
        assert_eq!(parse_retry_after(&past, now), Some(Duration::ZERO));
        for bad in ["soon", "-1", "NaN", ""] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad}");
        }
    }
}
