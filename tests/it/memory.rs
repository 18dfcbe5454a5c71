//! Memory (issue 40), through the real binary, the http adapter and the fakes: a fact
//! the model remembers is listed by `/memory`, reaches the next request's system
//! prompt, survives a restart and is forgotten by `/memory forget N`, never reaching a
//! group; a round dropped as stale remembers nothing; two processes (SQLite) and two
//! replicas (PostgreSQL) remembering for one person at once keep every fact — and with
//! the peers' write-back (`LULL_TEST_MEMORY_WRITE_BACK`) the checker names the facts
//! lost; `/forgetme` leaves none of the person's words in the database file.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::db;
use crate::support::fakes::openai::{Agent, Behavior, FakeOpenAi, Recorded};
use crate::support::fakes::webhook::Received;
use crate::support::http_bot::HttpBot;
use crate::support::process::LullProcess;

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// Processes on one database behind the http adapter, with a model that remembers.
struct MemoryBot(HttpBot);

impl std::ops::Deref for MemoryBot {
    type Target = HttpBot;
    fn deref(&self) -> &HttpBot {
        &self.0
    }
}

impl MemoryBot {
    async fn new(agent: Agent, postgres: Option<String>) -> MemoryBot {
        let bot = HttpBot::new(postgres).await;
        bot.model.fallback(Behavior::Agent(agent));
        MemoryBot(bot)
    }

    async fn start(&self, name: &str, extra: &[(&str, &str)]) -> LullProcess {
        let mut env = vec![
            ("OPENAI_MODEL", "fake-model"),
            ("LULL_DEBOUNCE_MS", "150"),
            ("LULL_MAX_WAIT_MS", "20000"),
            ("LULL_ADMINS", "http:boss"),
        ];
        env.extend_from_slice(extra);
        self.0.start(name, &env).await
    }

