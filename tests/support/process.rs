//! Real `lull` processes for tests: started with an environment, killed with SIGKILL,
//! restarted on the same port; their logs are appended to a file that survives kills.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port (bound and released; good enough for tests).
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The `lull` binary under test: this build's, or the one `LULL_TEST_BIN` names (to
/// check that a test fails on an older build, which a test that cannot fail must).
pub(crate) fn binary() -> std::ffi::OsString {
    std::env::var_os("LULL_TEST_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_lull").into())
}

/// One `lull` process and how to start it again.
pub(crate) struct LullProcess {
    pub name: String,
    pub port: u16,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    log: PathBuf,
    child: Option<Child>,
    /// Process ids of every incarnation, oldest first.
    pub pids: Vec<u32>,
    /// The port was picked here (not named by the test): another may be picked when
    /// something else took it between the pick and lull's bind.
    picked_port: bool,
}

impl LullProcess {
    /// Start `lull <args>` with `env` (plus `LULL_HTTP_ADDR` on a fresh port), logging
    /// to `<dir>/<name>.log`. Nothing from the test's own environment leaks in.
    pub(crate) fn start(
        dir: &Path,
        name: &str,
        args: &[&str],
        env: &[(&str, String)],
    ) -> LullProcess {
        let mut all: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        // A test that needs the address up front (a webhook URL naming it) sets it.
        let named = all
            .get("LULL_HTTP_ADDR")
            .and_then(|addr| addr.rsplit_once(':'))
            .and_then(|(_, port)| port.parse().ok());
        let port = named.unwrap_or_else(free_port);
        all.entry("LULL_HTTP_ADDR".into())
            .or_insert_with(|| format!("127.0.0.1:{port}"));
        let mut process = LullProcess {
            name: name.into(),
            port,
            args: args.iter().map(|a| a.to_string()).collect(),
            env: all,
            log: dir.join(format!("{name}.log")),
            child: None,
            pids: Vec::new(),
            picked_port: named.is_none(),
        };
        process.spawn();
        process
    }

    /// A process that exited because the port picked for it was taken meanwhile (an
    /// outgoing connection of another test may be given the same port): start it again
    /// on a port picked anew. `false`: it exited for another reason.
    fn restarted_on_a_new_port(&mut self) -> bool {
        if !self.picked_port || !self.logs().contains("Address already in use") {
            return false;
        }
        self.port = free_port();
        self.env
            .insert("LULL_HTTP_ADDR".into(), format!("127.0.0.1:{}", self.port));
        let _ = std::fs::remove_file(&self.log);
        self.spawn();
        true
    }

    fn spawn(&mut self) {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(binary())
            .args(&self.args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(&self.env)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start lull");
        self.pids.push(child.id());
        self.child = Some(child);
    }

    pub(crate) fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub(crate) fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// SIGKILL: no cleanup, no lease released.
    pub(crate) fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Send a signal (SIGTERM for a graceful stop) without waiting.
    pub(crate) fn signal(&self, signal: &str) {
        if let Some(pid) = self.pid() {
            let status = Command::new("kill")
                .args([&format!("-{signal}"), &pid.to_string()])
                .status()
                .unwrap();
            assert!(status.success(), "kill -{signal} {pid}");
        }
    }

    /// Wait for the process to exit; returns its exit code.
    pub(crate) fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let deadline = Instant::now() + limit;
        let child = self.child.as_mut()?;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.child = None;
                return status.code();
            }
            if Instant::now() > deadline {
                panic!("{} did not exit within {limit:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub(crate) fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// Everything the process (all its incarnations) logged.
    pub(crate) fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Every ERROR line the process logged that contains `text`.
    pub(crate) fn error_lines(&self, text: &str) -> Vec<String> {
        self.logs()
            .lines()
            .filter(|l| l.contains("ERROR") && l.contains(text))
            .map(str::to_owned)
            .collect()
    }

    /// Wait until `/healthz` answers 200.
    pub(crate) async fn wait_healthy(&mut self, limit: Duration) {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(r) = client
                .get(format!("{}/healthz", self.base_url()))
                .send()
                .await
                && r.status().is_success()
            {
                return;
            }
            if !self.is_running() && !self.restarted_on_a_new_port() {
                panic!("{} exited during start:\n{}", self.name, self.logs());
            }
            if Instant::now() > deadline {
                panic!(
                    "{} not healthy within {limit:?}:\n{}",
                    self.name,
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The process's metrics, as `name{labels}` → value.
    pub(crate) async fn metrics(&self) -> Option<BTreeMap<String, f64>> {
        let text = reqwest::get(format!("{}/metrics", self.base_url()))
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        Some(parse_metrics(&text))
    }
}

impl Drop for LullProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Parse Prometheus text format into `name{labels}` → value.
pub(crate) fn parse_metrics(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// POST a message to a process's http adapter.
pub(crate) async fn post_message(
    client: &reqwest::Client,
    base_url: &str,
    conversation: &str,
    id: &str,
    text: &str,
) -> reqwest::Result<reqwest::Response> {
    client
        .post(format!("{base_url}/api/messages"))
        .json(&serde_json::json!({ "conversation": conversation, "user": "tester", "text": text, "id": id }))
        .timeout(Duration::from_secs(10))
        .send()
        .await
}
