//! The MCP client behind the tools seam ([`McpToolbox`]) against real servers: the
//! small stdio server in `tests/support/mcp_server.py` (always: it needs only
//! `python3`), and the reference servers `@modelcontextprotocol/server-filesystem`
//! (stdio) and `server-everything` (Streamable HTTP on loopback), installed by
//! `scripts/mcp-servers` (skipped with one line without them, unless
//! `LULL_REQUIRE_MCP=1`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lull_core::tools::config::{self, McpConfig};
use lull_core::tools::mcp::{McpSettings, McpToolbox};
use lull_core::tools::{CallOutcome, Effect, Toolbox};
use serde_json::{Map, Value, json};

/// The Python interpreter itself (not a launcher such as pyenv's shim, a shell
/// script that would add variables of its own to the server's environment).
fn python() -> String {
    static PYTHON: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let out = std::process::Command::new("python3")
                .args(["-c", "import sys; print(sys.executable)"])
                .output()
                .expect("python3 runs");
            String::from_utf8(out.stdout).unwrap().trim().to_owned()
        })
        .clone()
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/mcp_server.py")
}

/// A toolbox on one test server named `t` (its files in `dir`), `extra_env` added to
/// its `env`, `${VAR}` taken from this process's environment.
struct Fixture {
    dir: tempfile::TempDir,
    toolbox: Arc<McpToolbox>,
}

impl Fixture {
    async fn start(extra_env: Value, settings: McpSettings) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let mut env = json!({
            "MCP_COUNT_FILE": dir.path().join("count.jsonl"),
            "MCP_NOTES_FILE": dir.path().join("notes.txt"),
            "MCP_SLOW_MS": "300",
        });
        env.as_object_mut()
            .unwrap()
            .extend(extra_env.as_object().unwrap().clone());
        let text = json!({"mcpServers": {"t": {
            "command": python(),
            "args": [script()],
            "env": env,
            "confirm": ["plain_confirmed"],
            "readOnly": ["env_dump"],
        }}})
        .to_string();
        let config = config::parse(&text, "test.json", |v| std::env::var(v).ok()).unwrap();
        Fixture::with_config(dir, config, settings).await
    }

    async fn with_config(dir: tempfile::TempDir, config: McpConfig, settings: McpSettings) -> Self {
        let toolbox = McpToolbox::start(config, settings);
        assert!(
            toolbox.wait_settled(Duration::from_secs(20)).await,
            "{:?}",
            toolbox.servers()
        );
        assert_eq!(
            toolbox.servers()[0].state,
            "ready",
            "{:?}",
            toolbox.servers()
        );
        Fixture { dir, toolbox }
    }

    fn executions(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("count.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

fn args(value: Value) -> Map<String, Value> {
    value.as_object().unwrap().clone()
}

fn fast() -> McpSettings {
    McpSettings {
        call_timeout: Duration::from_secs(2),
        ..McpSettings::default()
    }
}

#[tokio::test]
async fn tools_are_listed_over_pages_named_and_given_their_effects() {
    let f = Fixture::start(json!({}), fast()).await;
    let tools = f.toolbox.tools();
    let effect = |name: &str| {
        tools
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name} in {tools:?}"))
            .effect
    };
    // 11 tools in pages of 3: all four pages were read.
    assert_eq!(tools.len(), 11, "{tools:?}");
    assert_eq!(effect("t__lookup"), Effect::ReadOnly);
    assert_eq!(effect("t__append"), Effect::Acts { idempotent: false });
    assert_eq!(
        effect("t__idempotent_append"),
        Effect::Acts { idempotent: true }
    );
    assert_eq!(
        effect("t__delete"),
        Effect::Destructive { idempotent: false }
    );
    assert_eq!(effect("t__plain"), Effect::Acts { idempotent: false });
    assert_eq!(
        effect("t__env_dump"),
        Effect::ReadOnly,
        "the readOnly override"
    );
    let lookup = tools.iter().find(|t| t.name == "t__lookup").unwrap();
    assert_eq!(
        (lookup.server.as_str(), lookup.tool.as_str()),
        ("t", "lookup")
    );
    assert_eq!(lookup.parameters["properties"]["query"]["type"], "string");
    assert_eq!(f.toolbox.servers()[0].tools, 11);
    f.toolbox.shutdown().await;
}

#[tokio::test]
async fn the_allowlist_and_confirm_apply() {
    let dir = tempfile::tempdir().unwrap();
    let text = json!({"mcpServers": {"t": {
        "command": python(), "args": [script()],
        "tools": ["lookup", "plain"], "confirm": ["plain"], "users": "admins",
    }}})
    .to_string();
    let config = config::parse(&text, "test.json", |_| None).unwrap();
    let f = Fixture::with_config(dir, config, fast()).await;
    let tools = f.toolbox.tools();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["t__lookup", "t__plain"]);
    assert_eq!(tools[1].effect, Effect::Destructive { idempotent: false });
    assert_eq!(tools[1].users, lull_core::tools::Users::Admins);
    let out = f.toolbox.call("t__append", Map::new(), None).await;
    assert!(out.is_error, "{out:?}");
    f.toolbox.shutdown().await;
}

