//! Configuration: environment variables (and a `.env` file), each also a command-line
//! flag. Defaults make `lull chat` work with nothing set.
//!
//! Parsing happens in two steps: clap reads every value into [`Settings`] (a value
//! that does not parse stops the program with a message naming its variable), then
//! [`Config::from_settings`] checks the values together (settings that cannot work,
//! such as a debounce not shorter than its cap) and builds the typed [`Config`].

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use secrecy::{ExposeSecret, SecretString};

pub use lull_adapters::discord::Shards as DiscordShards;
use lull_adapters::http::{WebhookSecret, WebhookSettings};
use lull_core::access::{Access, AccessList, Admins};
use lull_core::dispatcher::DispatchSettings;
use lull_core::limits::{Limits, TimeZone};
use lull_core::llm::HistoryBudget;
use lull_core::llm::echo::EchoDelay;
use lull_core::llm::openai::OpenAiSettings;
use lull_core::llm::transcribe::TranscribeSettings;
use lull_core::store::DatabaseUrl;
use lull_core::timing::{LeaseTiming, TimerPolicy};

pub const DEFAULT_TELEGRAM_API_URL: &str = "https://api.telegram.org";
pub const DEFAULT_DISCORD_API_URL: &str = "https://discord.com";
pub const DEFAULT_OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
pub const DEFAULT_OPENAI_MODEL: &str = "gpt-4.1-mini";
/// About as many tokens as `LULL_MAX_REPLY_CHARS`' default holds characters of
/// English, so the model is not asked for more than lull would send.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
/// The system prompt when `LULL_SYSTEM_PROMPT` is unset (a sentence to the model: with
/// the others, in the core's `texts`).
pub use lull_core::texts::DEFAULT_SYSTEM_PROMPT;

/// lull: a self-hosted AI chat bot that waits for a lull in the conversation and answers once.
#[derive(Debug, Parser)]
#[command(name = "lull", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub settings: Settings,
}

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Run the configured adapters, the scheduler and the HTTP server (the default).
    Run,
    /// Chat in the terminal: each input line is a message, replies go to stdout.
    Chat,
    /// Check the configuration and every connection it names; print a report.
    Check,
    /// Ask a running lull's /healthz (exit 0 when healthy), for container health checks.
    Healthcheck,
    /// Copy the SQLite database to PATH (a new file), consistently, while lull runs.
    Backup {
        /// Where to write the copy; an existing file is never overwritten.
        path: std::path::PathBuf,
    },
}

/// A `LULL_ALLOWED_CHATS` list.
fn chat_list(s: &str) -> Result<AccessList, String> {
    AccessList::parse(s, "LULL_ALLOWED_CHATS")
}

fn secret(s: &str) -> Result<SecretString, std::convert::Infallible> {
    Ok(SecretString::from(s))
}

/// Every setting, as read from flags and the environment.
#[derive(Debug, Clone, Args)]
pub struct Settings {
    /// Telegram bot token; enables the Telegram adapter.
    #[arg(long, global = true, env = "TELEGRAM_BOT_TOKEN", hide_env_values = true, value_parser = secret)]
    pub telegram_bot_token: Option<SecretString>,
    /// teloxide's name for the Telegram token.
    #[arg(long, global = true, env = "TELOXIDE_TOKEN", hide = true, hide_env_values = true, value_parser = secret)]
    pub teloxide_token: Option<SecretString>,
    /// Telegram Bot API base URL (a self-hosted Bot API server, tests).
    #[arg(long, global = true, env = "TELEGRAM_API_URL", default_value = DEFAULT_TELEGRAM_API_URL)]
    pub telegram_api_url: String,
    /// Public HTTPS URL Telegram POSTs updates to (webhook mode: every replica receives, none polls) [default: long polling]
    #[arg(long, global = true, env = "LULL_TELEGRAM_WEBHOOK_URL")]
    pub telegram_webhook_url: Option<String>,

