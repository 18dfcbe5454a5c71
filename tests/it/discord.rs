//! The Discord adapter end to end: the real `lull` binary against the fake Discord
//! (`support::fakes::discord`) on loopback, REST and gateway.
//!
//! Every test runs lull with `RUST_LOG=debug` and checks at the end that the bot
//! token appears in no log line. Progress is observed through the fake (what the bot
//! sent, which sessions are connected) and the database, not through sleeps.

use std::path::PathBuf;
use std::time::Duration;

use std::sync::Arc;

use lull_adapters::discord::Discord;
use lull_core::clock::SystemClock;
use lull_core::dispatcher::Dispatcher;
use lull_core::domain::{ConversationRef, HolderId, OutboxId, Platform, Timestamp};
use lull_core::llm::echo::EchoResponder;
use lull_core::store::{
    FaultPlan, NewMessage, OutboxKind, RecentQuery, SqliteStore, Store, prelude::*,
};
use lull_core::timing::TimerPolicy;
use lull_port::health::Health;
use lull_port::{Inbound, Outbound, OutgoingPart, SendError};
use secrecy::SecretString;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::helpers::settings;
use crate::support::db;
use crate::support::fakes::discord::{
    ChannelKind, DiscordFake, GUILD_ID, MAX_CONTENT, PostFault, Say, Sent, guild_on_shard,
};
use crate::support::process::LullProcess;

pub(crate) const TOKEN: &str = "MTEwMDAwMDAwMDAwMDAwMDAwMQ.GzXy1a.s3cr3t-t0ken-never-logged";
pub(crate) const ALICE: u64 = 3_000_000_000_000_000_001;
pub(crate) const BOB: u64 = 3_000_000_000_000_000_002;
const CAROL: u64 = 3_000_000_000_000_000_003;
pub(crate) const WAIT: Duration = Duration::from_secs(20);

/// A test's fake Discord, database folder and lull processes.
pub(crate) struct Harness {
    dir: tempfile::TempDir,
    pub(crate) fake: DiscordFake,
    pub(crate) processes: Vec<LullProcess>,
}

impl Harness {
    pub(crate) async fn new() -> Harness {
        Harness {
            dir: tempfile::tempdir().unwrap(),
            fake: DiscordFake::start(TOKEN).await,
            processes: Vec::new(),
        }
    }

    pub(crate) fn db(&self) -> PathBuf {
        self.dir.path().join("lull.db")
    }

    fn env(&self, extra: &[(&str, &str)]) -> Vec<(&'static str, String)> {
        let mut env: Vec<(&'static str, String)> = vec![
            ("DATABASE_URL", format!("sqlite:{}", self.db().display())),
            ("DISCORD_BOT_TOKEN", TOKEN.into()),
            ("DISCORD_API_URL", self.fake.api_url.clone()),
            ("LULL_LLM", "echo".into()),
            ("LULL_ALLOWED_USERS", "*".into()),
            ("LULL_DEBOUNCE_MS", "300".into()),
            ("LULL_MAX_WAIT_MS", "3000".into()),
            ("LULL_POLL_MS", "100".into()),
            ("LULL_LEASE_TTL_MS", "1500".into()),
            ("LULL_SHUTDOWN_GRACE_MS", "1000".into()),
            ("RUST_LOG", "debug".into()),
        ];
        for (key, value) in extra {
            env.retain(|(k, _)| k != key);
            let key: &'static str = Box::leak(key.to_string().into_boxed_str());
            env.push((key, value.to_string()));
        }
        env
    }

    /// Start a lull process and wait until it is healthy (connected or standing by).
    pub(crate) async fn start(&mut self, name: &str, extra: &[(&str, &str)]) -> usize {
        let env = self.env(extra);
        let mut process = LullProcess::start(self.dir.path(), name, &["run"], &env);
        process.wait_healthy(WAIT).await;
        self.processes.push(process);
        self.processes.len() - 1
    }

