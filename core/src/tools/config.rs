//! `LULL_MCP_CONFIG`: MCP servers in Claude Desktop's format.
//!
//! ```json
//! {"mcpServers": {
//!   "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv"],
//!             "env": {"TOKEN": "${FILES_TOKEN}"}},
//!   "web":   {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ${WEB_KEY}"},
//!             "tools": ["search"], "readOnly": ["search"], "confirm": [], "users": "admins"}
//! }}
//! ```
//!
//! Per server: `command` (+ `args`, `env`) for a stdio server, or `url` (+ `headers`)
//! for a Streamable HTTP one, never both; optional `tools` (an allowlist of the
//! server's tool names), `readOnly` and `confirm` (override the tools' annotations:
//! read-only, or destructive so a call waits for the person's yes), `users`
//! (`allowed`, the default, or `admins`), `disabled`. Other top-level keys of a Claude
//! Desktop file are ignored; unknown keys inside a server are refused (a typo must not
//! silently drop a `confirm`).
//!
//! Invariants: `${VAR}` in `env` and `headers` values is replaced from lull's
//! environment when the file is read (a missing variable is an error naming the
//! server, the key and the variable); every substituted value and every header value
//! is registered for redaction ([`lull_port::secrets::register`]) before anything can
//! log it, and is kept as a [`SecretString`] (no `Debug` shows it). Server names are
//! `[A-Za-z0-9_-]`, at most [`MAX_SERVER_NAME`] characters, without `__`, so
//! `SERVER__TOOL` fits OpenAI's function-name rule and splits one way.

use std::collections::BTreeMap;
use std::path::Path;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use super::Users;

/// The longest server name: leaves room in the 64 characters of `SERVER__TOOL`.
pub const MAX_SERVER_NAME: usize = 32;

/// The parsed file: the servers that are not disabled, by name.
#[derive(Debug, Clone)]
pub struct McpConfig {
    /// Where it was read from, for messages (`LULL_MCP_CONFIG`'s value).
    pub source: String,
    /// Sorted by name (the order tools are offered in).
    pub servers: Vec<ServerConfig>,
}

/// One server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub name: String,
    pub transport: Transport,
    /// `tools`: only these of the server's tools are offered (`None`: all).
    pub allow: Option<Vec<String>>,
    /// `readOnly`: these tools are read-only, whatever their annotations say.
    pub read_only: Vec<String>,
    /// `confirm`: these tools are destructive (wait for approval), whatever their
    /// annotations say.
    pub confirm: Vec<String>,
    pub users: Users,
}

/// How lull reaches a server.
#[derive(Debug, Clone)]
pub enum Transport {
    /// A child process speaking newline-delimited JSON-RPC on stdin/stdout. `env` is
    /// all it gets of an environment besides `PATH` and `HOME` (see
    /// [`super::mcp`]).
    Stdio {
        command: String,
        args: Vec<String>,
        env: Vec<(String, SecretString)>,
    },
    /// Streamable HTTP at `url`, every request carrying `headers`.
    Http {
        url: String,
        headers: Vec<(String, SecretString)>,
    },
}

/// A config that cannot be used; the message names the file and the server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct McpConfigError(pub String);

#[derive(Deserialize)]
struct File {
    #[serde(rename = "mcpServers")]
    mcp_servers: Option<BTreeMap<String, RawServer>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    /// Claude Desktop's optional transport name; checked against the keys given.
    #[serde(rename = "type")]
    kind: Option<String>,
    tools: Option<Vec<String>>,
    #[serde(rename = "readOnly", default)]
    read_only: Vec<String>,
    #[serde(default)]
    confirm: Vec<String>,
    users: Option<String>,
    #[serde(default)]
    disabled: bool,
}

/// Read and parse the file at `path`, substituting `${VAR}` from this process's
/// environment.
pub fn load(path: &Path) -> Result<McpConfig, McpConfigError> {
    let source = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| McpConfigError(format!("cannot read {source}: {e}")))?;
    parse(&text, &source, |name| std::env::var(name).ok())
}

