//! Tools through the real binary: a small stdio MCP server of the test support
//! (`tests/support/mcp_server.py`, counting each execution in a file) and the OpenAI
//! fake scripted as a model that calls tools ([`Agent`]). Each test counts what the
//! server executed and what the user saw: actions act once, never on an old picture
//! of the conversation, and an interrupted one is reported as of unknown outcome.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::db::{self, Location};
use crate::support::fakes::openai::{Agent, Behavior, FakeOpenAi};
use crate::support::fakes::webhook::{Received, Webhook};
use crate::support::process::{LullProcess, post_message};

/// The test support's MCP server.
fn server_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/mcp_server.py")
}

/// A lull process (or several, on one database) with the counting MCP server and a
/// tool-calling model.
pub(crate) struct ToolBot {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) database: Location,
    pub(crate) lulls: Vec<LullProcess>,
    pub(crate) webhook: Webhook,
    pub(crate) model: FakeOpenAi,
    client: reqwest::Client,
}

/// How to start a [`ToolBot`].
pub(crate) struct Setup<'a> {
    pub(crate) agent: Agent,
    pub(crate) processes: usize,
    pub(crate) extra: &'a [(&'a str, &'a str)],
    /// Extra server settings merged into the `counter` server's config.
    pub(crate) server: Value,
    /// More servers, `(name, config)`.
    pub(crate) more_servers: Vec<(&'a str, Value)>,
    /// A PostgreSQL database (`postgres://…`) instead of a SQLite file.
    pub(crate) postgres: Option<String>,
    /// How long the server's slow tools take (`MCP_SLOW_MS`).
    pub(crate) slow_ms: u64,
}

impl Default for Setup<'_> {
    fn default() -> Self {
        Setup {
            agent: Agent::default(),
            processes: 1,
            extra: &[],
            server: json!({}),
            more_servers: Vec::new(),
            postgres: None,
            slow_ms: 2000,
        }
    }
}

impl ToolBot {
    pub(crate) async fn start(setup: Setup<'_>) -> ToolBot {
        let dir = tempfile::tempdir().unwrap();
        let webhook = Webhook::start().await;
        let model = FakeOpenAi::start().await;
        model.fallback(Behavior::Agent(setup.agent));
        let slow_ms = setup.slow_ms.to_string();
        let counter_env = |dir: &Path| {
            json!({
                "MCP_COUNT_FILE": dir.join("executions.jsonl").display().to_string(),
                "MCP_NOTES_FILE": dir.join("notes.txt").display().to_string(),
                "MCP_SLOW_MS": slow_ms,
            })
        };
        let mut counter = json!({
            "command": "python3",
            "args": [server_script().display().to_string()],
            "env": counter_env(dir.path()),
        });
        for (k, v) in setup.server.as_object().unwrap() {
            counter[k] = v.clone();
        }
        let mut servers = json!({ "counter": counter });
        for (name, mut config) in setup.more_servers {
            config["command"] = json!("python3");
            config["args"] = json!([server_script().display().to_string()]);
            config["env"] = counter_env(dir.path());
            servers[name] = config;
        }
        let config = dir.path().join("mcp.json");
        std::fs::write(
            &config,
            serde_json::to_vec_pretty(&json!({ "mcpServers": servers })).unwrap(),
        )
        .unwrap();
        let database = match setup.postgres {
            Some(url) => Location::from_url(&url),
            None => Location::Sqlite(dir.path().join("lull.db")),
        };
        let mut env = vec![
            ("DATABASE_URL", database.url()),
            ("LULL_WEBHOOK_URL", webhook.url.clone()),
            ("OPENAI_BASE_URL", model.base_url.clone()),
            ("OPENAI_API_KEY", "sk-tools-test-secret".into()),
            ("OPENAI_MODEL", "fake-model".into()),
            ("LULL_MCP_CONFIG", config.display().to_string()),
            ("LULL_TOOL_TIMEOUT_MS", "3000".into()),
            ("LULL_DEBOUNCE_MS", "200".into()),
            ("LULL_MAX_WAIT_MS", "20000".into()),
            ("LULL_LEASE_TTL_MS", "3000".into()),
            ("RUST_LOG", "info,lull_core=debug".into()),
        ];
        env.extend(setup.extra.iter().map(|(k, v)| (*k, v.to_string())));
        let mut lulls = Vec::new();
        for n in 0..setup.processes {
            let mut lull = LullProcess::start(dir.path(), &format!("lull{n}"), &["run"], &env);
            lull.wait_healthy(Duration::from_secs(30)).await;
            lulls.push(lull);
        }
        ToolBot {
            dir,
            database,
            lulls,
            webhook,
            model,
            client: reqwest::Client::new(),
        }
    }

    pub(crate) async fn say(&self, conversation: &str, id: &str, text: &str) {
        self.say_to(0, conversation, id, text).await;
    }

    async fn say_to(&self, process: usize, conversation: &str, id: &str, text: &str) {
        let r = post_message(
            &self.client,
            &self.lulls[process].base_url(),
            conversation,
            id,
            text,
        )
        .await
        .unwrap();
        assert_eq!(r.status().as_u16(), 202);
    }

