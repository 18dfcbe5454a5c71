//! Jobs: reminders and scheduled tasks (`LULL_JOBS`), how many a chat may keep, how
//! often one may recur, and what a missed occurrence does.

use std::time::Duration;

use clap::Args;
use lull_core::dispatcher::{JOB_MIN_INTERVAL, JOBS_PER_CHAT, JobSettings, MissedPolicy};

use super::ConfigError;

/// `LULL_JOBS`, `LULL_JOBS_PER_CHAT`, `LULL_JOB_MIN_INTERVAL`, `LULL_JOB_MISSED`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Jobs")]
pub(crate) struct JobsArgs {
    /// `on`: `/remind`, `/schedule`, `/jobs` and `/timezone` work and due jobs fire; `off`: no job fires (they stay stored) and the commands say jobs are off.
    #[arg(long, global = true, env = "LULL_JOBS", default_value = "on")]
    pub jobs: String,
    /// The most active jobs (reminders and tasks) one chat may keep.
    #[arg(long, global = true, env = "LULL_JOBS_PER_CHAT", default_value_t = JOBS_PER_CHAT)]
    pub jobs_per_chat: u32,
    /// The shortest interval of a recurring job (e.g. `1m`, `15m`, `1h`): `every 10s` is refused below it.
    #[arg(
        long,
        global = true,
        env = "LULL_JOB_MIN_INTERVAL",
        default_value = "1m"
    )]
    pub job_min_interval: humantime::Duration,
    /// What a job does about occurrences missed while lull (or its database) was down: `once` fires one late occurrence saying how late; `skip` sends a short notice instead. Never one message per missed occurrence.
    #[arg(long, global = true, env = "LULL_JOB_MISSED", default_value = "once")]
    pub job_missed: String,
}

impl JobsArgs {
    /// The jobs settings; `None` with `LULL_JOBS=off`.
    pub(crate) fn settings(&self) -> Result<Option<JobSettings>, ConfigError> {
        if !super::on_off("LULL_JOBS", &self.jobs)? {
            return Ok(None);
        }
        if self.jobs_per_chat == 0 {
            return Err(ConfigError(
                "LULL_JOBS_PER_CHAT must be at least 1 (or set LULL_JOBS=off)".into(),
            ));
        }
        let min_interval: Duration = self.job_min_interval.into();
        if min_interval < Duration::from_secs(1) {
            return Err(ConfigError(format!(
                "LULL_JOB_MIN_INTERVAL must be at least 1s, got {}",
                self.job_min_interval
            )));
        }
        let missed = match self.job_missed.trim().to_ascii_lowercase().as_str() {
            "once" => MissedPolicy::Once,
            "skip" => MissedPolicy::Skip,
            _ => {
                return Err(ConfigError(format!(
                    "LULL_JOB_MISSED must be `once` or `skip`, got {:?}",
                    self.job_missed
                )));
            }
        };
        Ok(Some(JobSettings {
            per_chat: self.jobs_per_chat,
            min_interval,
            missed,
        }))
    }
}

// The flag's default spells the core's.
const _: () = assert!(JOB_MIN_INTERVAL.as_secs() == 60);

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::super::tests::{assert_errors_name, settings};
    use super::*;

    #[test]
    fn jobs_are_on_by_default_and_each_setting_is_checked() {
        let jobs = |args: &[&str]| {
            Config::from_settings(&settings(args))
                .unwrap()
                .dispatch
                .jobs
        };
        assert_eq!(jobs(&[]), Some(JobSettings::default()));
        assert_eq!(jobs(&["--jobs", "off"]), None);
        let tuned = jobs(&[
            "--jobs-per-chat",
            "3",
            "--job-min-interval",
            "5s",
            "--job-missed",
            "skip",
        ])
        .unwrap();
        assert_eq!(tuned.per_chat, 3);
        assert_eq!(tuned.min_interval, Duration::from_secs(5));
        assert_eq!(tuned.missed, MissedPolicy::Skip);
        assert_errors_name(&[
            (&["--jobs", "maybe"], "LULL_JOBS"),
            (&["--jobs-per-chat", "0"], "LULL_JOBS_PER_CHAT"),
            (&["--job-min-interval", "100ms"], "LULL_JOB_MIN_INTERVAL"),
            (&["--job-missed", "all"], "LULL_JOB_MISSED"),
        ]);
    }
}
