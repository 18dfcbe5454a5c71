//! The configuration table (`docs/configuration.md`) and `.env.example` are promises to users: these
//! tests fail when they and the code disagree.

use std::collections::BTreeMap;

use clap::CommandFactory;

use super::Cli;

/// Variables clap reads, with their flag and default (hidden aliases left out).
fn variables() -> BTreeMap<String, (String, Option<String>)> {
    Cli::command()
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .filter_map(|a| {
            let env = a.get_env()?.to_string_lossy().into_owned();
            let flag = format!("--{}", a.get_long()?);
            let default = a
                .get_default_values()
                .first()
                .map(|v| v.to_string_lossy().into_owned())
                // Applied in `Config::from_settings`, since its absence selects the responder.
                .or_else(|| {
                    (env == "OPENAI_BASE_URL")
                        .then(|| super::model::DEFAULT_OPENAI_BASE_URL.to_owned())
                });
            Some((env, (flag, default)))
        })
        .collect()
}

/// The table's rows (`docs/configuration.md`): `| `VAR` | `--flag` | meaning | default |`.
fn readme_rows() -> BTreeMap<String, (String, String)> {
    include_str!("../../docs/configuration.md")
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            if cells.len() < 6 || !cells[1].starts_with('`') || !cells[2].starts_with("`--") {
                return None;
            }
            Some((
                cells[1].trim_matches('`').to_owned(),
                (cells[2].trim_matches('`').to_owned(), cells[4].to_owned()),
            ))
        })
        .collect()
}

#[test]
fn the_readme_table_lists_every_variable_with_its_flag_and_default() {
    let code = variables();
    let readme = readme_rows();
    let in_code: Vec<&String> = code.keys().collect();
    let in_readme: Vec<&String> = readme.keys().collect();
    assert_eq!(
        in_code, in_readme,
        "variables in the code vs the table of docs/configuration.md"
    );
    for (variable, (flag, default)) in &code {
        let (readme_flag, readme_default) = &readme[variable];
        assert_eq!(flag, readme_flag, "{variable}: flag");
        // A documented literal default must be the code's default; prose defaults
        // ("unset", "the server's") are for variables without one.
        match default {
            Some(default) if !default.is_empty() && default.len() < 60 => assert_eq!(
                readme_default.trim_matches('`'),
                default,
                "{variable}: default in docs/configuration.md"
            ),
            _ => assert!(
                !(readme_default.starts_with('`')
                    && readme_default.ends_with('`')
                    && readme_default.matches('`').count() == 2),
                "{variable}: docs/configuration.md names a literal default the code does not have"
            ),
        }
    }
}

#[test]
fn env_example_mentions_every_variable() {
    let example = include_str!("../../.env.example");
    for variable in variables().keys() {
        assert!(
            example.contains(&format!("#{variable}="))
                || example.contains(&format!("\n{variable}=")),
            "{variable} is missing from .env.example"
        );
    }
}

/// What admins may do reads the same in `--help`, `.env.example` (where the comment
/// wraps its lines), the configuration table and the access page.
#[test]
fn the_admins_powers_read_the_same_everywhere() {
    use super::access::ADMIN_POWERS;
    let flat = |text: &str| {
        text.lines()
            .map(|l| l.trim_start_matches('#').trim())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let help = Cli::command().render_long_help().to_string();
    assert!(flat(&help).contains(ADMIN_POWERS), "--help");
    for (name, text) in [
        (".env.example", include_str!("../../.env.example")),
        (
            "docs/configuration.md",
            include_str!("../../docs/configuration.md"),
        ),
        (
            "docs/access-and-costs.md",
            include_str!("../../docs/access-and-costs.md"),
        ),
    ] {
        assert!(flat(text).contains(ADMIN_POWERS), "{name}");
    }
}
