//! [`McpToolbox`]: the [`Toolbox`] on MCP servers, through the official SDK (`rmcp`).
//!
//! Each configured server has a supervisor task: it connects (a stdio child, or
//! Streamable HTTP), lists the tools (every page), offers them while the connection
//! lives, and when it ends (the child died, the session was lost) connects again
//! after a backoff of [`McpSettings::backoff`] doubling to its maximum. Starting never
//! waits on a server: [`McpToolbox::start`] returns at once, and
//! [`McpToolbox::wait_settled`] waits, up to a deadline, for the first attempts.
//!
//! Invariants:
//! - A stdio child gets a minimal environment: `PATH` and `HOME` from lull's own (so
//!   `npx`/`uvx` find themselves and their caches) and the variables its `env` names,
//!   which override them. Nothing else of lull's environment (bot tokens,
//!   `OPENAI_API_KEY`, `DATABASE_URL`) reaches it (`env_clear`). Its stderr is read
//!   by lull, logged redacted at debug level, its last line kept for the state's
//!   error.
//! - [`Toolbox::call`] returns within [`McpSettings::call_timeout`] (a dropped call
//!   tells the server `notifications/cancelled`), with at most
//!   [`McpSettings::max_result_chars`] characters of text (redacted, cut with a note).
//!   What the transport reads of one message is bounded by rmcp (16 MiB a line or a
//!   JSON body), so a server answering megabytes costs a bounded amount of memory.
//! - Errors shown (call results, [`ServerState::error`]) pass
//!   [`lull_port::secrets::redact`]: no header or env value appears in them.
//! - Tool names are `SERVER__TOOL`, cut and made unique within a server to OpenAI's
//!   `^[a-zA-Z0-9_-]{1,64}$` (server names are checked by [`super::config`]).
//! - Effects: the config's `readOnly`/`confirm` first, then the annotations:
//!   `readOnlyHint: true` is read-only, `destructiveHint: true` destructive, anything
//!   else (no annotations included) acts; `idempotentHint: true` makes it idempotent.
//!   Note that the MCP spec's default for a missing `destructiveHint` is `true`; lull
//!   treats an unannotated tool as acting but not destructive (reserved, never run
//!   twice, no approval), and `confirm` makes it destructive.

use std::collections::{HashMap, HashSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientConfig, ContentBlock, Implementation,
    RequestMetaObject, ResourceContents, Tool,
};
use rmcp::service::{Peer, RoleClient, RunningService, ServiceExt};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use secrecy::ExposeSecret;
use serde_json::{Map, Value};
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

use super::config::{McpConfig, ServerConfig, Transport};
use super::{CallOutcome, Effect, ServerState, ToolOutput, ToolSpec, Toolbox};
use lull_port::secrets::redact;

/// The longest tool name OpenAI accepts.
pub const MAX_TOOL_NAME: usize = 64;

/// Environment variables a stdio child inherits from lull (before its own `env`).
pub const INHERITED_ENV: [&str; 2] = ["PATH", "HOME"];

/// How calls and connections are bounded.
#[derive(Debug, Clone)]
pub struct McpSettings {
    /// `LULL_TOOL_TIMEOUT_MS`: the deadline of one `tools/call`.
    pub call_timeout: Duration,
    /// `LULL_TOOL_RESULT_CHARS`: the most text one result gives the model.
    pub max_result_chars: usize,
    /// The deadline of one connection attempt (start or connect, initialize, list).
    pub connect_timeout: Duration,
    /// The wait before the first reconnection, doubled after each failure up to the
    /// second value; back to the first once a connection stood.
    pub backoff: (Duration, Duration),
}

/// `LULL_TOOL_TIMEOUT_MS`.
pub const CALL_TIMEOUT_MS: u64 = 30_000;
/// `LULL_TOOL_RESULT_CHARS`.
pub const MAX_RESULT_CHARS: usize = 16_000;

impl Default for McpSettings {
    fn default() -> Self {
        McpSettings {
            call_timeout: Duration::from_millis(CALL_TIMEOUT_MS),
            max_result_chars: MAX_RESULT_CHARS,
            connect_timeout: Duration::from_secs(30),
            backoff: (Duration::from_millis(500), Duration::from_secs(30)),
        }
    }
}

