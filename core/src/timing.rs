//! The timing rules, as pure functions of their inputs: when a conversation's timer
//! is due, when a stale reply must be delivered anyway, how lease renewal is paced.
//! Both the store (which arms timers inside its ingest transaction) and the dispatcher
//! use these, so the rules live in one place and are tested without a database.

use std::time::Duration;

use lull_port::Backoff;

use crate::domain::Timestamp;
use crate::rhythm::{Cue, DebounceMode, Rhythm, Waits};

/// The capped debounce window. Each message re-arms the conversation's timer to
/// `now + debounce`, but never past `first_pending + max_wait`; a burst of
/// `max_batch` pending messages is due at once.
///
/// Invariant (checked by [`TimerPolicy::new`]): `debounce < max_wait` and
/// `max_batch >= 1`, so the cap is always reachable and always binding. With adaptive
/// waiting ([`TimerPolicy::adaptive`]) each message's wait is picked in
/// `[min_debounce, debounce]` (`min_debounce <= debounce`, checked), and the cap still
/// applies after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerPolicy {
    debounce: Duration,
    max_wait: Duration,
    max_batch: u32,
    /// `LULL_DEBOUNCE_MIN_MS`: the shortest adaptive wait (equal to `debounce` when fixed).
    min_debounce: Duration,
    mode: DebounceMode,
}

/// Why a timing setting cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    #[error(
        "LULL_DEBOUNCE_MS ({debounce_ms}) must be shorter than LULL_MAX_WAIT_MS ({max_wait_ms}): the cap would never let the debounce window end on its own"
    )]
    DebounceNotShorterThanCap {
        debounce_ms: u128,
        max_wait_ms: u128,
    },
    #[error("LULL_MAX_BATCH must be at least 1")]
    EmptyBatch,
    #[error(
        "LULL_DEBOUNCE_MIN_MS ({min_ms}) must not be longer than LULL_DEBOUNCE_MS ({debounce_ms}): adaptive waits are picked between them"
    )]
    MinDebounceTooLong { min_ms: u128, debounce_ms: u128 },
    #[error(
        "LULL_LEASE_TTL_MS ({ttl_ms}) must be at least three renewal intervals (LULL_LEASE_RENEW_MS = {renew_ms}): a lease must survive two missed renewals"
    )]
    LeaseTooShort { ttl_ms: u128, renew_ms: u128 },
    #[error("LULL_LEASE_RENEW_MS must be at least 10 ms")]
    RenewTooFast,
}

impl TimerPolicy {
    pub fn new(
        debounce: Duration,
        max_wait: Duration,
        max_batch: u32,
    ) -> Result<Self, TimingError> {
        if debounce >= max_wait {
            return Err(TimingError::DebounceNotShorterThanCap {
                debounce_ms: debounce.as_millis(),
                max_wait_ms: max_wait.as_millis(),
            });
        }
        if max_batch == 0 {
            return Err(TimingError::EmptyBatch);
        }
        Ok(Self {
            debounce,
            max_wait,
            max_batch,
            min_debounce: debounce,
            mode: DebounceMode::Fixed,
        })
    }

    /// The same policy with adaptive waiting: each wait picked from the conversation's
    /// rhythm in `[min_debounce, debounce]`. Refused when `min_debounce > debounce`.
    pub fn adaptive(self, min_debounce: Duration) -> Result<Self, TimingError> {
        if min_debounce > self.debounce {
            return Err(TimingError::MinDebounceTooLong {
                min_ms: min_debounce.as_millis(),
                debounce_ms: self.debounce.as_millis(),
            });
        }
        Ok(Self {
            min_debounce,
            mode: DebounceMode::Adaptive,
            ..self
        })
    }

    pub fn mode(&self) -> DebounceMode {
        self.mode
    }

    /// The shortest wait (`LULL_DEBOUNCE_MIN_MS`; the debounce itself when fixed).
    pub fn min_debounce(&self) -> Duration {
        self.min_debounce
    }

    /// The waits to store with a rhythm just learned ([`Rhythm::waits`] within
    /// `[min_debounce, debounce]`).
    pub fn waits_of(&self, rhythm: &Rhythm) -> Option<Waits> {
        // The counter-test's switch: a known rhythm always waits the shortest window.
        if crate::switches::no_burst_window() && rhythm.known() {
            let min = self.min_debounce.as_millis() as u32;
            return Some(Waits {
                first_ms: min,
                burst_ms: min,
            });
        }
        rhythm.waits(self.min_debounce, self.debounce)
    }

