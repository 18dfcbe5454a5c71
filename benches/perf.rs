//! lull's benchmark suite: one command, one table. Every figure is measured against
//! real `lull run` processes (the release binary, the http adapter, the offline `echo`
//! responder, a loopback webhook), repeated, and printed as the median with min and
//! max, next to the limit it is compared with, measured in the same run.
//!
//! ```sh
//! cargo bench --bench perf                    # 3 repetitions
//! cargo bench --bench perf -- --reps 5        # more
//! cargo bench --bench perf -- --quick         # smaller sizes, for a smoke run
//! cargo bench --bench perf -- --ingest-only   # the write limit and ingest rows only
//! cargo bench --bench perf -- --postgres-only # the PostgreSQL rows only
//! cargo bench --bench perf -- --jobs-only     # the jobs row only
//! cargo bench --bench perf -- --conversations-only # long conversations, retention
//! ```
//!
//! What it measures (BENCHMARKS.md explains each figure and holds the results):
//! - the write limit of the same SQLite build: one-row and 100-row transactions (WAL;
//!   `synchronous` NORMAL and FULL), and lull's ingest rate through HTTP beside it;
//! - ingest latency p50/p99 with 1, 8 and 64 concurrent clients;
//! - scheduler lateness p50/p99 with 10k timers armed far ahead and 10 due per second;
//! - how fast 10k conversations due at the same instant are drained, and their lateness
//!   (`LULL_BENCH_ENV=K=V,…` sets variables for every process: an A/B of one binary);
//! - idle CPU and memory with no timers, with 10k far timers, and after 10k answered;
//! - model calls per burst against a bot that calls the model once per message;
//! - start-up time and binary size;
//! - with PostgreSQL installed (a durable throwaway cluster of the bench's own; the
//!   rows are skipped with a printed line otherwise): the one-row transaction rate of
//!   that server (`pgbench`, `synchronous_commit` on), lull's ingest rate and p99
//!   through HTTP with 1, 2 and 4 replicas on one database (the clients spread across
//!   them), and the scheduler lateness across two replicas (ingested on one, answered
//!   by either: the `NOTIFY` wake-up path);
//! - jobs: 1,000 reminders due in the same second (one per chat), their lateness
//!   p50/p99 from the due instant to the webhook's receipt;
//! - long conversations (`conversations`): tokens sent over 200 messages with and
//!   without summaries; retention on 100,000 messages: texts removed per second and
//!   ingest latency while it runs.

mod conversations;
mod figures;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use figures::{Figure, fmt};
use support::fakes::openai::FakeOpenAi;
use support::fakes::webhook::Webhook;
use support::postgres::{Cluster, Durability};
use support::process::{LullProcess, post_message};

/// Sizes of one run.
#[derive(Debug, Clone)]
struct Sizes {
    reps: usize,
    /// Messages per ingest measurement.
    ingest_messages: usize,
    /// Messages per PostgreSQL ingest measurement (and one-row transactions of its
    /// limits): 3,000 took half a second, too short to be measured twice alike
    /// (connections opened and statements prepared as the load starts).
    postgres_messages: usize,
    /// Timers armed far ahead (lateness, idle) and conversations drained at once.
    timers: usize,
    /// Seconds of 10-per-second traffic in the lateness measurement.
    lateness_seconds: u64,
    /// Seconds of each idle CPU window.
    idle_seconds: u64,
    /// Stop each repetition after the ingest rows (`--ingest-only`).
    ingest_only: bool,
    /// Only the PostgreSQL rows (`--postgres-only`).
    postgres_only: bool,
    /// Reminders due in the same second.
    reminders: usize,
    /// Only the jobs row (`--jobs-only`).
    jobs_only: bool,
    /// Messages of the long conversation (tokens with and without summaries).
    long_messages: usize,
    /// Answered messages (and as many replies) retention removes the texts of.
    retention_rows: usize,
    /// Only the long-conversation and retention rows (`--conversations-only`).
    conversations_only: bool,
}

impl Sizes {
    fn full() -> Sizes {
        Sizes {
            reps: 3,
            ingest_messages: 3000,
            postgres_messages: 12_000,
            timers: 10_000,
            lateness_seconds: 20,
            idle_seconds: 20,
            ingest_only: false,
            postgres_only: false,
            reminders: 1000,
            jobs_only: false,
            long_messages: 200,
            retention_rows: 100_000,
            conversations_only: false,
        }
    }