    async fn say_in_group(&self, conversation: &str, id: &str, user: &str, text: &str) {
        let r = self
            .client
            .post(format!("{}/api/messages", self.lulls[0].base_url()))
            .json(
                &json!({ "conversation": conversation, "user": user, "name": user,
                           "text": text, "id": id, "group": true }),
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
    }

    /// `user` says `text` in the group `conversation` (message `id`); the `n`th reply
    /// delivered, once it is, which must contain `expect`.
    async fn group_reply(
        &self,
        (conversation, id, user): (&str, &str, &str),
        text: &str,
        n: usize,
        expect: &str,
    ) -> Received {
        self.say_in_group(conversation, id, user, text).await;
        let replies = self.webhook.wait_replies(n, LONG).await;
        let reply = replies[n - 1].clone();
        assert!(reply.text.contains(expect), "{expect:?} in {reply:?}");
        reply
    }

    /// Every execution the server logged, in order: `(tool, line)`.
    pub(crate) fn executions(&self) -> Vec<Value> {
        executions(self.dir.path())
    }

    /// How many times `tool` was executed (started).
    pub(crate) fn executed(&self, tool: &str) -> usize {
        executed_in(self.dir.path(), tool)
    }

    /// Wait until `tool` was executed `n` times; panics after `limit`.
    async fn wait_executed(&self, tool: &str, n: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.executed(tool) < n {
            assert!(
                Instant::now() < deadline,
                "{tool} not executed {n} time(s) within {limit:?}: {:#?}\n{}",
                self.executions(),
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Wait until a receiver deduplicating on `webhook-id` shows `n` replies (a kill
    /// between a send and its mark may deliver one twice, under the same id).
    pub(crate) async fn wait_shown(&self, n: usize, limit: Duration) -> Vec<Received> {
        let deadline = Instant::now() + limit;
        loop {
            let shown = self.webhook.shown();
            if shown.len() >= n {
                return shown;
            }
            assert!(
                Instant::now() < deadline,
                "expected {n} replies shown within {limit:?}, got {shown:#?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub(crate) fn logs(&self) -> String {
        self.lulls
            .iter()
            .map(|l| l.logs())
            .collect::<Vec<_>>()
            .join("\n---\n")
    }

    /// The database's verdict once nothing is pending or undelivered.
    pub(crate) async fn verdict(&self) -> db::Verdict {
        db::settled(&self.database, Duration::from_secs(30)).await
    }

    pub(crate) async fn assert_invariants(&self, replies: usize) {
        let v = self.verdict().await;
        assert_eq!(
            (v.replies, v.duplicates, v.lost, v.stale),
            (replies, 0, 0, 0),
            "{v:?}"
        );
    }

    /// Wait until the model was asked `n` times.
    async fn wait_requests(&self, n: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.model.requests().len() < n {
            assert!(
                Instant::now() < deadline,
                "the model was not asked {n} time(s) within {limit:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Write `mcp.json` in `dir` naming the test server as `counter` (its executions
/// logged in `dir`, its slow tools taking `slow_ms`); its path.
pub(crate) fn counter_config(dir: &Path, slow_ms: u64) -> PathBuf {
    let config = dir.join("mcp.json");
    let server = json!({
        "command": "python3",
        "args": [server_script().display().to_string()],
        "env": {
            "MCP_COUNT_FILE": dir.join("executions.jsonl").display().to_string(),
            "MCP_NOTES_FILE": dir.join("notes.txt").display().to_string(),
            "MCP_SLOW_MS": slow_ms.to_string(),
        },
    });
    std::fs::write(
        &config,
        serde_json::to_vec(&json!({ "mcpServers": { "counter": server } })).unwrap(),
    )
    .unwrap();
    config
}

/// How many times the test server in `dir` started `tool`.
pub(crate) fn executed_in(dir: &Path, tool: &str) -> usize {
    executions(dir)
        .iter()
        .filter(|e| e["tool"] == tool && e["at"] != "end")
        .count()
}

fn executions(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("executions.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// A model that appends "milk" at once and writes its answer `answer_after` the result.
fn appends_milk(answer_after: Duration) -> Agent {
    Agent {
        calls: vec![append("milk")],
        answer_after,
        ..Agent::default()
    }
}

fn append(text: &str) -> (String, Value) {
    ("counter__append".into(), json!({ "text": text }))
}

const LONG: Duration = Duration::from_secs(40);

/// A burst of three messages: one reply after the tool turn, the read-only lookup and
/// the append each executed once, the reply saying what was done; the model's
/// request carried the tools (named `SERVER__TOOL`) and the idempotency key reached
/// the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_gets_one_reply_after_the_tool_turn_and_acts_once() {
    let bot = ToolBot::start(Setup {
        agent: Agent {
            calls: vec![
                ("counter__lookup".into(), json!({ "query": "milk" })),
                append("milk"),
            ],
            ..Agent::default()
        },
        ..Setup::default()
    })
    .await;
    for (id, text) in [("1", "buy"), ("2", "some"), ("3", "milk")] {
        bot.say("c1", id, text).await;
    }
    let replies = bot.webhook.wait_replies(1, LONG).await;
    let reply = &replies[0];
    assert!(
        reply.text.starts_with("[model] buy\nsome\nmilk | "),
        "{reply:?}"
    );
    assert!(reply.text.contains("appended"), "{reply:?}");
    assert!(
        reply
            .text
            .contains("Actions: ✓ counter__append {\"text\":\"milk\"}"),
        "the reply reports the action: {reply:?}"
    );
    bot.assert_invariants(1).await;
    assert_eq!(bot.executed("append"), 1, "{:#?}", bot.executions());
    assert_eq!(bot.executed("lookup"), 1);
    let first = &bot.model.requests()[0].body;
    let names: Vec<&str> = first["tools"]
        .as_array()
        .expect("tools offered")
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert!(
        names.contains(&"counter__append") && names.contains(&"counter__lookup"),
        "{names:?}"
    );
    assert_eq!(bot.model.requests().len(), 2, "one tool turn, one answer");
    let append = bot
        .executions()
        .into_iter()
        .find(|e| e["tool"] == "append")
        .unwrap();
    assert!(
        append["meta"]["idempotencyKey"]
            .as_str()
            .is_some_and(|k| k.starts_with("act_")),
        "the idempotency key reaches the server: {append}"
    );
    // Salted by this database: not the journal's own key.
    let journal = db::rows(&bot.database, "SELECT key FROM actions");
    assert_ne!(append["meta"]["idempotencyKey"], journal[0][0].as_str());
    // The lookup is read-only: never journaled, so not in the report.
    assert!(!reply.text.contains("counter__lookup {"), "{reply:?}");
}

/// A new message while the model decides on the append: the stale batch does not act;
/// the next round, covering both messages, appends once, and one reply covers both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_before_the_call_keeps_the_stale_batch_from_acting() {
    let bot = ToolBot::start(Setup {
        agent: Agent {
            calls: vec![append("milk")],
            think: Duration::from_millis(1500),
            ..Agent::default()
        },
        ..Setup::default()
    })
    .await;
    bot.say("c1", "1", "buy milk").await;
    bot.wait_requests(1, LONG).await;
    bot.say("c1", "2", "and bread").await;
    let replies = bot.webhook.wait_replies(1, LONG).await;
    assert!(
        replies[0]
            .text
            .starts_with("[model] buy milk\nand bread | appended"),
        "{:?}",
        replies[0]
    );
    bot.assert_invariants(1).await;
    assert_eq!(bot.executed("append"), 1, "{:#?}", bot.executions());
    assert!(
        bot.logs().contains("round stopped before an action"),
        "the first round stopped before acting"
    );
}

/// The append ran, then a new message arrived while the model wrote its answer: the
/// answer is dropped as stale, the next round's same call reuses the stored result
/// (not run again), and the one reply reports the action.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_after_the_append_does_not_repeat_it() {
    let bot = ToolBot::start(Setup {
        agent: appends_milk(Duration::from_millis(1500)),
        ..Setup::default()
    })
    .await;
    bot.say("c1", "1", "buy milk").await;
    bot.wait_executed("append", 1, LONG).await;
    bot.say("c1", "2", "thanks").await;
    let replies = bot.webhook.wait_replies(1, LONG).await;
    let reply = &replies[0];
    assert!(
        reply.text.starts_with("[model] buy milk\nthanks")
            && reply
                .text
                .contains("[Actions already taken for these messages"),
        "{reply:?}"
    );
    assert!(
        reply.text.contains("already taken"),
        "the model was told it was reused: {reply:?}"
    );
    assert!(
        reply.text.contains("Actions: ✓ counter__append"),
        "{reply:?}"
    );
    bot.assert_invariants(1).await;
    assert_eq!(bot.executed("append"), 1, "{:#?}", bot.executions());
}

/// The counter-test of the two above: with the journal bypassed
/// (`LULL_TEST_NO_JOURNAL=1`), the dropped round's append is run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_test_without_the_journal_the_append_is_doubled() {
    let bot = ToolBot::start(Setup {
        agent: appends_milk(Duration::from_millis(1500)),
        extra: &[("LULL_TEST_NO_JOURNAL", "1")],
        ..Setup::default()
    })
    .await;
    bot.say("c1", "1", "buy milk").await;
    bot.wait_executed("append", 1, LONG).await;
    bot.say("c1", "2", "thanks").await;
    bot.webhook.wait_replies(1, LONG).await;
    bot.assert_invariants(1).await;
    assert_eq!(
        bot.executed("append"),
        2,
        "without the journal the checker must see the append doubled: {:#?}",
        bot.executions()
    );
}

/// `kill -9` after the append, before the reply: after a restart no second append,
/// and one reply that reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_append_does_not_repeat_it() {
    let (appends, reply) = crash_after_the_append(&[]).await;
    assert!(reply.contains("Actions: ✓ counter__append"), "{reply}");
    assert_eq!(appends, 1);
}

/// Its counter-test: with the journal bypassed the restarted round appends again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_test_without_the_journal_a_crash_doubles_the_append() {
    let (appends, _) = crash_after_the_append(&[("LULL_TEST_NO_JOURNAL", "1")]).await;
    assert_eq!(
        appends, 2,
        "without the journal the restart must append again"
    );
}

/// Kill lull after the append ran and before the reply, restart it: how many appends
/// the server executed, and the one reply.
async fn crash_after_the_append(extra: &[(&str, &str)]) -> (usize, String) {
    let mut bot = ToolBot::start(Setup {
        agent: appends_milk(Duration::from_millis(2500)),
        extra,
        ..Setup::default()
    })
    .await;
    bot.say("c1", "1", "buy milk").await;
    bot.wait_executed("append", 1, LONG).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    bot.lulls[0].kill9();
    assert!(bot.webhook.replies().is_empty(), "killed before the reply");
    bot.lulls[0].restart();
    bot.lulls[0].wait_healthy(Duration::from_secs(30)).await;
    let replies = bot.webhook.wait_replies(1, LONG).await;
    bot.assert_invariants(1).await;
    (bot.executed("append"), replies[0].text.clone())
}

/// `kill -9` during a slow append: after a restart it is not run again; the model and
/// the user are told the outcome is unknown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_a_slow_append_reports_the_outcome_unknown() {
    let mut bot = ToolBot::start(Setup {
        agent: Agent {
            calls: vec![("counter__slow_append".into(), json!({ "text": "milk" }))],
            ..Agent::default()
        },
        ..Setup::default()
    })
    .await;
    bot.say("c1", "1", "buy milk").await;
    bot.wait_executed("slow_append", 1, LONG).await;
    bot.lulls[0].kill9();
    bot.lulls[0].restart();
    bot.lulls[0].wait_healthy(Duration::from_secs(30)).await;
    let replies = bot.webhook.wait_replies(1, Duration::from_secs(60)).await;
    let reply = &replies[0];
    assert!(
        reply.text.contains("Outcome unknown"),
        "the model was told: {reply:?}"
    );
    assert!(
        reply
            .text
            .contains("⚠ counter__slow_append {\"text\":\"milk\"}: outcome unknown"),
        "the user is told: {reply:?}"
    );
    bot.assert_invariants(1).await;
    assert_eq!(
        bot.executed("slow_append"),
        1,
        "not run again: {:#?}",
        bot.executions()
    );
}

/// The same with a tool that declares `idempotentHint`: it is run again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_an_idempotent_call_runs_it_again() {
    let mut bot = ToolBot::start(Setup {
        agent: Agent {
            calls: vec![(
                "counter__idempotent_append".into(),
                json!({ "text": "milk" }),
            )],
            ..Agent::default()
        },
        ..Setup::default()
    })
    .await;
    bot.say("c1", "1", "buy milk").await;
    bot.wait_executed("idempotent_append", 1, LONG).await;
    bot.lulls[0].kill9();
    bot.lulls[0].restart();
    bot.lulls[0].wait_healthy(Duration::from_secs(30)).await;
    let replies = bot.webhook.wait_replies(1, Duration::from_secs(60)).await;
    assert!(
        replies[0].text.contains("✓ counter__idempotent_append"),
        "{:?}",
        replies[0]
    );
    bot.assert_invariants(1).await;
    assert_eq!(
        bot.executed("idempotent_append"),
        2,
        "{:#?}",
        bot.executions()
    );
}

/// Two processes on one database, bursts to many conversations arriving at both while
/// calls run: each conversation's append is executed exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_act_once_per_batch() {
    let counts = two_processes_appends(None, &[]).await;
    assert!(
        counts.iter().all(|n| *n == 1),
        "appends per conversation: {counts:?}"
    );
}

/// The same on PostgreSQL (replicas on several hosts share one database).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_postgres_act_once_per_batch() {
    let Some(database) = crate::support::postgres::fresh_database() else {
        return;
    };
    let counts = two_processes_appends(Some(database), &[]).await;
    assert!(
        counts.iter().all(|n| *n == 1),
        "appends per conversation: {counts:?}"
    );
}

/// The counter-test: the same run with the journal bypassed doubles appends (a stale
/// batch acts, and the round covering it acts again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_test_two_processes_without_the_journal_double_appends() {
    let counts = two_processes_appends(None, &[("LULL_TEST_NO_JOURNAL", "1")]).await;
    assert!(
        counts.iter().any(|n| *n > 1),
        "without the journal the checker must find a doubled append: {counts:?}"
    );
}

/// Two processes on one database, eight conversations, each a message to one process
/// and, while its round decides and acts, another to the other: how many times each
/// conversation's append ran (every reply delivered once, nothing lost).
async fn two_processes_appends(postgres: Option<String>, extra: &[(&str, &str)]) -> Vec<usize> {
    let bot = ToolBot::start(Setup {
        postgres,
        agent: Agent {
            calls: vec![append("")],
            think: Duration::from_millis(300),
            answer_after: Duration::from_millis(300),
            user_field: Some("text"),
            ..Agent::default()
        },
        processes: 2,
        extra,
        ..Setup::default()
    })
    .await;
    let conversations = 8;
    for c in 0..conversations {
        bot.say_to(c % 2, &format!("c{c}"), "1", &format!("note {c}"))
            .await;
    }
    // More messages while the first rounds decide and act, to the other process.
    tokio::time::sleep(Duration::from_millis(400)).await;
    for c in 0..conversations {
        bot.say_to((c + 1) % 2, &format!("c{c}"), "2", "more").await;
    }
    bot.webhook
        .wait_replies(conversations, Duration::from_secs(60))
        .await;
    bot.assert_invariants(conversations).await;
    (0..conversations)
        .map(|c| {
            let text = format!("note {c}");
            bot.executions()
                .iter()
                .filter(|e| e["tool"] == "append" && e["arguments"]["text"] == text.as_str())
                .count()
        })
        .collect()
}

/// A destructive call waits for the person's yes: asked once in the chat; approved
/// after a restart, it runs once; a second approval runs nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destructive_call_runs_once_after_approval_across_a_restart() {
    let mut bot = ToolBot::start(Setup {
        agent: deleter(),
        ..Setup::default()
    })
    .await;
    bot.say("c1", "1", "delete my notes").await;
    let notices = bot.webhook.wait_notices(1, LONG).await;
    let question = &notices[0].text;
    assert!(
        question.contains("counter__delete") && question.contains("/approve"),
        "{question}"
    );
    let id: String = question
        .split("/approve ")
        .nth(1)
        .unwrap()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let replies = bot.wait_shown(1, LONG).await;
    assert!(
        replies[0].text.contains("needs the user's approval"),
        "{:?}",
        replies[0]
    );
    assert!(
        replies[0].text.contains("⏳ counter__delete"),
        "{:?}",
        replies[0]
    );
    assert_eq!(bot.executed("delete"), 0, "not before the yes");

    bot.lulls[0].restart();
    bot.lulls[0].wait_healthy(Duration::from_secs(30)).await;
    bot.say("c1", "2", &format!("/approve {id}")).await;
    let replies = bot.wait_shown(2, LONG).await;
    assert!(replies[1].text.contains("deleted"), "{:?}", replies[1]);
    assert!(
        replies[1].text.contains("✓ counter__delete"),
        "{:?}",
        replies[1]
    );
    // A second approval (a double tap): nothing more runs.
    bot.say("c1", "3", &format!("/approve {id}")).await;
    let replies = bot.wait_shown(3, LONG).await;
    assert!(replies[2].text.contains("no approval"), "{:?}", replies[2]);
    bot.assert_invariants(3).await;
    assert_eq!(bot.executed("delete"), 1, "{:#?}", bot.executions());
}

/// An approval after the question expired is refused; an approval by someone else
/// (not the asker, not an admin) is refused; the asker's runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_or_foreign_approvals_are_refused() {
    let bot = ToolBot::start(Setup {
        agent: deleter(),
        extra: &[("LULL_APPROVAL_TTL", "3s")],
        ..Setup::default()
    })
    .await;
    // Expired.
    bot.say("c1", "1", "delete my notes").await;
    let notices = bot.webhook.wait_notices(1, LONG).await;
    let id = approval_id(&notices[0].text);
    bot.webhook.wait_replies(1, LONG).await;
    tokio::time::sleep(Duration::from_millis(3500)).await;
    bot.say("c1", "2", &format!("/approve {id}")).await;
    let replies = bot.webhook.wait_replies(2, LONG).await;
    assert!(
        replies[1].text.contains("no approval") || replies[1].text.contains("expired"),
        "{:?}",
        replies[1]
    );
    assert_eq!(bot.executed("delete"), 0);

