//! Configuration: environment variables (and a `.env` file), each also a command-line
//! flag. Defaults make `lull chat` work with nothing set.
//!
//! Parsing happens in two steps: clap reads every value into [`Settings`] (a value
//! that does not parse stops the program with a message naming its variable), then
//! [`Config::from_settings`] checks the values together (settings that cannot work,
//! such as a debounce not shorter than its cap) and builds the typed [`Config`].
//!
//! One file per group of settings, each holding its flags (a clap group flattened
//! into [`Settings`]), its checks and their tests: [`platforms`], [`model`],
//! [`media`], [`timing`], [`http`], [`access`], [`limits`], [`tools`], [`controls`],
//! [`platform_controls`], [`jobs`], [`memory`], [`summary`], [`web`]; [`unknown`] names
//! the `LULL_*` variables no setting reads (a typo must not leave a limit off). The core's defaults are
//! named constants in [`lull_core::dispatcher`], read by the flags here and by
//! [`DispatchSettings::default`] alike.

mod access;
mod controls;
#[cfg(test)]
mod documentation;
mod http;
mod jobs;
mod limits;
mod media;
mod memory;
mod model;
mod platform_controls;
mod platforms;
mod summary;
mod timing;
mod tools;
mod unknown;
mod web;

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use secrecy::SecretString;

pub(crate) use lull_adapters::discord::Shards as DiscordShards;
use lull_core::dispatcher::DispatchSettings;
use lull_core::llm::HistoryBudget;
use lull_core::llm::transcribe::TranscribeSettings;
use lull_core::store::DatabaseUrl;

pub(crate) use self::access::AccessArgs;
pub(crate) use self::controls::ControlsArgs;
pub(crate) use self::http::{HttpAdapterConfig, HttpArgs};
pub(crate) use self::jobs::JobsArgs;
pub(crate) use self::limits::LimitsArgs;
pub(crate) use self::media::{MediaArgs, VisionMode};
pub(crate) use self::memory::MemoryArgs;
pub(crate) use self::model::{LlmConfig, ModelArgs, StreamMode};
pub(crate) use self::platform_controls::PlatformControlsArgs;
pub(crate) use self::platforms::PlatformArgs;
pub(crate) use self::summary::SummaryArgs;
pub(crate) use self::timing::TimingArgs;
pub(crate) use self::tools::{ToolsArgs, ToolsConfig};
pub(crate) use self::unknown::{IGNORE as IGNORE_VARIABLE, unknown as unknown_variables};
pub(crate) use self::web::WebArgs;

/// The system prompt when `LULL_SYSTEM_PROMPT` is unset (a sentence to the model: with
/// the others, in the core's `texts`).
pub(crate) use lull_core::texts::DEFAULT_SYSTEM_PROMPT;

/// `DATABASE_URL`.
const DEFAULT_DATABASE_URL: &str = "sqlite:lull.db";

/// lull: a self-hosted AI chat bot that waits for a lull in the conversation and answers once.
#[derive(Debug, Parser)]
#[command(name = "lull", version, about, long_about = None)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub settings: Settings,
}

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub(crate) enum Command {
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

/// A secret setting's value parser: the value is wrapped at once, so no `Debug` of the
/// settings shows it.
fn secret(s: &str) -> Result<SecretString, std::convert::Infallible> {
    Ok(SecretString::from(s))
}

/// Every setting, as read from flags and the environment: one group per file, and
/// the database and logging, which stand alone.
#[derive(Debug, Clone, Args)]
pub(crate) struct Settings {
    #[command(flatten)]
    pub platforms: PlatformArgs,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub media: MediaArgs,
    /// Database: `sqlite:PATH` (processes on one host), or `postgres://…` for replicas on several hosts.
    #[arg(
        long,
        global = true,
        env = "DATABASE_URL",
        default_value = DEFAULT_DATABASE_URL,
        help_heading = "Database and logs"
    )]
    pub database_url: String,
    #[command(flatten)]
    pub timing: TimingArgs,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub access: AccessArgs,
    #[command(flatten)]
    pub limits: LimitsArgs,
    #[command(flatten)]
    pub tools: ToolsArgs,
    #[command(flatten)]
    pub controls: ControlsArgs,
    #[command(flatten)]
    pub platform_controls: PlatformControlsArgs,
    #[command(flatten)]
    pub jobs: JobsArgs,
    #[command(flatten)]
    pub memory: MemoryArgs,
    #[command(flatten)]
    pub summary: SummaryArgs,
    #[command(flatten)]
    pub web: WebArgs,

    /// Log format: `text` or `json`.
    #[arg(
        long,
        global = true,
        env = "LOG_FORMAT",
        default_value = "text",
        help_heading = "Database and logs"
    )]
    pub log_format: LogFormat,
    /// Log filter, tracing's EnvFilter syntax [default: info; warn for `lull chat`, `healthcheck` and `backup`; none for `lull check`, whose report says it all]
    #[arg(
        long,
        global = true,
        env = "RUST_LOG",
        help_heading = "Database and logs"
    )]
    pub log_filter: Option<String>,
}