    fn quick() -> Sizes {
        Sizes {
            reps: 1,
            ingest_messages: 500,
            postgres_messages: 500,
            timers: 1000,
            lateness_seconds: 5,
            idle_seconds: 5,
            ingest_only: false,
            postgres_only: false,
            reminders: 200,
            jobs_only: false,
            long_messages: 60,
            retention_rows: 10_000,
            conversations_only: false,
        }
    }
}

/// The results, in the order of the table.
#[derive(Default)]
struct Table {
    rows: BTreeMap<usize, (String, String, Figure, String)>,
}

impl Table {
    fn record(&mut self, order: usize, name: &str, unit: &str, value: f64, limit: &str) {
        let row = self
            .rows
            .entry(order)
            .or_insert_with(|| (name.into(), unit.into(), Figure::default(), limit.into()));
        row.2.push(value);
        row.3 = limit.into();
    }

    /// The rows of one ingest measurement at `order` and the two after it: the rate
    /// (compared with `limit`), p50 and p99 of the latencies (sorted, milliseconds).
    /// `what` names the measurement and its setting: ("ingest", "8 client(s)").
    fn record_ingest(
        &mut self,
        order: usize,
        (what, setting): (&str, &str),
        rate: f64,
        latencies: &[f64],
        limit: &str,
    ) {
        self.record(
            order,
            &format!("{what} rate, {setting}"),
            "msg/s",
            rate,
            limit,
        );
        for (i, p) in [(1, 50.0), (2, 99.0)] {
            self.record(
                order + i,
                &format!("{what} p{p}, {setting}"),
                "ms",
                percentile(latencies, p),
                "",
            );
        }
    }

    fn figure(&self, order: usize) -> f64 {
        self.rows.get(&order).map_or(f64::NAN, |r| r.2.median())
    }

