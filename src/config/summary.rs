//! Long conversations (`LULL_SUMMARY`, `LULL_SUMMARY_MODEL`) and retention
//! (`LULL_RETENTION_DAYS`): how much of a conversation the model keeps, and how long
//! lull keeps its texts.

use std::time::Duration;

use clap::Args;
use lull_core::dispatcher::SummarySettings;
use lull_core::llm::HistoryBudget;

use super::{ConfigError, LlmConfig};

/// `LULL_SUMMARY`, `LULL_SUMMARY_MODEL`, `LULL_RETENTION_DAYS`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Long conversations and retention")]
pub(crate) struct SummaryArgs {
    /// `on`: when a conversation's history fills LULL_HISTORY_MESSAGES / LULL_HISTORY_CHARS, a summary of its older part is made after a reply (the person does not wait) and shown to the model before the newer messages; messages are never cut or rewritten. `off`: the model sees the newest messages only. Off with the echo responder.
    #[arg(long, global = true, env = "LULL_SUMMARY", default_value = "on")]
    pub summary: String,
    /// The model that writes summaries (a cheaper one will do); unset: the chat's model.
    #[arg(long, global = true, env = "LULL_SUMMARY_MODEL")]
    pub summary_model: Option<String>,
    /// Remove the texts of answered messages and delivered replies older than this many days (rows, counters and summaries stay; pending messages and undelivered replies are never touched); unset: keep everything.
    #[arg(long, global = true, env = "LULL_RETENTION_DAYS")]
    pub retention_days: Option<String>,
}

/// The longest retention accepted (100 years: a typo, not a policy, beyond it).
const MAX_RETENTION_DAYS: u64 = 36_500;

impl SummaryArgs {
    /// The summaries' settings; `None` with `LULL_SUMMARY=off` or the echo responder.
    pub(crate) fn settings(
        &self,
        llm: &LlmConfig,
        history: HistoryBudget,
    ) -> Result<Option<SummarySettings>, ConfigError> {
        if !super::on_off("LULL_SUMMARY", &self.summary)? {
            return Ok(None);
        }
        let model = match &self.summary_model {
            Some(model) if model.trim().is_empty() => {
                return Err(ConfigError(
                    "LULL_SUMMARY_MODEL is empty: name a model, or unset it to use the chat's"
                        .into(),
                ));
            }
            model => model.as_ref().map(|m| m.trim().to_owned()),
        };
        Ok(match llm {
            LlmConfig::Echo(_) => None,
            LlmConfig::OpenAi(_) => Some(SummarySettings { model, history }),
        })
    }

    /// `LULL_RETENTION_DAYS`: `None` keeps everything.
    pub(crate) fn retention(&self) -> Result<Option<Duration>, ConfigError> {
        let Some(days) = &self.retention_days else {
            return Ok(None);
        };
        match days.trim().parse::<u64>() {
            Ok(days) if (1..=MAX_RETENTION_DAYS).contains(&days) => {
                Ok(Some(Duration::from_secs(days * 86_400)))
            }
            _ => Err(ConfigError(format!(
                "LULL_RETENTION_DAYS must be a whole number of days from 1 to {MAX_RETENTION_DAYS}, got {days:?} (unset it to keep everything)"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::super::tests::{assert_errors_name, settings};

    #[test]
    fn summaries_follow_the_responder_and_each_setting_is_checked() {
        let config = |args: &[&str]| Config::from_settings(&settings(args)).unwrap().dispatch;
        let openai = ["--llm", "openai", "--openai-api-key", "sk-x"];
        // The echo responder has no model to summarise with.
        assert_eq!(config(&[]).summary, None);
        let on = config(&openai).summary.unwrap();
        assert_eq!((on.model, on.history.messages), (None, 20));
        let mut off = openai.to_vec();
        off.extend(["--summary", "off"]);
        assert_eq!(config(&off).summary, None);
        let mut cheap = openai.to_vec();
        cheap.extend(["--summary-model", "small-model"]);
        assert_eq!(
            config(&cheap).summary.unwrap().model.as_deref(),
            Some("small-model")
        );
        assert_eq!(config(&[]).retention, None);
        assert_eq!(
            config(&["--retention-days", "30"]).retention,
            Some(std::time::Duration::from_secs(30 * 86_400))
        );
        assert_errors_name(&[
            (&["--summary", "sometimes"], "LULL_SUMMARY"),
            (&["--retention-days", "0"], "LULL_RETENTION_DAYS"),
            (&["--retention-days", "30d"], "LULL_RETENTION_DAYS"),
            (&["--summary-model", " "], "LULL_SUMMARY_MODEL"),
        ]);
    }
}
