//! Jobs (issue 39), through the real binary, the http adapter and the fakes: a
//! reminder delivered once, on time, without the model; a task answered by exactly one
//! model request; many reminders due in the same second over two processes on one
//! SQLite file, one killed at the due time, each delivered exactly once (and, with the
//! occurrence key off, the checker finds the doubles); a recurring job never twice an
//! occurrence, lull stopped across several occurrences fires one late one (`once`) or
//! a notice (`skip`); cancel stops a job on every process; a WHEN that cannot be read
//! stores nothing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::support::fakes::openai::FakeOpenAi;
use crate::support::fakes::webhook::{Received, Webhook};
use crate::support::process::{LullProcess, post_message};
use crate::support::wall;

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// Processes on one SQLite file behind the http adapter, with the fake model.
struct Bots {
    dir: tempfile::TempDir,
    webhook: Webhook,
    model: FakeOpenAi,
    client: reqwest::Client,
}

impl Bots {
    async fn new() -> Bots {
        Bots {
            dir: tempfile::tempdir().unwrap(),
            webhook: Webhook::start().await,
            model: FakeOpenAi::start().await,
            client: reqwest::Client::new(),
        }
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("lull.db")
    }

    async fn start(&self, name: &str, extra: &[(&str, &str)]) -> LullProcess {
        let mut env = vec![
            ("DATABASE_URL", format!("sqlite:{}", self.db().display())),
            ("LULL_WEBHOOK_URL", self.webhook.url.clone()),
            ("OPENAI_BASE_URL", self.model.base_url.clone()),
            ("OPENAI_API_KEY", "sk-jobs-test".into()),
            ("LULL_STREAM", "off".into()),
            ("LULL_DEBOUNCE_MS", "150".into()),
            ("LULL_MAX_WAIT_MS", "4000".into()),
            ("LULL_POLL_MS", "200".into()),
            ("LULL_JOB_MIN_INTERVAL", "1s".into()),
            ("LULL_JOBS_PER_CHAT", "100".into()),
            ("RUST_LOG", "debug".into()),
        ];
        env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        let mut lull = LullProcess::start(self.dir.path(), name, &["run"], &env);
        lull.wait_healthy(SECS(20)).await;
        lull
    }

    async fn say(&self, lull: &LullProcess, conversation: &str, id: &str, text: &str) {
        let r = post_message(&self.client, &lull.base_url(), conversation, id, text)
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202, "{text}");
    }

    /// Everything delivered to `conversation` whose text contains `text`.
    fn with_text(&self, conversation: &str, text: &str) -> Vec<Received> {
        self.webhook
            .received()
            .into_iter()
            .filter(|r| r.conversation == conversation && r.text.contains(text))
            .collect()
    }

    /// The first row delivered to `conversation` whose text contains `text`.
    async fn wait_text(&self, conversation: &str, text: &str, limit: Duration) -> Received {
        until(&format!("{text:?} in {conversation}"), limit, || {
            self.with_text(conversation, text).into_iter().next()
        })
        .await
    }
}

