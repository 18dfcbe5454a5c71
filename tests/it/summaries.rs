//! Long conversations (issue 41), through the real binary, the http adapter and the
//! fakes, with an ideal summariser (`Behavior::Digest`: a summary is the fact words it
//! was given, so the checker can tell what a summary kept): a 60-message conversation
//! with a 6-message window keeps every fact, on SQLite and PostgreSQL; messages sent
//! while a slow summary is written are answered and kept; two processes finishing
//! summaries at once store one, and the peers' trimmed write-back
//! (`LULL_TEST_SUMMARY_WRITE_BACK`) loses messages the checker names; a failing summary
//! model stalls nothing; retention removes old texts only.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::db;
use crate::support::fakes::openai::{Behavior, Recorded, fact_words};
use crate::support::fakes::webhook::Answer;
use crate::support::http_bot::HttpBot;
use crate::support::process::LullProcess;

const SECS: fn(u64) -> Duration = Duration::from_secs;
/// The model that writes summaries here (`LULL_SUMMARY_MODEL`).
const SUMMARIZER: &str = "summarizer";
const CHAT: &str = "long-chat";

/// Processes on one database behind the http adapter, a chat model that answers at
/// once, and a summariser routed apart.
struct Long(HttpBot);

impl std::ops::Deref for Long {
    type Target = HttpBot;
    fn deref(&self) -> &HttpBot {
        &self.0
    }
}

impl Long {
    async fn new(postgres: Option<String>, summarizer: Behavior) -> Long {
        let bot = HttpBot::new(postgres).await;
        // The chat model's replies carry no fact: what the model is shown of a fact
        // comes from the person's message or from a summary.
        bot.model.fallback(Behavior::Content("noted".into()));
        bot.model.route_model(SUMMARIZER, summarizer);
        Long(bot)
    }

    async fn start(&self, name: &str, extra: &[(&str, &str)]) -> LullProcess {
        let mut env = vec![
            ("OPENAI_MODEL", "chat-model"),
            ("LULL_SUMMARY_MODEL", SUMMARIZER),
            ("LULL_HISTORY_MESSAGES", "6"),
            ("LULL_TOOLS", "off"),
            ("LULL_LLM_RETRIES", "0"),
            ("LULL_DEBOUNCE_MS", "100"),
        ];
        env.extend_from_slice(extra);
        self.0.start(name, &env).await
    }