    /// The range a message's wait is picked in: `[min_debounce, debounce]` when
    /// adaptive, the debounce alone when fixed or when the message's cue says the
    /// thought goes on.
    pub fn wait_range(&self, cue: Cue) -> (Duration, Duration) {
        match (self.mode, cue) {
            (DebounceMode::Adaptive, Cue::Complete) => (self.min_debounce, self.debounce),
            _ => (self.debounce, self.debounce),
        }
    }

    /// The wait after a message: `debounce` when fixed; when adaptive, the stored waits
    /// of the conversation's rhythm ([`TimerPolicy::waits_of`]) picked by how many
    /// messages are pending ([`Waits::pick`]), within [`TimerPolicy::wait_range`]: the
    /// same as [`adaptive_wait`](crate::rhythm::adaptive_wait) on the rhythm itself.
    pub fn debounce_for(&self, waits: Option<Waits>, cue: Cue, pending: u32) -> Duration {
        let (min, max) = self.wait_range(cue);
        Waits::pick(waits, pending, min, max)
    }

    pub fn debounce(&self) -> Duration {
        self.debounce
    }

    pub fn max_wait(&self) -> Duration {
        self.max_wait
    }

    pub fn max_batch(&self) -> u32 {
        self.max_batch
    }

    /// When a timer armed at `armed_at` fires, given the oldest pending message and how
    /// many messages are pending: `min(armed_at + debounce, first_pending + max_wait)`,
    /// or `armed_at` itself once the batch is full.
    pub fn due_at(
        &self,
        armed_at: Timestamp,
        first_pending_at: Timestamp,
        pending: u32,
    ) -> Timestamp {
        self.due_after(self.debounce, armed_at, first_pending_at, pending)
    }

    /// [`TimerPolicy::due_at`] with a wait picked for this message
    /// ([`TimerPolicy::debounce_for`]): `min(armed_at + wait, first_pending + max_wait)`,
    /// or `armed_at` once the batch is full. The cap binds whatever the wait.
    ///
    /// The capped debounce lives in these places, which must agree (the conformance
    /// checks of arming and adaptive arming pin them together on both backends):
    /// - here, which SQLite's ingest and PostgreSQL's re-arming (`postgres::messages`)
    ///   call, with the wait of [`crate::rhythm::Waits::pick`];
    /// - PostgreSQL's `lull_ingest` (migration 14) and `lull_ingest_rows` (migration
    ///   16), which pick the wait from the conversation's stored rhythm and apply the
    ///   cap in SQL, in the one round trip that stores the message (reading the rhythm
    ///   first to pick it here would cost a second one);
    /// - the typing hold (`extend_timer`, both backends): later, never past the cap;
    /// - on every re-arm, never sooner than a failure's backoff (`retry_at`) or a
    ///   limit's hold (`held_until`).
    pub fn due_after(
        &self,
        wait: Duration,
        armed_at: Timestamp,
        first_pending_at: Timestamp,
        pending: u32,
    ) -> Timestamp {
        if pending >= self.max_batch {
            return armed_at;
        }
        armed_at
            .plus(wait)
            .min(first_pending_at.plus(self.max_wait))
    }

    /// The cap: a reply made stale by newer messages is still delivered once the
    /// oldest message it covers has waited `max_wait`, so a chat that never pauses
    /// is never starved.
    pub fn cap_reached(&self, now: Timestamp, oldest_pending_at: Timestamp) -> bool {
        now >= oldest_pending_at.plus(self.max_wait)
    }
}

/// Lease lifetime and renewal pace. Invariant (checked by [`LeaseTiming::new`]): the
/// lease lives at least three renewal intervals, so one slow or failed renewal does
/// not lose it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    ttl: Duration,
    renew_every: Duration,
}

impl LeaseTiming {
    pub fn new(ttl: Duration, renew_every: Duration) -> Result<Self, TimingError> {
        if renew_every < Duration::from_millis(10) {
            return Err(TimingError::RenewTooFast);
        }
        if ttl < renew_every * 3 {
            return Err(TimingError::LeaseTooShort {
                ttl_ms: ttl.as_millis(),
                renew_ms: renew_every.as_millis(),
            });
        }
        Ok(Self { ttl, renew_every })
    }

    /// The contract's default pace: renewed every third of the TTL.
    pub fn with_ttl(ttl: Duration) -> Result<Self, TimingError> {
        Self::new(ttl, ttl / 3)
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn renew_every(&self) -> Duration {
        self.renew_every
    }
}

/// Pauses before a conversation whose generation failed is tried again: doubling from
/// one second, capped at five minutes (with the port's jitter, so processes do not retry
/// in lock-step).
pub const FAILURE_BACKOFF: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(300));