    /// The Discord adapter's state as `/healthz` reports it.
    async fn discord_state(&self, process: usize) -> String {
        let health: Value = reqwest::get(format!("{}/healthz", self.processes[process].base_url()))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        health["adapters"]["discord"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    async fn wait_state(&self, process: usize, state: &str) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while self.discord_state(process).await != state {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} never reported discord {state}:\n{}",
                self.processes[process].name,
                self.processes[process].logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Wait until every stored message is answered and nothing is left to deliver,
    /// then check the invariants on what was stored.
    pub(crate) async fn settled(&self) -> db::Verdict {
        let verdict = db::settled(&self.db(), WAIT).await;
        assert_eq!(verdict.duplicates, 0, "{verdict:?}");
        assert_eq!(verdict.lost, 0, "{verdict:?}");
        assert_eq!(verdict.stale, 0, "{verdict:?}");
        verdict
    }

    /// The logs of every process so far.
    pub(crate) fn logs(&self) -> String {
        self.processes.iter().map(LullProcess::logs).collect()
    }

    /// The bot token appears in no log line, and every request carried it.
    pub(crate) fn assert_token_kept_secret(&self) {
        for process in &self.processes {
            let logs = process.logs();
            assert!(!logs.is_empty());
            assert!(
                !logs.contains(TOKEN) && !logs.contains("s3cr3t-t0ken"),
                "{} logged the token",
                process.name
            );
        }
        assert_eq!(self.fake.unauthorized(), 0);
    }
}

/// The reply's lines after the echo header: the messages the model was given.
pub(crate) fn echoed(sent: &Sent) -> Vec<&str> {
    sent.content.lines().skip(1).collect()
}

/// An image attachment, its caption and the line typed after it are one burst: the
/// image is fetched from its CDN URL (without the bot token) when the reply is
/// generated, and the model gets it as an image part with all the text.
/// One `lull run` on the fake, answering with a fake model (which records images),
/// connected; a DM channel.
async fn with_a_model_in_a_dm() -> (Harness, crate::support::fakes::openai::FakeOpenAi, u64) {
    let mut h = Harness::new().await;
    let model = crate::support::fakes::openai::FakeOpenAi::start().await;
    let dm = h.fake.channel(ChannelKind::Dm);
    h.start(
        "lull",
        &[
            ("LULL_LLM", "openai"),
            ("OPENAI_BASE_URL", &model.base_url),
            ("OPENAI_API_KEY", "sk-discord-media"),
        ],
    )
    .await;
    h.fake.wait_connected(1, WAIT).await;
    (h, model, dm)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_attachment_reaches_the_model_with_its_burst() {
    let (h, model, dm) = with_a_model_in_a_dm().await;

    let image = b"\x89PNG\r\n\x1a\nfake image bytes".to_vec();
    let id = h
        .fake
        .say(Say::new(dm, ALICE, "what is in this picture?").image(image.clone()));
    h.fake.say(Say::new(dm, ALICE, "the blue thing"));
    let replies = h.fake.wait_sent(dm, 1, WAIT).await;
    assert_eq!(
        replies[0].content,
        "[model] [image] what is in this picture?\nthe blue thing"
    );
    let verdict = h.settled().await;
    assert_eq!((verdict.messages, verdict.replies), (2, 1), "{verdict:?}");
    use base64::Engine as _;
    assert_eq!(
        model.images(0),
        [format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(&image)
        )]
    );
    assert_eq!(model.requests().len(), 1);
    assert_eq!(
        h.fake.downloads(),
        [(id, None)],
        "fetched once, without the token"
    );
    h.assert_token_kept_secret();
}

/// Discord signs attachment URLs for about a day; a batch held longer (a daily budget,
/// a model down) finds its URL expired (404). Before: the image was dropped as gone and
/// the model answered without it. Now the URL is signed again once
/// (`POST /attachments/refresh-urls`) and the image reaches the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_attachment_url_is_signed_again_and_the_image_reaches_the_model() {
    let (h, model, dm) = with_a_model_in_a_dm().await;
    let image = b"\x89PNG\r\n\x1a\nan image held past its URL".to_vec();
    h.fake
        .say(Say::new(dm, ALICE, "and this one?").image(image.clone()));
    h.fake.expire_attachment_urls();
    let replies = h.fake.wait_sent(dm, 1, WAIT).await;
    assert_eq!(replies[0].content, "[model] [image] and this one?");
    use base64::Engine as _;
    assert_eq!(
        model.images(0),
        [format!(
            "data:image/png;base64,{}",
            base64::engine::general_purpose::STANDARD.encode(&image)
        )],
        "the image reached the model"
    );
    let refreshed = h.fake.refreshed();
    assert_eq!(refreshed.len(), 1, "signed again once: {refreshed:?}");
    assert_eq!(
        h.fake.downloads().len(),
        2,
        "the expired URL, then the fresh one"
    );
    h.assert_token_kept_secret();
}

/// Three quick DMs get one reply covering all three, in order, with "typing…" shown
/// meanwhile; an edit of a pending message replaces its text; the send carries a
/// nonce, `enforce_nonce` and no mentions; a DM reply quotes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dm_burst_gets_one_reply() {
    let mut h = Harness::new().await;
    let dm = h.fake.channel(ChannelKind::Dm);
    h.start("lull", &[("LULL_ECHO_DELAY_MS", "200")]).await;
    h.fake.wait_connected(1, WAIT).await;

    h.fake.say(Say::new(dm, ALICE, "hey"));
    let typo = h
        .fake
        .say(Say::new(dm, ALICE, "what is the capital of Frnace"));
    h.fake.say(Say::new(dm, ALICE, "in one word"));
    h.fake.edit(dm, typo, "what is the capital of France");

    let sent = h.fake.wait_sent(dm, 1, WAIT).await;
    let verdict = h.settled().await;
    assert_eq!((verdict.messages, verdict.replies), (3, 1), "{verdict:?}");
    let sent_now = h.fake.sent(dm);
    assert_eq!(
        sent_now.len(),
        1,
        "one reply, not one per message: {sent_now:#?}"
    );
    let reply = &sent[0];
    assert!(
        reply.content.starts_with("[echo] 3 messages:"),
        "{}",
        reply.content
    );
    assert_eq!(
        echoed(reply),
        ["hey", "what is the capital of France", "in one word"]
    );
    assert!(reply.nonce.as_ref().is_some_and(|n| n.len() <= 25));
    assert!(reply.enforce_nonce);
    assert_eq!(reply.allowed_mentions, Some(json!({"parse": []})));
    assert_eq!(reply.reply_to, None, "DM replies quote nothing");
    assert!(h.fake.typing(dm) >= 1, "typing was shown");
    h.assert_token_kept_secret();
}

