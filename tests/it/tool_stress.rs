//! The stress run with tools that act: several `lull run` processes on one database
//! (SQLite, or PostgreSQL replicas), a model that calls the counting MCP server's
//! `slow_append` in every round (its argument the batch's first message, so each batch
//! is one decision), bursts that grow while a round decides and acts (new messages
//! mid-round: stale drops, rounds overtaken, forced commits at the cap), and processes
//! killed with SIGKILL in the middle of calls and started again.
//!
//! The checker reads what the server executed (its log of every start, with the
//! request's `_meta.idempotencyKey`) and what the database holds:
//! - **side effects per idempotency key** and **per decision** (the batch's first
//!   message): at most one each (the tool is not idempotent; a call whose holder died
//!   mid-call is reported unknown, never run again);
//! - the reply invariants as every stress run checks them: no duplicate, none lost, every
//!   reply fresh or forced by the cap;
//! - how many actions ended unknown (killed mid-call), for the figures.
//!
//! Counter-test: with the journal bypassed (`LULL_TEST_NO_JOURNAL`), the same run counts
//! doubled side effects.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::db;
use crate::support::fakes::openai::Agent;
use crate::support::process::post_message;
use crate::tools::{Setup, ToolBot};

/// One run's plan.
struct Plan {
    processes: usize,
    conversations: usize,
    bursts: usize,
    kills: usize,
    postgres: Option<String>,
    switches: &'static [(&'static str, &'static str)],
    seed: u64,
}

/// What the checker found (printed whole: some fields are figures, not checks).
#[derive(Debug)]
#[allow(dead_code)]
struct Report {
    messages: usize,
    replies: usize,
    /// Side effects (started executions) in all.
    side_effects: usize,
    /// The most side effects of one idempotency key.
    max_per_key: usize,
    /// Side effects beyond the first, per idempotency key.
    doubled_by_key: usize,
    /// Side effects beyond the first, per decision (batch).
    doubled_by_decision: usize,
    duplicates: usize,
    lost: usize,
    stale: usize,
    /// Journal rows stored `unknown` (their holder died mid-call).
    unknown: usize,
    kills: usize,
}

