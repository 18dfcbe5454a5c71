//! Guarding the owner's wallet, through the real binary and the fake model: who is
//! admitted (users, chats, admins' run-time decisions), who may reset a group, the
//! rate limit (held messages answered once when the window reopens), token budgets
//! (refused until the next day, across a restart, and never overspent by processes
//! answering at once).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::db;
use crate::support::fakes::openai::{Behavior, FakeOpenAi};
use crate::support::fakes::telegram::{BOT_USERNAME, TelegramFake, mention, text_message};
use crate::support::fakes::webhook::{Received, Webhook};
use crate::support::process::LullProcess;

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// The number a metric series has, 0 when absent.
async fn metric(lull: &LullProcess, series: &str) -> f64 {
    lull.metrics()
        .await
        .and_then(|m| m.get(series).copied())
        .unwrap_or(0.0)
}

// ---------------------------------------------------------------- Telegram: access

/// `lull run` on the Telegram fake, answering with the fake model.
struct Tg {
    dir: tempfile::TempDir,
    fake: TelegramFake,
    model: FakeOpenAi,
    lull: LullProcess,
}

impl Tg {
    async fn start(extra: &[(&str, &str)]) -> Tg {
        let dir = tempfile::tempdir().unwrap();
        let fake = TelegramFake::start().await;
        let model = FakeOpenAi::start().await;
        let mut vars = vec![
            ("LULL_LLM", "openai".to_owned()),
            ("OPENAI_BASE_URL", model.base_url.clone()),
            ("OPENAI_API_KEY", "sk-wallet-test".to_owned()),
            ("OPENAI_MODEL", "fake-model".to_owned()),
            ("LULL_ALLOWED_USERS", String::new()),
            ("LULL_STREAM", "off".to_owned()),
            ("LULL_DEBOUNCE_MS", "200".to_owned()),
            // Budgets about messages, not tools (see `Wallet::start`).
            ("LULL_TOOLS", "off".to_owned()),
        ];
        vars.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        let vars: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let env = crate::telegram::env(dir.path(), &fake, &vars);
        let begun = Instant::now();
        let lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
        fake.wait_for("a poll", SECS(20), |f| {
            f.polls()
                .iter()
                .any(|p| p.started >= begun && p.status != 409)
                .then_some(())
        })
        .await;
        Tg {
            dir,
            fake,
            model,
            lull,
        }
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("lull.db")
    }

    /// The texts sent to `chat`, once `n` arrived.
    async fn texts(&self, chat: i64, n: usize) -> Vec<String> {
        let sent = self.fake.wait_sent(chat, n, SECS(15)).await;
        sent.into_iter().map(|s| s.text).collect()
    }

    /// Nothing more reaches `chat` than the `n` messages it has, over a while longer
    /// than the debounce and a round.
    async fn stays_at(&self, chat: i64, n: usize) {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let sent = self.fake.sent_to(chat);
        assert_eq!(sent.len(), n, "{sent:#?}\n{}", self.lull.logs());
    }
}

/// A user who is not admitted is told their id once per conversation, however much
/// they write, and nothing of theirs reaches the model; an admitted user is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_user_never_reaches_the_model_and_is_told_once() {
    let tg = Tg::start(&[("LULL_ALLOWED_USERS", "telegram:4401")]).await;
    for text in ["hello?", "anyone?", "please"] {
        tg.fake.push_message(text_message(4402, 4402, text));
    }
    tg.fake.push_message(text_message(4401, 4401, "hi"));
    assert_eq!(tg.texts(4401, 1).await, ["[model] hi"]);
    let denied = tg.texts(4402, 1).await;
    assert!(denied[0].contains("telegram:4402"), "{}", denied[0]);
    tg.stays_at(4402, 1).await;
    assert_eq!(tg.model.requests().len(), 1, "only the admitted user's");
    assert!(
        db::messages(&tg.db())
            .iter()
            .all(|m| m.conversation != "4402")
    );
    assert_eq!(
        metric(&tg.lull, "lull_limited_total{reason=\"denied\"}").await,
        3.0
    );
}