/// In a guild channel a message without a mention gets no reply and one with a
/// mention (or replying to lull) gets one, quoting it; a thread is its own
/// conversation; `@lull /reset` is a command; an attachment without text gets the
/// "text only" notice; a user not in LULL_ALLOWED_USERS gets the access notice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guild_messages_need_a_mention_and_threads_are_separate() {
    let mut h = Harness::new().await;
    let channel = h.fake.channel(ChannelKind::Guild);
    let thread = h.fake.channel(ChannelKind::Thread);
    let allowed = format!("discord:{ALICE} discord:{BOB}");
    // In a guild only an admin may /reset.
    let admin = format!("discord:{ALICE}");
    h.start(
        "lull",
        &[("LULL_ALLOWED_USERS", &allowed), ("LULL_ADMINS", &admin)],
    )
    .await;
    h.fake.wait_connected(1, WAIT).await;

    // Chatter first: were it taken in, it would join the mention's batch.
    h.fake.say(Say::new(channel, BOB, "lunch anyone?"));
    h.fake.say(Say::new(channel, ALICE, "me"));
    let asked = h
        .fake
        .say(Say::new(channel, ALICE, "what's 2+2?").mention());
    let replies = h.fake.wait_sent(channel, 1, WAIT).await;
    assert_eq!(
        echoed(&replies[0]),
        ["user1: what's 2+2?"],
        "only the mention is answered"
    );
    assert_eq!(
        replies[0].reply_to,
        Some(asked.to_string()),
        "quotes the question"
    );
    assert_eq!(replies[0].fail_if_not_exists, Some(false));
    assert_eq!(replies[0].allowed_mentions, Some(json!({"parse": []})));

    // The thread is a conversation of its own, answered in the thread.
    h.fake.say(Say::new(thread, BOB, "in the thread").mention());
    let in_thread = h.fake.wait_sent(thread, 1, WAIT).await;
    assert_eq!(echoed(&in_thread[0]), ["user2: in the thread"]);

    // A reply to lull needs no mention.
    let follow_up = h
        .fake
        .say(Say::new(channel, ALICE, "and 3+3?").reply_to(replies[0].id));
    let replies = h.fake.wait_sent(channel, 2, WAIT).await;
    assert_eq!(echoed(&replies[1]), ["user1: and 3+3?"]);
    assert_eq!(replies[1].reply_to, Some(follow_up.to_string()));

    // A command after a mention; an attachment without text; a stranger.
    h.fake.say(Say::new(channel, ALICE, "/reset").mention());
    let replies = h.fake.wait_sent(channel, 3, WAIT).await;
    assert_eq!(replies[2].content, lull_core::texts::RESET_TEXT);
    h.fake
        .say(Say::new(channel, ALICE, "").mention().attachment());
    let replies = h.fake.wait_sent(channel, 4, WAIT).await;
    assert_eq!(
        replies[3].content,
        lull_core::texts::unsupported_text("attachment")
    );
    // Bots (lull's own messages come back over the gateway too) are never answered;
    // the notice that follows shows the bot's message was handled before it.
    h.fake.say(Say::new(channel, 42, "beep").mention().by_bot());
    h.fake.say(Say::new(channel, CAROL, "hi bot").mention());
    let replies = h.fake.wait_sent(channel, 5, WAIT).await;
    assert!(
        replies[4].content.contains(&format!("discord:{CAROL}")),
        "{}",
        replies[4].content
    );

    let verdict = h.settled().await;
    assert_eq!((verdict.messages, verdict.replies), (3, 3), "{verdict:?}");
    assert_eq!(h.fake.sent(channel).len(), 5);
    let stored: Vec<String> = db::messages(&h.db()).into_iter().map(|m| m.text).collect();
    assert_eq!(stored, ["what's 2+2?", "in the thread", "and 3+3?"]);
    h.assert_token_kept_secret();
}

/// A message sent while no lull process was connected is read back from the
/// channel's history after the restart and answered; one already answered is not
/// answered again, and guild chatter from the gap stays unanswered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_sent_while_down_is_answered_after_restart() {
    let mut h = Harness::new().await;
    let dm = h.fake.channel(ChannelKind::Dm);
    let channel = h.fake.channel(ChannelKind::Guild);
    let lull = h.start("lull", &[]).await;
    h.fake.wait_connected(1, WAIT).await;
    let first = h.fake.say(Say::new(dm, ALICE, "first"));
    h.fake.say(Say::new(channel, ALICE, "hello").mention());
    h.fake.wait_sent(dm, 1, WAIT).await;
    h.fake.wait_sent(channel, 1, WAIT).await;
    h.settled().await;

    h.processes[lull].kill9();
    h.fake.wait_connected(0, WAIT).await;
    h.fake.say(Say::new(dm, ALICE, "sent while you were down"));
    h.fake.say(Say::new(channel, BOB, "chatter while down"));
    let mentioned = h
        .fake
        .say(Say::new(channel, BOB, "are you back?").mention());

    h.processes[lull].restart();
    let dm_replies = h.fake.wait_sent(dm, 2, WAIT).await;
    assert_eq!(echoed(&dm_replies[1]), ["sent while you were down"]);
    let replies = h.fake.wait_sent(channel, 2, WAIT).await;
    assert_eq!(echoed(&replies[1]), ["user2: are you back?"]);
    assert_eq!(replies[1].reply_to, Some(mentioned.to_string()));
    assert!(
        h.fake.history_reads().contains(&(dm, Some(first))),
        "history is read after the last stored message: {:?}",
        h.fake.history_reads()
    );
    let verdict = h.settled().await;
    assert_eq!((verdict.messages, verdict.replies), (4, 4), "{verdict:?}");
    assert_eq!(h.fake.sent(dm).len(), 2);
    h.assert_token_kept_secret();
}

/// Two processes, one token: one holds the gateway, the other stands by; when the
/// holder is killed the standby connects within the lease TTL, catches up and
/// answers, and there is never more than one session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateway_holder_is_replaced_by_the_standby() {
    let mut h = Harness::new().await;
    let dm = h.fake.channel(ChannelKind::Dm);
    let a = h.start("a", &[]).await;
    h.fake.wait_connected(1, WAIT).await;
    let b = h.start("b", &[]).await;
    h.wait_state(a, "up").await;
    h.wait_state(b, "standby").await;
    assert_eq!(h.fake.connected(), 1);
    assert_eq!(h.fake.identifies(), 1);

    h.fake.say(Say::new(dm, ALICE, "before"));
    h.fake.wait_sent(dm, 1, WAIT).await;
    h.settled().await;

    h.processes[a].kill9();
    let killed = tokio::time::Instant::now();
    h.fake.say(Say::new(dm, ALICE, "while nobody listens"));
    h.fake
        .wait_for(WAIT, || (h.fake.identifies() == 2).then_some(()))
        .await
        .expect("the standby connects");
    let takeover = killed.elapsed();
    eprintln!("standby took over the gateway {takeover:?} after the holder was killed");
    assert!(
        takeover < Duration::from_millis(1500 + 1500),
        "{takeover:?}"
    );
    h.wait_state(b, "up").await;
    let sent = h.fake.wait_sent(dm, 2, WAIT).await;
    assert_eq!(echoed(&sent[1]), ["while nobody listens"]);
    h.fake.say(Say::new(dm, ALICE, "after"));
    let sent = h.fake.wait_sent(dm, 3, WAIT).await;
    assert_eq!(echoed(&sent[2]), ["after"]);
    assert_eq!(h.fake.connected(), 1);
    let verdict = h.settled().await;
    assert_eq!((verdict.messages, verdict.replies), (3, 3), "{verdict:?}");
    h.assert_token_kept_secret();
}

