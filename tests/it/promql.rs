//! The documented PromQL queries work (docs/operations.md, "Metrics"): a real Prometheus scrapes a real `lull run`
//! through a scripted exchange, and every query in that table returns one
//! finite value, the ones with a known answer that answer.
//!
//! Needs the `prometheus` server binary (Debian's `prometheus` package). Without it
//! the test says so and passes, unless `LULL_REQUIRE_PROMETHEUS=1` (CI sets it).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::fakes::webhook::Webhook;
use crate::support::process::{LullProcess, free_port, post_message};

/// The queries of the "question | query" table in docs/operations.md, with their questions.
fn readme_queries() -> Vec<(String, String)> {
    include_str!("../../docs/operations.md")
        .lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split(" | ").collect();
            let [question, query] = cells.as_slice() else {
                return None;
            };
            let query = query.trim_end_matches(" |").trim();
            let query = query.strip_prefix('`')?.strip_suffix('`')?;
            query.contains("lull_").then(|| {
                (
                    question.trim_start_matches("| ").to_owned(),
                    query.to_owned(),
                )
            })
        })
        .collect()
}

/// Every query of the Grafana dashboard (`deploy/grafana/lull.json`), with its panel.
fn dashboard_queries() -> Vec<(String, String)> {
    let dashboard: Value =
        serde_json::from_str(include_str!("../../deploy/grafana/lull.json")).unwrap();
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| {
            let title = panel["title"].as_str().unwrap().to_owned();
            panel["targets"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |t| (title.clone(), t["expr"].as_str().unwrap().to_owned()))
        })
        .collect()
}

fn prometheus_binary() -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("prometheus"))
        .find(|candidate| candidate.is_file())
}

/// A Prometheus server scraping one target every second; killed on drop.
struct Prometheus {
    child: Child,
    url: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(binary: &Path, dir: &Path, target: &str) -> Prometheus {
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: lull\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let port = free_port();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// The instant vector a query returns now.
    async fn query(&self, query: &str) -> Vec<Value> {
        let response: Value = reqwest::Client::new()
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", query)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(response["status"], "success", "{query}: {response}");
        response["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Wait until a query returns something.
    async fn wait_for(&self, query: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let ready = reqwest::get(format!("{}/-/ready", self.url)).await;
            if ready.is_ok_and(|r| r.status().is_success()) && !self.query(query).await.is_empty() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "Prometheus never saw {query}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Wait for `n` more scrapes of the target.
    async fn scrapes(&self, n: usize) {
        let count = || async {
            self.query("count_over_time(up[1h])").await[0]["value"][1]
                .as_str()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        };
        let target = count().await + n as u64;
        while count().await < target {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_queries_answer_on_a_real_prometheus() {
    let Some(binary) = prometheus_binary() else {
        assert!(
            std::env::var("LULL_REQUIRE_PROMETHEUS").as_deref() != Ok("1"),
            "LULL_REQUIRE_PROMETHEUS=1 but no prometheus binary on PATH"
        );
        crate::support::skip::skipped(
            "the README's queries on Prometheus",
            "no prometheus binary on PATH (apt install prometheus)",
        );
        return;
    };
    let queries = readme_queries();
    assert!(
        queries.len() >= 5,
        "the query table of docs/operations.md: {queries:?}"
    );

    let dir = tempfile::tempdir().unwrap();
    let webhook = Webhook::start().await;
    let env = vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        ),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
        ("LULL_DEBOUNCE_MS", "300".into()),
        ("LULL_MAX_WAIT_MS", "5000".into()),
    ];
    let mut lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
    lull.wait_healthy(Duration::from_secs(20)).await;
    let prometheus = Prometheus::start(&binary, dir.path(), &format!("127.0.0.1:{}", lull.port));
    // The counters' starting values are scraped before any traffic.
    prometheus.wait_for("lull_llm_requests_total").await;
    prometheus.scrapes(1).await;

    // Two waves of five bursts of three messages: one model call and one reply per
    // burst. Histograms appear at their first observation, so a rate over them needs
    // a second wave after that first scrape, as ongoing traffic provides.
    let client = reqwest::Client::new();
    for wave in 0..2 {
        for conversation in 0..5 {
            for id in 0..3 {
                let r = post_message(
                    &client,
                    &lull.base_url(),
                    &format!("c{wave}-{conversation}"),
                    &id.to_string(),
                    "hello",
                )
                .await
                .unwrap();
                assert_eq!(r.status(), 202);
            }
        }
        webhook
            .wait_replies(5 * (wave + 1), Duration::from_secs(20))
            .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        prometheus.scrapes(2).await;
    }
    // The pending gauge is set at the scheduler's polls (a loaded machine may take
    // several): once lull reads none pending, Prometheus scrapes that.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while lull
        .metrics()
        .await
        .and_then(|m| m.get("lull_pending_conversations").copied())
        != Some(0.0)
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    prometheus.scrapes(2).await;

    let expected = [
        ("model calls per delivered reply", 1.0),
        ("messages answered per model call", 3.0),
        ("share of model calls that failed", 0.0),
        ("stale replies dropped per reply", 0.0),
        ("messages per reply", 3.0),
        ("conversations waiting", 0.0),
    ];
    // The dashboard's panels: each query evaluates and shows something after this
    // traffic (limits held nothing, so only that series may be absent).
    let panels = dashboard_queries();
    assert!(panels.len() >= 10, "{panels:?}");
    for (panel, query) in &panels {
        let result = prometheus.query(query).await;
        if !query.contains("lull_limited_total") {
            assert!(!result.is_empty(), "panel {panel}: `{query}` shows nothing");
        }
    }
    println!("the dashboard's {} queries answer", panels.len());
    for (question, query) in &queries {
        let result = prometheus.query(query).await;
        assert_eq!(result.len(), 1, "{question}: `{query}` gave {result:?}");
        let value: f64 = result[0]["value"][1].as_str().unwrap().parse().unwrap();
        assert!(value.is_finite(), "{question}: `{query}` = {value}");
        if let Some((_, want)) = expected.iter().find(|(q, _)| question.starts_with(q)) {
            assert!(
                (value - want).abs() < 0.01,
                "{question}: `{query}` = {value}, expected {want}"
            );
        }
    }
}

fn promtool_binary() -> Option<PathBuf> {
    prometheus_binary()
        .map(|p| p.with_file_name("promtool"))
        .filter(|p| p.is_file())
}

/// The alert rules shipped in `deploy/prometheus/` load (`promtool check rules`) and
/// behave as their unit tests say (`promtool test rules`): each alert fires on series
/// that should raise it, with the labels and text an operator sees, and not before; the
/// compose file's Prometheus configuration is valid and finds them.
#[test]
fn the_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let Some(promtool) = promtool_binary() else {
        assert!(
            std::env::var("LULL_REQUIRE_PROMETHEUS").as_deref() != Ok("1"),
            "LULL_REQUIRE_PROMETHEUS=1 but no promtool next to prometheus on PATH"
        );
        crate::support::skip::skipped(
            "the alert rules' promtool checks",
            "no promtool on PATH (apt install prometheus)",
        );
        return;
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus");
    for args in [
        ["check", "rules", "alerts.yml"],
        ["test", "rules", "alerts_test.yml"],
        ["check", "config", "prometheus.yml"],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("run promtool");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        println!("promtool {}:\n{said}", args.join(" "));
        assert!(out.status.success(), "promtool {}: {said}", args.join(" "));
        assert!(said.contains("SUCCESS"), "{said}");
    }
}