/// Parse `text` (read from `source`), taking `${VAR}` values from `lookup`.
pub fn parse(
    text: &str,
    source: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<McpConfig, McpConfigError> {
    let file: File = serde_json::from_str(text)
        .map_err(|e| McpConfigError(format!("{source} is not a valid MCP config: {e}")))?;
    let Some(raw) = file.mcp_servers else {
        return Err(McpConfigError(format!(
            "{source} has no \"mcpServers\" object"
        )));
    };
    let mut servers = Vec::new();
    for (name, server) in raw {
        if server.disabled {
            continue;
        }
        servers.push(server_config(source, name, server, &lookup)?);
    }
    Ok(McpConfig {
        source: source.to_owned(),
        servers,
    })
}

fn server_config(
    source: &str,
    name: String,
    raw: RawServer,
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<ServerConfig, McpConfigError> {
    let fail = |why: String| McpConfigError(format!("{source}: server \"{name}\": {why}"));
    check_name(&name).map_err(|why| fail(why.to_owned()))?;
    let transport = match (raw.command, raw.url) {
        (Some(_), Some(_)) => return Err(fail("has both \"command\" and \"url\"".into())),
        (None, None) => {
            return Err(fail(
                "has neither \"command\" (a stdio server) nor \"url\" (Streamable HTTP)".into(),
            ));
        }
        (Some(command), None) => {
            if !raw.headers.is_empty() {
                return Err(fail("\"headers\" needs a \"url\" server".into()));
            }
            if command.trim().is_empty() {
                return Err(fail("\"command\" is empty".into()));
            }
            if let Some(kind) = &raw.kind
                && kind != "stdio"
            {
                return Err(fail(format!("\"type\": \"{kind}\" with a \"command\"")));
            }
            let env = substitute_all(&raw.env, "env", false, lookup).map_err(fail)?;
            Transport::Stdio {
                command,
                args: raw.args,
                env,
            }
        }
        (None, Some(url)) => {
            if !raw.env.is_empty() || !raw.args.is_empty() {
                return Err(fail(
                    "\"args\" and \"env\" need a \"command\" server".into(),
                ));
            }
            if let Some(kind) = &raw.kind
                && !matches!(kind.as_str(), "http" | "streamable-http" | "streamableHttp")
            {
                return Err(fail(format!(
                    "\"type\": \"{kind}\" is not Streamable HTTP (\"http\")"
                )));
            }
            let parsed =
                url::Url::parse(&url).map_err(|e| fail(format!("\"url\" is not a URL ({e})")))?;
            if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
                return Err(fail("\"url\" must be an http:// or https:// URL".into()));
            }
            let headers = substitute_all(&raw.headers, "headers", true, lookup).map_err(fail)?;
            for (header, _) in &headers {
                if reqwest::header::HeaderName::from_bytes(header.as_bytes()).is_err() {
                    return Err(fail(format!("\"{header}\" is not an HTTP header name")));
                }
            }
            Transport::Http { url, headers }
        }
    };
    let users = match raw.users.as_deref() {
        None | Some("allowed") => Users::Allowed,
        Some("admins") => Users::Admins,
        Some(other) => {
            return Err(fail(format!(
                "\"users\" must be \"allowed\" or \"admins\", got \"{other}\""
            )));
        }
    };
    if let Some(both) = raw.read_only.iter().find(|t| raw.confirm.contains(t)) {
        return Err(fail(format!(
            "tool \"{both}\" is in both \"readOnly\" and \"confirm\""
        )));
    }
    Ok(ServerConfig {
        name,
        transport,
        allow: raw.tools,
        read_only: raw.read_only,
        confirm: raw.confirm,
        users,
    })
}

/// Why `name` cannot be a server name, if it cannot.
fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > MAX_SERVER_NAME {
        return Err("a server name must have 1 to 32 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err("a server name may only hold letters, digits, '_' and '-'");
    }
    if name.contains("__") || name.ends_with('_') {
        return Err(
            "a server name may not hold \"__\" or end with '_' (tools are named SERVER__TOOL)",
        );
    }
    Ok(())
}

/// Every value of `map` with `${VAR}` substituted; substituted values (and, for
/// `all_secret`, every value) registered for redaction.
fn substitute_all(
    map: &BTreeMap<String, String>,
    what: &str,
    all_secret: bool,
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, SecretString)>, String> {
    let mut out = Vec::new();
    for (key, value) in map {
        let (value, substituted) =
            substitute(value, lookup).map_err(|why| format!("\"{what}\" key \"{key}\": {why}"))?;
        if all_secret || substituted {
            register(&value);
        }
        out.push((key.clone(), value));
    }
    Ok(out)
}

/// Registers `value` for redaction, and its last word alone (the token of
/// `Bearer TOKEN`), so an error quoting only the token is redacted too.
fn register(value: &SecretString) {
    lull_port::secrets::register(value);
    if let Some((_, last)) = value.expose_secret().trim().rsplit_once(' ') {
        lull_port::secrets::register(&SecretString::from(last));
    }
}

/// `value` with each `${VAR}` replaced by `lookup(VAR)` (each registered for
/// redaction), and whether any was. A missing variable, or an unclosed `${`, is an
/// error naming it.
fn substitute(
    value: &str,
    lookup: &impl Fn(&str) -> Option<String>,
) -> Result<(SecretString, bool), String> {
    let mut out = String::new();
    let mut rest = value;
    let mut substituted = false;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            return Err("an unclosed \"${\"".into());
        };
        let variable = &after[..end];
        if variable.is_empty() {
            return Err("an empty \"${}\"".into());
        }
        let Some(found) = lookup(variable) else {
            return Err(format!("the environment variable {variable} is not set"));
        };
        out.push_str(&found);
        // The variable's value on its own too: an error may quote just that.
        lull_port::secrets::register(&SecretString::from(found));
        substituted = true;
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok((SecretString::from(out), substituted))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(name: &str) -> Option<String> {
        match name {
            "TOKEN" => Some("tok-12345-secret".into()),
            "KEY" => Some("key-67890-secret".into()),
            _ => None,
        }
    }

    fn parse_ok(text: &str) -> McpConfig {
        parse(text, "mcp.json", lookup).expect("parses")
    }

    fn parse_err(text: &str) -> String {
        parse(text, "mcp.json", lookup).unwrap_err().0
    }

    #[test]
    fn both_transports_with_substitution_and_overrides() {
        let config = parse_ok(
            r#"{"globalShortcut": "x", "mcpServers": {
                "web": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer ${KEY}"},
                        "tools": ["search"], "readOnly": ["search"], "users": "admins"},
                "files": {"command": "npx", "args": ["-y", "srv"], "env": {"T": "pre-${TOKEN}-post", "P": "/tmp"},
                          "confirm": ["write"]},
                "off": {"command": "x", "disabled": true}
            }}"#,
        );
        assert_eq!(config.source, "mcp.json");
        let names: Vec<&str> = config.servers.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["files", "web"], "sorted, disabled left out");
        let files = &config.servers[0];
        let Transport::Stdio { command, args, env } = &files.transport else {
            panic!("stdio");
        };
        assert_eq!((command.as_str(), args.len()), ("npx", 2));
        let env: Vec<(&str, &str)> = env
            .iter()
            .map(|(k, v)| (k.as_str(), v.expose_secret()))
            .collect();
        assert_eq!(env, [("P", "/tmp"), ("T", "pre-tok-12345-secret-post")]);
        assert_eq!(files.confirm, ["write"]);
        assert_eq!(files.users, Users::Allowed);
        let web = &config.servers[1];
        let Transport::Http { url, headers } = &web.transport else {
            panic!("http");
        };
        assert_eq!(url, "https://example.com/mcp");
        assert_eq!(headers[0].1.expose_secret(), "Bearer key-67890-secret");
        assert_eq!(web.allow.as_deref(), Some(&["search".to_owned()][..]));
        assert_eq!(web.users, Users::Admins);
        // Registered for redaction, and hidden from Debug.
        let shown = lull_port::secrets::redact("tok-12345-secret and key-67890-secret");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(!format!("{config:?}").contains("12345"));
    }

    #[test]
    fn errors_name_the_file_the_server_and_the_cause() {
        let cases: &[(&str, &[&str])] = &[
            ("{", &["mcp.json", "not a valid MCP config"]),
            ("{}", &["mcp.json", "mcpServers"]),
            (
                r#"{"mcpServers": {"a": {"command": "x", "url": "http://h/"}}}"#,
                &["mcp.json", "\"a\"", "both"],
            ),
            (
                r#"{"mcpServers": {"a": {"args": []}}}"#,
                &["\"a\"", "neither"],
            ),
            (
                r#"{"mcpServers": {"bad name": {"command": "x"}}}"#,
                &["\"bad name\"", "letters"],
            ),
            (
                r#"{"mcpServers": {"a__b": {"command": "x"}}}"#,
                &["\"a__b\"", "__"],
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "env": {"K": "${MISSING}"}}}}"#,
                &["\"a\"", "\"K\"", "MISSING"],
            ),
            (
                r#"{"mcpServers": {"a": {"url": "http://h/", "headers": {"H": "${NOPE}"}}}}"#,
                &["\"a\"", "\"H\"", "NOPE"],
            ),
            (
                r#"{"mcpServers": {"a": {"url": "ftp://h/"}}}"#,
                &["\"a\"", "http"],
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "users": "all"}}}"#,
                &["\"a\"", "users"],
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "confrim": []}}}"#,
                &["mcp.json", "confrim"],
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "readOnly": ["t"], "confirm": ["t"]}}}"#,
                &["\"a\"", "both"],
            ),
        ];
        for (text, words) in cases {
            let e = parse_err(text);
            for word in *words {
                assert!(e.contains(word), "{text}: {e} (expected {word})");
            }
        }
        let long = "x".repeat(MAX_SERVER_NAME + 1);
        let e = parse_err(&format!(
            r#"{{"mcpServers": {{"{long}": {{"command": "x"}}}}}}"#
        ));
        assert!(e.contains("32"), "{e}");
    }

    #[test]
    fn a_missing_file_is_named() {
        let e = load(Path::new("/nonexistent/mcp.json")).unwrap_err().0;
        assert!(e.contains("/nonexistent/mcp.json"), "{e}");
    }
}
