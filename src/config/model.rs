//! The model: which responder answers (`openai` or `echo`), the OpenAI-compatible
//! server and its request settings, the history it sees, and how long a reply may be
//! and how it is shown while it is written.

use clap::Args;
use lull_core::dispatcher;
use lull_core::llm::HistoryBudget;
use lull_core::llm::echo::EchoDelay;
use lull_core::llm::openai::OpenAiSettings;
use secrecy::SecretString;

use super::{ConfigError, DEFAULT_SYSTEM_PROMPT, http_url, positive, secret};

pub(super) const DEFAULT_OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
pub(super) const DEFAULT_OPENAI_MODEL: &str = "gpt-4.1-mini";
/// About as many tokens as `LULL_MAX_REPLY_CHARS`' default holds characters of
/// English, so the model is not asked for more than lull would send.
pub(super) const DEFAULT_MAX_TOKENS: u32 = 4096;
/// `LULL_LLM_TIMEOUT_MS`.
const DEFAULT_LLM_TIMEOUT_MS: u64 = 60_000;
/// `LULL_LLM_RETRIES`.
const DEFAULT_LLM_RETRIES: u32 = 3;
/// `LULL_ECHO_DELAY_MS`: the echo responder answers at once.
const DEFAULT_ECHO_DELAY_MS: &str = "0";

/// `OPENAI_*`, `LULL_LLM*`, `LULL_SYSTEM_PROMPT`, `LULL_TEMPERATURE`,
/// `LULL_MAX_TOKENS`, `LULL_MAX_REPLY_CHARS`, `LULL_HISTORY_*`, `LULL_STREAM`,
/// `LULL_ECHO_DELAY_MS`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "The model")]
pub(crate) struct ModelArgs {
    /// API key of the LLM server (optional for local servers).
    #[arg(long, global = true, env = "OPENAI_API_KEY", hide_env_values = true, value_parser = secret)]
    pub openai_api_key: Option<SecretString>,
    /// Base URL of any OpenAI-compatible server [default: OpenAI's]
    #[arg(long, global = true, env = "OPENAI_BASE_URL")]
    pub openai_base_url: Option<String>,
    /// Older name of OPENAI_BASE_URL.
    #[arg(long, global = true, env = "OPENAI_API_BASE", hide = true)]
    pub openai_api_base: Option<String>,
    /// Model name.
    #[arg(long, global = true, env = "OPENAI_MODEL", default_value = DEFAULT_OPENAI_MODEL)]
    pub openai_model: String,
    /// `openai` or `echo` (offline) [default: openai if a key or base URL is set, else echo]
    #[arg(long, global = true, env = "LULL_LLM")]
    pub llm: Option<LlmKind>,
    /// System prompt.
    #[arg(long, global = true, env = "LULL_SYSTEM_PROMPT", default_value = DEFAULT_SYSTEM_PROMPT, hide_default_value = true)]
    pub system_prompt: String,
    /// Time limit of one model request, in milliseconds; for a streamed answer, of the wait for its first words and of every pause.
    #[arg(
        long,
        global = true,
        env = "LULL_LLM_TIMEOUT_MS",
        default_value_t = DEFAULT_LLM_TIMEOUT_MS
    )]
    pub llm_timeout_ms: u64,
    /// Retries of a failed model request within one round (timeouts, connection errors, 429, 5xx).
    #[arg(long, global = true, env = "LULL_LLM_RETRIES", default_value_t = DEFAULT_LLM_RETRIES)]
    pub llm_retries: u32,
    /// Sampling temperature, 0 to 2 [default: the server's]
    #[arg(long, global = true, env = "LULL_TEMPERATURE")]
    pub temperature: Option<f32>,
    /// Longest reply the model may generate, in tokens.
    #[arg(long, global = true, env = "LULL_MAX_TOKENS", default_value_t = DEFAULT_MAX_TOKENS)]
    pub max_tokens: u32,
    /// Longest reply lull sends, in characters; a longer one is cut with a note.
    #[arg(
        long,
        global = true,
        env = "LULL_MAX_REPLY_CHARS",
        default_value_t = dispatcher::MAX_REPLY_CHARS
    )]
    pub max_reply_chars: usize,
    /// Earlier messages (user turns and replies) sent to the model as history.
    #[arg(
        long,
        global = true,
        env = "LULL_HISTORY_MESSAGES",
        default_value_t = dispatcher::HISTORY_MESSAGES
    )]
    pub history_messages: usize,
    /// Character budget of that history; the oldest exchanges are left out first.
    #[arg(
        long,
        global = true,
        env = "LULL_HISTORY_CHARS",
        default_value_t = dispatcher::HISTORY_CHARS
    )]
    pub history_chars: usize,
    /// Live drafts: `auto` shows each reply while it is written where the platform has drafts (Telegram private chats, `lull chat` on a terminal); `off` never.
    #[arg(long, global = true, env = "LULL_STREAM", default_value = "auto")]
    pub stream: StreamMode,
    /// Delay of the echo responder: `N` or `MIN..MAX` milliseconds.
    #[arg(long, global = true, env = "LULL_ECHO_DELAY_MS", default_value = DEFAULT_ECHO_DELAY_MS)]
    pub echo_delay_ms: EchoDelay,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LlmKind {
    Openai,
    Echo,
}