/// The [`Toolbox`] on the servers of an [`McpConfig`].
pub struct McpToolbox {
    servers: Vec<Arc<Server>>,
    settings: McpSettings,
    stop: CancellationToken,
    supervisors: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Bumped at every state change, for [`McpToolbox::wait_until`].
    changes: tokio::sync::watch::Sender<u64>,
}

/// One server: its config and what its supervisor last saw.
struct Server {
    config: ServerConfig,
    live: RwLock<Live>,
    /// The last line the child wrote to stderr (redacted, cut), for errors.
    stderr_tail: Mutex<Option<String>>,
}

struct Live {
    state: &'static str,
    error: Option<String>,
    /// Set while `ready`.
    peer: Option<Peer<RoleClient>>,
    tools: Arc<Vec<ToolSpec>>,
}

impl McpToolbox {
    /// Start a supervisor for every server of `config` and return at once (they
    /// connect in the background; see [`McpToolbox::wait_settled`]). Must be called
    /// within a Tokio runtime.
    pub fn start(config: McpConfig, settings: McpSettings) -> Arc<McpToolbox> {
        let (changes, _) = tokio::sync::watch::channel(0);
        let toolbox = Arc::new(McpToolbox {
            servers: config
                .servers
                .into_iter()
                .map(|config| {
                    Arc::new(Server {
                        config,
                        live: RwLock::new(Live {
                            state: "starting",
                            error: None,
                            peer: None,
                            tools: Arc::new(Vec::new()),
                        }),
                        stderr_tail: Mutex::new(None),
                    })
                })
                .collect(),
            settings,
            stop: CancellationToken::new(),
            supervisors: Mutex::new(Vec::new()),
            changes,
        });
        let handles = toolbox
            .servers
            .iter()
            .map(|server| tokio::spawn(supervise(toolbox.clone(), server.clone())))
            .collect();
        *toolbox.supervisors.lock().expect("not poisoned") = handles;
        toolbox
    }

    /// Wait until no server is still `starting` (each is `ready` or has failed its
    /// first attempt), or `timeout` passed. True when settled.
    pub async fn wait_settled(&self, timeout: Duration) -> bool {
        self.wait_until(timeout, |states| {
            states.iter().all(|s| s.state != "starting")
        })
        .await
    }

    /// Wait until `done` holds of [`Toolbox::servers`], or `timeout` passed. True
    /// when it holds.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        done: impl Fn(&[ServerState]) -> bool,
    ) -> bool {
        let mut changes = self.changes.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            changes.borrow_and_update();
            if done(&self.servers()) {
                return true;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                _ => return done(&self.servers()),
            }
        }
    }

    fn set(&self, server: &Server, change: impl FnOnce(&mut Live)) {
        change(&mut server.live.write().expect("not poisoned"));
        self.changes.send_modify(|n| *n += 1);
    }

    /// The ready server offering `name`, its peer and the tool.
    fn find(&self, name: &str) -> Result<(Arc<Server>, Peer<RoleClient>, ToolSpec), String> {
        let server_name = name.split_once("__").map_or(name, |(server, _)| server);
        let Some(server) = self.servers.iter().find(|s| s.config.name == server_name) else {
            return Err(format!("there is no tool named {name}"));
        };
        let live = server.live.read().expect("not poisoned");
        let (Some(peer), "ready") = (&live.peer, live.state) else {
            return Err(format!(
                "the tool {name} is not available now: its MCP server {server_name} is {}",
                live.state
            ));
        };
        let Some(spec) = live.tools.iter().find(|t| t.name == name) else {
            return Err(format!("there is no tool named {name}"));
        };
        Ok((server.clone(), peer.clone(), spec.clone()))
    }
}

#[async_trait]
impl Toolbox for McpToolbox {
    fn tools(&self) -> Vec<ToolSpec> {
        self.servers
            .iter()
            .flat_map(|server| {
                let live = server.live.read().expect("not poisoned");
                if live.state == "ready" {
                    live.tools.as_ref().clone()
                } else {
                    Vec::new()
                }
            })
            .collect()
    }