    fn print(&self) {
        println!("| figure | lull (median, min–max) | compared with |");
        println!("| --- | --- | --- |");
        for (name, unit, figure, limit) in self.rows.values() {
            println!("| {name} | {} | {limit} |", figure.cell(unit));
        }
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// CPU time of each thread of a process so far, in nanoseconds (the first field of
/// /proc/PID/task/TID/schedstat: nanosecond resolution, where /proc/PID/stat counts
/// 10 ms ticks, too coarse for an idle process).
fn thread_cpu_ns(pid: u32) -> BTreeMap<u32, u64> {
    let mut threads = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return threads;
    };
    for task in tasks.flatten() {
        let Ok(tid) = task.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Some(ns) = std::fs::read_to_string(task.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        {
            threads.insert(tid, ns);
        }
    }
    threads
}

/// CPU seconds a process used between two samples of [`thread_cpu_ns`] (a thread
/// that started meanwhile counts whole; one that ended meanwhile is missed, which an
/// idle process, whose threads live on, does not do).
fn cpu_seconds_between(before: &BTreeMap<u32, u64>, after: &BTreeMap<u32, u64>) -> f64 {
    after
        .iter()
        .map(|(tid, ns)| ns - before.get(tid).copied().unwrap_or(0).min(*ns))
        .sum::<u64>() as f64
        / 1e9
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(f64::NAN)
        / 1024.0
}

/// A `lull run` on a fresh database with the http adapter and the echo responder.
struct Bot {
    dir: tempfile::TempDir,
    lull: LullProcess,
    webhook: Arc<Webhook>,
    client: reqwest::Client,
}

impl Bot {
    async fn start(extra: &[(&'static str, String)]) -> Bot {
        let dir = tempfile::tempdir().unwrap();
        let webhook = Arc::new(Webhook::start().await);
        Self::start_in(dir, webhook, extra).await
    }

    async fn start_in(
        dir: tempfile::TempDir,
        webhook: Arc<Webhook>,
        extra: &[(&'static str, String)],
    ) -> Bot {
        let mut env: Vec<(&'static str, String)> = vec![
            (
                "DATABASE_URL",
                format!("sqlite:{}", dir.path().join("lull.db").display()),
            ),
            ("LULL_WEBHOOK_URL", webhook.url.clone()),
            ("LULL_LLM", "echo".into()),
            ("RUST_LOG", "warn".into()),
        ];
        // `LULL_BENCH_ENV=K=V,K=V`: settings for every process of the run (an A/B of
        // one binary, e.g. `LULL_TOOLS=off`).
        let bench_env: Vec<(&'static str, String)> = std::env::var("LULL_BENCH_ENV")
            .unwrap_or_default()
            .split(',')
            .filter_map(|pair| {
                let (k, v) = pair.split_once('=')?;
                Some((
                    &*Box::leak(k.trim().to_owned().into_boxed_str()),
                    v.trim().to_owned(),
                ))
            })
            .collect();
        for (k, v) in extra.iter().chain(&bench_env) {
            env.retain(|(key, _)| key != k);
            env.push((k, v.clone()));
        }
        let mut lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
        lull.wait_healthy(Duration::from_secs(30)).await;
        Bot {
            dir,
            lull,
            webhook,
            client: reqwest::Client::builder()
                .pool_max_idle_per_host(128)
                .build()
                .unwrap(),
        }
    }

    fn db(&self) -> std::path::PathBuf {
        self.dir.path().join("lull.db")
    }

    async fn post(&self, conversation: &str, id: &str) -> Duration {
        let sent = Instant::now();
        let r = post_message(
            &self.client,
            &self.lull.base_url(),
            conversation,
            id,
            "hello",
        )
        .await
        .unwrap();
        assert_eq!(
            r.status().as_u16(),
            202,
            "{}",
            r.text().await.unwrap_or_default()
        );
        sent.elapsed()
    }

    /// Stop gracefully (the database file is closed cleanly).
    fn stop(mut self) -> (tempfile::TempDir, Arc<Webhook>) {
        self.lull.signal("TERM");
        self.lull.wait_exit(Duration::from_secs(30));
        (self.dir, self.webhook)
    }
}

/// Settings that keep every message waiting (no round runs during a measurement).
fn far_timers() -> Vec<(&'static str, String)> {
    vec![
        ("LULL_DEBOUNCE_MS", "3600000".into()),
        ("LULL_MAX_WAIT_MS", "7200000".into()),
        ("LULL_MAX_BATCH", "1000".into()),
    ]
}

/// Rows per second of the same SQLite build writing `rows_per_tx` rows per
/// transaction: the limit ingest is compared with.
fn sqlite_limit(dir: &Path, synchronous: &str, rows_per_tx: usize, rows: usize) -> f64 {
    let path = dir.join(format!("limit-{synchronous}-{rows_per_tx}.db"));
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
        .unwrap();
    conn.execute_batch(&format!(
        "PRAGMA synchronous = {synchronous};
         CREATE TABLE messages (id INTEGER PRIMARY KEY, conversation TEXT NOT NULL, text TEXT NOT NULL);"
    ))
    .unwrap();
    let started = Instant::now();
    let mut written = 0;
    while written < rows {
        let tx = conn.unchecked_transaction().unwrap();
        for _ in 0..rows_per_tx {
            tx.execute(
                "INSERT INTO messages (conversation, text) VALUES (?1, 'hello')",
                [format!("c{written}")],
            )
            .unwrap();
            written += 1;
        }
        tx.commit().unwrap();
    }
    rows as f64 / started.elapsed().as_secs_f64()
}

/// `messages` posts from `clients` concurrent clients to conversations round-robin,
/// the clients spread over the replicas `bots`: the rate, and every request's latency
/// in milliseconds.
async fn ingest(bots: &[Arc<Bot>], clients: usize, messages: usize, tag: &str) -> (f64, Vec<f64>) {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..clients {
        let bot = bots[client % bots.len()].clone();
        let tag = tag.to_owned();
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let mut i = client;
            while i < messages {
                let took = bot
                    .post(&format!("{tag}-c{}", i % 1000), &format!("m{i}"))
                    .await;
                latencies.push(took.as_secs_f64() * 1000.0);
                i += clients;
            }
            latencies
        });
    }
    let mut latencies = Vec::new();
    while let Some(part) = tasks.join_next().await {
        latencies.extend(part.unwrap());
    }
    let rate = messages as f64 / started.elapsed().as_secs_f64();
    latencies.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (rate, latencies)
}

/// Lateness of replies in milliseconds (delivered at the webhook − due time): one
/// message to a new conversation every 100 ms for `seconds`, posted to the replicas
/// `bots` in turn (they share one webhook), each due `debounce_ms` after it was sent.
async fn lateness(bots: &[Arc<Bot>], seconds: u64, debounce_ms: u64, tag: &str) -> Vec<f64> {
    let webhook = &bots[0].webhook;
    let count = (seconds * 10) as usize;
    let before = webhook.accepted();
    let mut due = BTreeMap::new();
    for i in 0..count {
        let at = Instant::now();
        let key = format!("{tag}{i}");
        bots[i % bots.len()].post(&key, "1").await;
        due.insert(key, at + Duration::from_millis(debounce_ms));
        tokio::time::sleep(Duration::from_millis(100).saturating_sub(at.elapsed())).await;
    }
    webhook
        .wait_replies(before + count, Duration::from_secs(60))
        .await;
    let mut lateness: Vec<f64> = webhook
        .replies()
        .iter()
        .filter_map(|r| {
            let due = due.get(&r.conversation)?;
            Some(r.at.saturating_duration_since(*due).as_secs_f64() * 1000.0)
        })
        .collect();
    lateness.sort_by(|a, b| a.partial_cmp(b).unwrap());
    lateness
}

/// Post one message to each of `n` conversations (kept waiting by far timers).
async fn arm(bot: &Arc<Bot>, n: usize, tag: &str) {
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..16 {
        let bot = bot.clone();
        let tag = tag.to_owned();
        tasks.spawn(async move {
            let mut i = client;
            while i < n {
                bot.post(&format!("{tag}{i}"), "1").await;
                i += 16;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// CPU share of one core (percent) over `seconds`, and RSS at the end.
async fn idle(pid: u32, seconds: u64) -> (f64, f64) {
    // Let start-up work and a first poll pass.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = thread_cpu_ns(pid);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let used = cpu_seconds_between(&before, &thread_cpu_ns(pid));
    (100.0 * used / started.elapsed().as_secs_f64(), rss_mib(pid))
}

async fn run(sizes: &Sizes) -> Table {
    let mut table = Table::default();
    let scratch = tempfile::tempdir().unwrap();
    let binary = env!("CARGO_BIN_EXE_lull");
    let postgres = Cluster::private(Durability::On);
    if postgres.is_none() {
        eprintln!("PostgreSQL is not installed: skipping the PostgreSQL rows");
    }
    for rep in 0..sizes.reps {
        eprintln!("== repetition {} of {}", rep + 1, sizes.reps);
        if sizes.jobs_only {
            jobs_rows(&mut table, sizes).await;
            continue;
        }
        if sizes.conversations_only {
            conversations::summary_rows(&mut table, sizes.long_messages).await;
            conversations::retention_rows(&mut table, sizes.retention_rows).await;
            continue;
        }
        if sizes.postgres_only {
            match &postgres {
                Some(cluster) => {
                    postgres_rows(&mut table, sizes, rep, cluster, scratch.path()).await
                }
                None => eprintln!("--postgres-only without PostgreSQL: nothing to measure"),
            }
            continue;
        }

        // The write limit of the same SQLite build.
        let rows = sizes.ingest_messages;
        let normal_1 = sqlite_limit(scratch.path(), "NORMAL", 1, rows);
        let full_1 = sqlite_limit(scratch.path(), "FULL", 1, rows);
        let normal_100 = sqlite_limit(scratch.path(), "NORMAL", 100, rows * 10);
        for file in std::fs::read_dir(scratch.path()).unwrap() {
            let _ = std::fs::remove_file(file.unwrap().path());
        }
        table.record(
            1,
            "SQLite limit: one-row transactions, WAL, synchronous=NORMAL",
            "rows/s",
            normal_1,
            "the limit",
        );
        table.record(
            2,
            "SQLite limit: one-row transactions, WAL, synchronous=FULL",
            "rows/s",
            full_1,
            "the limit",
        );
        table.record(
            3,
            "SQLite limit: 100-row transactions, WAL, synchronous=NORMAL",
            "rows/s",
            normal_100,
            "the limit",
        );

        // Ingest through HTTP: rate and latency at 1, 8 and 64 clients.
        let bot = Arc::new(Bot::start(&far_timers()).await);
        for (order, clients) in [(10, 1usize), (20, 8), (30, 64)] {
            let (rate, latencies) = ingest(
                std::slice::from_ref(&bot),
                clients,
                rows,
                &format!("r{rep}k{clients}"),
            )
            .await;
            table.record_ingest(
                order,
                ("ingest", &format!("{clients} client(s)")),
                rate,
                &latencies,
                &format!("{} rows/s (one-row, FULL)", fmt(full_1)),
            );
        }
        let rate_64 = table.figure(30);
        table.record(
            33,
            "ingest at 64 clients / one-row limit (FULL, what lull promises)",
            "×",
            rate_64 / full_1,
            "goal ≥ 1.0",
        );
        table.record(
            34,
            "ingest at 64 clients / one-row limit (NORMAL)",
            "×",
            rate_64 / normal_1,
            "",
        );
        drop(bot);
        if let Some(cluster) = &postgres {
            postgres_rows(&mut table, sizes, rep, cluster, scratch.path()).await;
        }
        if sizes.ingest_only {
            continue;
        }
        jobs_rows(&mut table, sizes).await;
        // Long conversations and retention: slow, measured once.
        if rep == 0 {
            conversations::summary_rows(&mut table, sizes.long_messages).await;
            conversations::retention_rows(&mut table, sizes.retention_rows).await;
        }

        // Idle with no timers.
        let bot = Arc::new(Bot::start(&far_timers()).await);
        let (cpu, rss) = idle(bot.lull.pid().unwrap(), sizes.idle_seconds).await;
        table.record(
            60,
            "idle CPU, no timers (polling every second)",
            "% of a core",
            cpu,
            "goal < 0.05",
        );
        table.record(61, "RSS, idle", "MiB", rss, "goal < 12");

        // Idle with 10k timers armed far ahead.
        arm(&bot, sizes.timers, &format!("far{rep}-")).await;
        let (cpu, rss) = idle(bot.lull.pid().unwrap(), sizes.idle_seconds).await;
        table.record(
            62,
            &format!("idle CPU, {} far timers", sizes.timers),
            "% of a core",
            cpu,
            "goal < 0.05",
        );
        table.record(
            63,
            &format!("RSS, {} far timers", sizes.timers),
            "MiB",
            rss,
            "",
        );

        // Lateness with those timers armed: 10 conversations due per second.
        let (dir, webhook) = Arc::try_unwrap(bot).ok().unwrap().stop();
        let debounce = 200;
        let bot = Arc::new(
            Bot::start_in(
                dir,
                webhook,
                &[
                    ("LULL_DEBOUNCE_MS", debounce.to_string()),
                    ("LULL_MAX_WAIT_MS", "5000".into()),
                ],
            )
            .await,
        );
        let lateness = lateness(
            std::slice::from_ref(&bot),
            sizes.lateness_seconds,
            debounce,
            &format!("late{rep}-"),
        )
        .await;
        table.record(
            40,
            &format!("lateness p50, {} far timers, 10 due/s", sizes.timers),
            "ms",
            percentile(&lateness, 50.0),
            "delivered at the webhook − due time",
        );
        table.record(
            41,
            &format!("lateness p99, {} far timers, 10 due/s", sizes.timers),
            "ms",
            percentile(&lateness, 99.0),
            "goal < 10",
        );

        // 10k conversations due at the same instant: make the far timers due now, for
        // any process (they were armed by the process just stopped, so another takes
        // them over a hand-off, `LULL_POLL_MS`, after their due time: set them that
        // much earlier).
        let (dir, webhook) = Arc::try_unwrap(bot).ok().unwrap().stop();
        let db = dir.path().join("lull.db");
        let due = now_ms() - 1000;
        {
            let conn = rusqlite::Connection::open(&db).unwrap();
            conn.busy_timeout(Duration::from_secs(10)).unwrap();
            conn.execute("UPDATE timers SET due_at = ?1", [due])
                .unwrap();
        }
        let already = webhook.accepted();
        let due_instant = Instant::now();
        let bot = Arc::new(Bot::start_in(dir, webhook, &[]).await);
        let target = already + sizes.timers;
        let drained = loop {
            let n = bot.webhook.accepted();
            if n >= target {
                break due_instant.elapsed();
            }
            assert!(
                due_instant.elapsed() < Duration::from_secs(1200),
                "drain stuck at {n} of {target}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let mut drain_late: Vec<f64> = bot.webhook.received()[already..]
            .iter()
            .map(|r| r.at.saturating_duration_since(due_instant).as_secs_f64() * 1000.0)
            .collect();
        drain_late.sort_by(|a, b| a.partial_cmp(b).unwrap());
        table.record(
            50,
            &format!("drain of {} conversations due at once", sizes.timers),
            "replies/s",
            sizes.timers as f64 / drained.as_secs_f64(),
            "goal ≥ 1000",
        );
        table.record(
            51,
            "lateness p99 in that drain",
            "ms",
            percentile(&drain_late, 99.0),
            "from process start",
        );

        // Idle after they were all answered.
        let (cpu, rss) = idle(bot.lull.pid().unwrap(), sizes.idle_seconds).await;
        table.record(
            64,
            &format!("idle CPU, after {} answered", sizes.timers),
            "% of a core",
            cpu,
            "goal < 0.05",
        );
        table.record(
            65,
            &format!("RSS, after {} answered", sizes.timers),
            "MiB",
            rss,
            "goal < 32",
        );
        drop(bot);

        // Model calls per burst against one call per message.
        let (calls, messages) = calls_per_burst(rep as u64).await;
        table.record(
            70,
            "model calls per burst of 1–5 messages",
            "calls/burst",
            calls.0 as f64 / calls.1 as f64,
            &format!(
                "{} for one call per message",
                fmt(messages as f64 / calls.1 as f64)
            ),
        );

        // Start-up time.
        let started = Instant::now();
        let bot = Bot::start(&[]).await;
        table.record(
            80,
            "start-up (spawn to /healthz 200)",
            "ms",
            started.elapsed().as_secs_f64() * 1000.0,
            "",
        );
        drop(bot);
    }
    let size = std::fs::metadata(binary).map(|m| m.len()).unwrap_or(0);
    table.record(
        90,
        "binary size (release, stripped)",
        "MiB",
        size as f64 / 1024.0 / 1024.0,
        "",
    );
    table
}

/// Concurrent clients of the PostgreSQL ingest rows, spread over the replicas.
const POSTGRES_CLIENTS: usize = 64;

/// The PostgreSQL rows of one repetition, each measurement on a fresh database of
/// `cluster` (durable: `fsync` and `synchronous_commit` on): the server's one-row
/// transaction rate, lull's ingest with 1, 2 and 4 replicas, and (unless
/// `--ingest-only`) the lateness across two replicas.
async fn postgres_rows(
    table: &mut Table,
    sizes: &Sizes,
    rep: usize,
    cluster: &Cluster,
    scratch: &Path,
) {
    let limit = postgres_limit(cluster, 1, sizes.postgres_messages, scratch);
    let limit_64 = postgres_limit(
        cluster,
        POSTGRES_CLIENTS,
        sizes.postgres_messages * 4,
        scratch,
    );
    table.record(
        100,
        "PostgreSQL limit: one-row transactions from 1 client, synchronous_commit=on",
        "rows/s",
        limit,
        "the limit",
    );
    table.record(
        101,
        &format!("PostgreSQL limit: one-row transactions from {POSTGRES_CLIENTS} clients, synchronous_commit=on"),
        "rows/s",
        limit_64,
        "the limit",
    );
    for (i, n) in [1usize, 2, 4].into_iter().enumerate() {
        let bots = replicas(cluster, n, &far_timers()).await;
        let before = due_work_queries(&bots).await;
        let (rate, latencies) = ingest(
            &bots,
            POSTGRES_CLIENTS,
            sizes.postgres_messages,
            &format!("pg{rep}r{n}"),
        )
        .await;
        let after = due_work_queries(&bots).await;
        let order = 110 + 10 * i;
        table.record_ingest(
            order,
            (
                "PostgreSQL ingest",
                &format!("{n} replica(s), {POSTGRES_CLIENTS} clients"),
            ),
            rate,
            &latencies,
            &format!("{} rows/s (one-row, 1 client)", fmt(limit)),
        );
        if let (Some(before), Some(after)) = (before, after) {
            table.record(
                order + 3,
                &format!("PostgreSQL due-work queries per ingested message, {n} replica(s)"),
                "queries/msg",
                (after - before) / sizes.postgres_messages as f64,
                "all replicas together; goal: flat in replicas",
            );
        }
    }
    let (rate_1, p99_1) = (table.figure(110), table.figure(112));
    table.record(
        150,
        "PostgreSQL ingest, 1 replica / one-row limit from 1 client",
        "×",
        rate_1 / limit,
        "goal ≥ 1.0",
    );
    table.record(
        151,
        &format!("PostgreSQL ingest, 1 replica / one-row limit from {POSTGRES_CLIENTS} clients"),
        "×",
        rate_1 / limit_64,
        "goal ≥ 0.5",
    );
    for (order, n, at) in [(152, 2, 120), (154, 4, 130)] {
        table.record(
            order,
            &format!("PostgreSQL ingest rate, {n} replicas / 1 replica"),
            "×",
            table.figure(at) / rate_1,
            "goal ≥ 0.9",
        );
        table.record(
            order + 1,
            &format!("PostgreSQL ingest p99, {n} replicas / 1 replica"),
            "×",
            table.figure(at + 2) / p99_1,
            "goal ≤ 2",
        );
    }
    if sizes.ingest_only {
        return;
    }
    let debounce = 200;
    for (order, n) in [(140, 2), (142, 4)] {
        let bots = replicas(
            cluster,
            n,
            &[
                ("LULL_DEBOUNCE_MS", debounce.to_string()),
                ("LULL_MAX_WAIT_MS", "5000".into()),
            ],
        )
        .await;
        let late = lateness(
            &bots,
            sizes.lateness_seconds,
            debounce,
            &format!("pglate{rep}r{n}-"),
        )
        .await;
        table.record(
            order,
            &format!("PostgreSQL lateness p50, {n} replicas, 10 due/s"),
            "ms",
            percentile(&late, 50.0),
            "delivered at the webhook − due time (posted to the replicas in turn)",
        );
        table.record(
            order + 1,
            &format!("PostgreSQL lateness p99, {n} replicas, 10 due/s"),
            "ms",
            percentile(&late, 99.0),
            "the poll alone: up to 1000 ms (LULL_POLL_MS)",
        );
    }
}

/// The due-work queries the replicas `bots` sent so far, summed
/// (`lull_due_work_queries_total` of each one's `/metrics`); `None` when a build
/// does not count them (`LULL_TEST_BIN` naming an older one).
async fn due_work_queries(bots: &[Arc<Bot>]) -> Option<f64> {
    let mut total = None;
    for bot in bots {
        let text = bot
            .client
            .get(format!("{}/metrics", bot.lull.base_url()))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let counted = text
            .lines()
            .filter(|l| l.starts_with("lull_due_work_queries_total"))
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .reduce(|a, b| a + b);
        if let Some(counted) = counted {
            total = Some(total.unwrap_or(0.0) + counted);
        }
    }
    total
}

/// `n` `lull run` replicas on one fresh database of `cluster`, sharing one webhook.
async fn replicas(cluster: &Cluster, n: usize, extra: &[(&'static str, String)]) -> Vec<Arc<Bot>> {
    let url = cluster.create_database();
    let webhook = Arc::new(Webhook::start().await);
    let mut env = vec![("DATABASE_URL", url)];
    env.extend(extra.iter().cloned());
    let mut bots = Vec::new();
    for _ in 0..n {
        let dir = tempfile::tempdir().unwrap();
        bots.push(Arc::new(Bot::start_in(dir, webhook.clone(), &env).await));
    }
    bots
}

/// Rows per second of `transactions` one-row transactions from `clients` concurrent
/// clients (`pgbench`, each client's one after the other), on a fresh database of
/// `cluster`: the limits the PostgreSQL ingest rows are compared with.
fn postgres_limit(cluster: &Cluster, clients: usize, transactions: usize, scratch: &Path) -> f64 {
    let url = cluster.create_database();
    let database = support::db::Postgres(url.clone());
    let setting = support::db::rows(&database, "SHOW synchronous_commit");
    assert_eq!(
        setting,
        [["on"]],
        "the limit is measured with synchronous_commit on"
    );
    support::db::rows(
        &database,
        "CREATE TABLE messages (id bigserial PRIMARY KEY, conversation text NOT NULL, text text NOT NULL)",
    );
    let script = scratch.join("one-row.sql");
    std::fs::write(
        &script,
        "INSERT INTO messages (conversation, text) VALUES ('c', 'hello');\n",
    )
    .unwrap();
    let name = url.rsplit('/').next().unwrap();
    let output = std::process::Command::new(cluster.bin().join("pgbench"))
        .args(["-n", "-h", "127.0.0.1", "-U", "postgres", "-c"])
        .arg(clients.to_string())
        .arg("-j")
        .arg(clients.min(2).to_string())
        .arg("-p")
        .arg(cluster.port().to_string())
        .arg("-t")
        .arg((transactions / clients).max(1).to_string())
        .arg("-f")
        .arg(&script)
        .arg(name)
        .output()
        .expect("run pgbench");
    let _ = std::fs::remove_file(&script);
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "pgbench failed: {text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    text.lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no tps in pgbench's output: {text}"))
}

/// A scripted workload of bursts (1–5 messages, 50–300 ms apart) in 40
/// conversations, answered by a fake model that counts its requests. Returns
/// ((model calls, bursts), messages).
async fn calls_per_burst(seed: u64) -> ((usize, usize), usize) {
    let model = FakeOpenAi::start().await;
    let bot = Arc::new(
        Bot::start(&[
            ("LULL_LLM", "openai".into()),
            ("OPENAI_BASE_URL", model.base_url.clone()),
            ("LULL_DEBOUNCE_MS", "800".into()),
        ])
        .await,
    );
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut tasks = tokio::task::JoinSet::new();
    let mut messages = 0;
    let mut bursts = 0;
    for c in 0..40 {
        let n = rng.usize(1..=5);
        let gaps: Vec<u64> = (0..n).map(|_| rng.u64(50..=300)).collect();
        messages += n;
        bursts += 1;
        let bot = bot.clone();
        tasks.spawn(async move {
            for (i, gap) in gaps.into_iter().enumerate() {
                bot.post(&format!("burst{c}"), &format!("m{i}")).await;
                tokio::time::sleep(Duration::from_millis(gap)).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    bot.webhook
        .wait_replies(bursts, Duration::from_secs(60))
        .await;
    support::db::settled(&bot.db(), Duration::from_secs(30)).await;
    ((model.requests().len(), bursts), messages)
}

/// Jobs: `sizes.reminders` reminders, one per chat, all due at the start of the same
/// minute (UTC); the lateness of each, from that instant to the webhook's receipt.
async fn jobs_rows(table: &mut Table, sizes: &Sizes) {
    let bot = Bot::start(&[("LULL_JOBS_PER_CHAT", "10".into())]).await;
    let n = sizes.reminders;
    // The minute after the one in which the last reminder is made, with room to make
    // them all (about 1,000 a second through HTTP).
    let due_ms = support::wall::minute_after(Duration::from_secs(10));
    let when = support::wall::utc_minute(due_ms / 1000);
    let mut tasks = tokio::task::JoinSet::new();
    let bot = Arc::new(bot);
    for chunk in 0..8 {
        let bot = bot.clone();
        let when = when.clone();
        tasks.spawn(async move {
            for i in (chunk..n).step_by(8) {
                let text = format!("/remind {when} r{i}");
                let r = post_text(&bot, &format!("j{i}"), "1", &text).await;
                assert_eq!(r, 202);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let due = support::wall::instant_of(due_ms);
    // Every chat got its confirmation and its reminder: 2 notices each.
    bot.webhook
        .wait_notices(2 * n, Duration::from_secs(180))
        .await;
    let mut late: Vec<f64> = bot
        .webhook
        .notices()
        .into_iter()
        .filter(|r| r.text.starts_with("⏰ r"))
        .map(|r| r.at.saturating_duration_since(due).as_secs_f64() * 1000.0)
        .collect();
    assert_eq!(late.len(), n, "each reminder once");
    late.sort_by(f64::total_cmp);
    table.record(
        90,
        &format!("jobs: lateness p50, {n} reminders due in the same second"),
        "ms",
        late[n / 2],
        "",
    );
    table.record(
        91,
        &format!("jobs: lateness p99, {n} reminders due in the same second"),
        "ms",
        late[n * 99 / 100],
        "goal < 500",
    );
}

/// Post `text` as a message of `conversation`; the status code.
async fn post_text(bot: &Bot, conversation: &str, id: &str, text: &str) -> u16 {
    let r = bot
        .client
        .post(format!("{}/api/messages", bot.lull.base_url()))
        .json(&serde_json::json!({
            "conversation": conversation, "user": "u1", "text": text, "id": id
        }))
        .send()
        .await
        .unwrap();
    r.status().as_u16()
}

fn main() {
    let mut sizes = Sizes::full();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => sizes = Sizes::quick(),
            "--ingest-only" => sizes.ingest_only = true,
            "--postgres-only" => sizes.postgres_only = true,
            "--jobs-only" => sizes.jobs_only = true,
            "--conversations-only" => sizes.conversations_only = true,
            "--reps" => sizes.reps = args.next().and_then(|v| v.parse().ok()).expect("--reps N"),
            "--bench" => {}
            other => panic!("unknown argument {other}"),
        }
    }
    let runtime = figures::runtime();
    let started = Instant::now();
    let table = runtime.block_on(run(&sizes));
    println!(
        "lull benchmark: {} repetition(s), {} CPUs, {:.0} s",
        sizes.reps,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        started.elapsed().as_secs_f64()
    );
    table.print();
}
