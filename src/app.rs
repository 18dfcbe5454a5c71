//! Wiring: builds the store, responder, adapters and dispatcher from a [`Config`] and
//! runs them. The binary is a thin shell around [`run`] and [`chat`]; both take their
//! shutdown as a future, so tests can trigger it.

use std::future::{Future, IntoFuture};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, LlmConfig};
use crate::http::HttpState;
use lull_adapters::console::{self, ConsoleOutbound};
use lull_adapters::http::WebhookOutbound;
use lull_core::dispatcher::{Dispatcher, Event};
use lull_core::domain::Platform;
use lull_core::llm::Responder;
use lull_core::llm::echo::EchoResponder;
use lull_core::llm::fit::Fitting;
use lull_core::llm::openai::OpenAiResponder;
use lull_core::llm::retry::{RetryPolicy, Retrying};
use lull_core::llm::transcribe::OpenAiTranscriber;
use lull_core::store::Store;
use lull_port::health::{AdapterState, Health};
use lull_port::{Inbound, Outbound};

/// Open the configured database.
pub(crate) async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    lull_core::store::open(&config.database, config.dispatch.timers)
        .await
        .with_context(|| format!("DATABASE_URL: cannot use {}", config.database.shown()))
}

/// The configured responder, with the failure policy: a prompt refused as too long
/// is sent again smaller ([`Fitting`]), transient failures are retried, and every
/// request is metered ([`Retrying`]).
pub(crate) fn responder(config: &Config) -> anyhow::Result<Arc<dyn Responder>> {
    fn wrap<R: Responder>(inner: R, config: &Config) -> Arc<dyn Responder> {
        let policy = RetryPolicy {
            retries: config.llm_retries,
            ..RetryPolicy::default()
        };
        Arc::new(Fitting::new(Retrying::new(inner, policy), config.history))
    }
    Ok(match &config.llm {
        LlmConfig::Echo(delay) => wrap(EchoResponder::new(*delay), config),
        LlmConfig::OpenAi(settings) => wrap(
            OpenAiResponder::new(settings.clone()).map_err(anyhow::Error::msg)?,
            config,
        ),
    })
}

/// Say at start which responder answers, and warn when the offline `echo` answers
/// only because no model is configured.
fn log_responder(config: &Config) {
    match &config.llm {
        LlmConfig::Echo(_) if config.echo_by_default => tracing::warn!(
            responder = "echo",
            "no OPENAI_API_KEY or OPENAI_BASE_URL is set: replies come from the offline echo responder, not a model (set one of them, or LULL_LLM=echo to keep echo)"
        ),
        LlmConfig::Echo(_) => tracing::info!(
            responder = "echo",
            "replies come from the offline echo responder (LULL_LLM=echo)"
        ),
        LlmConfig::OpenAi(settings) => tracing::info!(
            responder = "openai",
            model = %settings.model,
            server = %lull_port::secrets::redact_url(&settings.base_url),
            max_tokens = settings.max_tokens,
            "replies come from the model"
        ),
    }
}

async fn dispatcher(
    config: &Config,
    outbounds: Vec<Arc<dyn Outbound>>,
) -> anyhow::Result<Arc<Dispatcher>> {
    let dispatcher = Dispatcher::new(
        open_store(config).await?,
        responder(config)?,
        outbounds,
        config.dispatch.clone(),
        lull_core::clock::for_process(),
    );
    transcriber(config, &dispatcher)?;
    toolbox(config, &dispatcher).await;
    Ok(dispatcher)
}

/// How long the start waits for the MCP servers' first connection, so the first
/// rounds see their tools; a server not ready by then is offered once it is.
const TOOLS_START_WAIT: Duration = Duration::from_secs(10);