    async fn call(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        key: Option<&str>,
    ) -> ToolOutput {
        let (server, peer, spec) = match self.find(name) {
            Ok(found) => found,
            Err(why) => return ToolOutput::error(why, CallOutcome::Error),
        };
        let mut params = CallToolRequestParams::new(spec.tool.clone()).with_arguments(arguments);
        if let Some(key) = key {
            let mut meta = RequestMetaObject::new();
            meta.insert("idempotencyKey".into(), Value::from(key));
            params.meta = Some(meta);
        }
        let started = Instant::now();
        // Peer::call_tool sends `notifications/cancelled` when dropped unanswered.
        let answer = tokio::time::timeout(self.settings.call_timeout, peer.call_tool(params)).await;
        metrics::histogram!(
            crate::metrics::TOOL_CALL_SECONDS,
            "server" => server.config.name.clone(),
            "tool" => spec.tool.clone()
        )
        .record(started.elapsed().as_secs_f64());
        match answer {
            Err(_) => ToolOutput::error(
                format!(
                    "the tool {name} gave no answer within {}",
                    humantime::format_duration(self.settings.call_timeout)
                ),
                CallOutcome::Timeout,
            ),
            // A JSON-RPC error is the server's answer: the call did not act.
            Ok(Err(e @ rmcp::ServiceError::McpError(_))) => ToolOutput::error(
                format!(
                    "the tool {name} failed: {}",
                    redact(lull_port::secrets::chain(&e))
                ),
                CallOutcome::Error,
            ),
            // Anything else failed after the request was written (the server died,
            // the connection closed or broke, an HTTP error that is not an answer):
            // it may have acted. Unknown is told, not guessed (docs/tools.md).
            Ok(Err(e)) => ToolOutput::error(
                format!(
                    "the connection to the tool {name} ended before it answered: {}",
                    redact(lull_port::secrets::chain(&e))
                ),
                CallOutcome::Lost,
            ),
            Ok(Ok(result)) => output(&result, self.settings.max_result_chars),
        }
    }

    fn servers(&self) -> Vec<ServerState> {
        self.servers
            .iter()
            .map(|server| {
                let live = server.live.read().expect("not poisoned");
                ServerState {
                    name: server.config.name.clone(),
                    state: live.state,
                    tools: if live.state == "ready" {
                        live.tools.len()
                    } else {
                        0
                    },
                    error: live.error.clone(),
                }
            })
            .collect()
    }

    async fn shutdown(&self) {
        self.stop.cancel();
        let handles = std::mem::take(&mut *self.supervisors.lock().expect("not poisoned"));
        for mut handle in handles {
            // Each closes its server's stdin, then signals and kills a child that
            // does not exit (rmcp's graceful shutdown, at most 6 s); a child left
            // after that is killed when its handle drops.
            if tokio::time::timeout(Duration::from_secs(8), &mut handle)
                .await
                .is_err()
            {
                handle.abort();
            }
        }
    }
}

/// Connect, offer, watch, reconnect; until the toolbox stops.
async fn supervise(toolbox: Arc<McpToolbox>, server: Arc<Server>) {
    let settings = &toolbox.settings;
    let stop = &toolbox.stop;
    let name = server.config.name.as_str();
    // The one backoff policy: from the first delay, doubling to the most.
    let policy = lull_port::retry::Backoff::new(settings.backoff.0, settings.backoff.1);
    let mut failures = 1;
    let mut backoff = policy.delay(failures);
    loop {
        let attempt = tokio::select! {
            attempt = tokio::time::timeout(settings.connect_timeout, connect(&server)) => attempt,
            () = stop.cancelled() => return,
        };
        let failure = match attempt {
            Ok(Ok((running, tools))) => {
                let specs = Arc::new(specs(&server.config, &tools));
                tracing::info!(server = name, tools = specs.len(), "MCP server ready");
                let peer = running.peer().clone();
                toolbox.set(&server, |live| {
                    live.state = "ready";
                    live.error = None;
                    live.peer = Some(peer);
                    live.tools = specs;
                });
                failures = 1;
                backoff = policy.delay(failures);
                let cancel = running.cancellation_token();
                let waiting = running.waiting();
                tokio::pin!(waiting);
                tokio::select! {
                    _ = &mut waiting => {}
                    () = stop.cancelled() => {
                        cancel.cancel();
                        let _ = (&mut waiting).await;
                        toolbox.set(&server, |live| {
                            live.state = "stopped";
                            live.peer = None;
                        });
                        return;
                    }
                }
                let why = server.why("the server closed the connection");
                tracing::warn!(server = name, error = %why, retry_in = ?backoff, "MCP server lost; restarting");
                toolbox.set(&server, |live| {
                    live.state = "restarting";
                    live.error = Some(why);
                    live.peer = None;
                });
                None
            }
            Ok(Err(why)) => Some(server.why(&why)),
            Err(_) => Some(format!(
                "no answer within {} (start, initialize, tools/list)",
                humantime::format_duration(settings.connect_timeout)
            )),
        };
        if let Some(why) = failure {
            tracing::warn!(server = name, error = %why, retry_in = ?backoff, "MCP server failed");
            toolbox.set(&server, |live| {
                live.state = "failed";
                live.error = Some(why);
                live.peer = None;
            });
        }
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            () = stop.cancelled() => return,
        }
        failures += 1;
        backoff = policy.delay(failures);
    }
}