#[tokio::test]
async fn a_call_returns_text_and_carries_the_idempotency_key() {
    let f = Fixture::start(json!({}), fast()).await;
    let out = f
        .toolbox
        .call("t__lookup", args(json!({"query": "life"})), None)
        .await;
    assert_eq!(out.text, "life: the answer is 42");
    assert!(!out.is_error);
    assert_eq!(out.outcome, CallOutcome::Ok);
    let out = f
        .toolbox
        .call("t__append", args(json!({"text": "hello"})), Some("key-123"))
        .await;
    assert_eq!(
        (out.text.as_str(), out.outcome),
        ("appended", CallOutcome::Ok)
    );
    let runs = f.executions();
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!(runs[1]["tool"], "append");
    assert_eq!(runs[1]["arguments"]["text"], "hello");
    assert_eq!(runs[1]["meta"]["idempotencyKey"], "key-123", "{runs:?}");
    assert!(runs[0]["meta"].get("idempotencyKey").is_none(), "{runs:?}");
    let notes = std::fs::read_to_string(f.dir.path().join("notes.txt")).unwrap();
    assert_eq!(notes, "hello\n");
    f.toolbox.shutdown().await;
}

#[tokio::test]
async fn a_failing_tool_and_an_unknown_name_are_errors() {
    let f = Fixture::start(json!({}), fast()).await;
    let out = f.toolbox.call("t__fail", Map::new(), None).await;
    assert!(out.is_error);
    assert_eq!(out.outcome, CallOutcome::Error);
    assert!(out.text.contains("it failed"), "{out:?}");
    let out = f.toolbox.call("t__nope", Map::new(), None).await;
    assert!(out.is_error && out.text.contains("t__nope"), "{out:?}");
    let out = f.toolbox.call("other__lookup", Map::new(), None).await;
    assert!(out.is_error, "{out:?}");
    f.toolbox.shutdown().await;
}

#[tokio::test]
async fn a_hanging_tool_times_out_within_the_deadline_and_the_server_goes_on() {
    let f = Fixture::start(json!({}), fast()).await;
    let started = Instant::now();
    let out = f.toolbox.call("t__hang", Map::new(), None).await;
    let took = started.elapsed();
    assert_eq!(out.outcome, CallOutcome::Timeout, "{out:?}");
    assert!(out.is_error && out.text.contains("2s"), "{out:?}");
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(4),
        "{took:?}"
    );
    let out = f
        .toolbox
        .call("t__lookup", args(json!({"query": "q"})), None)
        .await;
    assert_eq!(out.outcome, CallOutcome::Ok, "{out:?}");
    f.toolbox.shutdown().await;
}

#[tokio::test]
async fn a_server_that_dies_is_an_error_then_restarted() {
    let f = Fixture::start(json!({}), fast()).await;
    let started = Instant::now();
    let out = f.toolbox.call("t__die", Map::new(), None).await;
    // It died after the request was written: it may have acted (issue 37).
    assert_eq!(out.outcome, CallOutcome::Lost, "{out:?}");
    assert!(out.is_error && out.outcome.is_unknown(), "{out:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "no wait for the deadline"
    );
    // Down: its tools are not offered, a call says so.
    assert!(
        f.toolbox
            .wait_until(Duration::from_secs(5), |s| s[0].state != "ready")
            .await
    );
    let state = &f.toolbox.servers()[0];
    if state.state == "restarting" {
        assert!(f.toolbox.tools().is_empty());
        assert!(state.error.is_some(), "{state:?}");
    }
    assert!(
        f.toolbox
            .wait_until(Duration::from_secs(10), |s| s[0].state == "ready")
            .await,
        "{:?}",
        f.toolbox.servers()
    );
    let out = f
        .toolbox
        .call("t__lookup", args(json!({"query": "again"})), None)
        .await;
    assert_eq!(out.text, "again: the answer is 42");
    f.toolbox.shutdown().await;
}