/// The tools of `LULL_MCP_CONFIG`'s servers, offered to the model (none with tools
/// off). The servers start in the background; the start waits for them at most
/// [`TOOLS_START_WAIT`].
async fn toolbox(config: &Config, dispatcher: &Dispatcher) {
    use lull_core::tools::Toolbox;
    let Some(tools) = &config.tools else {
        return;
    };
    let toolbox = tools.start();
    toolbox.wait_settled(TOOLS_START_WAIT).await;
    for server in toolbox.servers() {
        if server.state == "ready" {
            tracing::info!(server = %server.name, tools = server.tools, "MCP server ready");
        } else {
            tracing::warn!(
                server = %server.name,
                state = server.state,
                error = server.error.as_deref().unwrap_or("none yet"),
                config = %tools.mcp.source,
                "MCP server not ready: its tools are offered once it is"
            );
        }
    }
    dispatcher.set_toolbox(toolbox);
}

/// Stop the MCP servers lull started, by `deadline` at the latest (a child left then
/// is killed as its handle drops).
async fn stop_tools(dispatcher: &Dispatcher, deadline: tokio::time::Instant) {
    if let Some(toolbox) = dispatcher.toolbox()
        && tokio::time::timeout_at(deadline, toolbox.shutdown())
            .await
            .is_err()
    {
        tracing::warn!("MCP servers did not stop in time: killing them");
    }
}

/// Voice messages and audio files are transcribed by the configured server (none
/// with the echo responder).
fn transcriber(config: &Config, dispatcher: &Dispatcher) -> anyhow::Result<()> {
    if let Some(settings) = &config.transcribe {
        let transcriber = OpenAiTranscriber::new(settings.clone()).map_err(anyhow::Error::msg)?;
        dispatcher.set_transcriber(Arc::new(transcriber));
    }
    Ok(())
}

