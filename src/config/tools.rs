//! Tools: the MCP servers whose tools the model may call (`LULL_MCP_CONFIG`, Claude
//! Desktop's `mcpServers` JSON, read by [`lull_core::tools::config`]), whether they
//! are on, and how calls are bounded. A config file that cannot be used stops the
//! start with a message naming `LULL_MCP_CONFIG`, the file and the server.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use lull_core::tools::config::McpConfig;
use lull_core::tools::mcp::{self, McpSettings, McpToolbox};
use lull_core::tools::{self, ToolSettings};

use super::ConfigError;

/// `LULL_MCP_CONFIG`, `LULL_TOOLS`, `LULL_TOOL_STEPS`, `LULL_TOOL_TIMEOUT_MS`,
/// `LULL_TOOL_RESULT_CHARS`, `LULL_APPROVAL_TTL`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Tools (MCP servers)")]
pub(crate) struct ToolsArgs {
    /// MCP servers whose tools the model may call: a JSON file in Claude Desktop's format (`{"mcpServers": {...}}`; `${VAR}` in `env` and `headers` values is taken from lull's environment).
    #[arg(long, global = true, env = "LULL_MCP_CONFIG")]
    pub mcp_config: Option<PathBuf>,
    /// Tools: `auto` offers lull's own tools (memory's `lull__remember`, `lull__forget`) and, when LULL_MCP_CONFIG is set, its servers' tools to the model; `off` offers none (the file is not read).
    #[arg(long, global = true, env = "LULL_TOOLS", default_value = "auto")]
    pub tools: ToolsMode,
    /// Model turns per round at most, each of which may call tools; the last one must answer.
    #[arg(
        long,
        global = true,
        env = "LULL_TOOL_STEPS",
        default_value_t = tools::TOOL_STEPS
    )]
    pub tool_steps: u32,
    /// Deadline of one tool call, in milliseconds: a call without an answer by then is told to the model as timed out.
    #[arg(
        long,
        global = true,
        env = "LULL_TOOL_TIMEOUT_MS",
        default_value_t = mcp::CALL_TIMEOUT_MS
    )]
    pub tool_timeout_ms: u64,
    /// Most characters of one tool result the model sees; a longer result is cut, with a note.
    #[arg(
        long,
        global = true,
        env = "LULL_TOOL_RESULT_CHARS",
        default_value_t = mcp::MAX_RESULT_CHARS
    )]
    pub tool_result_chars: usize,
    /// How long a destructive tool call waits for the person's `/approve` (e.g. `10m`, `1h`).
    #[arg(long, global = true, env = "LULL_APPROVAL_TTL", default_value = "10m")]
    pub approval_ttl: humantime::Duration,
}

/// `LULL_TOOLS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ToolsMode {
    /// Tools are on when LULL_MCP_CONFIG is set.
    Auto,
    /// No tools.
    Off,
}

/// The MCP servers and how their calls are bounded (tools on).
#[derive(Debug, Clone)]
pub(crate) struct ToolsConfig {
    pub mcp: McpConfig,
    pub settings: McpSettings,
}

/// The smallest `LULL_TOOL_RESULT_CHARS`: room for some result and the note that it
/// was cut.
const MIN_RESULT_CHARS: usize = 100;

impl ToolsArgs {
    /// Whether lull's own tools are offered (`LULL_TOOLS=auto`).
    pub(crate) fn builtin(&self) -> bool {
        self.tools == ToolsMode::Auto
    }

    /// How rounds run tools, checked.
    pub(crate) fn settings(&self) -> Result<ToolSettings, ConfigError> {
        if self.tool_steps == 0 {
            return Err(ConfigError(
                "LULL_TOOL_STEPS must be at least 1, got 0".into(),
            ));
        }
        let approval_ttl: Duration = self.approval_ttl.into();
        if approval_ttl.is_zero() {
            return Err(ConfigError(
                "LULL_APPROVAL_TTL must be longer than 0".into(),
            ));
        }
        Ok(ToolSettings {
            steps: self.tool_steps,
            call_timeout: super::positive("LULL_TOOL_TIMEOUT_MS", self.tool_timeout_ms)?,
            approval_ttl,
        })
    }