async fn run(plan: Plan) -> Report {
    let mut extra = vec![
        ("LULL_DEBOUNCE", "fixed"),
        ("LULL_MAX_WAIT_MS", "4000"),
        ("LULL_TOOL_TIMEOUT_MS", "3000"),
        ("LULL_POLL_MS", "200"),
        ("RUST_LOG", "info"),
    ];
    extra.extend_from_slice(plan.switches);
    let mut bot = ToolBot::start(Setup {
        agent: Agent {
            calls: vec![(
                "counter__slow_append".into(),
                serde_json::json!({ "text": "" }),
            )],
            think: Duration::from_millis(150),
            answer_after: Duration::from_millis(300),
            user_field: Some("text"),
            ..Agent::default()
        },
        processes: plan.processes,
        extra: &extra,
        postgres: plan.postgres.clone(),
        slow_ms: 500,
        ..Setup::default()
    })
    .await;
    let urls: Arc<Vec<String>> = Arc::new(bot.lulls.iter().map(|l| l.base_url()).collect());
    let mut drivers = tokio::task::JoinSet::new();
    for c in 0..plan.conversations {
        let urls = urls.clone();
        let (bursts, seed) = (plan.bursts, plan.seed + c as u64);
        drivers.spawn(async move { drive(c, bursts, seed, &urls).await });
    }
    let mut rng = fastrand::Rng::with_seed(plan.seed);
    let mut kills = 0;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    while kills < plan.kills {
        // Kill the process whose call is running (a start the server has not ended),
        // when one is; else one at random.
        let deadline = Instant::now() + Duration::from_secs(3);
        let mut running = None;
        while Instant::now() < deadline && running.is_none() {
            running = call_running(&bot);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let victim = running
            .and_then(|parent| bot.lulls.iter().position(|l| l.pid() == Some(parent)))
            .unwrap_or_else(|| rng.usize(..bot.lulls.len()));
        bot.lulls[victim].kill9();
        kills += 1;
        tokio::time::sleep(Duration::from_millis(rng.u64(200..600))).await;
        bot.lulls[victim].restart();
        bot.lulls[victim]
            .wait_healthy(Duration::from_secs(30))
            .await;
        tokio::time::sleep(Duration::from_millis(rng.u64(800..1600))).await;
    }
    while let Some(done) = drivers.join_next().await {
        done.expect("a conversation's driver");
    }
    let verdict = db::settled(&bot.database, Duration::from_secs(90)).await;
    let executions = bot.executions();
    let started: Vec<&Value> = executions
        .iter()
        .filter(|e| e["tool"] == "slow_append" && e["at"] == "start")
        .collect();
    let mut by_key: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_decision: BTreeMap<String, usize> = BTreeMap::new();
    for e in &started {
        if let Some(key) = e["meta"]["idempotencyKey"].as_str() {
            *by_key.entry(key.to_owned()).or_default() += 1;
        }
        let decision = e["arguments"]["text"].as_str().unwrap_or_default();
        *by_decision.entry(decision.to_owned()).or_default() += 1;
    }
    let beyond_first = |counts: &BTreeMap<String, usize>| -> usize {
        counts.values().map(|n| n.saturating_sub(1)).sum()
    };
    let unknown = db::rows(
        &bot.database,
        "SELECT COUNT(*) FROM actions WHERE state = 'unknown'",
    )[0][0]
        .parse()
        .unwrap_or(0);
    let report = Report {
        messages: verdict.messages,
        replies: verdict.replies,
        side_effects: started.len(),
        max_per_key: by_key.values().copied().max().unwrap_or(0),
        doubled_by_key: beyond_first(&by_key),
        doubled_by_decision: beyond_first(&by_decision),
        duplicates: verdict.duplicates,
        lost: verdict.lost,
        stale: verdict.stale,
        unknown,
        kills,
    };
    println!(
        "tool stress ({} processes, {}): {report:?}",
        plan.processes,
        if plan.postgres.is_some() {
            "PostgreSQL"
        } else {
            "SQLite"
        }
    );
    if report.duplicates + report.lost + report.stale > 0 {
        println!("{}", bot.logs());
    }
    report
}

/// The lull process (its pid) whose server has a `slow_append` started and not ended,
/// if any.
fn call_running(bot: &ToolBot) -> Option<u32> {
    let mut open: BTreeMap<String, (i64, Option<u32>)> = BTreeMap::new();
    for e in bot.executions() {
        if e["tool"] != "slow_append" {
            continue;
        }
        let text = e["arguments"]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let entry = open.entry(text).or_default();
        entry.0 += if e["at"] == "start" { 1 } else { -1 };
        entry.1 = e["parent"].as_u64().map(|p| p as u32);
    }
    open.values()
        .find(|(n, _)| *n > 0)
        .and_then(|(_, parent)| *parent)
}

/// One conversation: `bursts` bursts of 1–3 messages (the first names the batch), sent
/// to the processes in turn (to another when one is down, as a platform redelivers),
/// 100–700 ms apart, 1.5–3 s between bursts: later messages land while a round decides
/// and acts.
async fn drive(c: usize, bursts: usize, seed: u64, urls: &[String]) {
    let client = reqwest::Client::new();
    let mut rng = fastrand::Rng::with_seed(seed);
    tokio::time::sleep(Duration::from_millis(rng.u64(0..1000))).await;
    let mut id = 0;
    for b in 0..bursts {
        for m in 0..rng.usize(1..=3) {
            id += 1;
            let text = if m == 0 {
                format!("note c{c} b{b}")
            } else {
                format!("and more {m}")
            };
            send(
                &client,
                urls,
                rng.usize(..urls.len()),
                &format!("c{c}"),
                &id.to_string(),
                &text,
            )
            .await;
            tokio::time::sleep(Duration::from_millis(rng.u64(100..700))).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(1500..3000))).await;
    }
}

/// Post until a process stores it (202), starting with process `first`.
async fn send(
    client: &reqwest::Client,
    urls: &[String],
    first: usize,
    conversation: &str,
    id: &str,
    text: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(60);
    for attempt in 0.. {
        let url = &urls[(first + attempt) % urls.len()];
        if let Ok(r) = post_message(client, url, conversation, id, text).await
            && r.status().as_u16() == 202
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{conversation}/{id} never stored"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn assert_acted_once(report: &Report) {
    assert_eq!(
        (
            report.doubled_by_key,
            report.doubled_by_decision,
            report.duplicates,
            report.lost,
            report.stale
        ),
        (0, 0, 0, 0, 0),
        "{report:?}"
    );
    assert!(report.side_effects > 0 && report.kills > 0, "{report:?}");
}

/// The SQLite plan: three processes on one file.
fn sqlite_plan(switches: &'static [(&'static str, &'static str)]) -> Plan {
    Plan {
        processes: 3,
        conversations: 10,
        bursts: 3,
        kills: 4,
        postgres: None,
        switches,
        seed: 37,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tool_stress_with_kills_mid_call_acts_once() {
    assert_acted_once(&run(sqlite_plan(&[])).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_tool_stress_with_kills_mid_call_acts_once() {
    let Some(database) = crate::support::postgres::fresh_database() else {
        return;
    };
    let report = run(Plan {
        processes: 2,
        conversations: 10,
        bursts: 3,
        kills: 3,
        postgres: Some(database),
        switches: &[],
        seed: 38,
    })
    .await;
    assert_acted_once(&report);
}

/// Counter-test: with the journal bypassed, the same run counts doubled side effects
/// (a round dropped as stale, overtaken or killed acts again when its batch is answered).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn counter_test_tool_stress_without_the_journal_doubles_side_effects() {
    let report = run(sqlite_plan(&[("LULL_TEST_NO_JOURNAL", "1")])).await;
    assert!(report.doubled_by_decision > 0, "{report:?}");
}