impl Server {
    /// `why`, with the child's last stderr line when there is one, redacted.
    fn why(&self, why: &str) -> String {
        let tail = self.stderr_tail.lock().expect("not poisoned").clone();
        redact(match tail {
            Some(line) => format!("{why} (its last stderr line: {line})"),
            None => why.to_owned(),
        })
    }
}

type Running = RunningService<RoleClient, ClientConfig>;

/// One connection: started (or reached), initialized, its tools listed.
async fn connect(server: &Arc<Server>) -> Result<(Running, Vec<Tool>), String> {
    let mut info = ClientConfig::default();
    info.client_info = Implementation::new("lull", env!("CARGO_PKG_VERSION"));
    let running = match &server.config.transport {
        Transport::Stdio { command, args, env } => {
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(args).env_clear().kill_on_drop(true);
            for name in INHERITED_ENV {
                if let Some(value) = std::env::var_os(name) {
                    cmd.env(name, value);
                }
            }
            for (key, value) in env {
                cmd.env(key, value.expose_secret());
            }
            *server.stderr_tail.lock().expect("not poisoned") = None;
            let (transport, stderr) = TokioChildProcess::builder(cmd)
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot start {command}: {e}"))?;
            if let Some(stderr) = stderr {
                tokio::spawn(read_stderr(server.clone(), stderr));
            }
            info.serve(transport).await.map_err(|e| {
                format!(
                    "initialize failed: {}",
                    plain(&lull_port::secrets::chain(&e))
                )
            })?
        }
        Transport::Http { url, headers } => {
            use reqwest::header::{HeaderName, HeaderValue};
            let mut custom = HashMap::new();
            for (key, value) in headers {
                let name = HeaderName::from_bytes(key.as_bytes())
                    .map_err(|_| format!("\"{key}\" is not an HTTP header name"))?;
                let mut value = HeaderValue::from_str(value.expose_secret())
                    .map_err(|_| format!("the value of header \"{key}\" is not valid"))?;
                value.set_sensitive(true);
                custom.insert(name, value);
            }
            let client = reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .build()
                .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
            let transport = StreamableHttpClientTransport::with_client(
                client,
                StreamableHttpClientTransportConfig::with_uri(url.as_str()).custom_headers(custom),
            );
            info.serve(transport).await.map_err(|e| {
                format!(
                    "cannot connect to {}: {}",
                    lull_port::secrets::redact_url(url),
                    plain(&lull_port::secrets::chain(&e))
                )
            })?
        }
    };
    let tools = running.peer().list_all_tools().await.map_err(|e| {
        format!(
            "tools/list failed: {}",
            plain(&lull_port::secrets::chain(&e))
        )
    })?;
    Ok((running, tools))
}

/// An MCP client error as one plain sentence for people (`lull check`, `/healthz`,
/// the logs): the SDK's Rust type names (`[rmcp::transport::…]`) and its request
/// bookkeeping (`Send message error Transport`, `, when send initialize request`)
/// left out, and the two failures a newcomer meets said in words: a server that
/// closed its end before it answered (it exited at start), a URL nothing answers at.
pub(crate) fn plain(text: &str) -> String {
    let mut text = text.to_owned();
    if let Some(at) = text.find(", when send ") {
        text.truncate(at);
    }
    // Bracketed type names, brackets balanced (generics nest `<…>`, not brackets).
    while let Some(start) = text.find(" [")
        && let Some(len) = text[start..].find(']')
        && text[start..start + len].contains("::")
    {
        text.replace_range(start..start + len + 1, "");
    }
    for noise in ["Send message error Transport error: ", "Client error: "] {
        text = text.replace(noise, "");
    }
    if let Some(at) = text.find("error sending request for url") {
        text.replace_range(
            at..,
            "nothing answered the request (is the server running, and is the URL right?)",
        );
    }
    if let Some(at) = ["Broken pipe", "connection closed"]
        .iter()
        .find_map(|closed| text.find(closed))
    {
        text.replace_range(
            at..,
            "the server closed its end before it answered: it may have exited at start (run its command by hand to see why)",
        );
    }
    text
}