    /// Discord bot token; enables the Discord adapter.
    #[arg(long, global = true, env = "DISCORD_BOT_TOKEN", hide_env_values = true, value_parser = secret)]
    pub discord_bot_token: Option<SecretString>,
    /// serenity's name for the Discord token.
    #[arg(long, global = true, env = "DISCORD_TOKEN", hide = true, hide_env_values = true, value_parser = secret)]
    pub discord_token: Option<SecretString>,
    /// Discord REST base URL; the gateway URL is read from it.
    #[arg(long, global = true, env = "DISCORD_API_URL", default_value = DEFAULT_DISCORD_API_URL)]
    pub discord_api_url: String,
    /// Discord gateway shards: a number, or `auto` (Discord's recommendation); replicas split them, one lease per shard.
    #[arg(long, global = true, env = "LULL_DISCORD_SHARDS", default_value = "1")]
    pub discord_shards: DiscordShards,

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
        default_value_t = 60_000
    )]
    pub llm_timeout_ms: u64,
    /// Retries of a failed model request within one round (timeouts, connection errors, 429, 5xx).
    #[arg(long, global = true, env = "LULL_LLM_RETRIES", default_value_t = 3)]
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
        default_value_t = lull_core::dispatcher::MAX_REPLY_CHARS
    )]
    pub max_reply_chars: usize,
    /// Earlier messages (user turns and replies) sent to the model as history.
    #[arg(
        long,
        global = true,
        env = "LULL_HISTORY_MESSAGES",
        default_value_t = 20
    )]
    pub history_messages: usize,
    /// Character budget of that history; the oldest exchanges are left out first.
    #[arg(
        long,
        global = true,
        env = "LULL_HISTORY_CHARS",
        default_value_t = 16_000
    )]
    pub history_chars: usize,
    /// Live drafts: `auto` shows each reply while it is written where the platform has drafts (Telegram private chats, `lull chat` on a terminal); `off` never.
    #[arg(long, global = true, env = "LULL_STREAM", default_value = "auto")]
    pub stream: StreamMode,
    /// Images: `auto` sends the images of the messages being answered to the model (OpenAI-style image parts; a model that refuses them gets the text, and the user is told once); `off` shows the model only an "[image]" marker.
    #[arg(long, global = true, env = "LULL_VISION", default_value = "auto")]
    pub vision: VisionMode,
    /// Largest image read, in bytes: Telegram photos are taken in the largest size under it; a larger image is not read and the user is told.
    #[arg(
        long,
        global = true,
        env = "LULL_MAX_IMAGE_BYTES",
        default_value_t = lull_core::dispatcher::MAX_IMAGE_BYTES
    )]
    pub max_image_bytes: u64,
    /// Transcription model for voice messages and audio files (an OpenAI-compatible `/audio/transcriptions`); with `LULL_LLM=echo` nothing is transcribed.
    #[arg(
        long,
        global = true,
        env = "LULL_TRANSCRIBE_MODEL",
        default_value = "whisper-1"
    )]
    pub transcribe_model: String,
    /// API base of the transcription server (a local whisper server); default: OPENAI_BASE_URL, with the same key.
    #[arg(long, global = true, env = "LULL_TRANSCRIBE_BASE_URL")]
    pub transcribe_base_url: Option<String>,
    /// Longest voice message or audio file transcribed, in seconds; a longer one is not, and the user is told.
    #[arg(
        long,
        global = true,
        env = "LULL_MAX_AUDIO_SECONDS",
        default_value_t = 300
    )]
    pub max_audio_seconds: u32,

    /// Database: `sqlite:PATH` (processes on one host), or `postgres://…` for replicas on several hosts.
    #[arg(
        long,
        global = true,
        env = "DATABASE_URL",
        default_value = "sqlite:lull.db"
    )]
    pub database_url: String,

    /// Debounce window: a reply waits this long after the last message.
    #[arg(long, global = true, env = "LULL_DEBOUNCE_MS", default_value_t = 1500)]
    pub debounce_ms: u64,
    /// Cap of the debounce window, counted from the oldest unanswered message.
    #[arg(
        long,
        global = true,
        env = "LULL_MAX_WAIT_MS",
        default_value_t = 10_000
    )]
    pub max_wait_ms: u64,
    /// Answer at once when this many messages are pending.
    #[arg(long, global = true, env = "LULL_MAX_BATCH", default_value_t = 20)]
    pub max_batch: u32,
    /// Lease lifetime; a crashed process's conversations are taken over after it.
    #[arg(
        long,
        global = true,
        env = "LULL_LEASE_TTL_MS",
        default_value_t = 30_000
    )]
    pub lease_ttl_ms: u64,
    /// Lease renewal interval [default: a third of LULL_LEASE_TTL_MS]
    #[arg(long, global = true, env = "LULL_LEASE_RENEW_MS")]
    pub lease_renew_ms: Option<u64>,
    /// How often to look for work armed by other processes.
    #[arg(long, global = true, env = "LULL_POLL_MS", default_value_t = 1000)]
    pub poll_ms: u64,

    /// Address of the HTTP server (health, metrics, http adapter).
    #[arg(
        long,
        global = true,
        env = "LULL_HTTP_ADDR",
        default_value = "127.0.0.1:8080"
    )]
    pub http_addr: SocketAddr,
    /// Where the http adapter POSTs replies; enables the http adapter.
    #[arg(long, global = true, env = "LULL_WEBHOOK_URL")]
    pub webhook_url: Option<String>,
    /// Bearer token the http adapter requires.
    #[arg(long, global = true, env = "LULL_HTTP_TOKEN", hide_env_values = true, value_parser = secret)]
    pub http_token: Option<SecretString>,
    /// Key that signs webhook requests: `whsec_` and base64 (Standard Webhooks) [default: unsigned]
    #[arg(long, global = true, env = "LULL_WEBHOOK_SECRET", hide_env_values = true, value_parser = secret)]
    pub webhook_secret: Option<SecretString>,
    /// Time limit of one webhook POST, in milliseconds; a slower answer is a failed attempt.
    #[arg(
        long,
        global = true,
        env = "LULL_WEBHOOK_TIMEOUT_MS",
        default_value_t = 30_000
    )]
    pub webhook_timeout_ms: u64,
    /// How long a reply the webhook keeps refusing is retried before it is given up: `30s`, `15m`, `24h`, `1d`.
    #[arg(
        long,
        global = true,
        env = "LULL_WEBHOOK_MAX_AGE",
        default_value = "1d"
    )]
    pub webhook_max_age: humantime::Duration,

    /// Delay of the echo responder: `N` or `MIN..MAX` milliseconds.
    #[arg(long, global = true, env = "LULL_ECHO_DELAY_MS", default_value = "0")]
    pub echo_delay_ms: EchoDelay,
    /// Time to finish generations and sends in flight on SIGTERM, in milliseconds; a hard limit.
    #[arg(
        long,
        global = true,
        env = "LULL_SHUTDOWN_GRACE_MS",
        default_value_t = 10_000
    )]
    pub shutdown_grace_ms: u64,
    /// Who may use the bot: `platform:user_id` entries, `platform:*` or `*` [default: local users only]
    #[arg(
        long,
        global = true,
        env = "LULL_ALLOWED_USERS",
        default_value = "",
        hide_default_value = true
    )]
    pub allowed_users: AccessList,
    /// Groups and servers whose every member may use the bot: `telegram:<chat_id>`, `discord:<server or channel id>`, `platform:*` [default: none]
    #[arg(
        long,
        global = true,
        env = "LULL_ALLOWED_CHATS",
        default_value = "",
        hide_default_value = true,
        value_parser = chat_list
    )]
    pub allowed_chats: AccessList,
    /// Admins, `platform:user_id` entries: they alone /reset groups, see others' /usage, and /allow or /deny users and chats at run time [default: none]
    #[arg(
        long,
        global = true,
        env = "LULL_ADMINS",
        default_value = "",
        hide_default_value = true
    )]
    pub admins: Admins,
    /// Messages one user may send per minute; more are kept and answered together once the minute has room (0: no limit)
    #[arg(long, global = true, env = "LULL_RATE_PER_MIN", default_value_t = 0)]
    pub rate_per_min: u32,
    /// Tokens one user may spend per day (0: no limit)
    #[arg(
        long,
        global = true,
        env = "LULL_USER_DAILY_TOKENS",
        default_value_t = 0
    )]
    pub user_daily_tokens: u64,
    /// Tokens the whole bot may spend per day (0: no limit)
    #[arg(long, global = true, env = "LULL_DAILY_TOKENS", default_value_t = 0)]
    pub daily_tokens: u64,
    /// Time zone whose midnight resets the daily budgets: an IANA name such as Europe/Berlin
    #[arg(long, global = true, env = "LULL_TIMEZONE", default_value = "UTC")]
    pub timezone: TimeZone,

    /// Log format: `text` or `json`.
    #[arg(long, global = true, env = "LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
    /// Log filter, tracing's EnvFilter syntax [default: info; warn for `lull chat`]
    #[arg(long, global = true, env = "RUST_LOG")]
    pub log_filter: Option<String>,
}