/// The counter-test of the gateway lease: two processes that share no database (so
/// no lease) both connect and both answer the same DM; the single-session assertions
/// above can therefore fail. (Discord's nonce still shows the reply once: the two
/// processes derive the same nonce for the same outbox row, a second line of defence.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_test_without_a_shared_lease_both_processes_connect() {
    let mut h = Harness::new().await;
    let dm = h.fake.channel(ChannelKind::Dm);
    h.start("a", &[]).await;
    let other = format!("sqlite:{}", h.dir.path().join("other.db").display());
    h.start("b", &[("DATABASE_URL", other.as_str())]).await;
    h.fake.wait_connected(2, WAIT).await;
    h.fake.say(Say::new(dm, ALICE, "hello"));
    h.fake
        .wait_for(WAIT, || (h.fake.posts().len() >= 2).then_some(()))
        .await
        .expect("both processes sent a reply");
    assert_eq!(
        h.fake.sent(dm).len(),
        1,
        "the shared nonce kept the reply visible once"
    );
}

/// A holder stopped with SIGTERM leaves the gateway and releases the lease, so the
/// standby takes over at its next claim attempt, long before the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_holder_hands_the_gateway_over_at_once() {
    let mut h = Harness::new().await;
    let dm = h.fake.channel(ChannelKind::Dm);
    let slow_expiry = [
        ("LULL_LEASE_TTL_MS", "30000"),
        ("LULL_LEASE_RENEW_MS", "500"),
    ];
    let a = h.start("a", &slow_expiry).await;
    h.fake.wait_connected(1, WAIT).await;
    let b = h.start("b", &slow_expiry).await;
    h.wait_state(b, "standby").await;

    let stopped = tokio::time::Instant::now();
    h.processes[a].signal("TERM");
    assert_eq!(h.processes[a].wait_exit(WAIT), Some(0));
    h.fake
        .wait_for(WAIT, || (h.fake.identifies() == 2).then_some(()))
        .await
        .expect("the standby connects");
    let handover = stopped.elapsed();
    eprintln!("graceful handover of the gateway took {handover:?}");
    assert!(handover < Duration::from_secs(5), "{handover:?}");
    assert_eq!(h.fake.connected(), 1);
    h.fake.say(Say::new(dm, ALICE, "still there?"));
    h.fake.wait_sent(dm, 1, WAIT).await;
    h.settled().await;
    h.assert_token_kept_secret();
}

/// A holder that loses the gateway lease (here: taken over in the database, as after
/// a pause longer than the TTL) disconnects at once and stands by; when the lease is
/// free again it reconnects and catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_gateway_lease_disconnects_the_holder() {
    let mut h = Harness::new().await;
    let dm = h.fake.channel(ChannelKind::Dm);
    let lull = h.start("lull", &[]).await;
    h.fake.wait_connected(1, WAIT).await;
    h.fake.say(Say::new(dm, ALICE, "hello"));
    h.fake.wait_sent(dm, 1, WAIT).await;

    let write = |sql: &str| {
        let conn = rusqlite::Connection::open(h.db()).unwrap();
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        conn.execute(sql, []).unwrap();
    };
    write(
        "UPDATE leases SET holder = 'another process', token = token + 1,
         expires_at = 9000000000000 WHERE resource = 'poller/discord'",
    );
    h.fake.wait_connected(0, WAIT).await;
    h.wait_state(lull, "standby").await;
    h.fake
        .say(Say::new(dm, ALICE, "while the lease is elsewhere"));

    write("UPDATE leases SET holder = NULL, expires_at = 0 WHERE resource = 'poller/discord'");
    let sent = h.fake.wait_sent(dm, 2, WAIT).await;
    assert_eq!(echoed(&sent[1]), ["while the lease is elsewhere"]);
    assert_eq!((h.fake.connected(), h.fake.identifies()), (1, 2));
    h.settled().await;
    h.assert_token_kept_secret();
}

/// A reply of about 4,500 characters with a code block arrives as three messages of
/// at most 2000 characters, in order, each with its code fences balanced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_reply_arrives_as_three_well_formed_messages() {
    let mut h = Harness::new().await;
    let dm = h.fake.channel(ChannelKind::Dm);
    h.start("lull", &[]).await;
    h.fake.wait_connected(1, WAIT).await;

    // Three messages of Discord's size (each under 2000); the echo reply repeats them.
    let prose = "The quick brown fox jumps over the lazy dog. ".repeat(33);
    let code: String = (0..60)
        .map(|i| format!("let value_{i} = {i} * 2;\n"))
        .collect();
    let block = format!("Here is the code:\n```rust\n{code}```");
    let outro = "Then it all works out in the end, more or less. ".repeat(33);
    for text in [&prose, &block, &outro] {
        assert!(text.chars().count() < MAX_CONTENT);
        h.fake.say(Say::new(dm, ALICE, text.trim_end()));
    }
    h.fake.wait_sent(dm, 3, WAIT).await;
    h.settled().await;
    let sent = h.fake.sent(dm);
    assert_eq!(sent.len(), 3, "{sent:#?}");
    let total: usize = sent.iter().map(|s| s.content.chars().count()).sum();
    eprintln!(
        "a {total}-character reply arrived as parts of {:?} characters",
        sent.iter()
            .map(|s| s.content.chars().count())
            .collect::<Vec<_>>()
    );
    assert!((4400..4700).contains(&total), "{total} characters");
    for part in &sent {
        assert!(part.content.chars().count() <= MAX_CONTENT);
        let fences = part
            .content
            .lines()
            .filter(|l| l.trim_start().starts_with("```"))
            .count();
        assert_eq!(fences % 2, 0, "a fence left open:\n{}", part.content);
    }
    assert!(sent[0].content.starts_with("[echo] 3 messages:"));
    assert!(sent[2].content.trim_end().ends_with("more or less."));
    let nonces: Vec<_> = sent.iter().map(|s| s.nonce.clone().unwrap()).collect();
    assert!(
        nonces[0] != nonces[1] && nonces[1] != nonces[2],
        "{nonces:?}"
    );
    h.assert_token_kept_secret();
}

