//! The platforms of `lull run`: each configured adapter connected (its outbound, and
//! its inbound loop or webhook), and its command menus registered beside the start.

use std::sync::Arc;

use tokio::task::JoinSet;

use crate::config::Config;
use lull_adapters::http::WebhookOutbound;
use lull_core::domain::Platform;
use lull_port::health::{AdapterState, Health};
use lull_port::{Inbound, Outbound};

/// The connected adapters, before the dispatcher exists.
pub(super) struct Adapters {
    /// One per platform: where replies go.
    pub(super) outbounds: Vec<Arc<dyn Outbound>>,
    /// The loops that read updates (Telegram polling, Discord's gateway).
    pub(super) inbounds: Vec<Arc<dyn Inbound>>,
    /// Telegram in webhook mode: every replica receives on its HTTP server.
    pub(super) telegram_webhook: Option<Arc<lull_adapters::telegram::TelegramWebhook>>,
    /// The menus being registered: tracked, aborted at shutdown if still running.
    pub(super) menus: JoinSet<()>,
}

impl Adapters {
    /// Connect every adapter `config` enables; an error names the variable to fix.
    pub(super) fn connect(config: &Config, health: &Health) -> anyhow::Result<Adapters> {
        let mut adapters = Adapters {
            outbounds: Vec::new(),
            inbounds: Vec::new(),
            telegram_webhook: None,
            menus: JoinSet::new(),
        };
        if let Some(http) = &config.http_adapter {
            // Its intake is the HTTP server's `/api/messages`, not a loop of its own.
            adapters.outbounds.push(Arc::new(
                WebhookOutbound::new(http.webhook.clone()).map_err(anyhow::Error::msg)?,
            ));
            health.set(Platform::Http, AdapterState::Up);
        }
        adapters.telegram(config)?;
        adapters.discord(config)?;
        if adapters.outbounds.is_empty() {
            anyhow::bail!(
                "nothing to run: set TELEGRAM_BOT_TOKEN, DISCORD_BOT_TOKEN or LULL_WEBHOOK_URL to enable an adapter (or try `lull chat`)"
            );
        }
        Ok(adapters)
    }

    /// Telegram, polling or (with a webhook URL) receiving; its menus registered
    /// beside the start, never holding it up.
    fn telegram(&mut self, config: &Config) -> anyhow::Result<()> {
        let Some(telegram) = &config.telegram else {
            return Ok(());
        };
        match &config.telegram_webhook {
            Some(url) => {
                let (outbound, webhook) =
                    lull_adapters::telegram::connect_webhook(telegram, url.clone())?;
                self.outbounds.push(Arc::new(outbound));
                self.telegram_webhook = Some(Arc::new(webhook));
            }
            None => {
                let (outbound, inbound) = lull_adapters::telegram::connect(telegram)?;
                self.outbounds.push(Arc::new(outbound));
                self.inbounds.push(Arc::new(inbound));
            }
        }
        let telegram = telegram.clone();
        self.menus.spawn(async move {
            match lull_adapters::telegram::set_menus(&telegram, &lull_port::Menus::of_commands()).await {
                Ok(()) => tracing::debug!("Telegram command menus registered"),
                Err(e) => {
                    tracing::warn!(error = %e, "could not register the Telegram command menus; commands still work when typed")
                }
            }
        });
        Ok(())
    }

    /// Discord's gateway; its slash commands registered beside the start, never
    /// holding it up.
    fn discord(&mut self, config: &Config) -> anyhow::Result<()> {
        let Some(discord) = &config.discord else {
            return Ok(());
        };
        let settings = discord.clone();
        self.menus.spawn(async move {
            let menus = lull_port::Menus::of_commands();
            match lull_adapters::discord::register_commands(&settings, &menus).await {
                Ok(count) => tracing::debug!(count, "Discord slash commands registered"),
                Err(e) => {
                    tracing::warn!(error = %e, "could not register the Discord slash commands; commands still work after a mention")
                }
            }
        });
        let discord = lull_adapters::discord::Discord::new(discord, config.discord_shards)?;
        self.outbounds.push(Arc::new(discord.outbound));
        self.inbounds.push(Arc::new(discord.inbound));
        Ok(())
    }
}
