//! lull's own tools beside a toolbox: [`Beside`] offers the inner toolbox's tools (the
//! MCP servers', or another layer of lull's) and its own, answers its own names and
//! hands every other call on. The job tools, the memory tools and the web tools are
//! each one [`OwnTools`], layered per round.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value};

use super::{CallOutcome, ServerState, ToolOutput, ToolSpec, Toolbox};

/// The server name lull's own tools are counted under (`lull_tool_calls_total{server}`).
pub const OWN_SERVER: &str = "lull";

impl ToolSpec {
    /// One of lull's own tools: `name` is `lull__TOOL`, counted under [`OWN_SERVER`].
    pub fn own(
        name: &str,
        description: &str,
        parameters: Value,
        effect: super::Effect,
        users: super::Users,
    ) -> ToolSpec {
        ToolSpec {
            name: name.to_owned(),
            server: OWN_SERVER.to_owned(),
            tool: name.trim_start_matches("lull__").to_owned(),
            description: description.to_owned(),
            parameters,
            effect,
            users,
        }
    }
}

/// A set of lull's own tools.
#[async_trait]
pub trait OwnTools: Send + Sync + 'static {
    /// The tools offered, in a stable order.
    fn specs(&self) -> Vec<ToolSpec>;

    /// Whether `name` is one of these tools.
    fn owns(&self, name: &str) -> bool;

    /// Run one of these tools (`key`: a reserved action's idempotency key). Never
    /// fails, never hangs (as [`Toolbox::call`]).
    async fn call_own(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        key: Option<&str>,
    ) -> ToolOutput;
}

/// `own`'s tools beside `inner`'s.
pub struct Beside<T> {
    own: T,
    inner: Option<Arc<dyn Toolbox>>,
}

impl<T: OwnTools> Beside<T> {
    /// The toolbox offering `inner`'s tools, then `own`'s.
    pub fn over(own: T, inner: Option<Arc<dyn Toolbox>>) -> Arc<dyn Toolbox> {
        Arc::new(Beside { own, inner })
    }
}

#[async_trait]
impl<T: OwnTools> Toolbox for Beside<T> {
    fn tools(&self) -> Vec<ToolSpec> {
        let mut tools = self.inner.as_ref().map(|t| t.tools()).unwrap_or_default();
        tools.extend(self.own.specs());
        tools
    }

    async fn call(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        key: Option<&str>,
    ) -> ToolOutput {
        if self.own.owns(name) {
            return self.own.call_own(name, arguments, key).await;
        }
        match &self.inner {
            Some(inner) => inner.call(name, arguments, key).await,
            None => ToolOutput::error(crate::texts::unknown_tool_result(name), CallOutcome::Error),
        }
    }

    fn servers(&self) -> Vec<ServerState> {
        self.inner.as_ref().map(|t| t.servers()).unwrap_or_default()
    }

    async fn shutdown(&self) {
        if let Some(inner) = &self.inner {
            inner.shutdown().await;
        }
    }
}