    // Someone else's, in a group.
    bot.say_in_group("g1", "1", "ann", "delete the notes").await;
    let notices = bot.webhook.wait_notices(2, LONG).await;
    let id = approval_id(&notices[1].text);
    bot.webhook.wait_replies(3, LONG).await;
    let approve = format!("/approve {id}");
    bot.group_reply(("g1", "2", "bob"), &approve, 4, "only the person")
        .await;
    assert_eq!(bot.executed("delete"), 0);
    bot.group_reply(("g1", "3", "ann"), &approve, 5, "✓ counter__delete")
        .await;
    assert_eq!(bot.executed("delete"), 1);
    bot.assert_invariants(5).await;
}

/// One 4xx on a tool turn that does not name tools (here "fake failure 400") is answered
/// without tools that once, and the next round offers the tools again. Before issue 37
/// any 4xx turned tools off for the whole process until a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_that_names_no_tools_keeps_them_offered() {
    let bot = ToolBot::start(Setup::default()).await;
    bot.model.fallback(Behavior::Answer);
    bot.model.script([Behavior::Status(400)]);
    bot.say("c1", "1", "hello").await;
    let replies = bot.webhook.wait_replies(1, LONG).await;
    assert_eq!(replies[0].text, "[model] hello");
    bot.say("c2", "1", "again").await;
    bot.webhook.wait_replies(2, LONG).await;
    let requests = bot.model.requests();
    let offers = |n: usize| requests[n].body.get("tools").is_some_and(|t| t.is_array());
    assert!(offers(0) && !offers(1), "asked again without tools once");
    assert!(offers(2), "the tools are offered again");
    bot.assert_invariants(2).await;
}