/// What `found` finds, once it finds it (within `limit`).
async fn until<T>(what: &str, limit: Duration, mut found: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = found() {
            return value;
        }
        assert!(Instant::now() < deadline, "no {what} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A reminder is delivered once, about when it is due, and the model is never asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reminder_is_delivered_once_on_time_without_the_model() {
    let b = Bots::new().await;
    let lull = b.start("lull", &[]).await;
    let asked = Instant::now();
    b.say(&lull, "r1", "1", "/remind in 3s water the plants")
        .await;
    let made = b.wait_text("r1", "Done: #", SECS(10)).await;
    assert!(made.text.contains("water the plants"), "{}", made.text);
    let fired = b.wait_text("r1", "⏰ water the plants", SECS(15)).await;
    let late = fired.at.duration_since(asked).saturating_sub(SECS(3));
    println!("reminder due in 3 s, delivered {:?} late", late);
    assert!(fired.at.duration_since(asked) >= Duration::from_millis(2900));
    tokio::time::sleep(SECS(2)).await;
    assert_eq!(b.with_text("r1", "⏰ water the plants").len(), 1);
    assert_eq!(b.model.requests().len(), 0, "a reminder asks no model");
    b.say(&lull, "r1", "2", "/jobs").await;
    b.wait_text("r1", "No reminders or scheduled tasks", SECS(10))
        .await;
}

/// A task's prompt is answered by exactly one model request and one reply, as a
/// message from the person who scheduled it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_is_answered_by_one_model_request() {
    let b = Bots::new().await;
    let lull = b.start("lull", &[]).await;
    b.say(&lull, "t1", "1", "/schedule in 2s what is on today?")
        .await;
    b.wait_text("t1", "Done: #", SECS(10)).await;
    let reply = until("the task's reply", SECS(20), || {
        b.webhook
            .replies()
            .into_iter()
            .find(|r| r.conversation == "t1")
    })
    .await;
    tokio::time::sleep(SECS(2)).await;
    let requests = b.model.requests();
    assert_eq!(requests.len(), 1, "{}", lull.logs());
    let user = b
        .model
        .messages(0)
        .into_iter()
        .rev()
        .find(|(role, _)| role == "user")
        .unwrap();
    assert!(
        user.1.contains("Scheduled task: what is on today?"),
        "{user:?}"
    );
    assert_eq!(
        b.webhook
            .replies()
            .iter()
            .filter(|r| r.conversation == "t1")
            .count(),
        1,
        "{reply:?}"
    );
}

/// A WHEN that cannot be read gets one line saying what forms work, and nothing is
/// stored; a recurring job more often than `LULL_JOB_MIN_INTERVAL` is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_when_that_cannot_be_read_stores_nothing() {
    let b = Bots::new().await;
    let lull = b.start("lull", &[("LULL_JOB_MIN_INTERVAL", "1m")]).await;
    b.say(
        &lull,
        "w1",
        "1",
        "/remind whenever it suits water the plants",
    )
    .await;
    let told = b.wait_text("w1", "I couldn't tell when", SECS(10)).await;
    assert_eq!(told.text.lines().count(), 1, "{}", told.text);
    b.say(&lull, "w1", "2", "/remind every 10s stretch").await;
    b.wait_text("w1", "repeats too often", SECS(10)).await;
    b.say(&lull, "w1", "3", "/remind in 5m").await;
    b.wait_text("w1", "Nothing to do then", SECS(10)).await;
    b.say(&lull, "w1", "4", "/jobs").await;
    b.wait_text("w1", "No reminders or scheduled tasks", SECS(10))
        .await;
}

/// `count` reminders in as many chats, all due at the same second, made through
/// `lull`; returns when each was confirmed.
async fn reminders_due_together(b: &Bots, lull: &LullProcess, count: usize, due_ms: u64) {
    // A whole minute (UTC, lull's default zone): the reminders are due at its start.
    let when = wall::utc_minute(due_ms / 1000);
    for n in 0..count {
        let text = format!("/remind {when} r{n}");
        b.say(lull, &format!("c{n}"), "1", &text).await;
    }
    for n in 0..count {
        b.wait_text(&format!("c{n}"), "Done: #", SECS(20)).await;
    }
}

/// How many times each reminder was delivered, by its text (`r0`, `r1`, …).
fn deliveries(b: &Bots, count: usize) -> BTreeMap<String, usize> {
    (0..count)
        .map(|n| {
            let text = format!("⏰ r{n}");
            (text.clone(), b.with_text(&format!("c{n}"), &text).len())
        })
        .collect()
}

