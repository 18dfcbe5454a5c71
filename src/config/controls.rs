//! Controls: the models a conversation may pick (`LULL_MODELS`, the first the
//! default), the personas it may speak with (`LULL_PERSONAS`, a JSON file read at
//! start: a file that cannot be used stops the start naming the variable), and a
//! fresh context after a long silence (`LULL_IDLE_RESET`).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use lull_core::controls::Controls;

use super::{ConfigError, LlmConfig};

/// `LULL_MODELS`, `LULL_PERSONAS`, `LULL_IDLE_RESET`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Controls")]
pub(crate) struct ControlsArgs {
    /// Models a chat may pick with /model, comma-separated; the first is the default (it replaces OPENAI_MODEL). Unset: any model the server lists.
    #[arg(long, global = true, env = "LULL_MODELS")]
    pub models: Option<String>,
    /// Personas a chat may pick with /persona: a JSON file `{"NAME": {"prompt": "…", "model": "…", "temperature": 0.7}}` (model and temperature optional).
    #[arg(long, global = true, env = "LULL_PERSONAS")]
    pub personas: Option<PathBuf>,
    /// A chat idle this long starts from a fresh context (e.g. `6h`); `off`: never.
    #[arg(long, global = true, env = "LULL_IDLE_RESET", default_value = "off", value_parser = idle_reset)]
    pub idle_reset: IdleReset,
}

/// `LULL_IDLE_RESET`: `off` or a duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IdleReset(pub Option<Duration>);

fn idle_reset(value: &str) -> Result<IdleReset, String> {
    if value.trim().eq_ignore_ascii_case("off") {
        return Ok(IdleReset(None));
    }
    let duration: Duration = humantime::parse_duration(value.trim())
        .map_err(|e| format!("expected `off` or a duration such as 6h ({e})"))?;
    if duration.is_zero() {
        return Err("must be longer than 0 (or `off`)".into());
    }
    Ok(IdleReset(Some(duration)))
}

impl ControlsArgs {
    /// The controls in force; with `LULL_MODELS` set, its first model answers by
    /// default (`llm`'s model is replaced by it).
    pub(crate) fn check(&self, llm: &mut LlmConfig) -> Result<Controls, ConfigError> {
        let models: Vec<String> = self
            .models
            .iter()
            .flat_map(|list| list.split(','))
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(str::to_owned)
            .collect();
        if self.models.is_some() && models.is_empty() {
            return Err(ConfigError(
                "LULL_MODELS must name at least one model (comma-separated), or be unset".into(),
            ));
        }
        if let Some(bad) = models.iter().find(|m| m.chars().any(char::is_whitespace)) {
            return Err(ConfigError(format!(
                "LULL_MODELS: model name {bad:?} has a space (the list is comma-separated)"
            )));
        }
        let personas = match &self.personas {
            None => Default::default(),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    ConfigError(format!(
                        "LULL_PERSONAS: cannot read {}: {e}",
                        path.display()
                    ))
                })?;
                Controls::parse_personas(&text)
                    .map_err(|e| ConfigError(format!("LULL_PERSONAS ({}): {e}", path.display())))?
            }
        };
        let default_model = match llm {
            LlmConfig::OpenAi(settings) => {
                if let Some(first) = models.first() {
                    settings.model = first.clone();
                }
                settings.model.clone()
            }
            LlmConfig::Echo(_) => models.first().map_or("echo", String::as_str).to_owned(),
        };
        Ok(Controls {
            models,
            default_model,
            personas,
            idle_reset: self.idle_reset.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::Config;
    use super::super::tests::{assert_errors_name, settings};
    use super::*;

    #[test]
    fn the_first_of_the_models_is_the_default() {
        let config = Config::from_settings(&settings(&[
            "--openai-base-url",
            "http://127.0.0.1:1/v1",
            "--models",
            "small, big",
        ]))
        .unwrap();
        let LlmConfig::OpenAi(openai) = &config.llm else {
            panic!("openai")
        };
        assert_eq!(openai.model, "small");
        assert_eq!(config.dispatch.controls.models, ["small", "big"]);
        assert_eq!(config.dispatch.controls.default_model, "small");
        assert_eq!(config.dispatch.controls.idle_reset, None, "off by default");
    }

    #[test]
    fn personas_are_read_and_the_idle_reset_parsed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("personas.json");
        std::fs::write(&path, r#"{"pirate": {"prompt": "Arr."}}"#).unwrap();
        let config = Config::from_settings(&settings(&[
            "--personas",
            path.to_str().unwrap(),
            "--idle-reset",
            "6h",
        ]))
        .unwrap();
        let controls = &config.dispatch.controls;
        assert_eq!(controls.personas["pirate"].prompt, "Arr.");
        assert_eq!(controls.idle_reset, Some(Duration::from_secs(6 * 3600)));
    }

    #[test]
    fn bad_controls_are_refused_naming_the_variable() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "{not json").unwrap();
        let missing = dir.path().join("missing.json");
        assert_errors_name(&[
            (&["--models", " , "], "LULL_MODELS"),
            (&["--models", "a b,c"], "LULL_MODELS"),
            (&["--personas", bad.to_str().unwrap()], "LULL_PERSONAS"),
            (&["--personas", missing.to_str().unwrap()], "LULL_PERSONAS"),
        ]);
        for value in ["0s", "soon"] {
            let parsed = super::super::Cli::try_parse_from(["lull", "--idle-reset", value]);
            assert!(parsed.is_err(), "{value}");
        }
    }
}