/// In a group, the approval belongs to everyone whose message the call answered, not
/// only to the last one to write: Ann asks for a deletion and Bob chats right after, in
/// the same burst; Carol (not in it) may not approve, Ann may. Before issue 37 only Bob
/// could ("only the person…" to Ann).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_asker_of_the_burst_may_approve_and_no_one_else() {
    let bot = ToolBot::start(Setup {
        agent: deleter(),
        // Ann's and Bob's messages are one burst even on a loaded machine.
        extra: &[("LULL_DEBOUNCE_MS", "1000")],
        ..Setup::default()
    })
    .await;
    bot.say_in_group("g1", "1", "ann", "delete the notes").await;
    bot.say_in_group("g1", "2", "bob", "lol ok").await;
    let notices = bot.webhook.wait_notices(1, LONG).await;
    let id = approval_id(&notices[0].text);
    let replies = bot.webhook.wait_replies(1, LONG).await;
    assert!(
        replies[0].text.contains("lol ok"),
        "one burst: {:?}",
        replies[0]
    );
    let approve = format!("/approve {id}");
    bot.group_reply(("g1", "3", "carol"), &approve, 2, "only the person")
        .await;
    assert_eq!(bot.executed("delete"), 0);
    bot.group_reply(("g1", "4", "ann"), &approve, 3, "✓ counter__delete")
        .await;
    assert_eq!(bot.executed("delete"), 1);
    bot.assert_invariants(3).await;
}