impl Settings {
    /// Every secret among the settings, set or not, hidden aliases included. The
    /// binary registers them for redaction ([`lull_port::secrets::register`]) before
    /// anything logs. A new secret setting goes here too; the test
    /// `every_hidden_value_is_a_registered_secret` fails until it does.
    pub(crate) fn secrets(&self) -> impl Iterator<Item = &SecretString> {
        let platforms = self.platforms.secrets();
        let model = self.model.secrets();
        let http = self.http.secrets();
        platforms.into_iter().chain(model).chain(http).flatten()
    }
}

/// `LOG_FORMAT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// A configuration that cannot work. The message names the variable to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct ConfigError(pub String);

impl From<lull_core::timing::TimingError> for ConfigError {
    fn from(e: lull_core::timing::TimingError) -> Self {
        ConfigError(e.to_string())
    }
}

/// A platform's connection settings (the adapters' own type).
pub(crate) use lull_adapters::PlatformSettings as PlatformConfig;

/// The validated configuration.
#[derive(Debug, Clone)]
pub(crate) struct Config {
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
    /// `LULL_HTTP_TOKEN`: the http adapter's bearer token, and the status page's off
    /// loopback.
    pub http_token: Option<secrecy::SecretString>,
    pub http_adapter: Option<HttpAdapterConfig>,
    /// The MCP servers whose tools the model may call (`None`: tools off).
    pub tools: Option<ToolsConfig>,
    /// lull's web tools (`None`: `LULL_TOOLS=off`).
    pub web: Option<lull_core::tools::web::WebSettings>,
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

/// `DATABASE_URL`: `sqlite:PATH` (also `sqlite://PATH`), or `postgres://…`
/// (also `postgresql://…`); anything else fails naming the variable.
pub(crate) fn database_url(url: &str) -> Result<DatabaseUrl, ConfigError> {
    DatabaseUrl::parse(url).map_err(ConfigError)
}

/// An `on`/`off` setting (any case, spaces around), or an error naming `variable`.
fn on_off(variable: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(ConfigError(format!(
            "{variable} must be `on` or `off`, got {value:?}"
        ))),
    }
}

fn positive(variable: &str, ms: u64) -> Result<Duration, ConfigError> {
    if ms == 0 {
        return Err(ConfigError(format!("{variable} must be greater than 0")));
    }
    Ok(Duration::from_millis(ms))
}

impl Config {
    /// The price list's warnings ([`limits::price_warnings`]): each model lull may ask
    /// (`LULL_MODELS`, the default, personas', `LULL_SUMMARY_MODEL`,
    /// `LULL_TRANSCRIBE_MODEL`) with no price. None with the echo responder.
    pub(crate) fn price_warnings(&self) -> Vec<String> {
        if matches!(self.llm, LlmConfig::Echo(_)) {
            return Vec::new();
        }
        let controls = &self.dispatch.controls;
        let mut models: Vec<(&str, &str)> = vec![(&controls.default_model, "the default model")];
        models.extend(controls.models.iter().map(|m| (m.as_str(), "LULL_MODELS")));
        models.extend(
            controls
                .personas
                .values()
                .filter_map(|p| p.model.as_deref())
                .map(|m| (m, "LULL_PERSONAS")),
        );
        if let Some(summary) = self
            .dispatch
            .summary
            .as_ref()
            .and_then(|s| s.model.as_deref())
        {
            models.push((summary, "LULL_SUMMARY_MODEL"));
        }
        if let Some(transcribe) = &self.transcribe {
            models.push((&transcribe.model, "LULL_TRANSCRIBE_MODEL"));
        }
        limits::price_warnings(&self.dispatch.limits, &models)
    }

