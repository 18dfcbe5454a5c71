//! Skipped tests say so: a test that cannot run here (a tool not installed) reports
//! one line past the test harness's capture (which takes only `print!`), so the
//! output shows it even when the test "passes", and appends it to the file
//! `LULL_SKIP_LOG` names, if set: `.ci/run` fails when that file is not empty, so
//! nothing required is skipped in CI unnoticed.

use std::io::Write as _;

/// Report that `test` was skipped, and why.
pub(crate) fn skipped(test: &str, why: &str) {
    let line = format!("SKIPPED {test}: {why}");
    let _ = writeln!(std::io::stderr(), "{line}");
    if let Some(path) = std::env::var_os("LULL_SKIP_LOG")
        && let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
    {
        let _ = writeln!(file, "{line}");
    }
}