/// A person whose budget ran out can still approve: an approval costs no tokens, so it is
/// taken before anyone pays; the written answer waits for the budget, and a notice says
/// what was done. Before issue 37 the `/approve` was held with the rest until the budget
/// reset, long after the question expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_over_budget_can_still_approve() {
    // The question's round spends about 74 tokens of 120 (and its requests carry the
    // tools' definitions, which every estimate counts: the budget holds them too): the
    // next reply's estimate no longer fits.
    let tools = offered_tools_tokens().await;
    println!("the offered tools' definitions: {tools} tokens (estimated from above)");
    let budget = (120 + tools).to_string();
    let bot = ToolBot::start(Setup {
        agent: deleter(),
        extra: &[
            ("LULL_USER_DAILY_TOKENS", &budget),
            ("LULL_MAX_TOKENS", "10"),
        ],
        ..Setup::default()
    })
    .await;
    let id = ask_to_delete(&bot, "c1").await;
    bot.say("c1", "2", &format!("/approve {id}")).await;
    bot.wait_executed("delete", 1, LONG).await;
    let told = bot
        .webhook
        .wait_until_received(LONG, |r| r.text.contains("approval was taken"))
        .await;
    assert!(told.text.contains("✓ counter__delete"), "{told:?}");
    assert_eq!(bot.executed("delete"), 1);
    assert_eq!(bot.webhook.replies().len(), 1, "the written answer waits");
}

/// The estimate of the tools' definitions a first request offers (as the reservation
/// counts them), learnt from a bot of the same setup.
async fn offered_tools_tokens() -> u64 {
    let probe = ToolBot::start(Setup {
        agent: deleter(),
        ..Setup::default()
    })
    .await;
    probe.say("probe", "1", "hello").await;
    probe.webhook.wait_replies(1, LONG).await;
    tools_tokens(&probe.model.requests()[0].body["tools"])
}

/// The estimate of the tools a request offered (`tools` of its body), as the
/// reservation counts them.
pub(crate) fn tools_tokens(tools: &Value) -> u64 {
    use lull_core::limits::text_tokens;
    tools
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            let f = &t["function"];
            text_tokens(f["name"].as_str().unwrap_or(""))
                + text_tokens(f["description"].as_str().unwrap_or(""))
                + text_tokens(&f["parameters"].to_string())
        })
        .sum()
}

/// `/approve` then `/cancel` of the same question in one burst (two quick taps): the
/// cancel wins, nothing runs, and the model is told it was not approved. Before issue
/// 37 the first answer decided: the deletion ran and the model was told "nothing was
/// run".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_in_the_same_burst_wins_over_an_approve() {
    let bot = ToolBot::start(Setup {
        agent: deleter(),
        // The two answers are one burst even on a loaded machine.
        extra: &[("LULL_DEBOUNCE_MS", "1000")],
        ..Setup::default()
    })
    .await;
    let id = ask_to_delete(&bot, "c1").await;
    bot.say("c1", "2", &format!("/approve {id}")).await;
    bot.say("c1", "3", &format!("/cancel {id}")).await;
    let replies = bot.wait_shown(2, LONG).await;
    assert_eq!(replies[1].covers, ["2", "3"], "one burst: {:?}", replies[1]);
    assert!(
        replies[1].text.contains("✗ counter__delete"),
        "{:?}",
        replies[1]
    );
    assert_eq!(bot.executed("delete"), 0, "{:#?}", bot.executions());
    // A later /approve finds nothing open.
    bot.say("c1", "4", &format!("/approve {id}")).await;
    let replies = bot.wait_shown(3, LONG).await;
    assert!(replies[2].text.contains("no approval"), "{:?}", replies[2]);
    assert_eq!(bot.executed("delete"), 0);
    bot.assert_invariants(3).await;
}

