//! The tools seam: what the model may call during a round, and how a call is run.
//!
//! A [`Toolbox`] offers [`ToolSpec`]s (named `SERVER__TOOL`, within OpenAI's function
//! name rules) and runs calls. The dispatcher decides *whether* a call runs (the
//! journal, [`crate::store::ActionStore`]: a call that is not read-only is reserved
//! before it runs and never runs twice); the toolbox only runs what it is handed.
//!
//! Invariant: [`Toolbox::call`] never fails and never hangs: a failing, dying or
//! hanging tool, and one that answers too much, becomes a [`ToolOutput`] with
//! `is_error` set (or cut with a note) within the call's deadline.
//!
//! [`mcp`] implements it on MCP servers (stdio and Streamable HTTP, through `rmcp`),
//! configured in Claude Desktop's `mcpServers` JSON ([`config`]). [`web`] holds lull's
//! own read-only web tools, `lull__fetch` (guarded against requests to the host's own
//! network) and `lull__search` (through SearXNG); [`beside`] layers lull's own tools
//! (these, the job tools, the memory tools) over any toolbox.

use std::time::Duration;

use async_trait::async_trait;

pub mod beside;
pub mod config;
pub mod mcp;
pub mod web;

/// How the dispatcher runs tools in a round (`LULL_TOOL_STEPS`, `LULL_TOOL_TIMEOUT_MS`,
/// `LULL_APPROVAL_TTL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolSettings {
    /// Model turns per round at most (each may call tools); the last one answers.
    pub steps: u32,
    /// A call's deadline (the toolbox's, [`mcp::McpSettings::call_timeout`]): the
    /// reservation of a call that acts expires after it and a margin, so a later round
    /// can tell an abandoned call from one still running.
    pub call_timeout: Duration,
    /// How long a destructive call waits for the person's `/approve`.
    pub approval_ttl: Duration,
}

/// `LULL_TOOL_STEPS`.
pub const TOOL_STEPS: u32 = 8;
/// `LULL_APPROVAL_TTL`: ten minutes.
pub const APPROVAL_TTL: Duration = Duration::from_secs(600);

impl Default for ToolSettings {
    fn default() -> Self {
        ToolSettings {
            steps: TOOL_STEPS,
            call_timeout: Duration::from_millis(mcp::CALL_TIMEOUT_MS),
            approval_ttl: APPROVAL_TTL,
        }
    }
}

/// What running a tool does to the world, from its MCP annotations (`readOnlyHint`,
/// `destructiveHint`, `idempotentHint`) or the server's `readOnly`/`confirm` lists in
/// the config, which override them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Reads only: runs freely, its result kept for the round.
    ReadOnly,
    /// Acts: reserved in the journal before it runs, never run twice. `idempotent`:
    /// running it twice does what running it once does, so an abandoned reservation
    /// may run again.
    Acts { idempotent: bool },
    /// Acts destructively: waits for the person's yes (`/approve`), then as `Acts`.
    Destructive { idempotent: bool },
    /// Stages a change of lull's own state (a memory) that is written in the reply's
    /// final-check transaction, or not at all: runs freely, like a read, because it
    /// acts on nothing until the reply is committed.
    WithReply,
}

impl Effect {
    /// The class people read (`lull check`, the console's tools page): what a call of
    /// the tool does.
    pub fn class(self) -> &'static str {
        match self {
            Effect::ReadOnly => "read-only",
            Effect::Acts { .. } => "acts once",
            Effect::Destructive { .. } => "waits for /approve",
            Effect::WithReply => "written with the reply",
        }
    }
}

/// Who may trigger a server's tools (`"users"` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Users {
    /// Everyone lull answers (the default).
    #[default]
    Allowed,
    /// Only lull's admins (`LULL_ADMINS`).
    Admins,
}

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// The name the model calls: `SERVER__TOOL`, at most 64 characters of
    /// `[A-Za-z0-9_-]` (OpenAI's rule), unique in the toolbox.
    pub name: String,
    /// The MCP server's name in the config.
    pub server: String,
    /// The tool's own name on its server.
    pub tool: String,
    pub description: String,
    /// The JSON Schema of the arguments (an object schema; `{"type":"object"}` when
    /// the server gives none).
    pub parameters: serde_json::Value,
    pub effect: Effect,
    pub users: Users,
}

/// How a call ended, for `lull_tool_calls_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallOutcome {
    Ok,
    /// The tool reported a failure (`isError`), the server answered the request with
    /// a JSON-RPC error, or the call could not be sent at all: it did not act.
    Error,
    /// No answer within the call's deadline.
    Timeout,
    /// The request was written, then the call failed without an answer (the server
    /// died, the connection closed or broke, an HTTP error that is no JSON-RPC
    /// answer): it may or may not have acted.
    Lost,
}

impl CallOutcome {
    /// Whether the call may have acted without lull knowing: its request was written
    /// and no answer came (a timeout, or a failure after the request: [`CallOutcome::Lost`]).
    pub fn is_unknown(self) -> bool {
        matches!(self, CallOutcome::Timeout | CallOutcome::Lost)
    }

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            CallOutcome::Ok => "ok",
            CallOutcome::Error => "error",
            CallOutcome::Timeout => "timeout",
            CallOutcome::Lost => "lost",
        }
    }
}

/// What a call gave the model: text (a tool's output is data, shown to the model as
/// a tool result and to nobody else), already cut to the toolbox's limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    pub text: String,
    pub is_error: bool,
    pub outcome: CallOutcome,
}

impl ToolOutput {
    /// A result that went well.
    pub fn ok(text: impl Into<String>) -> Self {
        ToolOutput {
            text: text.into(),
            is_error: false,
            outcome: CallOutcome::Ok,
        }
    }

    /// A failure told to the model as the tool's result.
    pub fn error(text: impl Into<String>, outcome: CallOutcome) -> Self {
        ToolOutput {
            text: text.into(),
            is_error: true,
            outcome,
        }
    }
}

/// One server's state, for `/healthz` and `lull check`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ServerState {
    pub name: String,
    /// `starting`, `ready`, `restarting` (a server whose connection ended, a stdio
    /// child that died, connected again with backoff), `failed` (the last attempt
    /// failed; `error` says why; tried again with backoff) or `stopped` (after
    /// [`Toolbox::shutdown`]).
    pub state: &'static str,
    pub tools: usize,
    /// Redacted: never a header or env value.
    pub error: Option<String>,
}

/// Something that offers tools and runs calls.
#[async_trait]
pub trait Toolbox: Send + Sync + 'static {
    /// The tools offered now (of servers that are up), in a stable order.
    fn tools(&self) -> Vec<ToolSpec>;

    /// Run `name` (a [`ToolSpec::name`]) with `arguments`. `key`, for a reserved
    /// action, is its idempotency key, passed to the server in the request's `_meta`
    /// (`{"idempotencyKey": key}`). Never fails, never outlasts the call's deadline
    /// (module docs).
    async fn call(
        &self,
        name: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
        key: Option<&str>,
    ) -> ToolOutput;

    /// Each configured server's state.
    fn servers(&self) -> Vec<ServerState>;

    /// Stop every server lull started (stdio children), at shutdown.
    async fn shutdown(&self);
}