/// 40 reminders due in the same second over two processes on one SQLite file; the
/// first is killed with SIGKILL at the due time and started again: each reminder is
/// delivered exactly once, none lost. Lateness is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reminders_due_together_over_two_processes_and_a_kill_fire_once() {
    let b = Bots::new().await;
    let mut a = b.start("a", &[]).await;
    let second = b.start("b", &[]).await;
    let due_ms = wall::minute_after(SECS(12));
    reminders_due_together(&b, &a, 40, due_ms).await;
    let due = wall::instant_of(due_ms);
    tokio::time::sleep_until(due.into()).await;
    a.kill9();
    a.restart();
    a.wait_healthy(SECS(20)).await;
    until("every reminder", SECS(30), || {
        deliveries(&b, 40).values().all(|&n| n >= 1).then_some(())
    })
    .await;
    tokio::time::sleep(SECS(3)).await;
    let counted = deliveries(&b, 40);
    let doubled: Vec<_> = counted.iter().filter(|(_, n)| **n > 1).collect();
    let lateness: Vec<Duration> = (0..40)
        .filter_map(|n| {
            b.with_text(&format!("c{n}"), &format!("⏰ r{n}"))
                .first()
                .map(|r| r.at.saturating_duration_since(due))
        })
        .collect();
    let mut sorted = lateness.clone();
    sorted.sort();
    println!(
        "40 reminders due together, two processes, one killed at the due time: delivered {}, doubled {}, lost {}, lateness p50 {:?} p99 {:?}",
        counted.values().filter(|&&n| n >= 1).count(),
        doubled.len(),
        counted.values().filter(|&&n| n == 0).count(),
        sorted[sorted.len() / 2],
        sorted[sorted.len() * 99 / 100],
    );
    assert!(
        doubled.is_empty(),
        "doubled: {doubled:?}\n{}",
        second.logs()
    );
}

/// The same on PostgreSQL: three replicas, 40 reminders due in the same second, and
/// the server restarted at the due time (every session cut, commits refused for a
/// moment): each reminder delivered exactly once, none lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reminders_due_together_on_three_postgres_replicas_and_a_restart_fire_once() {
    use crate::support::postgres::{Cluster, Durability};
    let Some(cluster) = Cluster::private(Durability::Off) else {
        return;
    };
    let cluster = std::sync::Arc::new(cluster);
    let url = cluster.create_database();
    let b = Bots::new().await;
    let pg = [("DATABASE_URL", url.as_str())];
    let a = b.start("a", &pg).await;
    let _b = b.start("b", &pg).await;
    let _c = b.start("c", &pg).await;
    let due_ms = wall::minute_after(SECS(12));
    reminders_due_together(&b, &a, 40, due_ms).await;
    let due = wall::instant_of(due_ms);
    tokio::time::sleep_until(due.into()).await;
    let restarting = cluster.clone();
    tokio::task::spawn_blocking(move || restarting.restart(SECS(2)))
        .await
        .unwrap();
    until("every reminder", SECS(60), || {
        deliveries(&b, 40).values().all(|&n| n >= 1).then_some(())
    })
    .await;
    tokio::time::sleep(SECS(3)).await;
    let counted = deliveries(&b, 40);
    let doubled = counted.values().filter(|&&n| n > 1).count();
    let mut lateness: Vec<Duration> = (0..40)
        .filter_map(|n| {
            let first = b
                .with_text(&format!("c{n}"), &format!("⏰ r{n}"))
                .into_iter()
                .next();
            first.map(|r| r.at.saturating_duration_since(due))
        })
        .collect();
    lateness.sort();
    println!(
        "40 reminders due together, three PostgreSQL replicas, the server restarted at the due time: delivered {}, doubled {doubled}, lost {}, lateness p50 {:?} p99 {:?}",
        counted.values().filter(|&&n| n >= 1).count(),
        counted.values().filter(|&&n| n == 0).count(),
        lateness[lateness.len() / 2],
        lateness[lateness.len() * 99 / 100],
    );
    assert_eq!(doubled, 0, "{counted:?}");
}