/// `/stop` after a call acted but before the reply that would report it: the answer to
/// `/stop` lists what was done (before issue 37 nobody was told).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_after_an_action_says_what_was_done() {
    let bot = ToolBot::start(Setup {
        agent: appends_milk(Duration::from_secs(5)),
        ..Setup::default()
    })
    .await;
    bot.say("c1", "1", "note milk").await;
    bot.wait_executed("append", 1, LONG).await;
    bot.say("c1", "2", "/stop").await;
    let stopped = bot
        .webhook
        .wait_until_received(LONG, |r| r.text.starts_with("Stopped."))
        .await;
    assert!(
        stopped
            .text
            .contains("✓ counter__append {\"text\":\"milk\"}"),
        "{stopped:?}"
    );
    // The dropped reply never comes.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        bot.webhook
            .replies()
            .iter()
            .all(|r| !r.text.starts_with("[model]")),
        "{:#?}",
        bot.webhook.replies()
    );
    assert_eq!(bot.executed("append"), 1);
}

/// A model that asks to delete the notes: the destructive call of the approval tests.
pub(crate) fn deleter() -> Agent {
    Agent::calling("counter__delete", json!({ "what": "notes" }))
}

/// "delete my notes" in `conversation`, once its question and its reply are shown: the
/// approval id asked for.
pub(crate) async fn ask_to_delete(bot: &ToolBot, conversation: &str) -> String {
    bot.say(conversation, "1", "delete my notes").await;
    let notices = bot.webhook.wait_notices(1, LONG).await;
    let id = approval_id(&notices[0].text);
    bot.wait_shown(1, LONG).await;
    id
}

pub(crate) fn approval_id(question: &str) -> String {
    question
        .split("/approve ")
        .nth(1)
        .unwrap()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect()
}

/// A server that dies, hangs or answers 5 MB: a clear tool error (or a cut result)
/// reaches the model, and the reply still arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_tool_becomes_an_error_result_and_the_reply_arrives() {
    for (tool, expect) in [
        ("counter__hang", "Error:"),
        ("counter__huge", "cut"),
        ("counter__fail", "Error:"),
        ("counter__die", "Error:"),
    ] {
        let bot = ToolBot::start(Setup {
            agent: Agent::calling(tool, json!({})),
            server: json!({ "readOnly": ["hang", "huge", "fail", "die"] }),
            // Room in the reply for the cut result and its note.
            extra: &[("LULL_TOOL_RESULT_CHARS", "2000")],
            ..Setup::default()
        })
        .await;
        bot.say("c1", "1", "try it").await;
        let replies = bot.webhook.wait_replies(1, LONG).await;
        assert!(
            replies[0].text.starts_with("[model] try it | "),
            "{tool}: {:?}",
            replies[0]
        );
        assert!(replies[0].text.contains(expect), "{tool}: {:?}", replies[0]);
        assert!(
            replies[0].text.len() < 40_000,
            "{tool}: the result is capped"
        );
        bot.assert_invariants(1).await;
    }
}

/// A server that dies in the middle of a call that acts (it did its side effect, then
/// exited before answering): the outcome is unknown, stored `unknown` in the journal and
/// said so in the reply, never "failed" (a person told "failed" asks again and gets a
/// second side effect). Before issue 37 the reply said "✗ counter__die failed".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_mid_call_reports_the_outcome_unknown() {
    let bot = ToolBot::start(Setup {
        agent: Agent::calling("counter__die", json!({})),
        ..Setup::default()
    })
    .await;
    bot.say("c1", "1", "do it").await;
    let replies = bot.wait_shown(1, LONG).await;
    let text = &replies[0].text;
    assert!(
        text.contains("⚠ counter__die {}: outcome unknown"),
        "{text}\n{}",
        bot.logs()
    );
    assert!(!text.contains("✗") && !text.contains("failed"), "{text}");
    assert_eq!(bot.executed("die"), 1);
    let states = db::rows(&bot.database, "SELECT state FROM actions");
    assert_eq!(states, [["unknown"]], "the journal says unknown");
    bot.assert_invariants(1).await;
}

