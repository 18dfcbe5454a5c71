//! The platforms: Telegram's and Discord's tokens (each enables its adapter), their
//! API URLs, Telegram's webhook mode and Discord's shards.

use clap::Args;
use secrecy::SecretString;

use super::{ConfigError, DiscordShards, PlatformConfig, http_url, secret};

pub(super) const DEFAULT_TELEGRAM_API_URL: &str = "https://api.telegram.org";
pub(super) const DEFAULT_DISCORD_API_URL: &str = "https://discord.com";
/// `LULL_DISCORD_SHARDS`: one gateway session.
const DEFAULT_DISCORD_SHARDS: &str = "1";

/// `TELEGRAM_*`, `DISCORD_*`, `LULL_TELEGRAM_WEBHOOK_URL`, `LULL_DISCORD_SHARDS`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Telegram and Discord")]
pub(crate) struct PlatformArgs {
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
    #[arg(long, global = true, env = "LULL_DISCORD_SHARDS", default_value = DEFAULT_DISCORD_SHARDS)]
    pub discord_shards: DiscordShards,
}

/// The platforms as configured.
#[derive(Debug, Clone)]
pub(crate) struct Platforms {
    pub telegram: Option<PlatformConfig>,
    pub telegram_webhook: Option<url::Url>,
    pub discord: Option<PlatformConfig>,
    pub discord_shards: DiscordShards,
}

/// A Telegram bot token has the shape `<bot id>:<secret>` (digits, a colon, then
/// letters, digits, `_` and `-`), as @BotFather gives it. A token of another shape
/// (quotes or spaces pasted with it, a `bot` prefix from a URL, half of it) is refused
/// at start, naming the variable and never the token.
fn telegram_token_shape(token: &SecretString) -> Result<(), ConfigError> {
    use secrecy::ExposeSecret as _;
    let token = token.expose_secret();
    let shaped = token.split_once(':').is_some_and(|(id, secret)| {
        !id.is_empty()
            && id.chars().all(|c| c.is_ascii_digit())
            && secret.len() >= 20
            && secret
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    });
    if shaped {
        Ok(())
    } else {
        Err(ConfigError(
            "TELEGRAM_BOT_TOKEN does not look like a bot token (digits, a colon, then at least 20 letters, digits, _ or -, as @BotFather gives it): check for quotes, spaces or a \"bot\" prefix".into(),
        ))
    }
}

impl PlatformArgs {
    /// The platforms' settings; `max_image_bytes` is the largest image an adapter
    /// reads (`LULL_MAX_IMAGE_BYTES`).
    pub(crate) fn check(&self, max_image_bytes: u64) -> Result<Platforms, ConfigError> {
        let s = self;
        let telegram = s
            .telegram_bot_token
            .clone()
            .or_else(|| s.teloxide_token.clone())
            .map(|token| {
                telegram_token_shape(&token)?;
                Ok::<_, ConfigError>(PlatformConfig {
                    token,
                    api_url: http_url("TELEGRAM_API_URL", &s.telegram_api_url)?,
                    max_image_bytes,
                    overhear: false,
                    auto_thread: false,
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
                    max_image_bytes,
                    overhear: false,
                    auto_thread: false,
                })
            })
            .transpose()?;
        Ok(Platforms {
            telegram,
            telegram_webhook,
            discord,
            discord_shards: s.discord_shards,
        })
    }

    /// The secrets of this group, set or not.
    pub(super) fn secrets(&self) -> [&Option<SecretString>; 4] {
        [
            &self.telegram_bot_token,
            &self.teloxide_token,
            &self.discord_bot_token,
            &self.discord_token,
        ]
    }
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

#[cfg(test)]
mod tests {
    use super::super::tests::{assert_errors_name, settings};
    use super::super::{Cli, Config};
    use super::*;
    use clap::Parser;

    #[test]
    fn the_telegram_webhook_url_must_be_https_except_on_loopback() {
        let with = |url: &str| {
            Config::from_settings(&settings(&[
                "--telegram-bot-token",
                "123:abcdefghijklmnopqrstuvwxyz",
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
            shards("auto").unwrap().settings.platforms.discord_shards,
            DiscordShards::Auto
        );
        assert_eq!(
            shards("4").unwrap().settings.platforms.discord_shards,
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
    fn errors_name_the_variable() {
        assert_errors_name(&[
            (
                &[
                    "--telegram-bot-token",
                    "123:abcdefghijklmnopqrstuvwxyz",
                    "--telegram-api-url",
                    "not a url",
                ],
                "TELEGRAM_API_URL",
            ),
            (&["--telegram-bot-token", "t"], "TELEGRAM_BOT_TOKEN"),
        ]);
    }

    /// A token shaped as @BotFather gives it passes; pasted wrong, it is refused, and
    /// the error never quotes it.
    #[test]
    fn a_telegram_token_must_look_like_one() {
        let good = "110201543:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw";
        assert!(telegram_token_shape(&SecretString::from(good)).is_ok());
        for bad in [
            "bot110201543:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw",
            "\"110201543:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw\"",
            "110201543:AAHdqTcvCH1vGWJ xfSeofSAs0K5PALDsaw",
            "110201543",
            "110201543:short",
            ":AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw",
        ] {
            let e = telegram_token_shape(&SecretString::from(bad)).unwrap_err();
            assert!(e.0.contains("TELEGRAM_BOT_TOKEN"), "{bad}: {e}");
            assert!(!e.0.contains("AAHdq"), "the token is never quoted: {e}");
        }
    }
}