/// `LULL_ALLOWED_CHATS` admits every member of a listed group, there only: the same
/// user is refused in another group and in a private chat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_member_admitted_by_chat_is_answered() {
    let tg = Tg::start(&[("LULL_ALLOWED_CHATS", "telegram:-1004410")]).await;
    let (listed, other) = (-100_4410, -100_4420);
    tg.fake.push_message(mention(listed, 4411, "what is lull?"));
    assert_eq!(
        tg.texts(listed, 1).await,
        ["[model] User4411: what is lull?"]
    );
    tg.fake.push_message(mention(other, 4411, "and here?"));
    tg.fake
        .push_message(text_message(4411, 4411, "and privately?"));
    assert!(tg.texts(other, 1).await[0].contains("telegram:4411"));
    assert!(tg.texts(4411, 1).await[0].contains("telegram:4411"));
    tg.stays_at(other, 1).await;
    assert_eq!(tg.model.requests().len(), 1);
}

/// In a group only an admin may `/reset`; anyone resets their private chat. `/usage`
/// shows an admin the group's use and the whole bot's, a member their own. Admins
/// `/allow` and `/deny` users at run time, without a restart; `lull check` shows the
/// decisions, which are kept in the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admins_alone_reset_groups_and_allow_or_deny_at_run_time() {
    let tg = Tg::start(&[
        ("LULL_ADMINS", "telegram:4421"),
        ("LULL_ALLOWED_CHATS", "telegram:-1004430"),
    ])
    .await;
    let group = -100_4430;
    let reset = format!("/reset@{BOT_USERNAME}");
    tg.fake.push_message(text_message(group, 4422, &reset));
    let texts = tg.texts(group, 1).await;
    assert!(texts[0].contains("only the bot's admins"), "{}", texts[0]);
    tg.fake.push_message(text_message(group, 4421, &reset));
    assert!(tg.texts(group, 2).await[1].starts_with("Done"));
    // A member is answered; an admin sees the group's use, a member their own.
    tg.fake.push_message(mention(group, 4422, "hello"));
    assert_eq!(tg.texts(group, 3).await[2], "[model] User4422: hello");
    let usage = format!("/usage@{BOT_USERNAME}");
    tg.fake.push_message(text_message(group, 4421, &usage));
    let texts = tg.texts(group, 4).await;
    assert!(
        texts[3].contains("this group: 27 tokens (no limit)")
            && texts[3].contains("The whole bot: 27 tokens"),
        "{}",
        texts[3]
    );
    tg.fake.push_message(text_message(group, 4422, &usage));
    let texts = tg.texts(group, 5).await;
    assert!(
        texts[4].contains("you: 27 tokens (no limit)") && !texts[4].contains("whole bot"),
        "{}",
        texts[4]
    );

    let (admin, user) = (4421, 4423);
    tg.fake.push_message(text_message(user, user, "hi"));
    assert!(tg.texts(user, 1).await[0].contains("telegram:4423"));
    tg.fake
        .push_message(text_message(admin, admin, "/allow telegram:4423"));
    assert!(tg.texts(admin, 1).await[0].starts_with("Allowed telegram:4423"));
    tg.fake
        .push_message(text_message(user, user, "hello again"));
    assert_eq!(tg.texts(user, 2).await[1], "[model] hello again");
    tg.fake.push_message(text_message(user, user, "/reset"));
    assert!(
        tg.texts(user, 3).await[2].starts_with("Done"),
        "anyone resets their private chat"
    );
    tg.fake
        .push_message(text_message(admin, admin, "/deny telegram:4423"));
    assert!(tg.texts(admin, 2).await[1].starts_with("Denied telegram:4423"));
    tg.fake
        .push_message(text_message(user, user, "still there?"));
    // Refused again; the notice was given in this conversation already.
    tg.stays_at(user, 3).await;
    assert_eq!(tg.model.requests().len(), 2);

    let out = lull_check(&tg.db());
    assert!(
        out.contains("denied telegram:4423 (by telegram:4421)"),
        "{out}"
    );
    assert!(out.contains("admins: telegram:4421"), "{out}");
}

/// `lull check` on the database at `db`, its output.
fn lull_check(db: &Path) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lull"))
        .arg("check")
        .env_clear()
        .env("DATABASE_URL", format!("sqlite:{}", db.display()))
        .env("LULL_LLM", "echo")
        .env("LULL_ADMINS", "telegram:4421")
        .env("LULL_USER_DAILY_TOKENS", "5000")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("tokens per user: 5000 a day")
            && text.contains("a reply takes at most 4000 tokens, less when a budget has less left"),
        "the limits in force: {text}"
    );
    text
}

