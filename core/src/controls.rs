//! The controls a conversation has over its own replies: which model answers
//! (`LULL_MODELS`, `/model`), which persona or system prompt it speaks with
//! (`LULL_PERSONAS`, `/persona`, `/prompt`), and a fresh context after a long silence
//! (`LULL_IDLE_RESET`). What a conversation chose is stored with it
//! ([`SettingStore`](crate::store::SettingStore)); this module turns that choice into
//! what the model is asked with ([`Choices`]).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::llm::Choices;
use crate::store::ConversationSettings;

/// A named persona: a system prompt, and optionally the model and temperature it is
/// answered with.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Persona {
    /// The system prompt the model is given instead of `LULL_SYSTEM_PROMPT`.
    pub prompt: String,
    /// The model it is answered with (unless the conversation picked one with `/model`).
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub temperature: Option<f32>,
}

/// The deployment's controls, checked at start.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Controls {
    /// `LULL_MODELS`: the models a conversation may pick, the first the default.
    /// Empty: any model the server lists may be picked.
    pub models: Vec<String>,
    /// The model that answers a conversation that chose none (`OPENAI_MODEL`, or the
    /// first of `LULL_MODELS`), as `/model` and `/status` name it.
    pub default_model: String,
    /// `LULL_PERSONAS`: the personas by name, in name order.
    pub personas: BTreeMap<String, Persona>,
    /// `LULL_IDLE_RESET`: a conversation idle this long starts from a fresh context.
    pub idle_reset: Option<Duration>,
}

impl Controls {
    /// Read a personas file: a JSON object of personas by name, each
    /// `{"prompt": "…", "model": "…", "temperature": 0.7}` (`model` and `temperature`
    /// optional). A name is one word (no spaces, so `/persona NAME` names it), a
    /// prompt is not empty, a temperature is within 0..=2.
    pub fn parse_personas(json: &str) -> Result<BTreeMap<String, Persona>, String> {
        let personas: BTreeMap<String, Persona> = serde_json::from_str(json)
            .map_err(|e| format!("not a JSON object of personas: {e}"))?;
        for (name, persona) in &personas {
            if name.is_empty() || name.chars().any(char::is_whitespace) {
                return Err(format!("persona name {name:?} must be one word"));
            }
            if persona.prompt.trim().is_empty() {
                return Err(format!("persona {name:?} has an empty prompt"));
            }
            if let Some(t) = persona.temperature
                && !(0.0..=2.0).contains(&t)
            {
                return Err(format!(
                    "persona {name:?}: temperature {t} is not within 0..2"
                ));
            }
        }
        Ok(personas)
    }

    /// The controls in force, for `lull check`: the models (or the server's list), the
    /// default, the personas, the idle reset.
    pub fn describe(&self) -> String {
        let models = if self.models.is_empty() {
            format!(
                "/model picks any model the server lists (default {})",
                self.default_model
            )
        } else {
            format!(
                "/model picks {} (default {})",
                self.models.join(", "),
                self.default_model
            )
        };
        let personas = if self.personas.is_empty() {
            "no personas (LULL_PERSONAS unset)".to_owned()
        } else {
            let names: Vec<&str> = self.personas.keys().map(String::as_str).collect();
            format!("personas {}", names.join(", "))
        };
        let idle = match self.idle_reset {
            Some(after) => format!(
                "a fresh context after {} idle",
                humantime::format_duration(after)
            ),
            None => "no idle reset".to_owned(),
        };
        format!("{models}; {personas}; {idle}")
    }

    /// What the model is asked with, given what the conversation chose: the model it
    /// picked, else its persona's, else the default; its own prompt, else its
    /// persona's, else `LULL_SYSTEM_PROMPT`. A stored choice no longer offered (the
    /// list or the personas file changed since) is ignored: the default answers.
    pub fn choices(&self, chosen: &ConversationSettings) -> Choices {
        let persona = chosen.persona.as_deref().and_then(|p| self.personas.get(p));
        let offered = |model: &String| self.models.is_empty() || self.models.contains(model);
        Choices {
            model: chosen
                .model
                .clone()
                .filter(offered)
                .or_else(|| persona.and_then(|p| p.model.clone())),
            system_prompt: chosen
                .prompt
                .clone()
                .or_else(|| persona.map(|p| p.prompt.clone())),
            temperature: persona.and_then(|p| p.temperature),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controls() -> Controls {
        Controls {
            models: vec!["small".into(), "big".into()],
            personas: Controls::parse_personas(
                r#"{"pirate": {"prompt": "Arr.", "model": "big", "temperature": 0.9},
                    "terse": {"prompt": "Be brief."}}"#,
            )
            .unwrap(),
            idle_reset: None,
            default_model: "small".into(),
        }
    }

    #[test]
    fn a_pick_beats_the_persona_which_beats_the_default() {
        let c = controls();
        assert_eq!(
            c.choices(&ConversationSettings::default()),
            Choices::default()
        );
        let pirate = ConversationSettings {
            persona: Some("pirate".into()),
            ..Default::default()
        };
        assert_eq!(
            c.choices(&pirate),
            Choices {
                model: Some("big".into()),
                system_prompt: Some("Arr.".into()),
                temperature: Some(0.9),
            }
        );
        let own = ConversationSettings {
            model: Some("small".into()),
            prompt: Some("Mine.".into()),
            ..pirate
        };
        let chosen = c.choices(&own);
        assert_eq!(chosen.model.as_deref(), Some("small"));
        assert_eq!(chosen.system_prompt.as_deref(), Some("Mine."));
    }

    #[test]
    fn a_choice_no_longer_offered_falls_back_to_the_default() {
        let c = controls();
        let gone = ConversationSettings {
            model: Some("retired".into()),
            persona: Some("deleted".into()),
            prompt: None,
        };
        assert_eq!(c.choices(&gone), Choices::default());
    }

    #[test]
    fn a_bad_personas_file_is_refused_with_the_reason() {
        for (json, why) in [
            ("[]", "not a JSON object"),
            (r#"{"a b": {"prompt": "x"}}"#, "one word"),
            (r#"{"a": {"prompt": " "}}"#, "empty prompt"),
            (r#"{"a": {"prompt": "x", "temperature": 5}}"#, "temperature"),
            (
                r#"{"a": {"prompt": "x", "voice": "deep"}}"#,
                "unknown field",
            ),
        ] {
            let error = Controls::parse_personas(json).unwrap_err();
            assert!(error.contains(why), "{json}: {error}");
        }
    }
}