/// A send whose response is lost (the message was created, the answer was a 500) is
/// retried with the same nonce, after a 429 waited out as Discord asked, and Discord
/// returns the first message instead of showing a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_send_reuses_its_nonce() {
    let mut h = Harness::new().await;
    let dm = h.fake.channel(ChannelKind::Dm);
    h.fake.fault_next_posts(&[
        PostFault::LoseResponse,
        PostFault::Refuse {
            status: 429,
            retry_after: 0.4,
        },
    ]);
    h.start("lull", &[]).await;
    h.fake.wait_connected(1, WAIT).await;
    h.fake.say(Say::new(dm, ALICE, "hello"));
    let posts = h
        .fake
        .wait_for(WAIT, || {
            let posts = h.fake.posts();
            (posts.len() >= 3).then_some(posts)
        })
        .await
        .expect("three attempts");
    h.settled().await;
    let statuses: Vec<u16> = posts.iter().map(|p| p.status).collect();
    assert_eq!(statuses, [500, 429, 200]);
    assert!(
        posts
            .iter()
            .all(|p| p.nonce == posts[0].nonce && p.nonce.is_some())
    );
    assert_eq!(
        posts[2].message, posts[0].message,
        "Discord returned the first message"
    );
    let waited = posts[2].at - posts[1].at;
    assert!(
        waited >= Duration::from_millis(400),
        "429 waited out: {waited:?}"
    );
    assert_eq!(h.fake.sent(dm).len(), 1, "shown once");
    h.assert_token_kept_secret();
}

/// A process killed after Discord created a part but before lull recorded it: the
/// process that recovers the outbox row sends it again with the same nonce, and the
/// user sees it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_retried_after_a_crash_is_shown_once() {
    let mut h = Harness::new().await;
    let dm = h.fake.channel(ChannelKind::Dm);
    // The first answer is lost; the retry hangs, and lull is killed while it waits
    // on it, with the part created but not recorded as sent (nothing else recorded
    // either: a killed retry that had been told to wait, a 429, races the kill
    // against recording that wait).
    h.fake
        .fault_next_posts(&[PostFault::LoseResponse, PostFault::Hang]);
    let lull = h.start("lull", &[]).await;
    h.fake.wait_connected(1, WAIT).await;
    h.fake.say(Say::new(dm, ALICE, "hello"));
    h.fake
        .wait_for(WAIT, || (h.fake.posts().len() == 2).then_some(()))
        .await
        .unwrap();
    h.processes[lull].kill9();
    assert_eq!(
        db::count(&h.db(), "SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL"),
        1,
        "killed between the send and recording it"
    );

    h.processes[lull].restart();
    let posts = h
        .fake
        .wait_for(WAIT, || {
            let posts = h.fake.posts();
            (posts.len() >= 3).then_some(posts)
        })
        .await
        .expect("the recovered row is sent again");
    h.settled().await;
    assert!(posts.iter().all(|p| p.nonce == posts[0].nonce));
    assert_eq!(posts[2].status, 200);
    assert_eq!(
        posts[2].message, posts[0].message,
        "Discord returned the first message"
    );
    assert_eq!(h.fake.sent(dm).len(), 1, "shown once");
    assert_eq!(h.fake.posts().len(), 3);
    h.assert_token_kept_secret();
}

/// Gateway drops lose nothing: a message sent during a drop is replayed into the
/// resumed session; when Discord refuses the resume, the fresh session catches up
/// from history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_drop_loses_no_message() {
    let mut h = Harness::new().await;
    let dm = h.fake.channel(ChannelKind::Dm);
    h.start("lull", &[]).await;
    h.fake.wait_connected(1, WAIT).await;
    h.fake.say(Say::new(dm, ALICE, "before the drop"));
    h.fake.wait_sent(dm, 1, WAIT).await;

    h.fake.drop_connections();
    h.fake.say(Say::new(dm, ALICE, "during the drop"));
    let sent = h.fake.wait_sent(dm, 2, WAIT).await;
    assert_eq!(echoed(&sent[1]), ["during the drop"]);
    assert_eq!((h.fake.resumes(), h.fake.identifies()), (1, 1), "resumed");

    h.fake.refuse_resume(true);
    h.fake.drop_connections();
    h.fake
        .say(Say::new(dm, ALICE, "during a drop without resume"));
    let sent = h.fake.wait_sent(dm, 3, WAIT).await;
    assert_eq!(echoed(&sent[2]), ["during a drop without resume"]);
    assert_eq!(h.fake.identifies(), 2, "identified afresh and caught up");
    assert_eq!(h.fake.connected(), 1);
    let verdict = h.settled().await;
    assert_eq!((verdict.messages, verdict.replies), (3, 3), "{verdict:?}");
    h.assert_token_kept_secret();
}