/// A busy chat with a tool that acts: a message every 400 ms, a 3 s cap, a model that
/// takes a second and calls `append` every round. The cap still bounds the wait: once
/// the oldest message has waited it, the call refused for the newer messages is told
/// "not run" and the forced reply goes out, well before the chat goes quiet. Before
/// issue 37 the refused reservation ended every round without a reply (none for 30 s,
/// 33 model calls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_acts_keeps_the_cap_in_a_busy_chat() {
    let bot = ToolBot::start(Setup {
        agent: Agent {
            calls: vec![append("busy")],
            think: Duration::from_millis(500),
            answer_after: Duration::from_millis(500),
            ..Agent::default()
        },
        extra: &[("LULL_MAX_WAIT_MS", "3000"), ("LULL_DEBOUNCE", "fixed")],
        ..Setup::default()
    })
    .await;
    let started = Instant::now();
    let mut first_reply = None;
    for n in 0..25 {
        bot.say("c1", &n.to_string(), &format!("message {n}")).await;
        if first_reply.is_none() && !bot.webhook.shown().is_empty() {
            first_reply = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let quiet = started.elapsed();
    let first_reply = first_reply.unwrap_or_else(|| {
        panic!(
            "no reply in {quiet:?} of a busy chat with a 3 s cap\n{}",
            bot.logs()
        )
    });
    println!("first reply after {first_reply:?} (cap 3 s, model 1 s)");
    let shown = bot.webhook.shown();
    // The forced reply says the call was not run (or, had the chat paused long enough
    // on a loaded machine for a round to act on a settled picture, that it ran).
    assert!(
        shown[0].text.contains("Not run: the conversation moved on")
            || shown[0].text.contains("✓ counter__append"),
        "{:?}",
        shown[0]
    );
    let v = bot.verdict().await;
    assert_eq!((v.duplicates, v.lost, v.stale), (0, 0, 0), "{v:?}");
    // Only the last batch, at rest, could reserve the call: it ran at most once a batch.
    assert!(bot.executed("append") <= v.replies, "{v:?}");
}

/// A model that refuses `tools` is asked again without them, and answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_tool_support_still_answers() {
    let bot = ToolBot::start(Setup::default()).await;
    bot.model.fallback(Behavior::RefuseTools);
    bot.say("c1", "1", "hello").await;
    let replies = bot.webhook.wait_replies(1, LONG).await;
    assert_eq!(replies[0].text, "[model] hello");
    bot.say("c2", "1", "again").await;
    bot.webhook.wait_replies(2, LONG).await;
    let requests = bot.model.requests();
    assert!(requests[0].body.get("tools").is_some_and(|t| t.is_array()));
    assert!(requests[1].body.get("tools").is_none_or(|t| t.is_null()));
    assert!(
        requests[2].body.get("tools").is_none_or(|t| t.is_null()),
        "tools are not offered again after a refusal"
    );
    assert_eq!(
        bot.logs().matches("the model refused the tools").count(),
        1,
        "logged once"
    );
    bot.assert_invariants(2).await;
}

/// An admins-only server's tools are offered only when everyone who wrote is an
/// admin; the stdio server's environment holds no secret of lull's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admins_only_tools_and_a_narrow_environment() {
    let env_file = tempfile::NamedTempFile::new().unwrap();
    let bot = ToolBot::start(Setup {
        agent: Agent::calling(
            "counter__env_dump",
            json!({ "path": env_file.path().display().to_string() }),
        ),
        more_servers: vec![("vault", json!({ "users": "admins" }))],
        extra: &[("LULL_ADMINS", "http:boss")],
        ..Setup::default()
    })
    .await;
    bot.say_in_group("g1", "1", "ann", "dump").await;
    bot.webhook.wait_replies(1, LONG).await;
    let offered = |n: usize| -> Vec<String> {
        bot.model.requests()[n].body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
            .collect()
    };
    assert!(
        !offered(0).iter().any(|n| n.starts_with("vault__")),
        "{:?}",
        offered(0)
    );
    bot.say_in_group("g2", "1", "boss", "dump").await;
    bot.webhook.wait_replies(2, LONG).await;
    let n = bot.model.requests().len();
    assert!(
        (0..n).any(|i| offered(i).iter().any(|n| n.starts_with("vault__"))),
        "an admin is offered the admins-only server's tools"
    );
    // In a group where a non-admin spoke, a prompt offering the admins-only tools
    // leaves the others' words out (before issue 37 Ann's text was in its history).
    bot.say_in_group("g1", "2", "boss", "dump again").await;
    bot.webhook.wait_replies(3, LONG).await;
    let n = bot.model.requests().len();
    let admin_prompts: Vec<usize> = (0..n)
        .filter(|i| offered(*i).iter().any(|n| n.starts_with("vault__")))
        .filter(|i| {
            bot.model
                .messages(*i)
                .iter()
                .any(|(_, text)| text.contains("dump again"))
        })
        .collect();
    assert!(!admin_prompts.is_empty(), "the admin is offered them in g1");
    for i in admin_prompts {
        let messages = bot.model.messages(i);
        assert!(
            messages.iter().all(|(_, text)| !text.contains("ann:")),
            "{messages:?}"
        );
    }
    let dumped = std::fs::read_to_string(env_file.path()).unwrap();
    for secret in [
        "sk-tools-test-secret",
        "LULL_WEBHOOK_URL",
        "DATABASE_URL",
        "OPENAI_API_KEY",
    ] {
        assert!(
            !dumped.contains(secret),
            "{secret} reached the MCP server: {dumped}"
        );
    }
    assert!(
        dumped.contains("MCP_COUNT_FILE"),
        "its own env is there: {dumped}"
    );
}

/// The tool loop in one process, with a toolbox of the test's own (no MCP server):
/// the round offers its tools, reserves the acting call, runs it once, answers after
/// the tool turn, and reports the action.
mod in_process {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use async_trait::async_trait;
    use lull_core::llm::HistoryBudget;
    use lull_core::llm::openai::{OpenAiResponder, OpenAiSettings};
    use lull_core::tools::{
        CallOutcome, Effect, ServerState, ToolOutput, ToolSpec, Toolbox, Users,
    };
    use serde_json::{Map, Value, json};

    use crate::helpers::{Node, settings, temp_db};
    use crate::support::fakes::openai::{Agent, Behavior, FakeOpenAi};

    /// A toolbox with a read-only `notes__read` and an acting `notes__add`, counting
    /// what it runs and the keys it is handed.
    #[derive(Default)]
    struct Notes {
        added: AtomicUsize,
        read: AtomicUsize,
        keys: std::sync::Mutex<Vec<Option<String>>>,
    }

    #[async_trait]
    impl Toolbox for Notes {
        fn tools(&self) -> Vec<ToolSpec> {
            let spec = |tool: &str, effect| ToolSpec {
                name: format!("notes__{tool}"),
                server: "notes".into(),
                tool: tool.into(),
                description: format!("{tool} a note"),
                parameters: json!({ "type": "object", "properties": { "text": { "type": "string" } } }),
                effect,
                users: Users::Allowed,
            };
            vec![
                spec("read", Effect::ReadOnly),
                spec("add", Effect::Acts { idempotent: false }),
            ]
        }

