//! Timing: the capped debounce and the burst size that answers at once, the lease's
//! lifetime and renewal, the poll for other processes' work, and the shutdown grace.
//! The rules they must obey together are the core's ([`lull_core::timing`]); a
//! setting that breaks one is refused at start-up, naming it.

use std::time::Duration;

use clap::Args;
use lull_core::dispatcher;
use lull_core::rhythm::DebounceMode;
use lull_core::timing::{LeaseTiming, TimerPolicy};

use super::{ConfigError, positive};

/// `LULL_DEBOUNCE_MS`, `LULL_DEBOUNCE`, `LULL_DEBOUNCE_MIN_MS`, `LULL_MAX_WAIT_MS`,
/// `LULL_MAX_BATCH`, `LULL_LEASE_*`, `LULL_POLL_MS`, `LULL_SHUTDOWN_GRACE_MS`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Timing")]
pub(crate) struct TimingArgs {
    /// Debounce window: a reply waits this long after the last message.
    #[arg(long, global = true, env = "LULL_DEBOUNCE_MS", default_value_t = dispatcher::DEBOUNCE_MS)]
    pub debounce_ms: u64,
    /// How each wait is picked: `adaptive` (from the conversation's rhythm, between
    /// LULL_DEBOUNCE_MIN_MS and LULL_DEBOUNCE_MS) or `fixed` (always LULL_DEBOUNCE_MS).
    #[arg(long, global = true, env = "LULL_DEBOUNCE", default_value = "adaptive")]
    pub debounce: DebounceArg,
    /// The shortest adaptive wait [default: 300, or LULL_DEBOUNCE_MS if shorter]
    #[arg(long, global = true, env = "LULL_DEBOUNCE_MIN_MS")]
    pub debounce_min_ms: Option<u64>,
    /// Cap of the debounce window, counted from the oldest unanswered message.
    #[arg(
        long,
        global = true,
        env = "LULL_MAX_WAIT_MS",
        default_value_t = dispatcher::MAX_WAIT_MS
    )]
    pub max_wait_ms: u64,
    /// Answer at once when this many messages are pending.
    #[arg(long, global = true, env = "LULL_MAX_BATCH", default_value_t = dispatcher::MAX_BATCH)]
    pub max_batch: u32,
    /// Lease lifetime; a crashed process's conversations are taken over after it.
    #[arg(
        long,
        global = true,
        env = "LULL_LEASE_TTL_MS",
        default_value_t = dispatcher::LEASE_TTL_MS
    )]
    pub lease_ttl_ms: u64,
    /// Lease renewal interval [default: a third of LULL_LEASE_TTL_MS]
    #[arg(long, global = true, env = "LULL_LEASE_RENEW_MS")]
    pub lease_renew_ms: Option<u64>,
    /// How often to look for work armed by other processes.
    #[arg(long, global = true, env = "LULL_POLL_MS", default_value_t = dispatcher::POLL_MS)]
    pub poll_ms: u64,
    /// Time to finish generations and sends in flight on SIGTERM, in milliseconds; a hard limit.
    #[arg(
        long,
        global = true,
        env = "LULL_SHUTDOWN_GRACE_MS",
        default_value_t = dispatcher::SHUTDOWN_GRACE_MS
    )]
    pub shutdown_grace_ms: u64,
}

/// `LULL_DEBOUNCE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DebounceArg {
    Adaptive,
    Fixed,
}

impl From<DebounceArg> for DebounceMode {
    fn from(arg: DebounceArg) -> Self {
        match arg {
            DebounceArg::Adaptive => DebounceMode::Adaptive,
            DebounceArg::Fixed => DebounceMode::Fixed,
        }
    }
}

impl TimingArgs {
    /// The capped debounce (with `LULL_DEBOUNCE` applied) and the lease's timing,
    /// checked together.
    pub(crate) fn check(&self) -> Result<(TimerPolicy, LeaseTiming), ConfigError> {
        let s = self;
        let timers = TimerPolicy::new(
            Duration::from_millis(s.debounce_ms),
            positive("LULL_MAX_WAIT_MS", s.max_wait_ms)?,
            s.max_batch,
        )?;
        let min = s
            .debounce_min_ms
            .map(|ms| positive("LULL_DEBOUNCE_MIN_MS", ms))
            .transpose()?;
        let timers = dispatcher::timer_policy(timers, s.debounce.into(), min)?;
        let ttl = positive("LULL_LEASE_TTL_MS", s.lease_ttl_ms)?;
        let lease = match s.lease_renew_ms {
            Some(renew) => LeaseTiming::new(ttl, Duration::from_millis(renew))?,
            None => LeaseTiming::with_ttl(ttl)?,
        };
        Ok((timers, lease))
    }

    /// `LULL_POLL_MS`, positive.
    pub(crate) fn poll_every(&self) -> Result<Duration, ConfigError> {
        positive("LULL_POLL_MS", self.poll_ms)
    }

    /// `LULL_SHUTDOWN_GRACE_MS`.
    pub(crate) fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::assert_errors_name;

    #[test]
    fn errors_name_the_variable() {
        assert_errors_name(&[
            (
                &["--debounce-ms", "5000", "--max-wait-ms", "4000"],
                "LULL_DEBOUNCE_MS",
            ),
            (
                &["--lease-ttl-ms", "1000", "--lease-renew-ms", "500"],
                "LULL_LEASE_TTL_MS",
            ),
            (&["--max-wait-ms", "0"], "LULL_MAX_WAIT_MS"),
            (&["--poll-ms", "0"], "LULL_POLL_MS"),
            (
                &["--debounce-ms", "1000", "--debounce-min-ms", "1200"],
                "LULL_DEBOUNCE_MIN_MS",
            ),
            (&["--debounce-min-ms", "0"], "LULL_DEBOUNCE_MIN_MS"),
        ]);
    }

    #[test]
    fn adaptive_waiting_is_the_default_and_fixed_is_a_choice() {
        use lull_core::rhythm::DebounceMode;
        use std::time::Duration;

        let timers = |args: &[&str]| {
            super::super::Config::from_settings(&super::super::tests::settings(args))
                .unwrap()
                .dispatch
                .timers
        };
        let adaptive = timers(&[]);
        assert_eq!(adaptive.mode(), DebounceMode::Adaptive);
        assert_eq!(adaptive.min_debounce(), Duration::from_millis(300));
        let fixed = timers(&["--debounce", "fixed"]);
        assert_eq!(fixed.mode(), DebounceMode::Fixed);
        assert_eq!(fixed.min_debounce(), fixed.debounce());
        // A short debounce is its own shortest wait; a fixed one ignores the minimum.
        let short = timers(&["--debounce-ms", "100"]);
        assert_eq!(short.min_debounce(), Duration::from_millis(100));
        let fixed = timers(&["--debounce", "fixed", "--debounce-min-ms", "5000"]);
        assert_eq!(fixed.mode(), DebounceMode::Fixed);
        assert_eq!(
            timers(&["--debounce-min-ms", "500"]).min_debounce(),
            Duration::from_millis(500)
        );
    }
}