/// Errors name what failed but never the token: a wrong token (the adapter stops
/// with a message saying so) and failing sends, all logged at debug level.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_never_appears_in_logs() {
    let mut h = Harness::new().await;
    let dm = h.fake.channel(ChannelKind::Dm);
    // Sends that fail, then succeed: their errors are logged.
    h.fake.fault_next_posts(&[
        PostFault::Refuse {
            status: 502,
            retry_after: 0.0,
        },
        PostFault::Refuse {
            status: 429,
            retry_after: 0.1,
        },
    ]);
    h.start("lull", &[]).await;
    h.fake.wait_connected(1, WAIT).await;
    h.fake.say(Say::new(dm, ALICE, "hello"));
    h.fake.wait_sent(dm, 1, WAIT).await;

    // A second process with a token Discord refuses.
    let wrong = "MTEwMDAwMDAwMDAwMDAwMDAwMQ.GzXy1a.wr0ng-t0ken-never-logged";
    let env = h.env(&[("DISCORD_BOT_TOKEN", wrong), ("LULL_LEASE_TTL_MS", "1500")]);
    let mut refused = LullProcess::start(h.dir.path(), "refused", &["run"], &env);
    // It stands by while the first holds the gateway: stop the first, so it tries.
    h.processes[0].signal("TERM");
    h.processes[0].wait_exit(WAIT);
    // A refused token stops the process with an error naming the variable.
    let code = refused.wait_exit(WAIT);
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}");
    let logs = refused.logs();
    assert!(
        logs.contains("DISCORD_BOT_TOKEN") && logs.contains("check the bot token"),
        "{logs}"
    );
    assert!(
        !logs.contains(wrong) && !logs.contains("wr0ng-t0ken"),
        "{logs}"
    );
    assert!(h.fake.unauthorized() >= 1);
    let first = h.processes[0].logs();
    assert!(first.contains("502"), "send errors were logged");
    assert!(!first.contains(TOKEN) && !first.contains("s3cr3t-t0ken"));
}

/// The gateway refusing the token (close code 4004, a token revoked while lull runs)
/// stops the process with an error naming the variable, instead of reconnecting forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_that_refuses_the_token_stops_the_process() {
    let h = Harness::new().await;
    h.fake.refuse_identify();
    let env = h.env(&[]);
    let mut lull = LullProcess::start(h.dir.path(), "lull", &["run"], &env);
    let code = lull.wait_exit(WAIT);
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}");
    let logs = lull.logs();
    assert!(logs.contains("refused DISCORD_BOT_TOKEN"), "{logs}");
    assert!(!logs.contains(TOKEN), "{logs}");
}

/// The store's catch-up query: per platform, the conversations whose last stored
/// message is recent, most recent first, each with the message stored last (by
/// storage order, not by the id's text).
#[tokio::test]
async fn recent_conversations_name_the_last_stored_message() {
    let dir = tempfile::tempdir().unwrap();
    let policy = TimerPolicy::new(Duration::from_secs(1), Duration::from_secs(5), 20).unwrap();
    let store = SqliteStore::open(dir.path().join("lull.db"), policy).unwrap();
    let holder = HolderId::new("test");
    let message = |platform, key: &str, id: &str| NewMessage {
        conversation: ConversationRef::new(platform, key),
        is_group: key.starts_with('g'),
        message_id: id.into(),
        user_id: "u".into(),
        author: "u".into(),
        text: "hi".into(),
        media: Vec::new(),
    };
    for (platform, key, id, at) in [
        (Platform::Discord, "old", "5", 1_000),
        (Platform::Discord, "dm", "98", 10_000),
        (Platform::Discord, "dm", "100", 11_000),
        (Platform::Discord, "g1", "7", 12_000),
        (Platform::Telegram, "t", "1", 13_000),
    ] {
        store
            .ingest(message(platform, key, id), &holder, Timestamp(at))
            .await
            .unwrap();
    }
    let recent = store
        .recent_conversations(RecentQuery {
            platform: Platform::Discord,
            since: Timestamp(5_000),
            limit: 10,
        })
        .await
        .unwrap();
    let got: Vec<_> = recent
        .iter()
        .map(|r| {
            (
                r.conversation.key.as_str(),
                r.is_group,
                r.last_message_id.as_str(),
            )
        })
        .collect();
    assert_eq!(got, [("g1", true, "7"), ("dm", false, "100")]);
    let limited = store
        .recent_conversations(RecentQuery {
            platform: Platform::Discord,
            since: Timestamp(0),
            limit: 1,
        })
        .await
        .unwrap();
    assert_eq!(limited.len(), 1);
    assert_eq!(limited[0].conversation.key, "g1");
}

pub(crate) fn adapter(fake: &DiscordFake) -> Discord {
    Discord::new(
        &lull_adapters::PlatformSettings {
            max_image_bytes: 10 << 20,
            token: SecretString::from(TOKEN),
            api_url: fake.api_url.clone(),
            overhear: false,
            auto_thread: false,
        },
        Default::default(),
    )
    .unwrap()
}