        async fn call(
            &self,
            name: &str,
            _arguments: Map<String, Value>,
            key: Option<&str>,
        ) -> ToolOutput {
            self.keys.lock().unwrap().push(key.map(str::to_owned));
            let text = match name {
                "notes__add" => {
                    self.added.fetch_add(1, Ordering::SeqCst);
                    "added"
                }
                _ => {
                    self.read.fetch_add(1, Ordering::SeqCst);
                    "no notes yet"
                }
            };
            ToolOutput {
                text: text.into(),
                is_error: false,
                outcome: CallOutcome::Ok,
            }
        }

        fn servers(&self) -> Vec<ServerState> {
            Vec::new()
        }

        async fn shutdown(&self) {}
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_process_runs_the_tool_turn_and_acts_once() {
        let db = temp_db();
        let model = FakeOpenAi::start().await;
        model.fallback(Behavior::Agent(Agent {
            calls: vec![
                ("notes__read".into(), json!({})),
                ("notes__add".into(), json!({ "text": "milk" })),
            ],
            ..Agent::default()
        }));
        let responder = OpenAiResponder::new(OpenAiSettings {
            base_url: model.base_url.clone(),
            api_key: None,
            model: "fake-model".into(),
            system_prompt: "be brief".into(),
            temperature: None,
            max_tokens: 100,
            history: HistoryBudget {
                messages: 10,
                chars: 10_000,
            },
            timeout: Duration::from_secs(10),
        })
        .unwrap();
        let settings = settings(100, 5000, 3000);
        let store = lull_core::store::SqliteStore::open(&db.path, settings.timers).unwrap();
        let notes = Arc::new(Notes::default());
        let node = Node::start_built(lull_core::domain::Platform::Http, |outbound| {
            lull_core::dispatcher::Dispatcher::builder(
                Arc::new(store),
                Arc::new(responder),
                settings,
                Arc::new(lull_core::clock::SystemClock),
            )
            .outbounds(vec![outbound as Arc<dyn lull_port::Outbound>])
            .toolbox(notes.clone())
        });
        node.send("c", "1", "remember").await;
        node.send("c", "2", "milk").await;
        let replies = node.outbound.wait_replies(1, Duration::from_secs(20)).await;
        assert_eq!(
            replies[0].text,
            "[model] remember\nmilk | no notes yet | added\n\nActions: ✓ notes__add {\"text\":\"milk\"}"
        );
        assert_eq!(notes.added.load(Ordering::SeqCst), 1);
        assert_eq!(notes.read.load(Ordering::SeqCst), 1);
        let keys = notes.keys.lock().unwrap().clone();
        assert_eq!(keys[0], None, "a read-only call carries no key");
        assert!(
            keys[1].as_deref().is_some_and(|k| k.starts_with("act_")),
            "{keys:?}"
        );
        let requests = model.requests();
        assert_eq!(requests.len(), 2);
        let second = &requests[1].body["messages"];
        let roles: Vec<&str> = second
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "tool"]);
        assert_eq!(second[2]["tool_calls"][1]["function"]["name"], "notes__add");
        assert_eq!(second[4]["tool_call_id"], second[2]["tool_calls"][1]["id"]);
    }
}

/// In a Telegram private chat the live draft says which tool runs while it runs
/// (streamed tool calls, then the call), and is never sent as a message: the one
/// message is the reply, which reports the action.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_telegram_draft_shows_the_tool_while_it_runs() {
    use crate::support::fakes::telegram::{TelegramFake, text_message};
    let dir = tempfile::tempdir().unwrap();
    let fake = TelegramFake::start().await;
    let model = FakeOpenAi::start().await;
    model.fallback(Behavior::Agent(Agent::calling(
        "counter__slow_append",
        json!({ "text": "milk" }),
    )));
    let mcp = counter_config(dir.path(), 2000);
    let env = crate::telegram::env(
        dir.path(),
        &fake,
        &[
            ("LULL_LLM", "openai"),
            ("OPENAI_BASE_URL", &model.base_url),
            ("OPENAI_API_KEY", "sk-draft-test"),
            ("OPENAI_MODEL", "fake-model"),
            ("LULL_MCP_CONFIG", &mcp.display().to_string()),
            ("LULL_DEBOUNCE_MS", "200"),
        ],
    );
    let begun = Instant::now();
    let _lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
    crate::telegram::wait_polling(&fake, begun).await;
    let chat = 4711;
    fake.push_message(text_message(chat, chat, "note milk"));
    let sent = fake.wait_sent(chat, 1, LONG).await;
    assert!(
        sent[0].text.contains("✓ counter__slow_append"),
        "{:?}",
        sent[0]
    );
    assert!(
        !sent[0].text.contains('🔧'),
        "the draft is never sent: {:?}",
        sent[0]
    );
    assert!(
        fake.drafts_to(chat)
            .iter()
            .any(|d| d.text.contains("🔧 counter__slow_append")),
        "the draft showed the tool: {:?}",
        fake.drafts_to(chat)
    );
    assert!(
        model.streamed(0),
        "the tool call came from a streamed answer"
    );
    assert_eq!(fake.sent_to(chat).len(), 1, "one message: the reply");
}

/// `/cancel N` refuses the call: never run, and the reply reports it as not approved
/// (what the decision left, not the question that was open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_is_never_run_and_reported_so() {
    let bot = ToolBot::start(Setup {
        agent: deleter(),
        ..Setup::default()
    })
    .await;
    bot.say("c1", "1", "delete my notes").await;
    let notices = bot.webhook.wait_notices(1, LONG).await;
    let id = approval_id(&notices[0].text);
    bot.wait_shown(1, LONG).await;
    bot.say("c1", "2", &format!("/cancel {id}")).await;
    let replies = bot.wait_shown(2, LONG).await;
    assert!(
        replies[1]
            .text
            .contains("✗ counter__delete {\"what\":\"notes\"}: not approved, not run"),
        "{:?}",
        replies[1]
    );
    bot.say("c1", "3", &format!("/approve {id}")).await;
    let replies = bot.wait_shown(3, LONG).await;
    assert!(replies[2].text.contains("no approval"), "{:?}", replies[2]);
    bot.assert_invariants(3).await;
    assert_eq!(bot.executed("delete"), 0, "{:#?}", bot.executions());
}
