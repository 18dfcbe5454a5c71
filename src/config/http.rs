//! The HTTP server (health, metrics, the http adapter) and the http adapter's
//! webhook: where replies are POSTed, how they are signed, how long a POST may take
//! and how long a refused reply is retried; the bearer token the adapter requires.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;
use lull_adapters::http::{WebhookSecret, WebhookSettings};
use secrecy::{ExposeSecret, SecretString};

use super::{ConfigError, http_url, positive, secret};

/// `LULL_HTTP_ADDR`: loopback only, until a token is set.
const DEFAULT_HTTP_ADDR: &str = "127.0.0.1:8080";
/// `LULL_WEBHOOK_TIMEOUT_MS`.
const DEFAULT_WEBHOOK_TIMEOUT_MS: u64 = 30_000;
/// `LULL_WEBHOOK_MAX_AGE`.
const DEFAULT_WEBHOOK_MAX_AGE: &str = "1d";

/// `LULL_HTTP_ADDR`, `LULL_HTTP_TOKEN`, `LULL_WEBHOOK_*`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "HTTP (health, metrics, status page, http adapter)")]
pub(crate) struct HttpArgs {
    /// Address of the HTTP server (health, metrics, http adapter).
    #[arg(
        long,
        global = true,
        env = "LULL_HTTP_ADDR",
        default_value = DEFAULT_HTTP_ADDR
    )]
    pub http_addr: SocketAddr,
    /// Where the http adapter POSTs replies; enables the http adapter.
    #[arg(long, global = true, env = "LULL_WEBHOOK_URL")]
    pub webhook_url: Option<String>,
    /// Bearer token the http adapter requires; also opens the status page off loopback.
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
        default_value_t = DEFAULT_WEBHOOK_TIMEOUT_MS
    )]
    pub webhook_timeout_ms: u64,
    /// How long a reply the webhook keeps refusing is retried before it is given up: `30s`, `15m`, `24h`, `1d`.
    #[arg(
        long,
        global = true,
        env = "LULL_WEBHOOK_MAX_AGE",
        default_value = DEFAULT_WEBHOOK_MAX_AGE
    )]
    pub webhook_max_age: humantime::Duration,
}

/// The http adapter's settings.
#[derive(Debug, Clone)]
pub(crate) struct HttpAdapterConfig {
    pub webhook: WebhookSettings,
    pub token: Option<SecretString>,
}

impl HttpArgs {
    /// The http adapter's settings (`None`: `LULL_WEBHOOK_URL` unset, the adapter is
    /// off); a token is required off loopback.
    pub(crate) fn check(&self) -> Result<Option<HttpAdapterConfig>, ConfigError> {
        let s = self;
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
        Ok(http_adapter)
    }

    /// The secrets of this group, set or not.
    pub(super) fn secrets(&self) -> [&Option<SecretString>; 2] {
        [&self.http_token, &self.webhook_secret]
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{assert_errors_name, settings};
    use super::super::{Cli, Config};
    use super::*;
    use clap::Parser;

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

    #[test]
    fn errors_name_the_variable() {
        assert_errors_name(&[
            (&["--webhook-url", "ftp://x"], "LULL_WEBHOOK_URL"),
            (
                &["--webhook-url", "http://:8080/replies"],
                "LULL_WEBHOOK_URL",
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
            (&["--webhook-secret", "s3cret"], "LULL_WEBHOOK_SECRET"),
            (&["--webhook-secret", "whsec_%%%"], "LULL_WEBHOOK_SECRET"),
            (&["--webhook-timeout-ms", "0"], "LULL_WEBHOOK_TIMEOUT_MS"),
            (&["--webhook-max-age", "0s"], "LULL_WEBHOOK_MAX_AGE"),
        ]);
    }
}