#[tokio::test]
async fn a_huge_answer_is_cut_with_a_note_without_a_stall() {
    let f = Fixture::start(
        json!({}),
        McpSettings {
            call_timeout: Duration::from_secs(20),
            max_result_chars: 1000,
            ..McpSettings::default()
        },
    )
    .await;
    let started = Instant::now();
    let out = f.toolbox.call("t__huge", Map::new(), None).await;
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(out.outcome, CallOutcome::Ok);
    assert!(
        out.text.starts_with(&"y".repeat(1000)),
        "{}",
        &out.text[..50]
    );
    assert!(out.text.len() < 1200, "{}", out.text.len());
    assert!(
        out.text.contains("5242880 characters"),
        "{}",
        &out.text[1000..]
    );
    f.toolbox.shutdown().await;
}

/// Runs in a child test process whose environment holds lull's secrets (a test
/// cannot set variables in its own process: the crate forbids `unsafe`).
#[tokio::test]
async fn a_stdio_server_sees_only_path_home_and_its_configured_env() {
    const CHILD: &str = "LULL_TEST_MCP_ENV_CHILD";
    if std::env::var_os(CHILD).is_none() {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "mcp::a_stdio_server_sees_only_path_home_and_its_configured_env",
                "--exact",
                "--nocapture",
            ])
            .env(CHILD, "1")
            .env("OPENAI_API_KEY", "sk-secret-openai")
            .env("TELEGRAM_BOT_TOKEN", "123:telegram-secret")
            .env("DATABASE_URL", "postgres://u:p@db/lull")
            .env("FILES_TOKEN", "files-token-secret")
            .status()
            .unwrap();
        assert!(status.success(), "the child test failed");
        return;
    }
    let f = Fixture::start(json!({"TOKEN": "tok-${FILES_TOKEN}"}), fast()).await;
    let dump = f.dir.path().join("env.json");
    let out = f
        .toolbox
        .call("t__env_dump", args(json!({"path": dump})), None)
        .await;
    assert_eq!(out.outcome, CallOutcome::Ok, "{out:?}");
    let env: Map<String, Value> =
        serde_json::from_str(&std::fs::read_to_string(&dump).unwrap()).unwrap();
    assert_eq!(env["TOKEN"], "tok-files-token-secret");
    assert_eq!(
        env.get("PATH").and_then(Value::as_str),
        std::env::var("PATH").ok().as_deref()
    );
    let configured = ["MCP_COUNT_FILE", "MCP_NOTES_FILE", "MCP_SLOW_MS", "TOKEN"];
    for name in env.keys() {
        assert!(
            name == "PATH"
                || name == "HOME"
                || configured.contains(&name.as_str())
                // Python sets it itself in a C locale (PEP 538).
                || name == "LC_CTYPE",
            "{name} reached the child: {env:?}"
        );
    }
    for secret in [
        "OPENAI_API_KEY",
        "TELEGRAM_BOT_TOKEN",
        "DATABASE_URL",
        "FILES_TOKEN",
    ] {
        assert!(!env.contains_key(secret), "{secret} reached the child");
    }
    // The substituted value is a registered secret.
    assert!(!lull_port::secrets::redact("files-token-secret").contains("files-token"));
    f.toolbox.shutdown().await;
}