// ---------------------------------------------------------------- http: limits

/// `lull run` processes with the http adapter on one database, the fake model and one
/// webhook.
struct Wallet {
    dir: tempfile::TempDir,
    webhook: Webhook,
    model: FakeOpenAi,
    client: reqwest::Client,
}

impl Wallet {
    async fn new() -> Wallet {
        Wallet {
            dir: tempfile::tempdir().unwrap(),
            webhook: Webhook::start().await,
            model: FakeOpenAi::start().await,
            client: reqwest::Client::new(),
        }
    }

    async fn start(&self, name: &str, extra: &[(&str, &str)]) -> LullProcess {
        let mut env = vec![
            ("DATABASE_URL", format!("sqlite:{}", self.db().display())),
            ("LULL_WEBHOOK_URL", self.webhook.url.clone()),
            ("OPENAI_BASE_URL", self.model.base_url.clone()),
            ("OPENAI_API_KEY", "sk-wallet-test".into()),
            ("OPENAI_MODEL", "fake-model".into()),
            ("LULL_DEBOUNCE_MS", "200".into()),
            ("LULL_MAX_WAIT_MS", "5000".into()),
            ("LULL_POLL_MS", "200".into()),
            // The budgets' arithmetic here is about messages: no tool definitions in
            // the requests (they are counted: `the_tools_definitions_are_reserved`).
            ("LULL_TOOLS", "off".into()),
            ("RUST_LOG", "debug".into()),
        ];
        env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        let mut lull = LullProcess::start(self.dir.path(), name, &["run"], &env);
        lull.wait_healthy(SECS(20)).await;
        lull
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("lull.db")
    }

