//! `LULL_*` variables this build does not know: a typo in a budget, an allow list or a
//! secret's name (`LULL_USER_DAILY_TOKEN=500` for `LULL_USER_DAILY_TOKENS`) must never
//! fail open, silently leaving the limit off. lull refuses to start naming each one
//! and the known name nearest to it. Variables meant for something else are listed in
//! `LULL_IGNORE` (comma-separated); those of lull's own test tooling are let through
//! by their prefix (`LULL_TEST_`, `LULL_REQUIRE_`, …, [`TOOLING`]).

use std::collections::BTreeSet;

use clap::CommandFactory;

use super::Cli;

/// The variable that lists `LULL_*` names lull should not read.
pub(crate) const IGNORE: &str = "LULL_IGNORE";

/// Names and prefixes of the variables lull's test tooling reads (the test switches,
/// the CI tiers, the fakes and fixtures): never settings, never refused.
const TOOLING: [&str; 9] = [
    "LULL_TEST_",
    "LULL_REQUIRE_",
    "LULL_LLAMA_",
    "LULL_MCP_EVERYTHING",
    "LULL_MCP_FILESYSTEM",
    "LULL_PG_BIN",
    "LULL_SKIP_LOG",
    "LULL_CI_CACHE",
    "LULL_SCREENSHOT_DIR",
];

/// The `LULL_*` names a setting reads: every flag's variable.
fn known() -> BTreeSet<String> {
    let mut known: BTreeSet<String> = Cli::command()
        .get_arguments()
        .filter_map(|a| a.get_env().map(|v| v.to_string_lossy().into_owned()))
        .filter(|name| name.starts_with("LULL_"))
        .collect();
    known.insert(IGNORE.to_owned());
    known
}

/// One line per `LULL_*` name of `names` this build does not know (`ignore`d and
/// tooling names aside), each with the nearest known name when one is close.
pub(crate) fn unknown<'a>(
    names: impl IntoIterator<Item = &'a str>,
    ignore: Option<&str>,
) -> Vec<String> {
    let known = known();
    let ignored: BTreeSet<&str> = ignore
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    let mut lines: Vec<String> = names
        .into_iter()
        .filter(|name| name.starts_with("LULL_"))
        .filter(|name| !known.contains(*name) && !ignored.contains(name))
        .filter(|name| !TOOLING.iter().any(|tool| name.starts_with(tool)))
        .map(|name| match nearest(name, &known) {
            Some(near) => format!("{name} is not a lull setting; did you mean {near}?"),
            None => format!("{name} is not a lull setting"),
        })
        .collect();
    lines.sort();
    lines
}

/// The known name nearest to `name`, if it is close (a typo: at most a third of the
/// name's letters, and at most 4, changed).
fn nearest<'a>(name: &str, known: &'a BTreeSet<String>) -> Option<&'a str> {
    let limit = (name.len() / 3).min(4);
    known
        .iter()
        .map(|k| (distance(name, k), k.as_str()))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, k)| k)
}

/// The edit distance (insertions, deletions, substitutions) between `a` and `b`.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (previous + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            previous = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_is_named_with_the_setting_it_meant() {
        let lines = unknown(["LULL_USER_DAILY_TOKEN", "LULL_DEBOUNCE_MS", "PATH"], None);
        assert_eq!(
            lines,
            ["LULL_USER_DAILY_TOKEN is not a lull setting; did you mean LULL_USER_DAILY_TOKENS?"]
        );
        assert_eq!(
            unknown(["LULL_ALOWED_USERS"], None),
            ["LULL_ALOWED_USERS is not a lull setting; did you mean LULL_ALLOWED_USERS?"]
        );
        assert_eq!(
            unknown(["LULL_SOMETHING_ELSE_ENTIRELY"], None),
            ["LULL_SOMETHING_ELSE_ENTIRELY is not a lull setting"]
        );
    }

    #[test]
    fn ignored_names_and_the_test_tooling_pass() {
        assert!(unknown(["LULL_MY_SIDECAR"], Some("LULL_OTHER, LULL_MY_SIDECAR")).is_empty());
        assert!(
            unknown(
                [
                    "LULL_TEST_DISABLE_LEASE",
                    "LULL_REQUIRE_POSTGRES",
                    "LULL_IGNORE"
                ],
                None
            )
            .is_empty()
        );
    }

    #[test]
    fn every_documented_variable_is_known() {
        let known = known();
        for name in [
            "LULL_JOBS",
            "LULL_USER_DAILY_TOKENS",
            "LULL_MCP_CONFIG",
            "LULL_ECHO_DELAY_MS",
        ] {
            assert!(known.contains(name), "{name}");
        }
    }
}