#[tokio::test]
async fn a_server_that_cannot_start_is_failed_with_a_reason_and_lull_goes_on() {
    let text = json!({"mcpServers": {
        "gone": {"command": "/nonexistent/mcp-server"},
        "mute": {"command": "python3", "args": ["-c", "import sys; sys.stderr.write('no luck here\\n'); sys.exit(1)"]},
    }})
    .to_string();
    let config = config::parse(&text, "test.json", |_| None).unwrap();
    let toolbox = McpToolbox::start(config, fast());
    assert!(toolbox.wait_settled(Duration::from_secs(10)).await);
    let states = toolbox.servers();
    assert_eq!(states[0].state, "failed");
    assert!(
        states[0]
            .error
            .as_deref()
            .unwrap()
            .contains("/nonexistent/mcp-server"),
        "{states:?}"
    );
    assert_eq!(states[1].state, "failed");
    assert!(toolbox.tools().is_empty());
    let out = toolbox.call("gone__x", Map::new(), None).await;
    assert!(out.is_error && out.text.contains("failed"), "{out:?}");
    toolbox.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_http_server_is_failed_without_showing_its_header() {
    let port = crate::support::process::free_port();
    let text = json!({"mcpServers": {"web": {
        "url": format!("http://127.0.0.1:{port}/mcp"),
        "headers": {"Authorization": "Bearer ${WEB_KEY}"},
    }}})
    .to_string();
    let config = config::parse(&text, "test.json", |v| {
        (v == "WEB_KEY").then(|| "web-key-that-is-secret".to_owned())
    })
    .unwrap();
    let toolbox = McpToolbox::start(config, fast());
    assert!(toolbox.wait_settled(Duration::from_secs(10)).await);
    let state = &toolbox.servers()[0];
    assert_eq!(state.state, "failed", "{state:?}");
    let error = state.error.as_deref().unwrap();
    assert!(error.contains(&format!("127.0.0.1:{port}")), "{error}");
    assert!(!error.contains("web-key"), "{error}");
    toolbox.shutdown().await;
}

#[tokio::test]
async fn shutdown_stops_the_children() {
    let f = Fixture::start(json!({}), fast()).await;
    let started = Instant::now();
    f.toolbox.shutdown().await;
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(f.toolbox.servers()[0].state, "stopped");
    assert!(f.toolbox.tools().is_empty());
}

// The real-server tier.

/// The reference servers' entry points, if installed (see the module docs).
fn reference_servers(test: &str) -> Option<(PathBuf, PathBuf)> {
    let required = std::env::var("LULL_REQUIRE_MCP").is_ok_and(|v| v == "1");
    let path = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|p| p.is_file())
    };
    match (path("LULL_MCP_FILESYSTEM"), path("LULL_MCP_EVERYTHING")) {
        (Some(fs), Some(everything)) => Some((fs, everything)),
        _ if required => panic!(
            "LULL_REQUIRE_MCP=1 but LULL_MCP_FILESYSTEM / LULL_MCP_EVERYTHING do not name files \
             (run `eval \"$(scripts/mcp-servers)\"`)"
        ),
        _ => {
            crate::support::skip::skipped(
                test,
                "no reference MCP servers here (run `eval \"$(scripts/mcp-servers)\"`)",
            );
            None
        }
    }
}

#[tokio::test]
async fn server_filesystem_over_stdio() {
    let Some((filesystem, _)) = reference_servers("server_filesystem_over_stdio") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    std::fs::write(root.join("hello.txt"), "hello from the file").unwrap();
    let text = json!({"mcpServers": {"files": {"command": "node", "args": [filesystem, root]}}})
        .to_string();
    let config = config::parse(&text, "test.json", |_| None).unwrap();
    let f = Fixture::with_config(
        dir,
        config,
        McpSettings {
            call_timeout: Duration::from_secs(20),
            ..McpSettings::default()
        },
    )
    .await;
    let tools = f.toolbox.tools();
    let effect = |name: &str| tools.iter().find(|t| t.name == name).unwrap().effect;
    assert_eq!(effect("files__read_file"), Effect::ReadOnly);
    assert!(
        matches!(effect("files__write_file"), Effect::Destructive { .. }),
        "{:?}",
        effect("files__write_file")
    );
    let out = f
        .toolbox
        .call(
            "files__read_text_file",
            args(json!({"path": root.join("hello.txt")})),
            None,
        )
        .await;
    assert_eq!(out.outcome, CallOutcome::Ok, "{out:?}");
    assert!(out.text.contains("hello from the file"), "{out:?}");
    f.toolbox.shutdown().await;
}

#[tokio::test]
async fn server_everything_over_streamable_http() {
    let Some((_, everything)) = reference_servers("server_everything_over_streamable_http") else {
        return;
    };
    let port = crate::support::process::free_port();
    let dir = tempfile::tempdir().unwrap();
    let mut server = std::process::Command::new("node")
        .arg(&everything)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/mcp");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "server-everything did not listen"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = json!({"mcpServers": {"everything": {
        "url": url, "headers": {"X-Lull-Test": "header-value-secret"},
    }}})
    .to_string();
    let config = config::parse(&text, "test.json", |_| None).unwrap();
    let f = Fixture::with_config(dir, config, fast()).await;
    assert!(
        f.toolbox
            .tools()
            .iter()
            .any(|t| t.name == "everything__echo"),
        "{:?}",
        f.toolbox.tools()
    );
    let out = f
        .toolbox
        .call(
            "everything__echo",
            args(json!({"message": "over http"})),
            Some("k1"),
        )
        .await;
    assert_eq!(out.outcome, CallOutcome::Ok, "{out:?}");
    assert!(out.text.contains("over http"), "{out:?}");
    f.toolbox.shutdown().await;
    let _ = server.kill();
    let _ = server.wait();
}