/// The counter-test: with the occurrence key off (`LULL_TEST_NO_OCCURRENCE_KEY=1`),
/// two processes that read the same due reminders both fire them, and the checker of
/// the test above finds the doubles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_test_without_the_occurrence_key_two_processes_double_fire() {
    let b = Bots::new().await;
    let off = [("LULL_TEST_NO_OCCURRENCE_KEY", "1")];
    let a = b.start("a", &off).await;
    let _second = b.start("b", &off).await;
    let due_ms = wall::minute_after(SECS(12));
    reminders_due_together(&b, &a, 40, due_ms).await;
    until("every reminder", SECS(100), || {
        deliveries(&b, 40).values().all(|&n| n >= 1).then_some(())
    })
    .await;
    tokio::time::sleep(SECS(3)).await;
    let doubled = deliveries(&b, 40).values().filter(|&&n| n > 1).count();
    println!("counter-test, occurrence key off: {doubled} of 40 reminders delivered twice");
    assert!(doubled > 0, "the checker found no doubles with the key off");
}

/// A recurring reminder: never two deliveries for one occurrence; lull stopped across
/// several occurrences fires one late delivery saying how late (`once`), and cancel on
/// one process stops it on every process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recurring_job_missed_while_down_fires_once_late_and_cancel_stops_it() {
    let b = Bots::new().await;
    let mut a = b.start("a", &[]).await;
    b.say(&a, "e1", "1", "/remind every 2s tick").await;
    let made = b.wait_text("e1", "Done: #", SECS(10)).await;
    let id: String = made
        .text
        .split('#')
        .nth(1)
        .unwrap()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    until("three ticks", SECS(20), || {
        (b.with_text("e1", "⏰ tick").len() >= 3).then_some(())
    })
    .await;
    a.signal("TERM");
    a.wait_exit(SECS(20));
    let before = b.with_text("e1", "⏰ tick").len();
    tokio::time::sleep(SECS(7)).await;
    a.restart();
    a.wait_healthy(SECS(20)).await;
    let late = b.wait_text("e1", "late by", SECS(20)).await;
    assert!(
        late.text.contains("earlier times were missed"),
        "{}",
        late.text
    );
    let ticks = b.with_text("e1", "⏰ tick");
    assert_eq!(
        ticks[before].text, late.text,
        "the first after the restart is the late one"
    );
    let second = b.start("b", &[]).await;
    b.say(&second, "e1", "2", &format!("/jobs cancel {id}"))
        .await;
    b.wait_text("e1", "Stopped job", SECS(10)).await;
    let stopped = b.with_text("e1", "⏰ tick").len();
    tokio::time::sleep(SECS(5)).await;
    assert!(
        b.with_text("e1", "⏰ tick").len() <= stopped + 1,
        "at most one in flight when cancelled"
    );
    // Never two for one occurrence: the ticks are at least about the interval apart.
    let ticks = b.with_text("e1", "⏰ tick");
    for pair in ticks.windows(2) {
        let gap = pair[1].at.duration_since(pair[0].at);
        assert!(
            gap >= Duration::from_millis(1000),
            "two ticks {gap:?} apart"
        );
    }
}

/// `LULL_JOB_MISSED=skip`: occurrences missed while lull was down are not fired; one
/// notice says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missed_occurrences_are_skipped_with_one_notice() {
    let b = Bots::new().await;
    let skip = [("LULL_JOB_MISSED", "skip")];
    let mut a = b.start("a", &skip).await;
    b.say(&a, "s1", "1", "/remind every 2s tock").await;
    b.wait_text("s1", "⏰ tock", SECS(10)).await;
    a.signal("TERM");
    a.wait_exit(SECS(20));
    tokio::time::sleep(SECS(7)).await;
    a.restart();
    a.wait_healthy(SECS(20)).await;
    let skipped = b.wait_text("s1", "skipped", SECS(20)).await;
    assert!(
        skipped.text.contains("while I was not running"),
        "{}",
        skipped.text
    );
    assert_eq!(b.with_text("s1", "skipped").len(), 1);
}