    /// The servers, read from `LULL_MCP_CONFIG` (`None` with tools off or no file).
    pub(crate) fn check(&self) -> Result<Option<ToolsConfig>, ConfigError> {
        let call_timeout = super::positive("LULL_TOOL_TIMEOUT_MS", self.tool_timeout_ms)?;
        if self.tool_result_chars < MIN_RESULT_CHARS {
            return Err(ConfigError(format!(
                "LULL_TOOL_RESULT_CHARS must be at least {MIN_RESULT_CHARS}, got {}",
                self.tool_result_chars
            )));
        }
        let Some(path) = self
            .mcp_config
            .as_ref()
            .filter(|_| self.tools == ToolsMode::Auto)
        else {
            return Ok(None);
        };
        let mcp = lull_core::tools::config::load(path)
            .map_err(|e| ConfigError(format!("LULL_MCP_CONFIG: {e}")))?;
        Ok(Some(ToolsConfig {
            mcp,
            settings: McpSettings {
                call_timeout,
                max_result_chars: self.tool_result_chars,
                ..McpSettings::default()
            },
        }))
    }
}

impl ToolsConfig {
    /// Start the servers (in the background: see [`McpToolbox::start`]).
    pub(crate) fn start(&self) -> Arc<McpToolbox> {
        McpToolbox::start(self.mcp.clone(), self.settings.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::super::tests::{assert_errors_name, settings};
    use super::*;

    #[test]
    fn defaults_are_the_cores_and_tools_need_a_config() {
        let config = Config::from_settings(&settings(&[])).unwrap();
        assert!(config.tools.is_none());
        assert_eq!(config.dispatch.tools, ToolSettings::default());
        let s = settings(&[]).tools;
        assert_eq!(s.tool_timeout_ms, mcp::CALL_TIMEOUT_MS);
        assert_eq!(s.tool_result_chars, mcp::MAX_RESULT_CHARS);
        assert_eq!(
            Duration::from(s.approval_ttl),
            lull_core::tools::APPROVAL_TTL
        );
    }

    #[test]
    fn a_config_file_turns_tools_on_unless_off() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mcp.json");
        std::fs::write(&path, r#"{"mcpServers": {"t": {"command": "true"}}}"#).unwrap();
        let path = path.to_str().unwrap();
        let on = Config::from_settings(&settings(&[
            "--mcp-config",
            path,
            "--tool-steps",
            "3",
            "--approval-ttl",
            "1h",
            "--tool-timeout-ms",
            "500",
        ]))
        .unwrap();
        let tools = on.tools.expect("on");
        assert_eq!(tools.mcp.servers[0].name, "t");
        assert_eq!(tools.settings.call_timeout, Duration::from_millis(500));
        assert_eq!(on.dispatch.tools.steps, 3);
        assert_eq!(on.dispatch.tools.approval_ttl, Duration::from_secs(3600));
        let off =
            Config::from_settings(&settings(&["--mcp-config", path, "--tools", "off"])).unwrap();
        assert!(off.tools.is_none());
    }

    #[test]
    fn errors_name_the_variable_and_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, r#"{"mcpServers": {"t": {}}}"#).unwrap();
        let bad = bad.to_str().unwrap();
        assert_errors_name(&[
            (&["--tool-steps", "0"], "LULL_TOOL_STEPS"),
            (&["--approval-ttl", "0s"], "LULL_APPROVAL_TTL"),
            (&["--tool-timeout-ms", "0"], "LULL_TOOL_TIMEOUT_MS"),
            (&["--tool-result-chars", "10"], "LULL_TOOL_RESULT_CHARS"),
            (
                &["--mcp-config", "/nonexistent/mcp.json"],
                "LULL_MCP_CONFIG",
            ),
            (&["--mcp-config", bad], "LULL_MCP_CONFIG"),
        ]);
        let e = Config::from_settings(&settings(&["--mcp-config", bad]))
            .unwrap_err()
            .0;
        assert!(e.contains(bad) && e.contains("\"t\""), "{e}");
    }
}