    /// Check the settings together and build the configuration. Each group checks its
    /// own; the order is the one errors have always been reported in.
    pub(crate) fn from_settings(s: &Settings) -> Result<Config, ConfigError> {
        let mut platforms = s.platforms.check(s.media.max_image_bytes)?;
        let group_context = s.platform_controls.group_context()?;
        for platform in [&mut platforms.telegram, &mut platforms.discord]
            .into_iter()
            .flatten()
        {
            platform.overhear = group_context > 0;
        }
        let discord_auto_thread = s.platform_controls.discord_auto_thread()?;
        if let Some(discord) = &mut platforms.discord {
            discord.auto_thread = discord_auto_thread;
        }
        let mut model = s.model.check()?;
        let controls = s.controls.check(&mut model.llm)?;
        let transcribe = s.media.transcribe(&model.llm)?;
        let max_reply_chars = s.model.max_reply_chars()?;
        let (timers, lease) = s.timing.check()?;
        let http_adapter = s.http.check()?;
        let limits = s
            .limits
            .limits(&model.llm, max_reply_chars, &controls.default_model)?;
        let tool_settings = s.tools.settings()?;
        let tools = s.tools.check()?;
        let web = s.web.settings(s.tools.tool_result_chars)?;
        let web = s.tools.builtin().then_some(web);
        let summary = s.summary.settings(&model.llm, model.history)?;
        Ok(Config {
            telegram: platforms.telegram,
            telegram_webhook: platforms.telegram_webhook,
            discord: platforms.discord,
            discord_shards: platforms.discord_shards,
            transcribe,
            llm: model.llm,
            echo_by_default: model.echo_by_default,
            llm_retries: s.model.llm_retries,
            history: model.history,
            database: database_url(&s.database_url)?,
            dispatch: DispatchSettings {
                timers,
                lease,
                poll_every: s.timing.poll_every()?,
                history: model.history.exchanges(),
                shutdown_grace: s.timing.shutdown_grace(),
                access: s.access.access(),
                limits,
                max_reply_chars,
                drafts: s.model.stream == StreamMode::Auto,
                vision: s.media.vision == VisionMode::Auto,
                max_image_bytes: s.media.max_image_bytes()?,
                max_audio_seconds: s.media.max_audio_seconds,
                tools: tool_settings,
                controls,
                ack_reaction: s.platform_controls.ack_reaction()?,
                group_context,
                discord_auto_thread,
                jobs: s.jobs.settings()?,
                memory: s.memory.settings()?,
                builtin_tools: s.tools.builtin(),
                summary,
                retention: s.summary.retention()?,
                ..DispatchSettings::default()
            },
            http_addr: s.http.http_addr,
            http_token: s.http.http_token.clone(),
            http_adapter,
            tools,
            web,
        })
    }
}

impl Cli {
    /// Parse the command line and environment. A value that does not parse ends the
    /// program with clap's message, prefixed with the variable it came from.
    pub(crate) fn parse_or_exit() -> Cli {
        use clap::CommandFactory;
        use clap::FromArgMatches;
        use clap::error::{ContextKind, ContextValue, ErrorKind};
        let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
        let parsed = command_for(&argv)
            .try_get_matches_from(&argv)
            .and_then(|matches| Cli::from_arg_matches(&matches));
        match parsed {
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
                let value = match e.get(ContextKind::InvalidValue) {
                    Some(ContextValue::String(value)) => value.clone(),
                    _ => String::new(),
                };
                match variable {
                    Some(variable) => {
                        // Only a plain number's parse error is said so: a setting
                        // with its own parser says its own form.
                        let plain_number = std::error::Error::source(&e)
                            .is_some_and(|s| s.is::<std::num::ParseIntError>());
                        let why = match expected_form(&variable).filter(|_| plain_number) {
                            Some(form) => format!("{value:?} is not {form}"),
                            None => e
                                .render()
                                .to_string()
                                .trim_start_matches("error: ")
                                .lines()
                                .take_while(|l| !l.trim().is_empty())
                                .map(str::trim)
                                .collect::<Vec<_>>()
                                .join(" "),
                        };
                        eprintln!("lull: invalid {variable}: {why}");
                        std::process::exit(2);
                    }
                    None => e.exit(),
                }
            }
            Err(e) => e.exit(),
        }
    }
}

