//! `lull run`: every configured adapter, the scheduler and the HTTP server, until
//! shutdown, then the stop in a known order: intake and the HTTP server first (no new
//! messages), then the scheduler (rounds in flight finish within the grace, then the
//! work beside them: `Dispatcher::run`), then the menus still registering, the
//! metrics upkeep, the MCP servers, and last the store's checkpoint.

use std::future::{Future, IntoFuture};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use super::adapters::Adapters;
use super::{
    SHUTDOWN_MARGIN, checkpoint, dispatcher, log_responder, open_store, status_page, stop_tools,
};
use crate::config::Config;
use crate::http::HttpState;
use lull_core::dispatcher::Dispatcher;
use lull_port::health::Health;

/// `lull run` until `shutdown` completes. Then the adapters and the HTTP server stop
/// taking messages, and rounds in flight get the grace period to finish; after it
/// their generations and sends are cancelled and their leases released. Returns within
/// the grace period plus [`SHUTDOWN_MARGIN`], however a platform, the webhook, the
/// model or an HTTP client behaves; nothing accepted is lost (it stays in the
/// database).
pub(crate) async fn run(config: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let metrics = crate::metrics::install().map_err(anyhow::Error::msg)?;
    let health = Health::default();
    let mut adapters = Adapters::connect(&config, &health)?;
    let store = open_store(&config).await?;
    log_responder(&config);
    let clock = lull_core::clock::for_process();
    let outbounds = std::mem::take(&mut adapters.outbounds);
    let dispatcher = dispatcher(&config, store.clone(), outbounds, clock.clone()).await?;
    let router = router(
        &config,
        &dispatcher,
        &adapters,
        &health,
        &metrics,
        store,
        clock,
    );
    let listener = tokio::net::TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("LULL_HTTP_ADDR: cannot listen on {}", config.http_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "HTTP server listening");
    let mut running = Running::start(&dispatcher, adapters, listener, router, &health, metrics);
    let failure = running.until(shutdown).await;
    running.stop(&config, &dispatcher).await?;
    tracing::info!("stopped");
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The HTTP routes: the status page and health, plus the http adapter's API and
/// Telegram's webhook where they are on.
fn router(
    config: &Config,
    dispatcher: &Arc<Dispatcher>,
    adapters: &Adapters,
    health: &Health,
    metrics: &metrics_exporter_prometheus::PrometheusHandle,
    store: Arc<dyn lull_core::store::Store>,
    clock: Arc<dyn lull_core::clock::Clock>,
) -> axum::Router {
    let api = config
        .http_adapter
        .as_ref()
        .map(|http| lull_adapters::http::routes(dispatcher.clone(), http.token.clone()));
    let telegram_route = adapters
        .telegram_webhook
        .as_ref()
        .map(|webhook| webhook.routes(dispatcher.clone()));
    let api = match (api, telegram_route) {
        (Some(api), Some(telegram)) => Some(api.merge(telegram)),
        (api, telegram) => api.or(telegram),
    };
    let status = status_page(config, dispatcher, health, metrics, clock.clone());
    let state = HttpState {
        status: Some(status),
        limits: config.dispatch.limits.clone(),
        clock,
        store,
        health: health.clone(),
        metrics: Some(metrics.clone()),
        tools: dispatcher.toolbox().cloned(),
        web: dispatcher.web().cloned(),
    };
    crate::http::app(state, api)
}

/// What runs while lull serves, each stopped in its turn.
struct Running {
    stop_intake: CancellationToken,
    stop_scheduler: CancellationToken,
    server: JoinHandle<std::io::Result<()>>,
    scheduler: JoinHandle<()>,
    intake: JoinSet<anyhow::Result<()>>,
    menus: JoinSet<()>,
    upkeep: JoinHandle<()>,
}

impl Running {
    /// Start the HTTP server, the scheduler, every adapter's intake and the metrics'
    /// upkeep.
    fn start(
        dispatcher: &Arc<Dispatcher>,
        mut adapters: Adapters,
        listener: tokio::net::TcpListener,
        router: axum::Router,
        health: &Health,
        metrics: metrics_exporter_prometheus::PrometheusHandle,
    ) -> Running {
        let stop_intake = CancellationToken::new();
        let stop_scheduler = CancellationToken::new();
        let server = tokio::spawn(
            axum::serve(listener, router)
                .with_graceful_shutdown(stop_intake.clone().cancelled_owned())
                .into_future(),
        );
        let scheduler = tokio::spawn(dispatcher.clone().run(stop_scheduler.clone()));
        let mut intake = JoinSet::new();
        for inbound in adapters.inbounds.drain(..) {
            let (dispatcher, health, stop) =
                (dispatcher.clone(), health.clone(), stop_intake.clone());
            intake.spawn(async move {
                dispatcher
                    .serve_platform(inbound, health, stop)
                    .await
                    .map_err(anyhow::Error::new)
            });
        }
        if let Some(webhook) = adapters.telegram_webhook.take() {
            let (health, stop) = (health.clone(), stop_intake.clone());
            intake.spawn(async move {
                webhook
                    .register(&health, &stop)
                    .await
                    .map_err(|reason| anyhow::anyhow!("the telegram adapter stopped: {reason}"))
            });
        }
        let upkeep = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                metrics.run_upkeep();
            }
        });
        Running {
            stop_intake,
            stop_scheduler,
            server,
            scheduler,
            intake,
            menus: adapters.menus,
            upkeep,
        }
    }

    /// Serve until `shutdown` completes or an adapter ends. An adapter ends on its own
    /// only when retrying cannot help (a rejected token, refused intents): the process
    /// stops with an error naming what to fix, so a supervisor (Docker's restart
    /// policy) sees the failure instead of a process that runs on, unhealthy, forever.
    async fn until(&mut self, shutdown: impl Future<Output = ()>) -> Option<anyhow::Error> {
        tokio::pin!(shutdown);
        loop {
            let failure = tokio::select! {
                () = &mut shutdown => return None,
                Some(ended) = self.intake.join_next() => match ended {
                    Ok(Ok(())) => continue,
                    Ok(Err(e)) => e,
                    Err(e) => anyhow::Error::new(e).context("an adapter task failed"),
                },
            };
            tracing::error!(error = %format!("{failure:#}"), "stopping: an adapter cannot continue");
            return Some(failure);
        }
    }

    /// Stop everything by a hard deadline: whatever a platform, the webhook, the model
    /// or an HTTP client does. The scheduler cancels rounds still running after the
    /// grace period (their leases released, their outbox rows kept); HTTP requests
    /// still open then are cut off; what is left after the margin is dropped.
    async fn stop(mut self, config: &Config, dispatcher: &Dispatcher) -> anyhow::Result<()> {
        let grace = config.dispatch.shutdown_grace;
        tracing::info!(
            grace_ms = grace.as_millis() as u64,
            "shutting down: no new messages; finishing rounds in flight"
        );
        let grace_over = tokio::time::Instant::now() + grace;
        let deadline = grace_over + SHUTDOWN_MARGIN;
        self.stop_intake.cancel();
        self.stop_scheduler.cancel();
        let intake = &mut self.intake;
        let scheduler = &mut self.scheduler;
        let stopped = async {
            while intake.join_next().await.is_some() {}
            scheduler.await
        };
        match tokio::time::timeout_at(deadline, stopped).await {
            Ok(joined) => joined.context("the scheduler task failed")?,
            Err(_) => {
                tracing::warn!(
                    "shutdown deadline passed: stopping adapters and rounds as they are"
                );
                self.intake.abort_all();
                self.scheduler.abort();
            }
        }
        // Requests still open after the grace period (a client sending slowly) are cut off.
        if let Ok(served) = tokio::time::timeout_at(grace_over, &mut self.server).await {
            served.context("the HTTP server task failed")??;
        } else {
            tracing::warn!("grace period over: closing HTTP connections still open");
            self.server.abort();
        }
        self.menus.abort_all();
        self.upkeep.abort();
        stop_tools(dispatcher, deadline).await;
        checkpoint(dispatcher.store(), deadline).await;
        Ok(())
    }
}
