//! Processes on one database (a SQLite file in a temporary folder, or a PostgreSQL
//! database) behind the http adapter, with the loopback model and webhook they talk
//! to: the harness of the tests that drive conversations through `/api/messages`.

use std::time::Duration;

use super::db::Location;
use super::fakes::openai::FakeOpenAi;
use super::fakes::webhook::Webhook;
use super::process::LullProcess;

pub(crate) struct HttpBot {
    pub dir: tempfile::TempDir,
    pub database: Location,
    pub webhook: Webhook,
    pub model: FakeOpenAi,
    pub client: reqwest::Client,
}

impl HttpBot {
    /// A fresh harness: SQLite in its folder, or the PostgreSQL database `postgres`.
    pub(crate) async fn new(postgres: Option<String>) -> HttpBot {
        let dir = tempfile::tempdir().unwrap();
        let database = match postgres {
            Some(url) => Location::from_url(&url),
            None => Location::Sqlite(dir.path().join("lull.db")),
        };
        HttpBot {
            dir,
            database,
            webhook: Webhook::start().await,
            model: FakeOpenAi::start().await,
            client: reqwest::Client::new(),
        }
    }

    /// Start `lull run` named `name` on the harness (whole answers, a fixed debounce,
    /// quick polls and leases), with `env` on top, and wait until it is healthy.
    pub(crate) async fn start(&self, name: &str, env: &[(&str, &str)]) -> LullProcess {
        let mut all = vec![
            ("DATABASE_URL", self.database.url()),
            ("LULL_WEBHOOK_URL", self.webhook.url.clone()),
            ("OPENAI_BASE_URL", self.model.base_url.clone()),
            ("OPENAI_API_KEY", "sk-http-bot-test".into()),
            ("LULL_STREAM", "off".into()),
            ("LULL_DEBOUNCE", "fixed".into()),
            ("LULL_POLL_MS", "200".into()),
            ("LULL_LEASE_TTL_MS", "3000".into()),
            ("RUST_LOG", "info,lull_core=debug".into()),
        ];
        all.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
        let mut lull = LullProcess::start(self.dir.path(), name, &["run"], &all);
        lull.wait_healthy(Duration::from_secs(30)).await;
        lull
    }
}