/// The settings a subcommand that needs few of them reads (by their field names): its
/// `--help` shows those and hides the rest (every setting is global, for `run`,
/// `chat` and `check`).
const OWN_SETTINGS: [(&str, &[&str]); 2] = [
    ("healthcheck", &["http_addr", "log_format", "log_filter"]),
    ("backup", &["database_url", "log_format", "log_filter"]),
];

/// The command line as `argv` uses it: for `healthcheck` and `backup` (named anywhere
/// in `argv`), the settings they do not read hidden from `--help`; they are still
/// accepted, so an environment set for `lull run` works for them too.
pub(crate) fn command_for(argv: &[std::ffi::OsString]) -> clap::Command {
    use clap::CommandFactory;
    let command = Cli::command();
    let own = OWN_SETTINGS
        .iter()
        .find(|(name, _)| argv.iter().skip(1).any(|a| a == name));
    match own {
        Some((_, keep)) => command.mut_args(|arg| {
            if arg.is_global_set() && !keep.contains(&arg.get_id().as_str()) {
                arg.hide(true)
            } else {
                arg
            }
        }),
        None => command,
    }
}

/// The form a numeric variable expects, by its name, as an error says it: whole
/// milliseconds for `…_MS`, seconds, days, or a whole number of something.
fn expected_form(variable: &str) -> Option<&'static str> {
    let whole = [
        "_TOKENS",
        "_PER_MIN",
        "_CHARS",
        "_MESSAGES",
        "_BATCH",
        "_RETRIES",
        "_STEPS",
        "_SHARDS",
        "_BYTES",
        "_PER_CHAT",
        "_CONTEXT",
    ];
    if variable.ends_with("_MS") {
        Some("whole milliseconds (a number such as 1500)")
    } else if variable.ends_with("_SECONDS") {
        Some("whole seconds (a number such as 300)")
    } else if variable.ends_with("_DAYS") {
        Some("whole days (a number such as 30)")
    } else if whole.iter().any(|w| variable.ends_with(w)) {
        Some("a whole number (such as 100)")
    } else {
        None
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(crate) fn settings(args: &[&str]) -> Settings {
        let mut argv = vec!["lull"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).expect("parses").settings
    }

    /// The configuration of `args` (no environment of lull's own set).
    pub(crate) fn config_of(args: &[&str]) -> Config {
        Config::from_settings(&settings(args)).expect("a valid configuration")
    }

    /// Each case's settings are refused with an error naming its variable.
    pub(crate) fn assert_errors_name(cases: &[(&[&str], &str)]) {
        for (args, variable) in cases {
            let e = Config::from_settings(&settings(args)).unwrap_err().0;
            assert!(e.contains(variable), "{args:?}: {e}");
        }
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
    fn the_flags_defaults_are_the_cores() {
        let flags = Config::from_settings(&settings(&[])).unwrap().dispatch;
        let core = DispatchSettings::default();
        assert_eq!(flags.timers.debounce(), core.timers.debounce());
        assert_eq!(flags.timers.max_wait(), core.timers.max_wait());
        assert_eq!(flags.timers.max_batch(), core.timers.max_batch());
        assert_eq!(flags.timers.mode(), core.timers.mode());
        assert_eq!(flags.timers.min_debounce(), core.timers.min_debounce());
        assert_eq!(flags.lease.ttl(), core.lease.ttl());
        assert_eq!(flags.lease.renew_every(), core.lease.renew_every());
        assert_eq!(flags.poll_every, core.poll_every);
        assert_eq!(flags.history, core.history);
        assert_eq!(flags.shutdown_grace, core.shutdown_grace);
        assert_eq!(flags.max_reply_chars, core.max_reply_chars);
        assert_eq!(flags.max_image_bytes, core.max_image_bytes);
        assert_eq!(flags.max_audio_seconds, core.max_audio_seconds);
        assert_eq!(flags.drafts, core.drafts);
        assert_eq!(flags.vision, core.vision);
        assert_eq!(flags.tools, core.tools);
    }

    #[test]
    fn errors_name_the_variable() {
        assert_errors_name(&[
            (&["--database-url", "mysql://x"], "DATABASE_URL"),
            (&["--database-url", "postgres://"], "DATABASE_URL"),
        ]);
    }
}