impl Settings {
    /// Every secret among the settings, set or not, hidden aliases included. The
    /// binary registers them for redaction ([`lull_port::secrets::register`]) before
    /// anything logs. A new secret setting goes here too; the test
    /// `every_hidden_value_is_a_registered_secret` fails until it does.
    pub fn secrets(&self) -> impl Iterator<Item = &SecretString> {
        [
            &self.telegram_bot_token,
            &self.teloxide_token,
            &self.discord_bot_token,
            &self.discord_token,
            &self.openai_api_key,
            &self.http_token,
            &self.webhook_secret,
        ]
        .into_iter()
        .flatten()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LlmKind {
    Openai,
    Echo,
}

/// `LULL_STREAM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StreamMode {
    /// Live drafts where the platform has them; the model's answer is streamed for them.
    Auto,
    /// No drafts: the model is asked for whole answers, as before streaming.
    Off,
}

/// `LULL_VISION`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum VisionMode {
    /// Images of the messages being answered go to the model as image parts.
    Auto,
    /// The model sees only an "[image]" marker; no image is fetched.
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// A configuration that cannot work. The message names the variable to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

impl From<lull_core::timing::TimingError> for ConfigError {
    fn from(e: lull_core::timing::TimingError) -> Self {
        ConfigError(e.to_string())
    }
}

/// Which responder answers.
#[derive(Debug, Clone)]
pub enum LlmConfig {
    Echo(EchoDelay),
    OpenAi(OpenAiSettings),
}

/// A platform's connection settings (the adapters' own type).
pub use lull_adapters::PlatformSettings as PlatformConfig;

/// The http adapter's settings.
#[derive(Debug, Clone)]
pub struct HttpAdapterConfig {
    pub webhook: WebhookSettings,
    pub token: Option<SecretString>,
}

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub telegram: Option<PlatformConfig>,
    /// Webhook mode (`LULL_TELEGRAM_WEBHOOK_URL`): Telegram POSTs updates here; no
    /// process polls.
    pub telegram_webhook: Option<url::Url>,
    pub discord: Option<PlatformConfig>,
    pub discord_shards: DiscordShards,
    pub llm: LlmConfig,
    /// Voice messages and audio files: transcribed with these settings; `None` with
    /// the echo responder (they reach it as their marker).
    pub transcribe: Option<TranscribeSettings>,
    /// The echo responder was chosen because neither `OPENAI_API_KEY` nor
    /// `OPENAI_BASE_URL` is set (not by `LULL_LLM=echo`): `lull run` warns.
    pub echo_by_default: bool,
    pub llm_retries: u32,
    /// How much earlier conversation the model sees (the responder trims to it).
    pub history: HistoryBudget,
    pub database: DatabaseUrl,
    /// The core's settings, declared once in the core.
    pub dispatch: DispatchSettings,
    pub http_addr: SocketAddr,
    pub http_adapter: Option<HttpAdapterConfig>,
}