    /// Message `n` ("message f07 …") to `lull`, and wait for the reply covering it.
    async fn say(&self, lull: &LullProcess, n: usize) {
        let id = format!("m{n:02}");
        let r = self
            .client
            .post(format!("{}/api/messages", lull.base_url()))
            .json(&json!({ "conversation": CHAT, "user": "ann", "name": "Ann",
                           "text": format!("message {} here", fact(n)), "id": id }))
            .timeout(SECS(10))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
        let deadline = std::time::Instant::now() + SECS(30);
        while !self
            .webhook
            .replies()
            .iter()
            .any(|r| r.covers.contains(&id))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "message {n} never answered"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Wait until every summary asked for has its outcome counted by one of `lulls`,
    /// and nothing new was asked for a moment (a summary is asked for just after a
    /// reply is delivered): the next round reads what was stored.
    async fn summaries_settled(&self, lulls: &[&LullProcess]) {
        let deadline = std::time::Instant::now() + SECS(30);
        let mut settled_since: Option<(std::time::Instant, usize)> = None;
        loop {
            let asked = self.model.requests_for(SUMMARIZER).len();
            let mut counted = 0.0;
            for lull in lulls {
                counted += summary_outcomes(lull).await.values().sum::<f64>();
            }
            if counted as usize >= asked {
                match settled_since {
                    Some((since, n)) if n == asked => {
                        if since.elapsed() >= Duration::from_millis(150) {
                            return;
                        }
                    }
                    _ => settled_since = Some((std::time::Instant::now(), asked)),
                }
            } else {
                settled_since = None;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "summaries never settled: {asked} asked, {counted} counted"
            );
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }

    /// The chat model's requests, in order.
    fn chat_requests(&self) -> Vec<Recorded> {
        self.model
            .requests()
            .into_iter()
            .filter(|r| r.body["model"] != SUMMARIZER)
            .collect()
    }

    /// Every message's text as stored, by id order.
    fn stored_texts(&self) -> Vec<String> {
        db::rows(&self.database, "SELECT text FROM messages ORDER BY id")
            .into_iter()
            .map(|r| r[0].clone())
            .collect()
    }
}

fn fact(n: usize) -> String {
    format!("f{n:02}")
}

/// `lull_summaries_total` by outcome.
async fn summary_outcomes(lull: &LullProcess) -> std::collections::BTreeMap<String, f64> {
    lull.metrics()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.starts_with("lull_summaries_total{"))
        .collect()
}

/// What one chat request carried: the facts of its messages verbatim (history and
/// batch), and the facts its summary kept.
struct Seen {
    verbatim: Vec<String>,
    summarised: Vec<String>,
}

fn seen(request: &Recorded) -> Seen {
    let messages = request.body["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let text = |m: &Value| m["content"].as_str().unwrap_or_default().to_owned();
    let system = messages.first().map(text).unwrap_or_default();
    let summarised = system
        .split_once("[Summary of this conversation")
        .map(|(_, block)| fact_words(block))
        .unwrap_or_default();
    let verbatim = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .flat_map(|m| fact_words(&text(m)))
        .collect();
    Seen {
        verbatim,
        summarised,
    }
}

/// The checker's figures over a conversation of `sent` messages.
#[derive(Debug, Default)]
struct Figures {
    requests: usize,
    summaries_seen: usize,
    /// Facts that never reached the model verbatim.
    never_verbatim: Vec<String>,
    /// (request, fact): a fact sent before the request, neither in it nor in its
    /// summary, before any summary covered it.
    dropped: Vec<(usize, String)>,
    /// Facts the last request reached neither verbatim nor through its summary.
    lost: Vec<String>,
}

fn check(requests: &[Recorded], sent: usize) -> Figures {
    let mut figures = Figures {
        requests: requests.len(),
        ..Figures::default()
    };
    let mut reached: Vec<String> = Vec::new();
    for (i, request) in requests.iter().enumerate() {
        let seen = seen(request);
        figures.summaries_seen += usize::from(!seen.summarised.is_empty());
        for f in &reached {
            if !seen.verbatim.contains(f) && !seen.summarised.contains(f) {
                figures.dropped.push((i, f.clone()));
            }
        }
        for f in &seen.verbatim {
            if !reached.contains(f) {
                reached.push(f.clone());
            }
        }
    }
    let all: Vec<String> = (1..=sent).map(fact).collect();
    figures.never_verbatim = all
        .iter()
        .filter(|f| !reached.contains(f))
        .cloned()
        .collect();
    if let Some(last) = requests.last() {
        let seen = seen(last);
        figures.lost = all
            .iter()
            .filter(|f| !seen.verbatim.contains(f) && !seen.summarised.contains(f))
            .cloned()
            .collect();
    }
    figures
}

async fn sixty_messages(postgres: Option<String>) {
    let long = Long::new(
        postgres,
        Behavior::Digest {
            after: Duration::ZERO,
            gate: None,
        },
    )
    .await;
    let lull = long.start("lull0", &[]).await;
    let sent = 60;
    for n in 1..=sent {
        long.say(&lull, n).await;
        long.summaries_settled(&[&lull]).await;
    }
    let requests = long.chat_requests();
    let figures = check(&requests, sent);
    let outcomes = summary_outcomes(&lull).await;
    println!(
        "60 messages, window of 6: {} chat requests, {} with a summary, {} summary requests, outcomes {outcomes:?}; dropped {:?}, lost {:?}",
        figures.requests,
        figures.summaries_seen,
        long.model.requests_for(SUMMARIZER).len(),
        figures.dropped,
        figures.lost
    );
    assert_eq!(figures.requests, sent, "one request per message");
    assert!(figures.never_verbatim.is_empty(), "{figures:?}");
    assert!(figures.dropped.is_empty(), "{figures:?}");
    assert!(figures.lost.is_empty(), "{figures:?}");
    // The fact of message 2 reaches the request answering message 60, by the summary.
    let last = seen(requests.last().unwrap());
    assert!(last.summarised.contains(&fact(2)) && !last.verbatim.contains(&fact(2)));
    // The window holds: at most three exchanges and the batch verbatim.
    assert!(last.verbatim.len() <= 4, "{:?}", last.verbatim);
    // Nothing was deleted or cut by summarising.
    let texts = long.stored_texts();
    assert_eq!(texts.len(), sent);
    for (i, text) in texts.iter().enumerate() {
        assert_eq!(text, &format!("message {} here", fact(i + 1)));
    }
    // `/status` says how far the summary reaches, as stored.
    let covered = db::rows(&long.database, "SELECT messages FROM summaries");
    let r = long
        .client
        .post(format!("{}/api/messages", lull.base_url()))
        .json(&json!({ "conversation": CHAT, "user": "ann", "text": "/status", "id": "status" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let status = long
        .webhook
        .wait_until_received(SECS(30), |r| r.text.contains("Summary:"))
        .await;
    println!("/status: {}", status.text);
    assert!(
        status.text.contains(&format!(
            "Summary: the first {} messages, up to",
            covered[0][0]
        )),
        "{}",
        status.text
    );
}

/// A 60-message conversation with `LULL_HISTORY_MESSAGES=6`: every fact reaches every
/// request until a summary covers it, and the last request through the summary;
/// every message is kept as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_conversation_keeps_every_fact_through_its_summaries() {
    sixty_messages(None).await;
}

/// The same on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_long_conversation_keeps_every_fact_through_its_summaries() {
    let Some(database) = crate::support::postgres::fresh_database() else {
        return;
    };
    sixty_messages(Some(database)).await;
}

/// Messages sent while a slow summary is written are answered at once, and reach
/// the model verbatim afterwards: nothing arriving meanwhile is lost. Counter-test:
/// the peers' trimmed write-back loses them, and the checker names them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_sent_while_a_slow_summary_is_written_are_kept() {
    let slow = |extra: &'static [(&'static str, &'static str)]| async move {
        let long = Long::new(
            None,
            Behavior::Digest {
                after: SECS(4),
                gate: None,
            },
        )
        .await;
        let lull = long.start("lull0", extra).await;
        let started = std::time::Instant::now();
        for n in 1..=8 {
            long.say(&lull, n).await;
        }
        let answered_in = started.elapsed();
        long.summaries_settled(&[&lull]).await;
        long.say(&lull, 9).await;
        long.summaries_settled(&[&lull]).await;
        long.say(&lull, 10).await;
        (check(&long.chat_requests(), 10), answered_in)
    };
    let (figures, answered_in) = slow(&[]).await;
    println!(
        "slow summary: 8 messages answered in {answered_in:?}; lost {:?}",
        figures.lost
    );
    assert!(
        answered_in < SECS(4) * 2,
        "the replies waited for a summary"
    );
    assert!(figures.lost.is_empty(), "{figures:?}");
    assert!(figures.never_verbatim.is_empty(), "{figures:?}");

    let (broken, _) = slow(&[("LULL_TEST_SUMMARY_WRITE_BACK", "1")]).await;
    println!(
        "slow summary, written back trimmed (counter-test): lost {:?}",
        broken.lost
    );
    assert!(
        !broken.lost.is_empty(),
        "the checker must name what a trimmed write-back loses: {broken:?}"
    );
}

/// Two processes finishing a summary of one conversation at once: A's lease expired
/// while it was stopped and B took it; both answers are released together. B's
/// (covering more, its lease held) is stored, A's dropped; every fact reaches the
/// next request. Counter-test: with the trimmed write-back the checker names the
/// messages lost.
async fn race(postgres: Option<String>, extra: &[(&str, &str)]) -> (Figures, String) {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let long = Long::new(
        postgres,
        Behavior::Digest {
            after: Duration::ZERO,
            gate: Some(gate.clone()),
        },
    )
    .await;
    let a = long.start("lull-a", extra).await;
    let b = long.start("lull-b", extra).await;
    for n in 1..=3 {
        long.say(&a, n).await;
    }
    // A's summary is asked for (the window is full) and held.
    wait_for(
        || long.model.requests_for(SUMMARIZER).len() == 1,
        "A's summary",
    )
    .await;
    a.signal("STOP");
    // A's summary lease expires while it is stopped.
    tokio::time::sleep(SECS(4)).await;
    long.say(&b, 4).await;
    wait_for(
        || long.model.requests_for(SUMMARIZER).len() == 2,
        "B's summary",
    )
    .await;
    long.say(&b, 5).await;
    a.signal("CONT");
    gate.add_permits(2);
    long.summaries_settled(&[&a, &b]).await;
    long.say(&b, 6).await;
    let mut outcomes = summary_outcomes(&a).await;
    for (k, v) in summary_outcomes(&b).await {
        *outcomes.entry(k).or_default() += v;
    }
    (check(&long.chat_requests(), 6), format!("{outcomes:?}"))
}

async fn wait_for(done: impl Fn() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + SECS(30);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_finishing_summaries_at_once_store_the_one_that_covers_more() {
    let (figures, outcomes) = race(None, &[]).await;
    println!("sqlite race: outcomes {outcomes}; lost {:?}", figures.lost);
    assert!(figures.lost.is_empty(), "{figures:?}");
    assert!(
        outcomes.contains("stored") && outcomes.contains("fenced"),
        "{outcomes}"
    );
    let (broken, outcomes) = race(None, &[("LULL_TEST_SUMMARY_WRITE_BACK", "1")]).await;
    println!(
        "sqlite race, written back trimmed (counter-test): outcomes {outcomes}; lost {:?}",
        broken.lost
    );
    assert!(!broken.lost.is_empty(), "{broken:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_replicas_finishing_summaries_at_once_store_the_one_that_covers_more() {
    let Some(database) = crate::support::postgres::fresh_database() else {
        return;
    };
    let (figures, outcomes) = race(Some(database), &[]).await;
    println!(
        "postgres race: outcomes {outcomes}; lost {:?}",
        figures.lost
    );
    assert!(figures.lost.is_empty(), "{figures:?}");
    assert!(
        outcomes.contains("stored") && outcomes.contains("fenced"),
        "{outcomes}"
    );
}

/// The summary model failing — 500, refusing (400), hanging — stalls nothing: every
/// message is answered, each failure is counted, and no summary is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_summary_model_stalls_nothing() {
    let long = Long::new(None, Behavior::Status(500)).await;
    let lull = long
        .start("lull0", &[("LULL_LLM_TIMEOUT_MS", "3000")])
        .await;
    let mut n = 0;
    for (behavior, outcome) in [
        (Behavior::Status(500), "failed"),
        (Behavior::Status(400), "refused"),
        (Behavior::Slow(SECS(30)), "failed"),
    ] {
        long.model.route_model(SUMMARIZER, behavior);
        let before = long.model.requests_for(SUMMARIZER).len();
        let started = std::time::Instant::now();
        while long.model.requests_for(SUMMARIZER).len() == before {
            n += 1;
            long.say(&lull, n).await;
        }
        // Answers go on while the summary fails or hangs.
        for _ in 0..2 {
            n += 1;
            long.say(&lull, n).await;
        }
        println!(
            "summary model {outcome}: messages answered meanwhile in {:?}",
            started.elapsed()
        );
        wait_for_outcome(&lull, outcome).await;
    }
    let stored = db::rows(&long.database, "SELECT COUNT(*) FROM summaries");
    assert_eq!(stored[0][0], "0");
    let figures = check(&long.chat_requests(), n);
    assert!(figures.never_verbatim.is_empty(), "{figures:?}");
    assert_eq!(long.webhook.replies().len(), n);
}

async fn wait_for_outcome(lull: &LullProcess, outcome: &str) {
    let deadline = std::time::Instant::now() + SECS(30);
    loop {
        let outcomes = summary_outcomes(lull).await;
        if outcomes
            .keys()
            .any(|k| k.contains(&format!("\"{outcome}\"")))
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {outcome}: {outcomes:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// On one process (stopped at the end): three answered and delivered messages in a
/// chat, a reply that cannot be delivered, and a message whose round is still waiting
/// for the model.
async fn old_pending_and_undelivered(long: &Long) {
    long.model.fallback(Behavior::Answer);
    let first = long.start("lull-first", &[]).await;
    let say_to = |conversation: &'static str, id: &'static str, text: &'static str| {
        let url = format!("{}/api/messages", first.base_url());
        let client = long.client.clone();
        async move {
            let r = client
                .post(url)
                .json(
                    &json!({ "conversation": conversation, "user": "ann", "text": text, "id": id }),
                )
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 202);
        }
    };
    for (id, text) in [("o1", "old one"), ("o2", "old two"), ("o3", "old three")] {
        say_to("old", id, text).await;
        long.webhook
            .wait_until_received(SECS(30), |r| r.covers.contains(&id.to_owned()))
            .await;
    }
    // A reply that cannot be delivered, and a message still waiting for its reply.
    long.webhook.otherwise(Answer::Status(500));
    say_to("undelivered", "u1", "undelivered question").await;
    wait_for(
        || {
            db::rows(
                &long.database,
                "SELECT COUNT(*) FROM outbox WHERE text LIKE '%undelivered question%'",
            )[0][0]
                == "1"
        },
        "the undelivered reply",
    )
    .await;
    long.model.fallback(Behavior::Slow(SECS(600)));
    say_to("pending", "p1", "pending question").await;
    wait_for(
        || {
            long.model
                .requests()
                .iter()
                .any(|r| r.body.to_string().contains("pending question"))
        },
        "the pending round",
    )
    .await;
    drop(first);
}

/// Retention with a test clock two days ahead and `LULL_RETENTION_DAYS=1`, on two
/// processes started at once: the old answered messages' and delivered replies' texts
/// are gone (rows kept), a pending message and an undelivered reply keep theirs, and
/// each text is removed once.
/// (SQLite only: on PostgreSQL every time is the database's clock, which a test clock
/// does not move; `store::postgres::retention_removes_…` checks the same statements
/// there with the time the check gives.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_removes_old_texts_but_never_pending_or_undelivered_ones() {
    let long = Long::new(None, Behavior::Answer).await;
    old_pending_and_undelivered(&long).await;
    let ahead = [
        ("LULL_RETENTION_DAYS", "1"),
        ("LULL_TEST_CLOCK_OFFSET_MS", "172800000"),
    ];
    let (two, three) = tokio::join!(
        long.start("lull-two", &ahead),
        long.start("lull-three", &ahead)
    );
    let removed = |kind: &str| {
        let (two, three) = (&two, &three);
        let key = format!("lull_retention_removed_total{{kind=\"{kind}\"}}");
        async move {
            let mut n = 0.0;
            for lull in [two, three] {
                n += lull
                    .metrics()
                    .await
                    .unwrap_or_default()
                    .get(&key)
                    .copied()
                    .unwrap_or(0.0);
            }
            n
        }
    };
    let deadline = std::time::Instant::now() + SECS(30);
    while removed("message").await < 4.0 {
        assert!(std::time::Instant::now() < deadline, "retention never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(SECS(1)).await;
    // Each text removed once, by one process or the other.
    assert_eq!(
        (removed("message").await, removed("reply").await),
        (4.0, 3.0)
    );
    let texts = db::rows(
        &long.database,
        "SELECT text, erased_at IS NOT NULL FROM messages ORDER BY id",
    );
    println!("messages after retention: {texts:?}");
    let kept: Vec<&str> = texts
        .iter()
        .filter(|r| !r[0].is_empty())
        .map(|r| r[0].as_str())
        .collect();
    assert_eq!(
        kept,
        ["pending question"],
        "only the pending message keeps its text"
    );
    assert_eq!(texts.len(), 5, "every row stays");
    let replies = db::rows(
        &long.database,
        "SELECT text, sent_at IS NOT NULL FROM outbox WHERE kind = 'reply' ORDER BY id",
    );
    println!("replies after retention: {replies:?}");
    assert!(
        replies
            .iter()
            .filter(|r| r[1] == "1" || r[1] == "true")
            .all(|r| r[0].is_empty())
    );
    assert!(
        replies
            .iter()
            .any(|r| r[0].contains("undelivered question")),
        "the undelivered reply keeps its text"
    );
    for lull in [&two, &three] {
        assert!(
            lull.error_lines("retention").is_empty(),
            "{:?}",
            lull.error_lines("retention")
        );
    }
}

/// `/forgetme` while a summary of the person's chat is written from the picture
/// before it; the text of the summary stored afterwards, if any.
async fn forget_while_summarising(extra: &[(&str, &str)]) -> Option<String> {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let long = Long::new(
        None,
        Behavior::Digest {
            after: Duration::ZERO,
            gate: Some(gate.clone()),
        },
    )
    .await;
    let lull = long.start("lull0", extra).await;
    for n in 1..=3 {
        long.say(&lull, n).await;
    }
    wait_for(
        || long.model.requests_for(SUMMARIZER).len() == 1,
        "the summary asked for",
    )
    .await;
    let r = long
        .client
        .post(format!("{}/api/messages", lull.base_url()))
        .json(&json!({ "conversation": CHAT, "user": "ann", "name": "Ann",
                       "text": "/forgetme", "id": "forget" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    long.webhook
        .wait_until_received(SECS(30), |r| r.text.contains("I erased"))
        .await;
    gate.add_permits(1);
    long.summaries_settled(&[&lull]).await;
    db::rows(&long.database, "SELECT text FROM summaries")
        .into_iter()
        .next()
        .map(|r| r[0].clone())
}

/// `/forgetme` while a summary of the person's chat is being written: the summary is
/// not stored, so their words never come back through it. Counter-test: with the
/// fences off (`LULL_TEST_UNFENCED_MEMORY`) the summary written from the picture
/// before the erase brings their words back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forgetme_fences_a_summary_being_written() {
    let stored = forget_while_summarising(&[]).await;
    println!("summary after /forgetme: {stored:?}");
    assert!(
        stored.as_deref().is_none_or(|s| fact_words(s).is_empty()),
        "{stored:?}"
    );
    let broken = forget_while_summarising(&[("LULL_TEST_UNFENCED_MEMORY", "1")]).await;
    println!("summary after /forgetme, fences off (counter-test): {broken:?}");
    assert!(
        broken.as_deref().is_some_and(|s| s.contains("f01")),
        "the counter-test must bring the erased words back: {broken:?}"
    );
}