    /// `text` from `user` in `conversation` (a group when `group`), message `id`.
    async fn say(&self, lull: &LullProcess, to: (&str, &str, bool), id: &str, text: &str) {
        let (conversation, user, group) = to;
        let r = self
            .client
            .post(format!("{}/api/messages", lull.base_url()))
            .json(
                &json!({ "conversation": conversation, "user": user, "name": user,
                           "text": text, "id": id, "group": group }),
            )
            .timeout(SECS(10))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202, "{text}");
    }

    /// The first row delivered to `conversation` whose text contains `text`.
    async fn wait_text(&self, conversation: &str, text: &str) -> Received {
        let deadline = std::time::Instant::now() + SECS(30);
        loop {
            let found = self
                .webhook
                .received()
                .into_iter()
                .find(|r| r.conversation == conversation && r.text.contains(text));
            if let Some(found) = found {
                return found;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no {text:?} in {conversation}: {:#?}",
                self.webhook.received()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The memories stored, `(scope, owner, text)`.
    fn memories(&self) -> Vec<(String, String, String)> {
        db::rows(
            &self.database,
            "SELECT scope, owner, text FROM memories ORDER BY id",
        )
        .into_iter()
        .map(|r| (r[0].clone(), r[1].clone(), r[2].clone()))
        .collect()
    }

    /// The system message of the newest model request whose user turn contains `text`.
    fn system_of(&self, text: &str) -> String {
        let requests = self.model.requests();
        let request = requests
            .iter()
            .rev()
            .find(|r| user_turns(r).iter().any(|u| u.contains(text)))
            .unwrap_or_else(|| panic!("no request with {text:?}"));
        request.body["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }
}

fn user_turns(request: &Recorded) -> Vec<String> {
    request.body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .map(|m| match &m["content"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect()
}

/// Every tool result the model was sent.
fn tool_results(model: &FakeOpenAi) -> Vec<String> {
    let mut results = BTreeSet::new();
    for request in model.requests() {
        for m in request.body["messages"].as_array().into_iter().flatten() {
            if m["role"] == "tool" {
                results.insert(m["content"].as_str().unwrap_or_default().to_owned());
            }
        }
    }
    results.into_iter().collect()
}

fn remembering() -> Agent {
    Agent {
        calls: vec![("lull__remember".into(), json!({ "text": "" }))],
        newest_field: Some("text"),
        only_if: Some("remember:"),
        ..Agent::default()
    }
}

const ANN: (&str, &str, bool) = ("ann-dm", "ann", false);

/// remember → `/memory` lists it → the next request's system prompt carries it →
/// it survives a restart → `/memory forget N` removes it. The same person in a group:
/// their private memory absent; a member's "remember" for the whole group is refused
/// (the model told why), an admin's is kept for that group only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_is_listed_shown_kept_and_forgotten_and_stays_private() {
    listed_shown_kept_forgotten(None).await;
}

/// The same on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_memory_is_listed_shown_kept_and_forgotten_and_stays_private() {
    let Some(database) = crate::support::postgres::fresh_database() else {
        return;
    };
    listed_shown_kept_forgotten(Some(database)).await;
}

async fn listed_shown_kept_forgotten(postgres: Option<String>) {
    let bot = MemoryBot::new(remembering(), postgres).await;
    let mut lull = bot.start("lull0", &[]).await;
    bot.say(&lull, ANN, "a1", "remember: likes green tea").await;
    bot.wait_text("ann-dm", "[model]").await;
    assert_eq!(
        bot.memories(),
        [(
            "person".into(),
            "ann".into(),
            "remember: likes green tea".into()
        )]
    );
    let results = tool_results(&bot.model);
    assert!(
        results
            .iter()
            .any(|r| r.contains("Will remember") && r.contains("green tea")),
        "the model was told what will be stored: {results:?}"
    );
    bot.say(&lull, ANN, "a2", "/memory").await;
    let listed = bot.wait_text("ann-dm", "What I remember about you").await;
    assert!(
        listed.text.contains("#1 remember: likes green tea"),
        "{}",
        listed.text
    );
    bot.say(&lull, ANN, "a3", "what do I like?").await;
    bot.wait_text("ann-dm", "[model] what do I like?").await;
    let system = bot.system_of("what do I like?");
    assert!(
        system.contains(r#"#1: "remember: likes green tea""#),
        "the memory block: {system}"
    );
    println!("the system prompt of a request with a memory:\n{system}");
    let metrics = lull.metrics().await.unwrap();
    assert_eq!(
        metrics.get(r#"lull_memories_total{op="remember"}"#),
        Some(&1.0)
    );

    lull.restart();
    lull.wait_healthy(SECS(30)).await;
    bot.say(&lull, ANN, "a4", "after the restart").await;
    bot.wait_text("ann-dm", "[model] after the restart").await;
    assert!(bot.system_of("after the restart").contains("green tea"));

    // The same person in a group: none of their private memories there.
    let group = ("team", "ann", true);
    bot.say(&lull, group, "g1", "hello team").await;
    bot.wait_text("team", "hello team").await;
    assert!(!bot.system_of("hello team").contains("green tea"));
    bot.say(&lull, group, "g2", "remember: standup at nine")
        .await;
    bot.wait_text("team", "standup at nine").await;
    let refused = tool_results(&bot.model);
    assert!(
        refused.iter().any(|r| r.contains("only lull's admins")),
        "a member is refused, and the model told why: {refused:?}"
    );
    bot.say(
        &lull,
        ("team", "boss", true),
        "g3",
        "remember: standup at ten",
    )
    .await;
    bot.wait_text("team", "remember: standup at ten").await;
    bot.say(&lull, ANN, "a5", "private again").await;
    bot.wait_text("ann-dm", "[model] private again").await;
    assert!(
        !bot.system_of("private again").contains("standup"),
        "a group's memory stays there"
    );
    let chat: Vec<_> = bot
        .memories()
        .into_iter()
        .filter(|m| m.0 == "chat")
        .collect();
    assert_eq!(
        chat,
        [(
            "chat".into(),
            "team".into(),
            "boss: remember: standup at ten".into()
        )]
    );

    // Forgotten by command: gone from the next prompt. Another scope's id: not found.
    bot.say(&lull, ANN, "a6", "/memory forget 2").await;
    bot.wait_text("ann-dm", "There is no memory #2 here").await;
    bot.say(&lull, ANN, "a7", "/memory forget 1").await;
    bot.wait_text("ann-dm", "Forgotten: memory #1.").await;
    bot.say(&lull, ANN, "a8", "and now?").await;
    bot.wait_text("ann-dm", "[model] and now?").await;
    assert!(!bot.system_of("and now?").contains("green tea"));
    assert_eq!(bot.memories().len(), 1, "the group's memory stays");
    // A member may not clear the group's memories.
    bot.say(&lull, group, "g4", "/memory clear").await;
    bot.wait_text("team", "Only lull's admins can change").await;
    assert_eq!(bot.memories().len(), 1);
}

/// A round that asked to remember, then was dropped as stale by a newer message,
/// stores nothing; the round that answers remembers once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_dropped_as_stale_remembers_nothing() {
    let agent = Agent {
        answer_after: Duration::from_millis(1500),
        only_if: None,
        ..remembering()
    };
    let bot = MemoryBot::new(agent, None).await;
    let lull = bot.start("lull0", &[]).await;
    bot.say(&lull, ANN, "s1", "fact-one").await;
    // The first round staged its fact and waits for the model's answer.
    let deadline = std::time::Instant::now() + SECS(20);
    while !tool_results(&bot.model)
        .iter()
        .any(|r| r.contains("fact-one"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the first round never staged"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bot.say(&lull, ANN, "s2", "fact-two").await;
    let reply = bot.wait_text("ann-dm", "[model]").await;
    assert_eq!(reply.covers, ["s1", "s2"]);
    tokio::time::sleep(SECS(1)).await;
    let stored: Vec<String> = bot.memories().into_iter().map(|m| m.2).collect();
    assert_eq!(
        stored,
        ["fact-two"],
        "the stale round's fact-one was never written"
    );
    assert_eq!(bot.webhook.replies().len(), 1);
}

/// The concurrency run's figures: facts asked (the newest message of each answered
/// batch), stored, lost (asked, not stored), stray (stored, never asked by a
/// committed reply).
#[derive(Debug, Default)]
struct Figures {
    asked: usize,
    stored: usize,
    lost: Vec<String>,
    stray: Vec<String>,
    doubled: usize,
}

/// `conversations` private chats of one person, `messages` each, spread over
/// `processes` processes, each round remembering its newest message.
async fn remember_at_once(
    postgres: Option<String>,
    processes: usize,
    extra: &[(&str, &str)],
) -> Figures {
    let agent = Agent {
        answer_after: Duration::from_millis(300),
        only_if: None,
        ..remembering()
    };
    let bot = MemoryBot::new(agent, postgres).await;
    let mut lulls = Vec::new();
    for n in 0..processes {
        lulls.push(bot.start(&format!("lull{n}"), extra).await);
    }
    let (conversations, messages) = (6, 6);
    for m in 0..messages {
        for c in 0..conversations {
            let lull = &lulls[(c + m) % processes];
            let id = format!("c{c}-m{m}");
            let to = (format!("dm-{c}"), "ann", false);
            bot.say(lull, (&to.0, to.1, to.2), &id, &format!("fact {id}"))
                .await;
        }
        // Each wave answered before the next: six rounds at once, one per chat.
        tokio::time::sleep(Duration::from_millis(1200)).await;
    }
    // Every message answered: each conversation's last message covered.
    let deadline = std::time::Instant::now() + SECS(60);
    loop {
        let replies = bot.webhook.replies();
        let covered: BTreeSet<String> = replies.iter().flat_map(|r| r.covers.clone()).collect();
        if covered.len() == conversations * messages {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not all answered: {covered:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let asked: BTreeSet<String> = bot
        .webhook
        .replies()
        .iter()
        .filter_map(|r| r.covers.last().map(|id| format!("fact {id}")))
        .collect();
    let rows = bot.memories();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for (scope, owner, text) in &rows {
        assert_eq!((scope.as_str(), owner.as_str()), ("person", "ann"));
        *counts.entry(text.clone()).or_default() += 1;
    }
    Figures {
        asked: asked.len(),
        stored: counts.len(),
        lost: asked
            .iter()
            .filter(|f| !counts.contains_key(*f))
            .cloned()
            .collect(),
        stray: counts
            .keys()
            .filter(|f| !asked.contains(*f))
            .cloned()
            .collect(),
        doubled: counts.values().filter(|n| **n > 1).count(),
    }
}

/// Two processes on one SQLite file remembering different facts for one person at
/// the same moment, many rounds: every fact stored exactly once. Counter-test: the
/// peers' write-back (read the list, write it back whole) loses facts, named here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_remembering_for_one_person_keep_every_fact() {
    let figures = remember_at_once(None, 2, &[]).await;
    println!("sqlite, rows: {figures:?}");
    assert!(figures.asked >= 18, "{figures:?}");
    assert!(
        figures.lost.is_empty() && figures.stray.is_empty(),
        "{figures:?}"
    );
    assert_eq!((figures.stored, figures.doubled), (figures.asked, 0));

    let broken = remember_at_once(None, 2, &[("LULL_TEST_MEMORY_WRITE_BACK", "1")]).await;
    println!("sqlite, written back whole (counter-test): {broken:?}");
    assert!(
        !broken.lost.is_empty(),
        "the checker must catch the facts a write-back loses: {broken:?}"
    );
}

/// The same over two replicas on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replicas_remembering_for_one_person_keep_every_fact() {
    let Some(database) = crate::support::postgres::fresh_database() else {
        return;
    };
    let figures = remember_at_once(Some(database), 2, &[]).await;
    println!("postgres, rows: {figures:?}");
    assert!(figures.asked >= 18, "{figures:?}");
    assert!(
        figures.lost.is_empty() && figures.stray.is_empty(),
        "{figures:?}"
    );
    assert_eq!((figures.stored, figures.doubled), (figures.asked, 0));
    let Some(database) = crate::support::postgres::fresh_database() else {
        return;
    };
    let broken = remember_at_once(Some(database), 2, &[("LULL_TEST_MEMORY_WRITE_BACK", "1")]).await;
    println!("postgres, written back whole (counter-test): {broken:?}");
    assert!(!broken.lost.is_empty(), "{broken:?}");
}

/// `/forgetme` erases the person's memories and words: none of their texts is left
/// in any table, nor anywhere in the database file or its write-ahead log; another
/// person's stay, and the counters (messages, replies covering them) are intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forgetme_leaves_none_of_the_persons_words_in_the_file() {
    // The model answers "noted" (it never quotes the person), after one call of
    // lull__remember for the first message.
    let bot = MemoryBot::new(Agent::default(), None).await;
    bot.model.fallback(Behavior::Content("noted".into()));
    bot.model.script([Behavior::Agent(remembering())]);
    let lull = bot.start("lull0", &[]).await;
    let secret = "zebra-marmalade-4471";
    bot.say(&lull, ANN, "f1", &format!("remember: my code is {secret}"))
        .await;
    bot.wait_text("ann-dm", "noted").await;
    assert_eq!(bot.memories().len(), 1);
    bot.say(&lull, ANN, "f2", &format!("the {secret} again"))
        .await;
    bot.say(&lull, ("bob-dm", "bob", false), "b1", "bob says hi")
        .await;
    bot.wait_text("bob-dm", "noted").await;
    let deadline = std::time::Instant::now() + SECS(20);
    while bot.webhook.replies().len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            bot.webhook.replies()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = db::count(&bot.database, "SELECT COUNT(*) FROM messages");
    bot.say(&lull, ANN, "f3", "/forgetme").await;
    let done = bot.wait_text("ann-dm", "I erased").await;
    println!("/forgetme: {}", done.text);
    let file = std::fs::read(bot.dir.path().join("lull.db")).unwrap();
    let wal = std::fs::read(bot.dir.path().join("lull.db-wal")).unwrap_or_default();
    let found = |bytes: &[u8]| bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
    assert!(
        !found(&file),
        "the person's words are still in the database file"
    );
    assert!(
        !found(&wal),
        "the person's words are still in the write-ahead log"
    );
    for table in ["messages", "memories", "overheard", "outbox"] {
        let texts = db::rows(&bot.database, &format!("SELECT * FROM {table}"));
        assert!(!format!("{texts:?}").contains(secret), "{table}: {texts:?}");
    }
    // The counters stay: every message is still a row, Bob's words are his.
    assert_eq!(
        db::count(&bot.database, "SELECT COUNT(*) FROM messages"),
        before
    );
    let bobs = db::rows(
        &bot.database,
        "SELECT text FROM messages WHERE user_id = 'bob'",
    );
    assert_eq!(bobs, [["bob says hi".to_owned()]]);
}

/// Bad input from the model, in one turn: an empty memory and a 100 KB one refused,
/// and 50 calls of `lull__remember` keep at most 20; the reply still arrives, and the
/// model is told why each refused fact was not kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_remembers_too_much_is_bounded() {
    let remember = |text: String| ("lull__remember".to_owned(), json!({ "text": text }));
    let mut calls = vec![remember(String::new()), remember("x".repeat(100_000))];
    calls.extend((0..50).map(|n| remember(format!("fact {n:02}"))));
    let agent = Agent {
        calls,
        ..Agent::default()
    };
    let bot = MemoryBot::new(agent, None).await;
    let lull = bot.start("lull0", &[]).await;
    bot.say(&lull, ANN, "x1", "remember everything").await;
    bot.wait_text("ann-dm", "[model] remember everything").await;
    let stored: Vec<String> = bot.memories().into_iter().map(|m| m.2).collect();
    let expected: Vec<String> = (0..20).map(|n| format!("fact {n:02}")).collect();
    assert_eq!(stored, expected);
    let results = tool_results(&bot.model);
    for why in [
        "text is empty",
        "at most 500 characters",
        "at most 20 memories",
    ] {
        assert!(
            results.iter().any(|r| r.contains(why)),
            "{why}: {results:?}"
        );
    }
}

/// `LULL_MEMORY=off`: the memory tools are not offered, nothing is shown, `/memory`
/// says memory is off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_off_offers_and_shows_nothing() {
    let bot = MemoryBot::new(remembering(), None).await;
    let lull = bot.start("lull0", &[("LULL_MEMORY", "off")]).await;
    bot.say(&lull, ANN, "o1", "remember: nothing at all").await;
    bot.wait_text("ann-dm", "[model] remember: nothing at all")
        .await;
    let offered: Vec<String> = bot
        .model
        .requests()
        .iter()
        .flat_map(|r| r.body["tools"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
        .collect();
    assert!(
        !offered.iter().any(|t| t.starts_with("lull__remember")),
        "{offered:?}"
    );
    assert!(bot.memories().is_empty());
    bot.say(&lull, ANN, "o2", "/memory").await;
    bot.wait_text("ann-dm", "Memory is off here").await;
}

/// `/forgetme` while a reply that remembers is being written: the reply goes out, its
/// fact is not written (the erase fenced the round in flight). Counter-test: without
/// the fence (`LULL_TEST_UNFENCED_MEMORY=1`) the fact comes back after the erase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forgetme_fences_a_reply_being_written() {
    for (switch, kept) in [(None, 0), (Some(("LULL_TEST_UNFENCED_MEMORY", "1")), 1)] {
        let agent = Agent {
            answer_after: Duration::from_millis(1500),
            ..remembering()
        };
        let bot = MemoryBot::new(agent, None).await;
        let lull = bot
            .start("lull0", &switch.into_iter().collect::<Vec<_>>())
            .await;
        bot.say(&lull, ANN, "f1", "remember: my cat is Miso").await;
        let deadline = std::time::Instant::now() + SECS(20);
        while !tool_results(&bot.model).iter().any(|r| r.contains("Miso")) {
            assert!(std::time::Instant::now() < deadline, "never staged");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bot.say(&lull, ANN, "f2", "/forgetme").await;
        bot.wait_text("ann-dm", "I erased").await;
        bot.wait_text("ann-dm", "[model] remember: my cat is Miso")
            .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            bot.memories().len(),
            kept,
            "switch {switch:?}: {:?}",
            bot.memories()
        );
    }
}
