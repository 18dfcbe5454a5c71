//! The console's tools page, `GET /tools`: each MCP server's state, and each tool the
//! model may call (the servers', then lull's own that are on: a private chat's round
//! offers them all) with its class (read-only, acts once, waits for `/approve`,
//! written with the reply), who may trigger it, and this process's calls of it by
//! outcome (`lull_tool_calls_total`). Read-only.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use lull_core::tools::{ServerState, ToolSpec, Users};

use super::page::{document, esc, nav};
use super::{StatusPage, html};

/// `GET /tools`.
pub(super) async fn page(State(status): State<StatusPage>, headers: HeaderMap) -> Response {
    if let Some(refused) = status.refusal(&headers, false) {
        return refused;
    }
    let toolbox = status
        .inner
        .console
        .as_ref()
        .and_then(|d| d.toolbox().cloned());
    let (servers, mut tools) = toolbox
        .map(|t| (t.servers(), t.tools()))
        .unwrap_or_default();
    if let Some(d) = &status.inner.console {
        tools.extend(d.console_own_tools());
    }
    let calls = status
        .inner
        .metrics
        .as_ref()
        .map(|m| tool_calls(&m.render()))
        .unwrap_or_default();
    html(StatusCode::OK, render(&servers, &tools, &calls))
}

/// This process's tool calls by ((server, tool), outcome), from the Prometheus text
/// `rendered`.
pub(super) fn tool_calls(rendered: &str) -> BTreeMap<((String, String), String), u64> {
    let mut calls = BTreeMap::new();
    for line in rendered.lines().filter(|l| !l.starts_with('#')) {
        let Some(labels) = line
            .strip_prefix(lull_core::metrics::TOOL_CALLS)
            .and_then(|rest| rest.strip_prefix('{'))
        else {
            continue;
        };
        let Some((labels, value)) = labels.rsplit_once("} ") else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|l| l.strip_prefix(&format!("{name}=\"")))
                .and_then(|l| l.split('"').next())
                .unwrap_or_default()
                .to_owned()
        };
        let Ok(n) = value.trim().parse::<f64>() else {
            continue;
        };
        let tool = (label("server"), label("tool"));
        *calls.entry((tool, label("outcome"))).or_default() += n as u64;
    }
    calls
}

fn render(
    servers: &[ServerState],
    tools: &[ToolSpec],
    calls: &BTreeMap<((String, String), String), u64>,
) -> String {
    let mut out = format!(
        "<header><h1>lull tools</h1><p>{} tool(s) the model may call: the MCP servers', then lull's own (server lull: memory, jobs and the web, as they are on); calls counted by this process since it started</p>{}</header><main>",
        tools.len(),
        nav("/tools")
    );
    out.push_str("<section class=\"wide\"><h2>MCP servers</h2>");
    if servers.is_empty() {
        out.push_str("<p class=\"muted\">No MCP server (LULL_MCP_CONFIG unset, or tools off).</p>");
    } else {
        out.push_str("<table id=\"servers\"><tr><th>server</th><th>state</th><th>tools</th><th>error</th></tr>");
        for s in servers {
            let class = if s.state == "ready" { "ok" } else { "bad" };
            let _ = write!(
                out,
                "<tr data-server=\"{n}\" data-state=\"{st}\"><td>{n}</td><td class=\"{class}\">{st}</td><td class=\"n\">{t}</td><td>{e}</td></tr>",
                n = esc(&s.name),
                st = s.state,
                t = s.tools,
                e = esc(s.error.as_deref().unwrap_or(""))
            );
        }
        out.push_str("</table>");
    }
    out.push_str("</section><section class=\"wide\"><h2>Tools</h2><table id=\"tools\"><tr><th>tool</th><th>server</th><th>class</th><th>who</th><th>calls</th></tr>");
    for t in tools {
        let counted: Vec<String> = calls
            .iter()
            .filter(|(((server, tool), _), _)| *server == t.server && *tool == t.tool)
            .map(|((_, outcome), n)| format!("{outcome} {n}"))
            .collect();
        let _ = write!(
            out,
            "<tr data-tool=\"{name}\" data-class=\"{class}\"><td><code>{tool}</code></td><td>{server}</td><td>{class}</td><td>{who}</td><td>{calls}</td></tr>",
            name = esc(&t.name),
            tool = esc(&t.tool),
            server = esc(&t.server),
            class = t.effect.class(),
            who = match t.users {
                Users::Allowed => "everyone answered",
                Users::Admins => "admins only",
            },
            calls = esc(&if counted.is_empty() {
                "none".to_owned()
            } else {
                counted.join(", ")
            }),
        );
    }
    out.push_str("</table></section></main>");
    document("lull — tools", &out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_are_read_by_tool_and_outcome() {
        let text = "# TYPE lull_tool_calls_total counter\n\
                    lull_tool_calls_total{outcome=\"ok\",server=\"fs\",tool=\"read\"} 3\n\
                    lull_tool_calls_total{outcome=\"refused\",server=\"fs\",tool=\"write\"} 1\n\
                    lull_tool_call_duration_seconds_count{server=\"fs\",tool=\"read\"} 3\n";
        let calls = tool_calls(text);
        let key =
            |tool: &str, outcome: &str| (("fs".to_owned(), tool.to_owned()), outcome.to_owned());
        assert_eq!(calls[&key("read", "ok")], 3);
        assert_eq!(calls[&key("write", "refused")], 1);
        assert_eq!(calls.len(), 2);
    }
}