/// Log the child's stderr (redacted, at debug level) and keep its last line.
async fn read_stderr(server: Arc<Server>, mut stderr: tokio::process::ChildStderr) {
    let mut buffer = vec![0u8; 4096];
    let mut line = Vec::new();
    while let Ok(read) = stderr.read(&mut buffer).await {
        if read == 0 {
            break;
        }
        for &byte in &buffer[..read] {
            if byte == b'\n' {
                let text = redact(String::from_utf8_lossy(&line).trim_end());
                if !text.is_empty() {
                    tracing::debug!(server = %server.config.name, line = %text, "MCP server stderr");
                    *server.stderr_tail.lock().expect("not poisoned") = Some(text);
                }
                line.clear();
            } else if line.len() < 500 {
                line.push(byte);
            }
        }
    }
}

/// The offered tools of a server: allowlisted, named, their effects decided.
fn specs(config: &ServerConfig, tools: &[Tool]) -> Vec<ToolSpec> {
    let offered: Vec<&Tool> = tools
        .iter()
        .filter(|t| {
            config
                .allow
                .as_ref()
                .is_none_or(|allow| allow.iter().any(|a| a == t.name.as_ref()))
        })
        .collect();
    for listed in config
        .allow
        .iter()
        .flatten()
        .chain(&config.read_only)
        .chain(&config.confirm)
    {
        if !tools.iter().any(|t| t.name == listed.as_str()) {
            tracing::warn!(server = %config.name, tool = %listed, "the config names a tool the MCP server does not offer");
        }
    }
    let names = tool_names(
        &config.name,
        &offered.iter().map(|t| t.name.as_ref()).collect::<Vec<_>>(),
    );
    offered
        .into_iter()
        .zip(names)
        .map(|(tool, name)| {
            let mut parameters = Value::Object(tool.input_schema.as_ref().clone());
            if let Value::Object(schema) = &mut parameters
                && !schema.contains_key("type")
            {
                schema.insert("type".into(), "object".into());
            }
            ToolSpec {
                name,
                server: config.name.clone(),
                tool: tool.name.to_string(),
                description: tool
                    .description
                    .as_deref()
                    .or(tool.title.as_deref())
                    .unwrap_or_default()
                    .to_owned(),
                parameters,
                effect: effect(config, tool),
                users: config.users,
            }
        })
        .collect()
}

/// What calling `tool` does: the config's overrides, then its annotations (module
/// docs).
pub fn effect(config: &ServerConfig, tool: &Tool) -> Effect {
    let name = tool.name.as_ref();
    let hints = tool.annotations.as_ref();
    let idempotent = hints.and_then(|a| a.idempotent_hint).unwrap_or(false);
    if config.read_only.iter().any(|t| t == name) {
        return Effect::ReadOnly;
    }
    if config.confirm.iter().any(|t| t == name) {
        return Effect::Destructive { idempotent };
    }
    match hints {
        Some(a) if a.read_only_hint == Some(true) => Effect::ReadOnly,
        Some(a) if a.destructive_hint == Some(true) => Effect::Destructive { idempotent },
        _ => Effect::Acts { idempotent },
    }
}

/// `SERVER__TOOL` for each of `tools`: characters outside `[A-Za-z0-9_-]` become
/// `_`, cut to [`MAX_TOOL_NAME`], a clash given `_2`, `_3`…
pub fn tool_names(server: &str, tools: &[&str]) -> Vec<String> {
    let mut used = HashSet::new();
    tools
        .iter()
        .map(|tool| {
            let clean: String = tool
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            let base: String = format!("{server}__{clean}")
                .chars()
                .take(MAX_TOOL_NAME)
                .collect();
            let mut name = base.clone();
            let mut n = 2;
            while !used.insert(name.clone()) {
                let suffix = format!("_{n}");
                name = format!(
                    "{}{suffix}",
                    &base[..base.len().min(MAX_TOOL_NAME - suffix.len())]
                );
                n += 1;
            }
            name
        })
        .collect()
}