/// The sending half on its own: the first part quotes the batch's last message in
/// guild channels and threads (asking Discord what a channel it never saw is), never
/// in DMs; a 429 becomes a wait of Discord's `retry_after`; a channel that is gone is
/// refused for good.
#[tokio::test]
async fn sends_quote_in_guilds_only_and_map_errors() {
    let fake = DiscordFake::start(TOKEN).await;
    let outbound = adapter(&fake).outbound;
    let dm = fake.channel(ChannelKind::Dm);
    let guild = fake.channel(ChannelKind::Guild);
    let thread = fake.channel(ChannelKind::Thread);
    let part = |conversation: &'static ConversationRef, index: usize| OutgoingPart {
        conversation,
        outbox_id: OutboxId(9),
        created_at: lull_core::domain::Timestamp(1_700_000_000_000),
        stored_at: lull_core::domain::Timestamp(1_700_000_000_000),
        kind: OutboxKind::Reply,
        index,
        count: 2,
        text: "hi",
        reply_to: Some("1234"),
        covers: &[],
        quick_replies: &[],
    };
    let conversation = |id: u64| {
        &*Box::leak(Box::new(ConversationRef::new(
            Platform::Discord,
            id.to_string(),
        )))
    };
    for channel in [dm, guild, thread] {
        outbound
            .send(&part(conversation(channel), 0))
            .await
            .unwrap();
        outbound
            .send(&part(conversation(channel), 1))
            .await
            .unwrap();
        outbound.typing(conversation(channel)).await.unwrap();
    }
    let quoted = |channel| {
        fake.sent(channel)
            .iter()
            .map(|s| s.reply_to.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(quoted(dm), [None, None]);
    assert_eq!(quoted(guild), [Some("1234".to_owned()), None]);
    assert_eq!(quoted(thread), [Some("1234".to_owned()), None]);
    assert_eq!(fake.typing(guild), 1);
    assert_eq!(outbound.typing_every(), Some(Duration::from_secs(8)));

    fake.fault_next_posts(&[
        PostFault::Refuse {
            status: 429,
            retry_after: 0.25,
        },
        PostFault::Refuse {
            status: 503,
            retry_after: 0.0,
        },
    ]);
    let retry = part(conversation(guild), 0);
    assert_eq!(
        outbound.send(&retry).await,
        Err(SendError::RetryAfter(Duration::from_millis(250)))
    );
    assert!(matches!(
        outbound.send(&retry).await,
        Err(SendError::Transient(_))
    ));
    assert!(matches!(
        outbound.send(&part(conversation(7), 0)).await,
        Err(SendError::Permanent(e)) if e.contains("404")
    ));
}

/// A message is handed to the core until it is stored: while the database refuses
/// writes the adapter retries, and once it recovers the message is stored and
/// answered; nothing is skipped or stored out of order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_is_retried_until_it_is_stored() {
    let fake = DiscordFake::start(TOKEN).await;
    let dm = fake.channel(ChannelKind::Dm);
    let dir = tempfile::tempdir().unwrap();
    let settings = settings(200, 2000, 1500);
    let faults = Arc::new(FaultPlan::default());
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(dir.path().join("lull.db"), settings.timers)
            .unwrap()
            .with_faults(faults.clone()),
    );
    let discord = adapter(&fake);
    let settings = lull_core::dispatcher::DispatchSettings {
        access: lull_core::access::Access {
            users: "*".parse().unwrap(),
            ..Default::default()
        },
        ..settings
    };
    let dispatcher = Dispatcher::builder(
        store.clone(),
        Arc::new(EchoResponder::default()),
        settings,
        Arc::new(SystemClock),
    )
    .outbounds(vec![Arc::new(discord.outbound)])
    .build();
    let stop = CancellationToken::new();
    let scheduler = tokio::spawn(dispatcher.clone().run(stop.clone()));
    let inbound: Arc<dyn Inbound> = Arc::new(discord.inbound);
    let intake = {
        let dispatcher = dispatcher.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            dispatcher
                .serve_platform(inbound, Health::default(), stop)
                .await
        })
    };
    fake.wait_connected(1, WAIT).await;

    faults.busy_intake(true);
    fake.say(Say::new(dm, ALICE, "one"));
    fake.say(Say::new(dm, ALICE, "two"));
    let conversation = ConversationRef::new(Platform::Discord, dm.to_string());
    // The first message is tried again and again; the second waits behind it.
    fake.wait_for(WAIT, || (faults.intake_calls() >= 3).then_some(()))
        .await
        .expect("the adapter retries");
    assert_eq!(
        store.is_settled(&conversation).await.unwrap(),
        None,
        "nothing stored while the database is busy"
    );
    faults.busy_intake(false);
    let sent = fake.wait_sent(dm, 1, WAIT).await;
    assert_eq!(echoed(&sent[0]), ["one", "two"]);

    stop.cancel();
    intake.await.unwrap().unwrap();
    scheduler.await.unwrap();
    fake.wait_connected(0, WAIT).await;
}

/// Even at `RUST_LOG=trace` the WebSocket library's raw frames (IDENTIFY carries the
/// token, as bytes) are never logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trace_logging_keeps_raw_gateway_frames_out() {
    let mut h = Harness::new().await;
    let dm = h.fake.channel(ChannelKind::Dm);
    h.start("lull", &[("RUST_LOG", "trace")]).await;
    h.fake.wait_connected(1, WAIT).await;
    h.fake.say(Say::new(dm, ALICE, "hello"));
    h.fake.wait_sent(dm, 1, WAIT).await;
    let logs = h.processes[0].logs();
    assert!(logs.contains("TRACE"), "trace logging is on");
    let frames: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("TRACE") && l.contains("tungstenite"))
        .collect();
    assert!(
        frames.is_empty(),
        "raw frames logged: {:?}",
        &frames[..frames.len().min(3)]
    );
    assert!(!logs.contains(TOKEN));
}

/// `LULL_ALLOWED_CHATS=discord:<server>` admits every member of the server, in its
/// channels only (a DM of the same user is refused), also for messages read back
/// from history after downtime (which carry no server: the channel's is looked up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_admits_its_members_live_and_on_catch_up() {
    let mut h = Harness::new().await;
    let dm = h.fake.channel(ChannelKind::Dm);
    let channel = h.fake.channel(ChannelKind::Guild);
    let server = format!("discord:{GUILD_ID}");
    let env = [("LULL_ALLOWED_USERS", ""), ("LULL_ALLOWED_CHATS", &server)];
    let lull = h.start("lull", &env).await;
    h.fake.wait_connected(1, WAIT).await;
    h.fake.say(Say::new(channel, ALICE, "hello").mention());
    let replies = h.fake.wait_sent(channel, 1, WAIT).await;
    assert_eq!(echoed(&replies[0]), ["user1: hello"]);
    h.fake.say(Say::new(dm, ALICE, "and in private?"));
    let denied = h.fake.wait_sent(dm, 1, WAIT).await;
    assert!(
        denied[0].content.contains("discord:"),
        "{}",
        denied[0].content
    );
    h.settled().await;

    h.processes[lull].kill9();
    h.fake.wait_connected(0, WAIT).await;
    h.fake
        .say(Say::new(channel, BOB, "are you back?").mention());
    h.processes[lull].restart();
    let replies = h.fake.wait_sent(channel, 2, WAIT).await;
    assert_eq!(echoed(&replies[1]), ["user2: are you back?"]);
    h.settled().await;
}