// The binary: `lull check`, `/healthz` and a clean stop with MCP servers configured.

/// A config file in `dir` with the test server `t` (its count file in `dir`) and a
/// server `broken` that cannot start.
fn config_file(dir: &Path) -> PathBuf {
    let path = dir.join("mcp.json");
    let text = json!({"mcpServers": {
        "t": {"command": python(), "args": [script()],
              "env": {"MCP_COUNT_FILE": dir.join("count.jsonl"), "MCP_TOOLS": "lookup,append"}},
        "broken": {"command": "/nonexistent/mcp-server"},
    }});
    std::fs::write(&path, text.to_string()).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lull_check_lists_each_servers_tools_and_names_a_broken_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path());
    let database = format!("sqlite:{}", dir.path().join("lull.db").display());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(crate::support::process::binary())
            .arg("check")
            .env_clear()
            .env("DATABASE_URL", database)
            .env("LULL_MCP_CONFIG", &config)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    let logs = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        !logs.contains("rmcp") && !report.contains("rmcp::"),
        "the SDK's own lines and type names stay out of check's output: {logs}{report}"
    );
    assert!(
        report.contains("ok    mcp           t: 2 tools (lookup: read-only, append: acts once)"),
        "{report}"
    );
    let broken = report
        .lines()
        .find(|l| l.starts_with("FAIL  mcp") && l.contains("broken"))
        .unwrap_or_else(|| panic!("{report}"));
    assert!(
        broken.contains("mcp.json") && broken.contains("/nonexistent/mcp-server"),
        "{broken}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_shows_each_server_and_a_clean_stop_ends_the_children() {
    let dir = tempfile::tempdir().unwrap();
    let webhook = crate::support::fakes::webhook::Webhook::start().await;
    let config = config_file(dir.path());
    let mut lull = crate::support::process::LullProcess::start(
        dir.path(),
        "lull",
        &["run"],
        &[
            (
                "DATABASE_URL",
                format!("sqlite:{}", dir.path().join("lull.db").display()),
            ),
            ("LULL_WEBHOOK_URL", webhook.url.clone()),
            ("LULL_MCP_CONFIG", config.display().to_string()),
            ("RUST_LOG", "info".into()),
        ],
    );
    lull.wait_healthy(Duration::from_secs(30)).await;
    let body: Value = reqwest::get(format!("{}/healthz", lull.base_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mcp = body["mcp"].as_array().unwrap_or_else(|| panic!("{body}"));
    assert_eq!(mcp[0]["name"], "broken");
    assert_eq!(mcp[0]["state"], "failed", "{body}");
    assert!(
        mcp[0]["error"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/mcp-server")
    );
    assert_eq!(mcp[1]["name"], "t");
    assert_eq!(mcp[1]["state"], "ready", "{body}");
    assert_eq!(mcp[1]["tools"], 2);
    assert_eq!(
        body["status"], "ok",
        "a tool server down leaves lull healthy"
    );
    // The console's tools page: each server's state, each tool's class.
    let page = reqwest::get(format!("{}/tools", lull.base_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for shown in [
        "data-server=\"broken\" data-state=\"failed\"",
        "data-server=\"t\" data-state=\"ready\"",
        "data-tool=\"t__lookup\" data-class=\"read-only\"",
        "data-tool=\"t__append\" data-class=\"acts once\"",
    ] {
        assert!(page.contains(shown), "{shown} in {page}");
    }
    // The child is lull's: gone after a clean stop.
    let child = children_of(lull.pid().unwrap());
    assert_eq!(child.len(), 1, "{child:?}");
    lull.signal("TERM");
    assert_eq!(
        lull.wait_exit(Duration::from_secs(20)),
        Some(0),
        "{}",
        lull.logs()
    );
    assert!(
        !Path::new(&format!("/proc/{}", child[0])).exists(),
        "the MCP server outlived lull"
    );
}

/// The process ids whose parent is `pid` (from /proc).
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|stat| {
                    let after = stat.rsplit_once(')')?.1;
                    after.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}