/// The model's view of a result: the text contents joined, other contents as
/// markers, redacted, at most `max_chars` characters (cut with a note).
pub fn output(result: &CallToolResult, max_chars: usize) -> ToolOutput {
    // Enough beyond the cut that a secret straddling it is still whole when
    // redacted.
    let keep = max_chars + 256;
    let mut text = String::new();
    let mut total = 0usize;
    let mut kept = 0usize;
    let mut push = |piece: &str| {
        if total > 0 {
            total += 1;
            if kept < keep {
                text.push('\n');
                kept += 1;
            }
        }
        let chars = piece.chars().count();
        total += chars;
        if kept < keep {
            let take = keep - kept;
            text.extend(piece.chars().take(take));
            kept += chars.min(take);
        }
    };
    for block in &result.content {
        match block {
            ContentBlock::Text(t) => push(&t.text),
            ContentBlock::Image(_) => push("[image]"),
            ContentBlock::Audio(_) => push("[audio]"),
            ContentBlock::Resource(r) => match &r.resource {
                ResourceContents::TextResourceContents { text, .. } => push(text),
                ResourceContents::BlobResourceContents { uri, .. } => {
                    push(&format!("[resource {uri}]"));
                }
                _ => push("[resource]"),
            },
            ContentBlock::ResourceLink(link) => push(&format!("[link {}]", link.uri)),
            _ => push("[content]"),
        }
    }
    if result.content.is_empty()
        && let Some(structured) = &result.structured_content
    {
        push(&structured.to_string());
    }
    let mut text = redact(text);
    if total > max_chars {
        text = text.chars().take(max_chars).collect();
        text.push_str(&format!(
            "\n[cut: the tool answered {total} characters; the first {max_chars} are shown]"
        ));
    }
    let is_error = result.is_error.unwrap_or(false);
    ToolOutput {
        text,
        is_error,
        outcome: if is_error {
            CallOutcome::Error
        } else {
            CallOutcome::Ok
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdks_errors_read_as_plain_sentences() {
        assert_eq!(
            plain(
                "Send message error Transport [rmcp::transport::child_process::TokioChildProcess] error: Broken pipe (os error 32), when send initialize request"
            ),
            "the server closed its end before it answered: it may have exited at start (run its command by hand to see why)"
        );
        assert_eq!(
            plain(
                "Send message error Transport [rmcp::transport::worker::WorkerTransport<rmcp::transport::streamable_http_client::StreamableHttpClientWorker<reqwest::async_impl::client::Client>>] error: Client error: error sending request for url (http://127.0.0.1:9/mcp), when send initialize request"
            ),
            "nothing answered the request (is the server running, and is the URL right?)"
        );
        assert_eq!(
            plain("connection closed: initialize response"),
            plain("Broken pipe (os error 32)"),
            "the same failure, however the SDK words it"
        );
        assert_eq!(plain("a plain reason"), "a plain reason");
    }

    #[test]
    fn names_fit_the_rule_and_are_unique() {
        let long = "t".repeat(80);
        let names = tool_names(
            "srv",
            &[
                "read file",
                "read_file",
                "ünï",
                long.as_str(),
                long.as_str(),
            ],
        );
        assert_eq!(names[0], "srv__read_file");
        assert_eq!(names[1], "srv__read_file_2");
        assert_eq!(names[2], "srv___n_");
        for name in &names {
            assert!(name.len() <= MAX_TOOL_NAME, "{name}");
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            );
        }
        assert_ne!(names[3], names[4]);
        assert!(names[4].ends_with("_2"));
    }

    #[test]
    fn output_is_cut_with_a_note() {
        let result: CallToolResult = serde_json::from_value(serde_json::json!({
            "content": [{"type": "text", "text": "x".repeat(1000)}, {"type": "image", "data": "", "mimeType": "image/png"}],
        }))
        .unwrap();
        let out = output(&result, 100);
        assert!(out.text.starts_with(&"x".repeat(100)));
        assert!(out.text.contains("1008 characters"), "{}", out.text);
        assert_eq!(out.outcome, CallOutcome::Ok);
        let small = output(&result, 2000);
        assert!(small.text.ends_with("\n[image]"), "{}", small.text);
    }
}