    async fn say(&self, lull: &LullProcess, conversation: &str, user: &str, id: &str, text: &str) {
        let r = self
            .client
            .post(format!("{}/api/messages", lull.base_url()))
            .json(&serde_json::json!({
                "conversation": conversation, "user": user, "text": text, "id": id
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
    }

    fn of_kind(&self, kind: &str) -> Vec<Received> {
        self.webhook
            .received()
            .into_iter()
            .filter(|r| r.kind == kind)
            .collect()
    }

    /// Once `n` rows of `kind` arrived, all of them.
    async fn wait(&self, kind: &str, n: usize, limit: Duration) -> Vec<Received> {
        let deadline = Instant::now() + limit;
        loop {
            let rows = self.of_kind(kind);
            if rows.len() >= n {
                return rows;
            }
            assert!(
                Instant::now() < deadline,
                "expected {n} {kind}s within {limit:?}, got {rows:#?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Nothing pending or undelivered, and no duplicate, loss, stale reply or token
    /// regression.
    async fn assert_invariants(&self, replies: usize) {
        let v = db::settled(&self.db(), SECS(20)).await;
        assert_eq!(
            (
                v.replies,
                v.duplicates,
                v.lost,
                v.stale,
                v.token_regressions
            ),
            (replies, 0, 0, 0, 0),
            "{v:?}"
        );
    }

    /// Tokens charged to `scope` on any day.
    fn charged(&self, scope: &str) -> i64 {
        db::count(
            &self.db(),
            &format!("SELECT COALESCE(SUM(tokens), 0) FROM token_usage WHERE scope = '{scope}'"),
        )
    }
}

/// Tokens the fake model reported for its requests (10 per message sent, 7 for the
/// answer).
fn reported(model: &FakeOpenAi) -> i64 {
    model
        .requests()
        .iter()
        .map(|r| 10 * r.body["messages"].as_array().map_or(0, Vec::len) as i64 + 7)
        .sum()
}

/// Over `LULL_RATE_PER_MIN` the messages are stored but not sent to the model; the
/// user is told once when they can continue; when the window reopens they are
/// answered together, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_over_the_rate_limit_is_answered_once_when_the_window_reopens() {
    let w = Wallet::new().await;
    let lull = w
        .start(
            "lull",
            &[
                ("LULL_RATE_PER_MIN", "2"),
                ("LULL_TEST_RATE_WINDOW_MS", "4000"),
            ],
        )
        .await;
    let first = Instant::now();
    w.say(&lull, "c1", "ann", "m1", "one").await;
    w.wait("reply", 1, SECS(10)).await;
    w.say(&lull, "c1", "ann", "m2", "two").await;
    w.wait("reply", 2, SECS(10)).await;
    for (id, text) in [("m3", "three"), ("m4", "four"), ("m5", "five")] {
        w.say(&lull, "c1", "ann", id, text).await;
    }
    let notices = w.wait("notice", 1, SECS(10)).await;
    assert!(
        notices[0].text.contains("2 a minute"),
        "{}",
        notices[0].text
    );
    assert!(
        w.of_kind("reply").len() == 2 && w.model.requests().len() == 2,
        "held messages do not reach the model"
    );
    let replies = w.wait("reply", 3, SECS(15)).await;
    assert!(
        first.elapsed() >= Duration::from_millis(3900),
        "answered when the window reopened, not before"
    );
    assert_eq!(replies[2].covers, ["m3", "m4", "m5"]);
    w.assert_invariants(3).await;
    assert_eq!(w.model.requests().len(), 3);
    assert_eq!(w.of_kind("notice").len(), 1, "told once");
    assert_eq!(
        metric(&lull, "lull_limited_total{reason=\"rate\"}").await,
        3.0
    );
}

/// Over `LULL_USER_DAILY_TOKENS` a user is told once and when the budget resets, and
/// nothing reaches the model until the next day; the budget is in the database, so a
/// restart changes nothing; the next day the held message is answered. `/usage`
/// shows the user their use and limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_over_budget_is_refused_until_the_next_day_even_across_a_restart() {
    let w = Wallet::new().await;
    let limits = [("LULL_USER_DAILY_TOKENS", "120"), ("LULL_MAX_TOKENS", "10")];
    let mut lull = w.start("today", &limits).await;
    // 27 tokens (system + question), then 47 (with the first exchange): 74 used, and
    // the third prompt (about 80 tokens, estimated from above) and a reply of 10 do
    // not fit the 46 left.
    w.say(&lull, "c1", "bob", "m1", "hi").await;
    w.wait("reply", 1, SECS(10)).await;
    w.say(&lull, "c1", "bob", "m2", "more").await;
    w.wait("reply", 2, SECS(10)).await;
    assert_eq!(w.charged("user:http:bob"), 74);
    w.say(&lull, "c1", "bob", "m3", "and more").await;
    let notices = w.wait("notice", 1, SECS(10)).await;
    assert!(
        notices[0]
            .text
            .contains("Not enough left of your tokens for a reply: 74 of 120 used today"),
        "{}",
        notices[0].text
    );
    w.say(&lull, "c1", "bob", "u1", "/usage").await;
    let notices = w.wait("notice", 2, SECS(10)).await;
    assert!(
        notices[1].text.contains("you: 74 of 120 tokens"),
        "{}",
        notices[1].text
    );
    assert_eq!(w.model.requests().len(), 2);
    assert_eq!(
        metric(&lull, "lull_limited_total{reason=\"user_budget\"}").await,
        1.0
    );

    // A restart on the same day: still held, and not told again.
    lull.kill9();
    let mut lull = w.start("restarted", &limits).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(w.model.requests().len(), 2, "{}", lull.logs());
    assert_eq!(w.of_kind("notice").len(), 2);
    assert_eq!(w.of_kind("reply").len(), 2);

    // The next day (a process whose clock is a day ahead): answered.
    lull.kill9();
    let tomorrow = [
        limits[0],
        limits[1],
        ("LULL_TEST_CLOCK_OFFSET_MS", "86400000"),
    ];
    let lull = w.start("tomorrow", &tomorrow).await;
    let replies = w.wait("reply", 3, SECS(15)).await;
    assert_eq!(replies[2].covers, ["m3"]);
    w.assert_invariants(3).await;
    assert_eq!(w.model.requests().len(), 3);
    assert_eq!(w.charged("user:http:bob"), reported(&w.model));
    drop(lull);
}

/// Two processes answering many conversations at once (a slow model, so their
/// generations overlap) never spend past `LULL_DAILY_TOKENS` together: each reply
/// reserves its most before the model is asked, under its lease, in one transaction
/// with the check. Every token the model reported is charged, none twice; the
/// conversations over budget are told and held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_processes_do_not_overspend() {
    let w = Wallet::new().await;
    w.model.fallback(Behavior::Slow(Duration::from_millis(400)));
    let limits = [("LULL_DAILY_TOKENS", "300"), ("LULL_MAX_TOKENS", "40")];
    let a = w.start("a", &limits).await;
    let b = w.start("b", &limits).await;
    for n in 0..12 {
        let lull = if n % 2 == 0 { &a } else { &b };
        let id = format!("m{n}");
        w.say(lull, &format!("c{n}"), &format!("user{n}"), &id, "hi")
            .await;
    }
    // Each reply costs 27 tokens and reserves about 90 (the system prompt, the
    // question, a reply of 40): at most eleven would fit 300 one after the other, and
    // at most eight once the reservation of the one in flight is counted.
    let deadline = Instant::now() + SECS(20);
    while w.of_kind("reply").len() + w.of_kind("notice").len() < 12 {
        assert!(
            Instant::now() < deadline,
            "replies {:?}, notices {:?}\n{}\n{}",
            w.of_kind("reply").len(),
            w.of_kind("notice").len(),
            a.logs(),
            b.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let spent = reported(&w.model);
    let replies = w.of_kind("reply").len();
    assert!(
        spent <= 300 && (3..=8).contains(&replies),
        "the model was asked for {spent} tokens in {replies} replies"
    );
    assert_eq!(
        w.charged("bot"),
        spent,
        "every reported token is charged once"
    );
    for notice in w.of_kind("notice") {
        assert!(
            notice
                .text
                .contains("Not enough left of this bot's tokens for a reply")
                && notice.text.contains("of 300 used today"),
            "{}",
            notice.text
        );
    }
    assert_eq!(
        db::count(&w.db(), "SELECT COUNT(*) FROM timers"),
        (12 - replies) as i64,
        "the rest are held for tomorrow"
    );
}

// ---------------------------------------------------------------- budgets that never trap

/// The first answer to reach the webhook, reply or notice.
async fn first_answer(w: &Wallet, lull: &LullProcess) -> Received {
    let deadline = Instant::now() + SECS(15);
    loop {
        if let Some(first) = w.webhook.received().into_iter().next() {
            return first;
        }
        assert!(
            Instant::now() < deadline,
            "no answer within 15 s\n{}",
            lull.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The `max_tokens` of model request `n`.
fn max_tokens(model: &FakeOpenAi, n: usize) -> u64 {
    model.requests()[n].body["max_tokens"]
        .as_u64()
        .expect("max_tokens is set")
}

/// A budget smaller than `LULL_MAX_TOKENS` (4096 by default) answers: the reply's
/// `max_tokens` is capped to what the budget has left, instead of a reservation of
/// 4096 that can never fit holding the messages day after day.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_below_max_tokens_still_answers_with_the_defaults() {
    let w = Wallet::new().await;
    let lull = w.start("lull", &[("LULL_USER_DAILY_TOKENS", "2000")]).await;
    w.say(&lull, "c1", "ann", "m1", "hi").await;
    let first = first_answer(&w, &lull).await;
    eprintln!("the user saw ({}): {}", first.kind, first.text);
    assert_eq!(
        (first.kind.as_str(), first.text.as_str()),
        ("reply", "[model] hi"),
        "the user saw: {first:?}"
    );
    let cap = max_tokens(&w.model, 0);
    assert!(
        (1000..2000).contains(&cap),
        "the reply may take what is left after the prompt, got max_tokens {cap}"
    );
    w.say(&lull, "c1", "ann", "m2", "and again").await;
    let replies = w.wait("reply", 2, SECS(10)).await;
    assert_eq!(replies[1].text, "[model] and again");
    w.say(&lull, "c1", "ann", "u1", "/usage").await;
    let notices = w.wait("notice", 1, SECS(10)).await;
    assert!(
        notices[0].text.contains("you: 74 of 2000 tokens"),
        "{}",
        notices[0].text
    );
    w.assert_invariants(2).await;
}

/// A model that reports more than was reserved is charged what it reported (nothing
/// is hidden), its reply was bounded by the `max_tokens` cap, and the next message is
/// refused with a notice that says what is true.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_reporting_more_than_reserved_is_charged_and_the_next_message_told_the_truth() {
    let w = Wallet::new().await;
    w.model.script([Behavior::Usage {
        prompt: 9000,
        completion: 500,
    }]);
    let lull = w.start("lull", &[("LULL_USER_DAILY_TOKENS", "6000")]).await;
    w.say(&lull, "c1", "bob", "m1", "hi").await;
    let first = first_answer(&w, &lull).await;
    assert_eq!(first.kind, "reply", "{first:?}");
    let cap = max_tokens(&w.model, 0);
    assert!(
        cap <= 4096,
        "the reply is bounded by LULL_MAX_TOKENS and what the budget had left: {cap}"
    );
    w.say(&lull, "c1", "bob", "m2", "more?").await;
    let notices = w.wait("notice", 1, SECS(10)).await;
    eprintln!("the user saw: {first:?}, then: {}", notices[0].text);
    assert!(
        notices[0]
            .text
            .contains("Not enough left of your tokens for a reply: 9500 of 6000 used today"),
        "the user saw: {}",
        notices[0].text
    );
    assert_eq!(w.charged("user:http:bob"), 9500, "what was reported");
    assert_eq!(w.model.requests().len(), 1, "the next message is refused");
    assert!(
        lull.logs()
            .contains("the model reported more tokens than were reserved"),
        "an overspend is not silent"
    );
}

/// In a group, one member over budget is told (once, by the notice that answers
/// their messages) and left out, while the rest of the group is answered; the group
/// goes on being answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_member_over_budget_is_told_and_left_out_while_the_group_is_answered() {
    let tg = Tg::start(&[
        ("LULL_ALLOWED_USERS", "*"),
        ("LULL_USER_DAILY_TOKENS", "300"),
        ("LULL_MAX_TOKENS", "10"),
    ])
    .await;
    let (group, ann, ben) = (-100_4450, 4451, 4452);
    // Ann spends 295 of her 300 tokens in her private chat.
    tg.model.script([Behavior::Usage {
        prompt: 290,
        completion: 5,
    }]);
    tg.fake.push_message(text_message(ann, ann, "hi"));
    assert_eq!(tg.texts(ann, 1).await, ["[model] hi"]);
    // Then both write in the group, in one burst.
    tg.fake.push_message(mention(group, ann, "what about me?"));
    tg.fake.push_message(mention(group, ben, "what is lull?"));
    let texts = tg.texts(group, 2).await;
    eprintln!("the group saw: {texts:#?}");
    assert!(
        texts.contains(&"[model] User4452: what is lull?".to_owned()),
        "Ben is answered; the group saw {texts:#?}"
    );
    assert!(
        texts.iter().any(|t| t.starts_with(
            "User4451: not enough left of your tokens for a reply: 295 of 300 used today"
        )),
        "Ann is told; the group saw {texts:#?}"
    );
    let turn = tg.model.messages(1).last().unwrap().1.clone();
    assert!(
        !turn.contains("what about me"),
        "Ann's message is left out: {turn}"
    );
    tg.stays_at(group, 2).await;
    // The group is not held: Ben is answered again at once.
    tg.fake.push_message(mention(group, ben, "and more?"));
    assert_eq!(tg.texts(group, 3).await[2], "[model] User4452: and more?");
    // Ann alone, still over: told, and nobody waits for her budget.
    tg.fake.push_message(mention(group, ann, "hello?"));
    let told = tg.texts(group, 4).await[3].clone();
    assert!(
        told.starts_with("User4451: not enough left of your tokens for a reply")
            && told.contains("so I can't answer this"),
        "{told}"
    );
    tg.fake.push_message(mention(group, ben, "still there?"));
    assert_eq!(
        tg.texts(group, 5).await[4],
        "[model] User4452: still there?"
    );
    assert_eq!(
        tg.model.requests().len(),
        4,
        "Ann's messages never reach the model"
    );
    let v = db::settled(&tg.db(), SECS(10)).await;
    assert_eq!(
        (v.duplicates, v.lost, v.stale, v.token_regressions),
        (0, 0, 0, 0),
        "{v:?}"
    );
}

// ---------------------------------------------------------------- a settle after midnight

/// A clock a test moves by hand (time is a source of non-determinism).
struct HandClock(std::sync::atomic::AtomicI64);

impl lull_core::clock::Clock for HandClock {
    fn now(&self) -> lull_core::domain::Timestamp {
        lull_core::domain::Timestamp(self.0.load(std::sync::atomic::Ordering::SeqCst))
    }
}

/// A model whose answer arrives two seconds later by the clock: past midnight.
struct PastMidnight(std::sync::Arc<HandClock>);

#[async_trait::async_trait]
impl lull_core::llm::Responder for PastMidnight {
    fn name(&self) -> &'static str {
        "past-midnight"
    }

    async fn respond(
        &self,
        _prompt: &lull_core::llm::Prompt,
        _partial: &lull_core::llm::Partial,
    ) -> Result<lull_core::llm::Generation, lull_core::llm::LlmError> {
        self.0
            .0
            .fetch_add(2000, std::sync::atomic::Ordering::SeqCst);
        Ok(lull_core::llm::Generation {
            text: "late".into(),
            usage: Some(lull_core::domain::TokenUsage {
                prompt: 30,
                completion: 5,
                cached: 0,
            }),
            tool_calls: Vec::new(),
        })
    }
}

/// A round that reserves before midnight and settles after it charges the day it
/// reserved on: what the model reported lands there, and the next day starts at 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settle_after_midnight_lands_on_the_day_of_the_reservation() {
    use crate::helpers;
    use lull_core::limits::{Limits, TimeZone};
    use lull_core::store::prelude::*;
    let db = helpers::temp_db();
    let now = lull_core::clock::Clock::now(&lull_core::clock::SystemClock).0;
    let midnight = TimeZone::utc()
        .next_day(lull_core::domain::Timestamp(now))
        .0;
    let clock = std::sync::Arc::new(HandClock(std::sync::atomic::AtomicI64::new(
        midnight - 1000,
    )));
    let mut settings = helpers::settings(20, 1000, 30_000);
    settings.limits = Limits {
        user_daily_tokens: 10_000,
        reply_tokens: 500,
        ..Limits::default()
    };
    let store = std::sync::Arc::new(
        lull_core::store::SqliteStore::open(&db.path, settings.timers).unwrap(),
    );
    let outbound = helpers::RecordingOutbound::new(lull_core::domain::Platform::Http);
    let dispatcher = lull_core::dispatcher::Dispatcher::builder(
        store.clone(),
        std::sync::Arc::new(PastMidnight(clock.clone())),
        settings,
        clock.clone(),
    )
    .outbounds(vec![
        outbound.clone() as std::sync::Arc<dyn lull_port::Outbound>
    ])
    .build();
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(dispatcher.clone().run(stop.clone()));
    dispatcher
        .ingest(helpers::message("c1", "m1", "hi"))
        .await
        .unwrap();
    // The debounce passes on the hand clock.
    clock.0.fetch_add(100, std::sync::atomic::Ordering::SeqCst);
    outbound.wait_replies(1, SECS(10)).await;
    stop.cancel();
    let day = |at: i64| TimeZone::utc().day(lull_core::domain::Timestamp(at));
    let scopes = ["user:http:user".to_owned()];
    let before = store
        .token_usage(&day(midnight - 1), &scopes)
        .await
        .unwrap();
    let after = store.token_usage(&day(midnight), &scopes).await.unwrap();
    assert_eq!(
        (before[0].tokens, after[0].tokens),
        (35, 0),
        "reported usage on the reservation's day ({}), nothing on the next",
        day(midnight - 1)
    );
}

// ---------------------------------------------------------------- an abandoned reservation

/// Every reservation expires: a holder that crashes mid-generation leaves its
/// reservation in the database, and the process that takes the conversation over
/// gives it back when it claims, so the user is charged only for the reply that was
/// delivered.
async fn a_crashed_round_gives_its_reservation_back_at_the_next_claim(
    backend: crate::helpers::Backend,
) {
    use crate::helpers::{self, CountingEcho, GatedResponder, Leases, Node, TestDb};
    use lull_core::limits::{Limits, TimeZone};
    let Some(db) = TestDb::new(backend) else {
        return;
    };
    let mut settings = helpers::settings(100, 3000, 1500);
    // The reservation's arithmetic is the round's alone: no tools offered.
    settings.builtin_tools = false;
    settings.limits = Limits {
        user_daily_tokens: 100_000,
        reply_tokens: 500,
        ..Limits::default()
    };
    let (stuck, mut started) = GatedResponder::new();
    let a = Node::on(&db, settings.clone(), stuck.clone(), Leases::Enforced).await;
    a.send("c1", "m1", "hi").await;
    assert_eq!(
        started.recv().await,
        Some(1),
        "a reserved and asks the model"
    );
    let today = TimeZone::utc().day(lull_core::clock::Clock::now(&lull_core::clock::SystemClock));
    let scopes = [
        "user:http:user".to_owned(),
        "conversation:http:c1".to_owned(),
    ];
    let reserved = a
        .dispatcher
        .store()
        .token_usage(&today, &scopes)
        .await
        .unwrap();
    assert!(
        reserved[0].tokens >= 500,
        "the reply's most is reserved: {reserved:?}"
    );
    a.crash();

    let b = Node::on(&db, settings, CountingEcho::new(0), Leases::Enforced).await;
    b.outbound.wait_replies(1, SECS(15)).await;
    crate::dispatcher::wait_settled(&b, "c1").await;
    let used = b
        .dispatcher
        .store()
        .token_usage(&today, &scopes)
        .await
        .unwrap();
    eprintln!("reserved by the crashed round: {reserved:?}; charged in the end: {used:?}");
    assert!(
        used[0].tokens < 100 && used[0] == used[1],
        "only the delivered reply is charged, not the crashed round's reservation too: {used:?}"
    );
}

crate::on_both_backends!(
    a_crashed_round_gives_its_reservation_back,
    crate::limits::a_crashed_round_gives_its_reservation_back_at_the_next_claim
);

/// With `LULL_DAILY_TOKENS` set, `/metrics` reports what the whole bot spent today
/// and the budget (`lull_daily_tokens_used`, `lull_daily_tokens_limit`: the alert
/// `LullBudgetNearlySpent` divides them), read from the store, so two replicas report
/// the same number; without it neither series exists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daily_budget_is_reported_to_metrics_from_the_store() {
    let w = Wallet::new().await;
    let a = w.start("a", &[("LULL_DAILY_TOKENS", "5000")]).await;
    let b = w.start("b", &[("LULL_DAILY_TOKENS", "5000")]).await;
    w.say(&a, "c1", "ann", "m1", "hi").await;
    w.wait("reply", 1, SECS(15)).await;
    let spent = reported(&w.model) as f64;
    assert!(spent > 0.0);
    for lull in [&a, &b] {
        assert_eq!(
            metric(lull, "lull_daily_tokens_used").await,
            spent,
            "{}",
            lull.name
        );
        assert_eq!(metric(lull, "lull_daily_tokens_limit").await, 5000.0);
    }
    let unlimited = Wallet::new().await;
    let c = unlimited.start("c", &[]).await;
    let metrics = c.metrics().await.unwrap();
    assert!(
        !metrics.contains_key("lull_daily_tokens_used")
            && !metrics.contains_key("lull_daily_tokens_limit")
    );
}

/// The tools' definitions go with every request that offers them, so the reservation
/// counts them: a budget that holds a short question without tools (`LULL_TOOLS=off`)
/// does not hold it with lull's own tools offered, and the person is told, with no
/// model request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tools_definitions_are_reserved() {
    let w = Wallet::new().await;
    let limits = [
        ("LULL_USER_DAILY_TOKENS", "200"),
        ("LULL_MAX_TOKENS", "10"),
        ("LULL_TOOLS", "auto"),
    ];
    let lull = w.start("tools", &limits).await;
    w.say(&lull, "c1", "bob", "m1", "hi").await;
    let notices = w.wait("notice", 1, SECS(10)).await;
    assert!(
        notices[0].text.contains("Not enough left of your tokens"),
        "{}",
        notices[0].text
    );
    assert_eq!(w.model.requests().len(), 0, "nothing reached the model");
    drop(lull);
    let without = w.start("no-tools", &[limits[0], limits[1]]).await;
    w.say(&without, "c2", "ann", "m1", "hi").await;
    w.wait("reply", 1, SECS(10)).await;
    assert!(
        w.model.requests()[0]
            .body
            .get("tools")
            .is_none_or(|t| t.is_null())
    );
}