/// `LULL_STREAM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum StreamMode {
    /// Live drafts where the platform has them; the model's answer is streamed for them.
    Auto,
    /// No drafts: the model is asked for whole answers, as before streaming.
    Off,
}

/// Which responder answers.
#[derive(Debug, Clone)]
pub(crate) enum LlmConfig {
    Echo(EchoDelay),
    OpenAi(OpenAiSettings),
}

/// The responder as configured.
#[derive(Debug, Clone)]
pub(crate) struct Model {
    pub llm: LlmConfig,
    /// The echo responder was chosen because neither `OPENAI_API_KEY` nor
    /// `OPENAI_BASE_URL` is set (not by `LULL_LLM=echo`).
    pub echo_by_default: bool,
    pub history: HistoryBudget,
}

impl ModelArgs {
    /// The responder and its settings.
    pub(crate) fn check(&self) -> Result<Model, ConfigError> {
        let s = self;
        let history = HistoryBudget {
            messages: s.history_messages,
            chars: s.history_chars,
        };
        let base_url = s
            .openai_base_url
            .clone()
            .or_else(|| s.openai_api_base.clone());
        let kind = s
            .llm
            .unwrap_or(if s.openai_api_key.is_some() || base_url.is_some() {
                LlmKind::Openai
            } else {
                LlmKind::Echo
            });
        // Checked whichever responder answers: a setting that cannot work is an error
        // before the model is switched on, not after.
        if let Some(t) = s.temperature
            && !(0.0..=2.0).contains(&t)
        {
            return Err(ConfigError(format!(
                "LULL_TEMPERATURE must be between 0 and 2, got {t}"
            )));
        }
        if s.max_tokens == 0 {
            return Err(ConfigError("LULL_MAX_TOKENS must be at least 1".into()));
        }
        let llm = match kind {
            LlmKind::Echo => LlmConfig::Echo(s.echo_delay_ms),
            LlmKind::Openai => {
                let base_url = http_url(
                    "OPENAI_BASE_URL",
                    base_url.as_deref().unwrap_or(DEFAULT_OPENAI_BASE_URL),
                )?;
                if s.openai_api_key.is_none() && base_url == DEFAULT_OPENAI_BASE_URL {
                    return Err(ConfigError(
                        "OPENAI_API_KEY is required for OpenAI's API (set it, point OPENAI_BASE_URL at another server, or use LULL_LLM=echo)".into(),
                    ));
                }
                if s.openai_model.trim().is_empty() {
                    return Err(ConfigError("OPENAI_MODEL must not be empty".into()));
                }
                LlmConfig::OpenAi(OpenAiSettings {
                    base_url,
                    api_key: s.openai_api_key.clone(),
                    model: s.openai_model.trim().to_owned(),
                    system_prompt: s.system_prompt.clone(),
                    temperature: s.temperature,
                    max_tokens: s.max_tokens,
                    history,
                    timeout: positive("LULL_LLM_TIMEOUT_MS", s.llm_timeout_ms)?,
                })
            }
        };
        Ok(Model {
            llm,
            echo_by_default: s.llm.is_none() && matches!(kind, LlmKind::Echo),
            history,
        })
    }

    /// `LULL_MAX_REPLY_CHARS`, with room for a reply and the note that it was cut.
    pub(crate) fn max_reply_chars(&self) -> Result<usize, ConfigError> {
        let s = self;
        if s.max_reply_chars < dispatcher::MIN_REPLY_CHARS {
            return Err(ConfigError(format!(
                "LULL_MAX_REPLY_CHARS must be at least {} (room for a reply and the note that it was cut), got {}",
                dispatcher::MIN_REPLY_CHARS,
                s.max_reply_chars
            )));
        }
        Ok(s.max_reply_chars)
    }

    /// The secrets of this group, set or not.
    pub(super) fn secrets(&self) -> [&Option<SecretString>; 1] {
        [&self.openai_api_key]
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::super::tests::{assert_errors_name, settings};
    use super::*;

    #[test]
    fn echo_by_default_only_without_a_choice() {
        assert!(
            Config::from_settings(&settings(&[]))
                .unwrap()
                .echo_by_default
        );
        let chosen = Config::from_settings(&settings(&["--llm", "echo"])).unwrap();
        assert!(!chosen.echo_by_default);
    }

    #[test]
    fn a_base_url_selects_openai_without_a_key() {
        let config = Config::from_settings(&settings(&[
            "--openai-base-url",
            "http://127.0.0.1:11434/v1/",
        ]))
        .unwrap();
        match config.llm {
            LlmConfig::OpenAi(s) => assert_eq!(s.base_url, "http://127.0.0.1:11434/v1"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors_name_the_variable() {
        assert_errors_name(&[
            (&["--llm", "openai"], "OPENAI_API_KEY"),
            // With the echo responder too: the setting is wrong before a model is set.
            (&["--temperature", "3"], "LULL_TEMPERATURE"),
            (&["--max-reply-chars", "10"], "LULL_MAX_REPLY_CHARS"),
            (
                &[
                    "--llm",
                    "openai",
                    "--openai-api-key",
                    "k",
                    "--temperature",
                    "3",
                ],
                "LULL_TEMPERATURE",
            ),
            (
                &[
                    "--llm",
                    "openai",
                    "--openai-api-key",
                    "k",
                    "--max-tokens",
                    "0",
                ],
                "LULL_MAX_TOKENS",
            ),
        ]);
    }
}
