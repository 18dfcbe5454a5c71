//! Skipped tests say so: a test that cannot run here (a tool not installed) reports
//! one line past the test harness's capture (which takes only `print!`), so the
//! output shows it even when the test "passes", and appends it to the file
//! `LULL_SKIP_LOG` names, if set: `.ci/run` fails when that file is not empty, so
//! nothing required is skipped in CI unnoticed. Each reason is also kept in
//! [`SKIPPED_TIERS`], which the last test target (`tests/zz_tiers.rs`) reads to say,
//! after every result, which tiers were skipped and how to enable them.

use std::io::Write as _;

/// Where this run's reasons for skipping are kept for `zz_tiers`, one a line.
pub(crate) const SKIPPED_TIERS: &str =
    concat!(env!("CARGO_TARGET_TMPDIR"), "/lull-skipped-tiers.txt");

/// Report that `test` was skipped, and why.
pub(crate) fn skipped(test: &str, why: &str) {
    let line = format!("SKIPPED {test}: {why}");
    let _ = writeln!(std::io::stderr(), "{line}");
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(SKIPPED_TIERS)
    {
        // One write a line: concurrent tests append whole lines.
        let _ = file.write_all(format!("{why}\n").as_bytes());
    }
    if let Some(path) = std::env::var_os("LULL_SKIP_LOG")
        && let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        let _ = file.write_all(format!("{line}\n").as_bytes());
    }
}
