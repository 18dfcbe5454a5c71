//! Wiring: builds the store, responder, adapters and dispatcher from a [`Config`] and
//! runs them. The binary is a thin shell around [`run`] and [`chat`]; both take their
//! shutdown as a future, so tests can trigger it. `adapters` connects the platforms of
//! `lull run`; `serve` runs them with the scheduler and the HTTP server, and stops
//! them in a known order.

mod adapters;
mod serve;

pub(crate) use serve::run;

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, LlmConfig};
use lull_adapters::console::{self, ConsoleOutbound};
use lull_core::dispatcher::{Dispatcher, Event};
use lull_core::llm::Responder;
use lull_core::llm::echo::EchoResponder;
use lull_core::llm::fit::Fitting;
use lull_core::llm::openai::OpenAiResponder;
use lull_core::llm::retry::{RetryPolicy, Retrying};
use lull_core::llm::transcribe::OpenAiTranscriber;
use lull_core::store::Store;
use lull_port::Outbound;

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
/// only because no model is configured, and of each model without a price.
fn log_responder(config: &Config) {
    for warning in config.price_warnings() {
        tracing::warn!("{warning}");
    }
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

/// The dispatcher of `config` on `store`, delivering through `outbounds`, with its
/// transcriber and toolbox (the MCP servers started, waited for a moment).
async fn dispatcher(
    config: &Config,
    store: Arc<dyn Store>,
    outbounds: Vec<Arc<dyn Outbound>>,
    clock: Arc<dyn lull_core::clock::Clock>,
) -> anyhow::Result<Arc<Dispatcher>> {
    let mut builder =
        Dispatcher::builder(store, responder(config)?, config.dispatch.clone(), clock)
            .outbounds(outbounds);
    if let Some(transcriber) = transcriber(config)? {
        builder = builder.transcriber(transcriber);
    }
    if let Some(toolbox) = toolbox(config).await {
        builder = builder.toolbox(toolbox);
    }
    if let Some(web) = &config.web {
        let web = lull_core::tools::web::Web::new(web)
            .map_err(|e| anyhow::anyhow!("the web tools could not start: {e}"))?;
        builder = builder.web(Arc::new(web));
    }
    Ok(builder.build())
}

/// How long the start waits for the MCP servers' first connection, so the first
/// rounds see their tools; a server not ready by then is offered once it is.
const TOOLS_START_WAIT: Duration = Duration::from_secs(10);

/// The tools of `LULL_MCP_CONFIG`'s servers, offered to the model (none with tools
/// off). The servers start in the background; the start waits for them at most
/// [`TOOLS_START_WAIT`].
async fn toolbox(config: &Config) -> Option<Arc<dyn lull_core::tools::Toolbox>> {
    use lull_core::tools::Toolbox;
    let tools = config.tools.as_ref()?;
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
    Some(toolbox)
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
fn transcriber(
    config: &Config,
) -> anyhow::Result<Option<Arc<dyn lull_core::llm::transcribe::Transcriber>>> {
    let Some(settings) = &config.transcribe else {
        return Ok(None);
    };
    let transcriber = OpenAiTranscriber::new(settings.clone()).map_err(anyhow::Error::msg)?;
    Ok(Some(Arc::new(transcriber)))
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
    let store = open_store(&config).await?;
    let clock = lull_core::clock::for_process();
    let dispatcher = dispatcher(&config, store, vec![console.clone()], clock).await?;
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
    .with_monthly_budget(config.dispatch.limits.monthly_usd)
    .with_console(dispatcher.clone())
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
