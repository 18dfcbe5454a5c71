//! Time as the dispatcher sees it.
//!
//! Deadlines (timer `due_at`, lease `expires_at`) are compared across processes, so
//! production reads the wall clock: on SQLite, every process is on one host and this
//! is the one clock they share; on PostgreSQL the store compares deadlines on the
//! database's clock and this clock only measures this process's own waits (a lease's
//! local validity, when to look for due work again). Tests that check timing rules swap in
//! [`TokioClock`], which follows tokio's (pausable) clock: time is a source of
//! non-determinism, and a paused clock removes it.

use crate::domain::Timestamp;

/// A source of the current time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Timestamp;
}

/// The wall clock; what every process on one database must share.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp(since_epoch.as_millis() as i64)
    }
}

/// The clock a `lull` process runs on: the wall clock. In builds with the
/// `test-switches` feature (tests only), `LULL_TEST_CLOCK_OFFSET_MS=N` moves it `N`
/// milliseconds ahead, so a test can start a process "tomorrow" (budgets reset).
pub fn for_process() -> std::sync::Arc<dyn Clock> {
    #[cfg(feature = "test-switches")]
    if let Some(offset) = std::env::var("LULL_TEST_CLOCK_OFFSET_MS")
        .ok()
        .and_then(|v| v.parse::<i64>().ok())
    {
        tracing::warn!(
            offset_ms = offset,
            "LULL_TEST_CLOCK_OFFSET_MS: the clock is moved (test build)"
        );
        return std::sync::Arc::new(OffsetClock(offset));
    }
    std::sync::Arc::new(SystemClock)
}

/// The wall clock moved by a fixed offset (test builds).
#[cfg(feature = "test-switches")]
#[derive(Debug, Clone, Copy)]
struct OffsetClock(i64);

#[cfg(feature = "test-switches")]
impl Clock for OffsetClock {
    fn now(&self) -> Timestamp {
        Timestamp(SystemClock.now().0.saturating_add(self.0))
    }
}

/// Wall time at creation plus tokio's elapsed time, so `tokio::time::pause()` and
/// `advance()` move it. Only meaningful within one process.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    base: Timestamp,
    start: tokio::time::Instant,
}

impl TokioClock {
    pub fn new() -> Self {
        Self {
            base: SystemClock.now(),
            start: tokio::time::Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        self.base.plus(self.start.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_advance() {
        let clock = TokioClock::new();
        let t0 = clock.now();
        tokio::time::advance(Duration::from_millis(1500)).await;
        assert_eq!(clock.now().0 - t0.0, 1500);
    }
}