/// An http(s) URL with a host, or an error naming the variable. Returned without a
/// trailing slash, so paths can be appended.
fn http_url(variable: &str, value: &str) -> Result<String, ConfigError> {
    let value = value.trim();
    let invalid = |why: &str| {
        ConfigError(format!(
            "{variable} must be an http:// or https:// URL with a host ({why}), got '{value}'"
        ))
    };
    let parsed = url::Url::parse(value).map_err(|e| invalid(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(invalid("wrong scheme"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(invalid("no host"));
    }
    Ok(value.trim_end_matches('/').to_owned())
}

/// Paths of the binary's own routes, which the Telegram webhook must not take.
const RESERVED_PATHS: [&str; 3] = ["/healthz", "/metrics", "/api/messages"];

/// `LULL_TELEGRAM_WEBHOOK_URL`: HTTPS (Telegram sends updates to nothing else; plain
/// http only to a loopback host, for tests and a local Bot API server), with a path
/// lull can serve as a route.
fn telegram_webhook_url(value: &str) -> Result<url::Url, ConfigError> {
    const VARIABLE: &str = "LULL_TELEGRAM_WEBHOOK_URL";
    let value = value.trim();
    let invalid = |why: &str| ConfigError(format!("{VARIABLE} {why}, got '{value}'"));
    let url = url::Url::parse(value).map_err(|e| invalid(&format!("must be a URL ({e})")))?;
    let loopback = match url.host() {
        Some(url::Host::Domain(host)) => host.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => return Err(invalid("must name a host")),
    };
    match url.scheme() {
        "https" => {}
        "http" if loopback => {}
        _ => {
            return Err(invalid(
                "must be an https:// URL (Telegram delivers webhooks over HTTPS only; http:// is accepted for loopback hosts)",
            ));
        }
    }
    let path = url.path();
    if !path
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "/-_.~".contains(c))
        || path.contains("//")
    {
        return Err(invalid(
            "must have a plain path (letters, digits and / - _ . ~)",
        ));
    }
    if RESERVED_PATHS.contains(&path.trim_end_matches('/')) {
        return Err(invalid(&format!(
            "must not use the path {path}: lull serves it itself"
        )));
    }
    Ok(url)
}

/// `DATABASE_URL`: `sqlite:PATH` (also `sqlite://PATH`), or `postgres://…`
/// (also `postgresql://…`); anything else fails naming the variable.
pub fn database_url(url: &str) -> Result<DatabaseUrl, ConfigError> {
    DatabaseUrl::parse(url).map_err(ConfigError)
}

fn positive(variable: &str, ms: u64) -> Result<Duration, ConfigError> {
    if ms == 0 {
        return Err(ConfigError(format!("{variable} must be greater than 0")));
    }
    Ok(Duration::from_millis(ms))
}

/// A byte count that must be positive, or an error naming the variable.
fn positive_bytes(name: &str, bytes: u64) -> Result<u64, ConfigError> {
    if bytes == 0 {
        return Err(ConfigError(format!(
            "{name} must be a positive number of bytes, got 0"
        )));
    }
    Ok(bytes)
}

impl Config {
    /// Check the settings together and build the configuration.
    pub fn from_settings(s: &Settings) -> Result<Config, ConfigError> {
        let telegram = s
            .telegram_bot_token
            .clone()
            .or_else(|| s.teloxide_token.clone())
            .map(|token| {
                Ok::<_, ConfigError>(PlatformConfig {
                    token,
                    api_url: http_url("TELEGRAM_API_URL", &s.telegram_api_url)?,
                    max_image_bytes: s.max_image_bytes,
                })
            })
            .transpose()?;
        let telegram_webhook = s
            .telegram_webhook_url
            .as_deref()
            .map(telegram_webhook_url)
            .transpose()?;
        if telegram_webhook.is_some() && telegram.is_none() {
            return Err(ConfigError(
                "LULL_TELEGRAM_WEBHOOK_URL is set but TELEGRAM_BOT_TOKEN is not: the webhook is the Telegram adapter's".into(),
            ));
        }
        let discord = s
            .discord_bot_token
            .clone()
            .or_else(|| s.discord_token.clone())
            .map(|token| {
                Ok::<_, ConfigError>(PlatformConfig {
                    token,
                    api_url: http_url("DISCORD_API_URL", &s.discord_api_url)?,
                    max_image_bytes: s.max_image_bytes,
                })
            })
            .transpose()?;

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

        let transcribe = match &llm {
            LlmConfig::Echo(_) => None,
            LlmConfig::OpenAi(openai) => {
                if s.transcribe_model.trim().is_empty() {
                    return Err(ConfigError(
                        "LULL_TRANSCRIBE_MODEL must not be empty".into(),
                    ));
                }
                Some(TranscribeSettings {
                    base_url: match &s.transcribe_base_url {
                        Some(url) => http_url("LULL_TRANSCRIBE_BASE_URL", url)?,
                        None => openai.base_url.clone(),
                    },
                    api_key: openai.api_key.clone(),
                    model: s.transcribe_model.trim().to_owned(),
                    timeout: openai.timeout,
                })
            }
        };
        if s.max_audio_seconds == 0 {
            return Err(ConfigError(
                "LULL_MAX_AUDIO_SECONDS must be a positive number of seconds, got 0".into(),
            ));
        }

        if s.max_reply_chars < lull_core::dispatcher::MIN_REPLY_CHARS {
            return Err(ConfigError(format!(
                "LULL_MAX_REPLY_CHARS must be at least {} (room for a reply and the note that it was cut), got {}",
                lull_core::dispatcher::MIN_REPLY_CHARS,
                s.max_reply_chars
            )));
        }
        let timers = TimerPolicy::new(
            Duration::from_millis(s.debounce_ms),
            positive("LULL_MAX_WAIT_MS", s.max_wait_ms)?,
            s.max_batch,
        )?;
        let ttl = positive("LULL_LEASE_TTL_MS", s.lease_ttl_ms)?;
        let lease = match s.lease_renew_ms {
            Some(renew) => LeaseTiming::new(ttl, Duration::from_millis(renew))?,
            None => LeaseTiming::with_ttl(ttl)?,
        };

        let webhook_secret = s
            .webhook_secret
            .as_ref()
            .map(|secret| {
                WebhookSecret::parse(secret.expose_secret())
                    .map_err(|e| ConfigError(format!("LULL_WEBHOOK_SECRET: {e}")))
            })
            .transpose()?;
        let webhook_timeout = positive("LULL_WEBHOOK_TIMEOUT_MS", s.webhook_timeout_ms)?;
        let webhook_max_age: Duration = s.webhook_max_age.into();
        if webhook_max_age.is_zero() {
            return Err(ConfigError(
                "LULL_WEBHOOK_MAX_AGE must be greater than 0 (for example 1d)".into(),
            ));
        }
        let http_adapter = s
            .webhook_url
            .as_deref()
            .map(|url| {
                Ok::<_, ConfigError>(HttpAdapterConfig {
                    webhook: WebhookSettings {
                        url: http_url("LULL_WEBHOOK_URL", url)?,
                        secret: webhook_secret.clone(),
                        timeout: webhook_timeout,
                        max_age: webhook_max_age,
                    },
                    token: s.http_token.clone(),
                })
            })
            .transpose()?;
        if let Some(adapter) = &http_adapter
            && adapter.token.is_none()
            && !s.http_addr.ip().is_loopback()
        {
            return Err(ConfigError(format!(
                "LULL_HTTP_TOKEN is required when the http adapter (LULL_WEBHOOK_URL) listens on a non-loopback address (LULL_HTTP_ADDR={})",
                s.http_addr
            )));
        }

        // Reserved before each reply: the most a reply may take, after the system
        // prompt (part of every prompt; the echo responder sends none).
        let (reply_tokens, system_tokens) = match &llm {
            LlmConfig::OpenAi(settings) => (
                u64::from(settings.max_tokens),
                lull_core::limits::text_tokens(&settings.system_prompt),
            ),
            LlmConfig::Echo(_) => (lull_core::limits::estimate_tokens(s.max_reply_chars), 0),
        };
        let limits = Limits {
            rate_per_min: s.rate_per_min,
            user_daily_tokens: s.user_daily_tokens,
            daily_tokens: s.daily_tokens,
            timezone: s.timezone.clone(),
            reply_tokens,
            system_tokens,
        };
        // A budget that cannot hold one reply would hold messages for ever.
        limits.check().map_err(ConfigError)?;
        Ok(Config {
            telegram,
            telegram_webhook,
            discord,
            discord_shards: s.discord_shards,
            transcribe,
            llm,
            echo_by_default: s.llm.is_none() && matches!(kind, LlmKind::Echo),
            llm_retries: s.llm_retries,
            history,
            database: database_url(&s.database_url)?,
            dispatch: DispatchSettings {
                timers,
                lease,
                poll_every: positive("LULL_POLL_MS", s.poll_ms)?,
                history: history.exchanges(),
                shutdown_grace: Duration::from_millis(s.shutdown_grace_ms),
                access: Access {
                    users: s.allowed_users.clone(),
                    chats: s.allowed_chats.clone(),
                    admins: s.admins.clone(),
                },
                limits,
                max_reply_chars: s.max_reply_chars,
                drafts: s.stream == StreamMode::Auto,
                vision: s.vision == VisionMode::Auto,
                max_image_bytes: positive_bytes("LULL_MAX_IMAGE_BYTES", s.max_image_bytes)?,
                max_audio_seconds: s.max_audio_seconds,
                ..DispatchSettings::default()
            },
            http_addr: s.http_addr,
            http_adapter,
        })
    }
}

impl Cli {
    /// Parse the command line and environment. A value that does not parse ends the
    /// program with clap's message, prefixed with the variable it came from.
    pub fn parse_or_exit() -> Cli {
        use clap::CommandFactory;
        use clap::error::{ContextKind, ContextValue, ErrorKind};
        match Cli::try_parse() {
            Ok(cli) => cli,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ValueValidation | ErrorKind::InvalidValue
                ) =>
            {
                let variable = match e.get(ContextKind::InvalidArg) {
                    Some(ContextValue::String(arg)) => Cli::command()
                        .get_arguments()
                        .find(|a| {
                            a.get_long().is_some_and(|l| {
                                arg.starts_with(&format!("--{l} ")) || arg == &format!("--{l}")
                            })
                        })
                        .and_then(|a| a.get_env().map(|v| v.to_string_lossy().into_owned())),
                    _ => None,
                };
                match variable {
                    Some(variable) => {
                        eprintln!(
                            "lull: invalid {variable}: {}",
                            e.render()
                                .to_string()
                                .trim_start_matches("error: ")
                                .trim_end()
                        );
                        std::process::exit(2);
                    }
                    None => e.exit(),
                }
            }
            Err(e) => e.exit(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(args: &[&str]) -> Settings {
        let mut argv = vec!["lull"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).expect("parses").settings
    }

    #[test]
    fn the_telegram_webhook_url_must_be_https_except_on_loopback() {
        let with = |url: &str| {
            Config::from_settings(&settings(&[
                "--telegram-bot-token",
                "123:abc",
                "--telegram-webhook-url",
                url,
            ]))
        };
        let ok = with("https://bot.example/telegram/hook").unwrap();
        assert_eq!(ok.telegram_webhook.unwrap().path(), "/telegram/hook");
        assert!(with("http://127.0.0.1:8080/tg").is_ok());
        assert!(with("http://localhost/tg").is_ok());
        assert!(with("http://[::1]:9/tg").is_ok());
        for bad in [
            "http://bot.example/tg",
            "ftp://bot.example/tg",
            "not a url",
            "https://bot.example/{x}",
            "https://bot.example/healthz",
            "https://bot.example/api/messages",
        ] {
            let e = with(bad).unwrap_err();
            assert!(e.0.contains("LULL_TELEGRAM_WEBHOOK_URL"), "{bad}: {e}");
        }
        let e = Config::from_settings(&settings(&[
            "--telegram-webhook-url",
            "https://bot.example/tg",
        ]))
        .unwrap_err();
        assert!(e.0.contains("TELEGRAM_BOT_TOKEN"), "{e}");
    }

    #[test]
    fn discord_shards_are_a_count_or_auto() {
        let shards = |v: &str| Cli::try_parse_from(["lull", "--discord-shards", v]);
        assert_eq!(
            shards("auto").unwrap().settings.discord_shards,
            DiscordShards::Auto
        );
        assert_eq!(
            shards("4").unwrap().settings.discord_shards,
            DiscordShards::Fixed(4)
        );
        assert!(shards("0").is_err());
        assert_eq!(
            Config::from_settings(&settings(&[]))
                .unwrap()
                .discord_shards,
            DiscordShards::Fixed(1)
        );
    }

    #[test]
    fn defaults_give_echo_on_sqlite() {
        let config = Config::from_settings(&settings(&[])).unwrap();
        assert!(matches!(config.llm, LlmConfig::Echo(_)));
        assert!(
            matches!(&config.database, DatabaseUrl::Sqlite(path) if path == std::path::Path::new("lull.db"))
        );
        assert_eq!(
            config.dispatch.timers.debounce(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            config.dispatch.timers.max_wait(),
            Duration::from_millis(10_000)
        );
        assert_eq!(config.dispatch.lease.ttl(), Duration::from_secs(30));
        assert!(config.dispatch.drafts, "LULL_STREAM=auto");
        assert!(
            !Config::from_settings(&settings(&["--stream", "off"]))
                .unwrap()
                .dispatch
                .drafts
        );
        assert!(
            config.telegram.is_none() && config.discord.is_none() && config.http_adapter.is_none()
        );
    }

    #[test]
    fn every_hidden_value_is_a_registered_secret() {
        use clap::CommandFactory;
        let hidden: Vec<String> = Cli::command()
            .get_arguments()
            .filter(|a| a.is_hide_env_values_set())
            .map(|a| a.get_long().expect("a flag").to_owned())
            .collect();
        assert!(hidden.len() >= 6, "{hidden:?}");
        let mut args = Vec::new();
        for (i, long) in hidden.iter().enumerate() {
            args.push(format!("--{long}"));
            args.push(format!("secret-value-{i}"));
        }
        let s = settings(&args.iter().map(String::as_str).collect::<Vec<_>>());
        use secrecy::ExposeSecret;
        let registered: Vec<&str> = s.secrets().map(|s| s.expose_secret()).collect();
        for (i, long) in hidden.iter().enumerate() {
            assert!(
                registered.contains(&format!("secret-value-{i}").as_str()),
                "--{long} hides its value but is missing from Settings::secrets"
            );
        }
    }

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
        let cases: &[(&[&str], &str)] = &[
            (
                &["--debounce-ms", "5000", "--max-wait-ms", "4000"],
                "LULL_DEBOUNCE_MS",
            ),
            (
                &["--lease-ttl-ms", "1000", "--lease-renew-ms", "500"],
                "LULL_LEASE_TTL_MS",
            ),
            (&["--database-url", "mysql://x"], "DATABASE_URL"),
            (&["--database-url", "postgres://"], "DATABASE_URL"),
            (&["--llm", "openai"], "OPENAI_API_KEY"),
            (&["--webhook-url", "ftp://x"], "LULL_WEBHOOK_URL"),
            (
                &["--webhook-url", "http://:8080/replies"],
                "LULL_WEBHOOK_URL",
            ),
            (
                &[
                    "--telegram-bot-token",
                    "t",
                    "--telegram-api-url",
                    "not a url",
                ],
                "TELEGRAM_API_URL",
            ),
            (
                &[
                    "--webhook-url",
                    "http://127.0.0.1:9/x",
                    "--http-addr",
                    "0.0.0.0:8080",
                ],
                "LULL_HTTP_TOKEN",
            ),
            (&["--max-wait-ms", "0"], "LULL_MAX_WAIT_MS"),
            (&["--max-reply-chars", "10"], "LULL_MAX_REPLY_CHARS"),
            (&["--webhook-secret", "s3cret"], "LULL_WEBHOOK_SECRET"),
            (&["--webhook-secret", "whsec_%%%"], "LULL_WEBHOOK_SECRET"),
            (&["--webhook-timeout-ms", "0"], "LULL_WEBHOOK_TIMEOUT_MS"),
            (&["--webhook-max-age", "0s"], "LULL_WEBHOOK_MAX_AGE"),
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
        ];
        for (args, variable) in cases {
            let e = Config::from_settings(&settings(args)).unwrap_err().0;
            assert!(e.contains(variable), "{args:?}: {e}");
        }
    }

    #[test]
    fn webhook_settings_take_human_durations_and_keep_the_secret_hidden() {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        for (age, seconds) in [("30s", 30), ("15m", 900), ("24h", 86_400), ("1d", 86_400)] {
            let config = Config::from_settings(&settings(&[
                "--webhook-url",
                "http://127.0.0.1:9/replies",
                "--webhook-secret",
                secret,
                "--webhook-max-age",
                age,
            ]))
            .unwrap();
            let webhook = &config.http_adapter.as_ref().unwrap().webhook;
            assert_eq!(webhook.max_age, Duration::from_secs(seconds), "{age}");
            assert_eq!(webhook.timeout, Duration::from_secs(30));
            assert!(webhook.secret.is_some());
            let shown = format!("{config:?}");
            assert!(
                !shown.contains("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
                "{shown}"
            );
        }
        assert!(
            Cli::try_parse_from(["lull", "--webhook-max-age", "a while"]).is_err(),
            "a duration without a unit is refused"
        );
    }
}

/// The README's configuration table and `.env.example` are promises to users: these
/// tests fail when they and the code disagree.
#[cfg(test)]
mod documentation {
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
                            .then(|| super::DEFAULT_OPENAI_BASE_URL.to_owned())
                    });
                Some((env, (flag, default)))
            })
            .collect()
    }

    /// README rows: `| `VAR` | `--flag` | meaning | default |`.
    fn readme_rows() -> BTreeMap<String, (String, String)> {
        include_str!("../README.md")
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
            "variables in the code vs the README table"
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
                    "{variable}: default in the README"
                ),
                _ => assert!(
                    !(readme_default.starts_with('`')
                        && readme_default.ends_with('`')
                        && readme_default.matches('`').count() == 2),
                    "{variable}: the README names a literal default the code does not have"
                ),
            }
        }
    }

    #[test]
    fn env_example_mentions_every_variable() {
        let example = include_str!("../.env.example");
        for variable in variables().keys() {
            assert!(
                example.contains(&format!("#{variable}="))
                    || example.contains(&format!("\n{variable}=")),
                "{variable} is missing from .env.example"
            );
        }
    }
}