/// The model's `lull__schedule` goes through the act-once journal: asked again in a
/// second round of the same batch (the first round's answer dropped as stale), it
/// reuses the stored result, and one job is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schedule_tool_asked_in_two_rounds_of_a_batch_makes_one_job() {
    use crate::support::fakes::openai::Agent;
    use crate::tools::{Setup, ToolBot};
    let bot = ToolBot::start(Setup {
        agent: Agent {
            calls: vec![(
                "lull__schedule".into(),
                serde_json::json!({ "when": "in 1h", "text": "call mom" }),
            )],
            answer_after: Duration::from_millis(1500),
            ..Agent::default()
        },
        ..Setup::default()
    })
    .await;
    let db = bot.dir.path().join("lull.db");
    let jobs = || {
        rusqlite::Connection::open(&db)
            .and_then(|c| c.query_row("SELECT COUNT(*) FROM jobs", [], |r| r.get::<_, i64>(0)))
            .unwrap_or(0)
    };
    post(&bot, "j1", "1", "remind me to call mom in an hour").await;
    until("the job", SECS(30), || (jobs() == 1).then_some(())).await;
    post(&bot, "j1", "2", "thanks").await;
    let replies = bot.webhook.wait_replies(1, SECS(40)).await;
    assert!(
        replies[0].text.contains("✓ lull__schedule"),
        "{:?}",
        replies[0]
    );
    tokio::time::sleep(SECS(1)).await;
    assert_eq!(jobs(), 1, "one job");
    let logs: String = bot.lulls.iter().map(LullProcess::logs).collect();
    assert!(
        logs.contains("its result reused"),
        "the second round asked again and reused the result"
    );
}

/// `text` from `u1` in `conversation`, through the first process of `bot`.
async fn post(bot: &crate::tools::ToolBot, conversation: &str, id: &str, text: &str) {
    let r = crate::support::process::post_message(
        &reqwest::Client::new(),
        &bot.lulls[0].base_url(),
        conversation,
        id,
        text,
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 202);
}

/// The job tools without any MCP server (`LULL_TOOLS=auto`): a person's
/// `lull__schedule` in a private chat makes the job; in a group, a member's call is
/// answered that only admins may (no job), and the group's history stays in the
/// prompt (the tools are offered to everyone, not admins only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_tools_need_no_mcp_server_and_a_group_member_is_told_no() {
    use crate::support::fakes::openai::{Agent, Behavior};
    let b = Bots::new().await;
    b.model.fallback(Behavior::Agent(Agent {
        calls: vec![(
            "lull__schedule".into(),
            serde_json::json!({ "when": "in 1h", "text": "stretch" }),
        )],
        only_if: Some("remind"),
        ..Agent::default()
    }));
    let lull = b.start("lull", &[("LULL_ADMINS", "http:boss")]).await;
    let jobs = || {
        rusqlite::Connection::open(b.db())
            .and_then(|c| c.query_row("SELECT COUNT(*) FROM jobs", [], |r| r.get::<_, i64>(0)))
            .unwrap_or(0)
    };
    b.say(&lull, "dm", "1", "remind me to stretch in an hour")
        .await;
    let reply = b.wait_text("dm", "✓ lull__schedule", SECS(20)).await;
    println!("{}", reply.text);
    let offered = b.model.requests()[0].body["tools"].clone();
    let tokens = crate::tools::tools_tokens(&offered);
    println!(
        "lull's own tools offered without MCP: {} ({tokens} tokens estimated from above, {} characters)",
        offered.as_array().map_or(0, Vec::len),
        offered.to_string().len()
    );
    assert_eq!(jobs(), 1);
    let group = |id: &str, user: &str, text: &str| {
        serde_json::json!({ "conversation": "team", "user": user, "name": user,
                            "text": text, "id": id, "group": true })
    };
    for body in [
        group("g1", "ann", "hello all"),
        group("g2", "ann", "please remind us"),
    ] {
        let r = b
            .client
            .post(format!("{}/api/messages", lull.base_url()))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
        let text = body["text"].as_str().unwrap().to_owned();
        b.wait_text("team", &text, SECS(20)).await;
    }
    assert_eq!(jobs(), 1, "a member's call made no job");
    let last = b.model.requests().last().unwrap().body.to_string();
    assert!(
        last.contains("only lull's admins may make or stop"),
        "{last}"
    );
    assert!(
        last.contains("hello all"),
        "the group's history stays in the prompt"
    );
}