/// `lull run`: every configured adapter, the scheduler and the HTTP server, until
/// `shutdown` completes. Then the adapters and the HTTP server stop taking messages,
/// and rounds in flight get the grace period to finish; after it their generations
/// and sends are cancelled and their leases released. Returns within the grace period
/// plus [`SHUTDOWN_MARGIN`], however a platform, the webhook, the model or an HTTP
/// client behaves; nothing accepted is lost (it stays in the database).
pub(crate) async fn run(config: Config, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let metrics = crate::metrics::install().map_err(anyhow::Error::msg)?;
    let health = Health::default();
    let mut outbounds: Vec<Arc<dyn Outbound>> = Vec::new();
    let mut inbounds: Vec<Arc<dyn Inbound>> = Vec::new();
    if let Some(http) = &config.http_adapter {
        // Its intake is the HTTP server's `/api/messages`, not a loop of its own.
        outbounds.push(Arc::new(
            WebhookOutbound::new(http.webhook.clone()).map_err(anyhow::Error::msg)?,
        ));
        health.set(Platform::Http, AdapterState::Up);
    }
    // Webhook mode: every replica receives on its HTTP server, none polls.
    let mut telegram_webhook = None;
    if let Some(telegram) = &config.telegram {
        match &config.telegram_webhook {
            Some(url) => {
                let (outbound, webhook) =
                    lull_adapters::telegram::connect_webhook(telegram, url.clone())?;
                outbounds.push(Arc::new(outbound));
                telegram_webhook = Some(Arc::new(webhook));
            }
            None => {
                let (outbound, inbound) = lull_adapters::telegram::connect(telegram)?;
                outbounds.push(Arc::new(outbound));
                inbounds.push(Arc::new(inbound));
            }
        }
        // The command menus: registered beside the start, never holding it up.
        let telegram = telegram.clone();
        tokio::spawn(async move {
            match lull_adapters::telegram::set_menus(&telegram, &lull_port::Menus::of_commands())
                .await
            {
                Ok(()) => tracing::debug!("Telegram command menus registered"),
                Err(e) => {
                    tracing::warn!(error = %e, "could not register the Telegram command menus; commands still work when typed")
                }
            }
        });
    }
    if let Some(discord) = &config.discord {
        // The slash commands: registered beside the start, never holding it up.
        let settings = discord.clone();
        tokio::spawn(async move {
            let menus = lull_port::Menus::of_commands();
            match lull_adapters::discord::register_commands(&settings, &menus).await {
                Ok(count) => tracing::debug!(count, "Discord slash commands registered"),
                Err(e) => {
                    tracing::warn!(error = %e, "could not register the Discord slash commands; commands still work after a mention")
                }
            }
        });
        let discord = lull_adapters::discord::Discord::new(discord, config.discord_shards)?;
        outbounds.push(Arc::new(discord.outbound));
        inbounds.push(Arc::new(discord.inbound));
    }
    if outbounds.is_empty() {
        anyhow::bail!(
            "nothing to run: set TELEGRAM_BOT_TOKEN, DISCORD_BOT_TOKEN or LULL_WEBHOOK_URL to enable an adapter (or try `lull chat`)"
        );
    }
    let store = open_store(&config).await?;
    log_responder(&config);
    let clock = lull_core::clock::for_process();
    let dispatcher = Dispatcher::new(
        store.clone(),
        responder(&config)?,
        outbounds,
        config.dispatch.clone(),
        clock.clone(),
    );
    transcriber(&config, &dispatcher)?;
    toolbox(&config, &dispatcher).await;
    let api = config
        .http_adapter
        .as_ref()
        .map(|http| lull_adapters::http::routes(dispatcher.clone(), http.token.clone()));
    let telegram_route = telegram_webhook
        .as_ref()
        .map(|webhook| webhook.routes(dispatcher.clone()));
    let api = match (api, telegram_route) {
        (Some(api), Some(telegram)) => Some(api.merge(telegram)),
        (api, telegram) => api.or(telegram),
    };
    let router = crate::http::app(
        HttpState {
            status: Some(status_page(
                &config,
                &dispatcher,
                &health,
                &metrics,
                clock.clone(),
            )),
            limits: config.dispatch.limits.clone(),
            clock,
            store,
            health: health.clone(),
            metrics: Some(metrics.clone()),
            tools: dispatcher.toolbox().cloned(),
        },
        api,
    );
    let listener = tokio::net::TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("LULL_HTTP_ADDR: cannot listen on {}", config.http_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "HTTP server listening");

    let stop_intake = CancellationToken::new();
    let stop_scheduler = CancellationToken::new();
    let mut server = tokio::spawn(
        axum::serve(listener, router)
            .with_graceful_shutdown(stop_intake.clone().cancelled_owned())
            .into_future(),
    );
    let mut scheduler = tokio::spawn(dispatcher.clone().run(stop_scheduler.clone()));
    let mut intake = tokio::task::JoinSet::new();
    for inbound in inbounds.drain(..) {
        let (dispatcher, health, stop) = (dispatcher.clone(), health.clone(), stop_intake.clone());
        intake.spawn(async move {
            dispatcher
                .serve_platform(inbound, health, stop)
                .await
                .map_err(anyhow::Error::new)
        });
    }
    if let Some(webhook) = telegram_webhook {
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

    // An adapter ends on its own only when retrying cannot help (a rejected token,
    // refused intents): the process stops with an error naming what to fix, so a
    // supervisor (Docker's restart policy) sees the failure instead of a process that
    // runs on, unhealthy, forever.
    let mut failure: Option<anyhow::Error> = None;
    tokio::pin!(shutdown);
    while failure.is_none() {
        tokio::select! {
            () = &mut shutdown => break,
            Some(ended) = intake.join_next() => match ended {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failure = Some(e),
                Err(e) => failure = Some(anyhow::Error::new(e).context("an adapter task failed")),
            },
        }
    }
    if let Some(e) = &failure {
        tracing::error!(error = %format!("{e:#}"), "stopping: an adapter cannot continue");
    }
    let grace = config.dispatch.shutdown_grace;
    tracing::info!(
        grace_ms = grace.as_millis() as u64,
        "shutting down: no new messages; finishing rounds in flight"
    );
    // A hard limit: whatever a platform, the webhook, the model or an HTTP client
    // does, everything stops by the deadline. The scheduler cancels rounds still
    // running after the grace period (their leases released, their outbox rows kept);
    // HTTP requests still open then are cut off; what is left after the margin is
    // dropped.
    let grace_over = tokio::time::Instant::now() + grace;
    let deadline = grace_over + SHUTDOWN_MARGIN;
    stop_intake.cancel();
    stop_scheduler.cancel();
    let stopped = async {
        while intake.join_next().await.is_some() {}
        (&mut scheduler).await
    };
    match tokio::time::timeout_at(deadline, stopped).await {
        Ok(joined) => joined.context("the scheduler task failed")?,
        Err(_) => {
            tracing::warn!("shutdown deadline passed: stopping adapters and rounds as they are");
            intake.abort_all();
            scheduler.abort();
        }
    }
    // Requests still open after the grace period (a client sending slowly) are cut off.
    if let Ok(served) = tokio::time::timeout_at(grace_over, &mut server).await {
        served.context("the HTTP server task failed")??;
    } else {
        tracing::warn!("grace period over: closing HTTP connections still open");
        server.abort();
    }
    upkeep.abort();
    stop_tools(&dispatcher, deadline).await;
    checkpoint(dispatcher.store(), deadline).await;
    tracing::info!("stopped");
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// How long after the grace period `lull run` may take to stop: time for stopped rounds
/// to hand their leases back.
pub(crate) const SHUTDOWN_MARGIN: Duration = Duration::from_millis(1000);

/// A clean stop's last step, once rounds and intake have stopped: the store makes its
/// files complete (SQLite: after the writes still queued, the write-ahead log folded
/// into the database file and truncated, so a copy of `lull.db` alone holds
/// everything), by `deadline` at the latest. If it cannot, nothing is lost (the log
/// keeps it, and the next start reads it); the operator is told what to copy.
async fn checkpoint(store: &Arc<dyn Store>, deadline: tokio::time::Instant) {
    match tokio::time::timeout_at(deadline, store.checkpoint()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(
            error = %e,
            "the database's write-ahead log was not checkpointed: back up the -wal file with the database"
        ),
        Err(_) => tracing::warn!(
            "no time left to checkpoint the database's write-ahead log: back up the -wal file with the database"
        ),
    }
}

/// `lull chat`: the console adapter on standard input and output. At end of input it
/// waits until every message is answered, then returns success. If the model fails,
/// the messages stay stored (a later run answers them) and the exit code says so.
pub(crate) async fn chat(
    config: Config,
    interrupt: impl Future<Output = ()>,
) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal as _;
    if std::io::stdin().is_terminal() {
        // On standard error: standard output carries the replies only.
        eprintln!("{}", chat_greeting(&config));
    }
    let console = Arc::new(ConsoleOutbound::stdout());
    let dispatcher = dispatcher(&config, vec![console.clone()]).await?;
    let stop = CancellationToken::new();
    let scheduler = tokio::spawn(dispatcher.clone().run(stop.clone()));
    let mut events = dispatcher.subscribe();
    let stdin = tokio::io::BufReader::new(tokio::io::stdin());

    tokio::pin!(interrupt);
    let outcome = tokio::select! {
        read = console::read_messages(dispatcher.as_ref(), stdin) => {
            read.context("reading standard input")?;
            tokio::select! {
                settled = wait_until_answered(&dispatcher, &mut events) => settled,
                () = &mut interrupt => ChatEnd::Interrupted,
            }
        }
        () = &mut interrupt => ChatEnd::Interrupted,
    };
    stop.cancel();
    scheduler.await.context("the scheduler task failed")?;
    let deadline = tokio::time::Instant::now() + SHUTDOWN_MARGIN;
    stop_tools(&dispatcher, deadline).await;
    checkpoint(dispatcher.store(), deadline).await;
    // A draft still shown (interrupted mid-reply) goes, and the terminal's line
    // wrapping with it.
    console.end_draft();
    Ok(match outcome {
        ChatEnd::Answered => ExitCode::SUCCESS,
        ChatEnd::Interrupted => {
            eprintln!("lull: interrupted; unanswered messages are kept and answered next time");
            ExitCode::from(130)
        }
        ChatEnd::ModelFailed(error) => {
            eprintln!(
                "lull: the model failed ({}); your messages are kept and answered next time",
                lull_port::secrets::redact(error)
            );
            ExitCode::from(1)
        }
        ChatEnd::GaveUp(error) => {
            eprintln!(
                "lull: the model could not answer ({})",
                lull_port::secrets::redact(error)
            );
            ExitCode::from(1)
        }
    })
}

/// What `lull chat` says first at a terminal: how to talk to it, who answers, and
/// that the conversation is kept in the database between runs.
fn chat_greeting(config: &Config) -> String {
    let answering = match &config.llm {
        LlmConfig::Echo(_) => {
            "the offline echo responder (it repeats what it got; set OPENAI_API_KEY or OPENAI_BASE_URL for a model)".to_owned()
        }
        LlmConfig::OpenAi(openai) => format!("{} at {}", openai.model, openai.base_url),
    };
    format!(
        "lull chat: type a message and press Enter; messages sent in a row are answered together. Ctrl-D ends.\n\
         Answering: {answering}.\n\
         The conversation is kept in {} between runs; /new forgets it.",
        config.database.shown()
    )
}

enum ChatEnd {
    Answered,
    Interrupted,
    /// The model failed; the messages stay pending.
    ModelFailed(String),
    /// The model could not answer a batch (too long, or refused); the user was told.
    GaveUp(String),
}

/// Wait until the console conversation has nothing pending and nothing undelivered.
/// Progress is observed through the dispatcher's events; the store is the judge.
async fn wait_until_answered(
    dispatcher: &Dispatcher,
    events: &mut tokio::sync::broadcast::Receiver<Event>,
) -> ChatEnd {
    let conversation = console::conversation();
    let mut gave_up = None;
    loop {
        match dispatcher.store().is_settled(&conversation).await {
            Ok(Some(true) | None) => return gave_up.map_or(ChatEnd::Answered, ChatEnd::GaveUp),
            Ok(Some(false)) => {}
            Err(e) => tracing::warn!(error = %e, "cannot check for pending messages"),
        }
        tokio::select! {
            event = events.recv() => match event {
                Ok(Event::GenerationFailed { error, .. }) => {
                    // Let the failure notice reach the terminal first.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    return ChatEnd::ModelFailed(error);
                }
                // Settles once its notice is delivered.
                Ok(Event::GaveUp { error, .. }) => gave_up = Some(error),
                _ => {}
            },
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// The status page of this process: its access rule from `LULL_HTTP_ADDR` and
/// `LULL_HTTP_TOKEN`, the MCP servers asked of the dispatcher's toolbox at each read.
fn status_page(
    config: &Config,
    dispatcher: &Arc<Dispatcher>,
    health: &lull_port::health::Health,
    metrics: &metrics_exporter_prometheus::PrometheusHandle,
    clock: Arc<dyn lull_core::clock::Clock>,
) -> crate::status::StatusPage {
    let access = crate::status::Access::new(config.http_addr, config.http_token.clone());
    let of = dispatcher.clone();
    let mcp_servers: crate::status::McpServers = Arc::new(move || {
        of.toolbox()
            .map(|toolbox| toolbox.servers())
            .unwrap_or_default()
    });
    crate::status::StatusPage::new(
        dispatcher.store().clone(),
        health.clone(),
        Some(metrics.clone()),
        (clock, config.dispatch.limits.timezone.clone()),
        access,
        Some(dispatcher.holder().clone()),
        Some(mcp_servers),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At a terminal, `lull chat` says how to talk to it, who answers, and that the
    /// conversation is kept between runs (and where); a key in the database URL is not
    /// shown.
    #[test]
    fn the_chat_greeting_says_who_answers_and_where_the_history_is_kept() {
        let config = |args: &[&str]| {
            Config::from_settings(&crate::config::tests::settings(args)).expect("valid")
        };
        let echo = chat_greeting(&config(&["--database-url", "sqlite:/tmp/x/lull.db"]));
        assert!(echo.contains("Ctrl-D"), "{echo}");
        assert!(echo.contains("echo responder"), "{echo}");
        assert!(
            echo.contains("kept in /tmp/x/lull.db between runs"),
            "{echo}"
        );
        let model = chat_greeting(&config(&[
            "--openai-base-url",
            "http://127.0.0.1:11434/v1",
            "--openai-model",
            "llama3.2",
            "--database-url",
            "postgres://lull:hunter2@db/lull",
        ]));
        assert!(
            model.contains("llama3.2 at http://127.0.0.1:11434/v1"),
            "{model}"
        );
        assert!(!model.contains("hunter2"), "{model}");
    }
}