/// Two processes with `LULL_DISCORD_SHARDS=2` on one database split the shards: the
/// first holds both until the second starts, then hands shard 1 over (the second
/// holds replica slot 1), and no shard ever has two connections. Guilds of both shards
/// and DMs are answered once; when the first is killed, the second takes over its
/// shard within the lease TTL and reads back only that shard's channels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_split_the_shards_and_take_over_a_dead_ones() {
    let mut h = Harness::new().await;
    let on0 = h.fake.channel_in(ChannelKind::Guild, guild_on_shard(0, 2));
    let on1 = h.fake.channel_in(ChannelKind::Guild, guild_on_shard(1, 2));
    let dm = h.fake.channel(ChannelKind::Dm);
    let channels = [on0, on1, dm];
    let shards = [("LULL_DISCORD_SHARDS", "2")];
    let a = h.start("a", &shards).await;
    h.fake.wait_shards(&[(0, 2), (1, 2)], WAIT).await;
    let b = h.start("b", &shards).await;
    let holds = |process: usize, shard: &str| {
        h.processes[process].logs().lines().any(|line| {
            line.contains("this process now holds the platform connection")
                && line.contains(&format!("shard={shard}"))
        })
    };
    h.fake
        .wait_for(WAIT, || holds(b, "1/2").then_some(()))
        .await
        .expect("the second process takes shard 1");
    assert!(
        h.processes[a]
            .logs()
            .contains("handed the shard to the replica it belongs to")
    );
    assert!(!holds(b, "0/2"));
    h.fake.wait_shards(&[(0, 2), (1, 2)], WAIT).await;

    for channel in channels {
        h.fake.say(Say::new(channel, ALICE, "hello").mention());
    }
    for channel in channels {
        h.fake.wait_sent(channel, 1, WAIT).await;
    }
    assert_eq!(h.settled().await.counts(), (3, 3, 0, 0, 0));

    let reads_before = h.fake.history_reads().len();
    let identifies = h.fake.identifies();
    h.processes[a].kill9();
    let killed = tokio::time::Instant::now();
    for channel in channels {
        h.fake
            .say(Say::new(channel, ALICE, "while nobody listens").mention());
    }
    h.fake
        .wait_for(WAIT, || (h.fake.identifies() > identifies).then_some(()))
        .await
        .expect("the other process connects shard 0");
    let takeover = killed.elapsed();
    eprintln!("shard 0 taken over {takeover:?} after its holder was killed");
    assert!(
        takeover < Duration::from_millis(1500 * 2 + 1000),
        "{takeover:?}"
    );
    h.fake.wait_shards(&[(0, 2), (1, 2)], WAIT).await;
    for channel in channels {
        let sent = h.fake.wait_sent(channel, 2, WAIT).await;
        let lines = echoed(&sent[1]);
        // Guild lines carry the author's name.
        assert!(
            lines.len() == 1 && lines[0].ends_with("while nobody listens"),
            "{lines:?}"
        );
    }
    assert_eq!(h.settled().await.counts(), (6, 6, 0, 0, 0));
    // Catch-up per shard: shard 0's new session read back its own channels (its
    // guild's, and DMs) once each, not shard 1's, which never stopped.
    let reads: Vec<u64> = h.fake.history_reads()[reads_before..]
        .iter()
        .map(|(channel, _)| *channel)
        .collect();
    let read = |channel| reads.iter().filter(|c| **c == channel).count();
    assert_eq!((read(on0), read(dm), read(on1)), (1, 1, 0), "{reads:?}");
    assert_eq!(h.fake.shard_overlaps(), 0, "two connections of one shard");
    h.assert_token_kept_secret();
}

/// The counter-test of the per-shard lease: two processes on separate databases (no
/// shared lease) both connect both shards, which the overlap count above catches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_test_without_a_shared_lease_both_processes_connect_each_shard() {
    let mut h = Harness::new().await;
    h.start("a", &[("LULL_DISCORD_SHARDS", "2")]).await;
    let other = format!("sqlite:{}", h.dir.path().join("other.db").display());
    h.start(
        "b",
        &[
            ("LULL_DISCORD_SHARDS", "2"),
            ("DATABASE_URL", other.as_str()),
        ],
    )
    .await;
    h.fake
        .wait_shards(&[(0, 2), (0, 2), (1, 2), (1, 2)], WAIT)
        .await;
    assert!(h.fake.shard_overlaps() >= 2, "{}", h.fake.shard_overlaps());
}

/// `LULL_DISCORD_SHARDS=auto` asks `GET /gateway/bot` for the recommended count and
/// connects that many shards; a guild on the last shard is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_shards_ask_discord_for_the_recommended_count() {
    let mut h = Harness::new().await;
    h.fake.recommend_shards(3);
    let on2 = h.fake.channel_in(ChannelKind::Guild, guild_on_shard(2, 3));
    let lull = h.start("lull", &[("LULL_DISCORD_SHARDS", "auto")]).await;
    h.fake.wait_shards(&[(0, 3), (1, 3), (2, 3)], WAIT).await;
    assert!(h.fake.bot_gateway_calls() >= 1);
    h.fake.say(Say::new(on2, ALICE, "third shard").mention());
    let sent = h.fake.wait_sent(on2, 1, WAIT).await;
    assert_eq!(echoed(&sent[0]), ["user1: third shard"]);
    assert!(
        h.processes[lull]
            .logs()
            .contains("Discord recommends this many shards")
    );
    h.assert_token_kept_secret();
}