/// Pauses before the next attempt to deliver an outbox row whose delivery failed:
/// doubling from a quarter second (a blip is retried at once, an outage ever more
/// rarely), capped at five minutes.
pub const DELIVERY_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(250), Duration::from_secs(300));

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn policy() -> TimerPolicy {
        TimerPolicy::new(ms(1500), ms(10_000), 20).unwrap()
    }

    #[test]
    fn each_message_pushes_the_timer_by_the_debounce() {
        let p = policy();
        assert_eq!(
            p.due_at(Timestamp(1000), Timestamp(1000), 1),
            Timestamp(2500)
        );
        assert_eq!(
            p.due_at(Timestamp(2000), Timestamp(1000), 2),
            Timestamp(3500)
        );
    }

    #[test]
    fn the_timer_never_passes_the_cap() {
        let p = policy();
        // Oldest pending at 1000: the cap is 11000 however late the last message is.
        assert_eq!(
            p.due_at(Timestamp(10_000), Timestamp(1000), 5),
            Timestamp(11_000)
        );
        assert_eq!(
            p.due_at(Timestamp(50_000), Timestamp(1000), 5),
            Timestamp(11_000)
        );
    }

    #[test]
    fn a_full_batch_is_due_at_once() {
        let p = policy();
        assert_eq!(
            p.due_at(Timestamp(2000), Timestamp(1000), 20),
            Timestamp(2000)
        );
        assert_eq!(
            p.due_at(Timestamp(2000), Timestamp(1000), 19),
            Timestamp(3500)
        );
    }

    #[test]
    fn an_adaptive_wait_stays_in_its_range_and_under_the_cap() {
        let p = policy().adaptive(ms(300)).unwrap();
        assert_eq!(p.mode(), DebounceMode::Adaptive);
        let quiet = [Timestamp(0), Timestamp(30_000), Timestamp(60_000)]
            .iter()
            .fold(Rhythm::default(), |r, t| r.learn(&[*t], p.debounce()));
        assert_eq!(
            p.debounce_for(p.waits_of(&quiet), Cue::Complete, 1),
            ms(300)
        );
        assert_eq!(
            p.debounce_for(p.waits_of(&quiet), Cue::Unfinished, 1),
            ms(1500)
        );
        assert_eq!(
            p.debounce_for(p.waits_of(&Rhythm::default()), Cue::Complete, 1),
            ms(1500)
        );
        assert_eq!(
            policy().debounce_for(p.waits_of(&quiet), Cue::Complete, 1),
            ms(1500),
            "fixed"
        );
        // Oldest pending at 1000: the cap is 11000 however long the wait.
        assert_eq!(
            p.due_after(ms(1500), Timestamp(10_000), Timestamp(1000), 5),
            Timestamp(11_000)
        );
        assert_eq!(
            p.due_after(ms(300), Timestamp(2000), Timestamp(1000), 20),
            Timestamp(2000)
        );
        let e = policy().adaptive(ms(1501)).unwrap_err().to_string();
        assert!(e.contains("LULL_DEBOUNCE_MIN_MS"), "{e}");
    }

    #[test]
    fn the_cap_is_reached_after_max_wait() {
        let p = policy();
        assert!(!p.cap_reached(Timestamp(10_999), Timestamp(1000)));
        assert!(p.cap_reached(Timestamp(11_000), Timestamp(1000)));
    }

    #[test]
    fn settings_that_cannot_work_are_refused() {
        assert!(matches!(
            TimerPolicy::new(ms(3000), ms(3000), 20),
            Err(TimingError::DebounceNotShorterThanCap { .. })
        ));
        assert_eq!(
            TimerPolicy::new(ms(10), ms(20), 0),
            Err(TimingError::EmptyBatch)
        );
        assert!(matches!(
            LeaseTiming::new(ms(1000), ms(400)),
            Err(TimingError::LeaseTooShort { .. })
        ));
        assert!(LeaseTiming::new(ms(1200), ms(400)).is_ok());
        assert_eq!(
            LeaseTiming::with_ttl(ms(30_000)).unwrap().renew_every(),
            ms(10_000)
        );
    }

    #[test]
    fn the_error_names_the_variable() {
        let e = TimerPolicy::new(ms(3000), ms(1000), 20)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("LULL_DEBOUNCE_MS") && e.contains("LULL_MAX_WAIT_MS"),
            "{e}"
        );
    }

    #[test]
    fn failure_and_delivery_backoffs_grow_and_are_capped() {
        for _ in 0..50 {
            let first = FAILURE_BACKOFF.delay(1);
            assert!(first >= ms(750) && first <= ms(1250));
            let tenth = FAILURE_BACKOFF.delay(10);
            assert!(tenth >= ms(225_000) && tenth <= ms(375_000));
            let first = DELIVERY_BACKOFF.delay(1);
            assert!(first >= ms(187) && first <= ms(313));
            assert!(DELIVERY_BACKOFF.delay(u32::MAX) <= ms(375_000));
        }
    }
}
