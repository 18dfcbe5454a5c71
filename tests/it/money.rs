//! Costs in money (issue 43), through the real binary, the http adapter and the fake
//! model (which reports usage, cached prompt tokens included): costs follow the
//! reported usage at `LULL_PRICES`, the chat's model switched with `/model` mid-day
//! included, checked against a computation of their own on SQLite and PostgreSQL; a
//! person's dollar budget holds across two processes answering their chats at once
//! (overspent by no more than one reservation), with the peers' "check, then bill"
//! (`LULL_TEST_UNRESERVED_DOLLARS`) as its counter-test; a free model is never held;
//! `lull check` names an unpriced model and refuses a malformed price list.

use std::time::Duration;

use serde_json::json;

use crate::support::db;
use crate::support::fakes::openai::Behavior;
use crate::support::http_bot::HttpBot;
use crate::support::process::LullProcess;

const SECS: fn(u64) -> Duration = Duration::from_secs;
/// Dollars per million tokens: input, output, cached input.
const SMALL: (f64, f64, f64) = (2.0, 8.0, 0.5);
const BIG: (f64, f64) = (20.0, 80.0);
const PRICES: &str = "small=2/8/0.5,big=20/80";

/// What the fake model reports for every call.
const PROMPT: u64 = 1000;
const COMPLETION: u64 = 200;
const CACHED: u64 = 400;

async fn start(bot: &HttpBot, name: &str, extra: &[(&str, &str)]) -> LullProcess {
    let mut env = vec![
        ("OPENAI_MODEL", "small"),
        ("LULL_MODELS", "small,big"),
        ("LULL_PRICES", PRICES),
        ("LULL_SUMMARY", "off"),
        ("LULL_TOOLS", "off"),
        ("LULL_LLM_RETRIES", "0"),
        ("LULL_DEBOUNCE_MS", "100"),
    ];
    env.extend_from_slice(extra);
    bot.start(name, &env).await
}

/// Message ids, unique in the test binary.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Post `text` as `user` in `conversation` to `lull`.
async fn say(bot: &HttpBot, lull: &LullProcess, conversation: &str, user: &str, text: &str) {
    let r = bot
        .client
        .post(format!("{}/api/messages", lull.base_url()))
        .json(&json!({ "conversation": conversation, "user": user, "text": text,
                       "id": format!("m{}", NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::SeqCst)) }))
        .timeout(SECS(10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
}

/// Wait until `n` things (replies or notices) reached `conversation`.
async fn wait_received(bot: &HttpBot, conversation: &str, n: usize) -> Vec<String> {
    let deadline = std::time::Instant::now() + SECS(30);
    loop {
        let got: Vec<String> = bot
            .webhook
            .received()
            .into_iter()
            .filter(|r| r.conversation == conversation)
            .map(|r| r.text)
            .collect();
        if got.len() >= n {
            return got;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{conversation}: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A scope's dollars in the database, nano-dollars, all days together.
fn cost_of(bot: &HttpBot, scope: &str) -> u64 {
    let rows = db::rows(
        &bot.database,
        &format!("SELECT COALESCE(SUM(cost), 0) FROM token_usage WHERE scope = '{scope}'"),
    );
    rows[0][0].parse().unwrap()
}

/// Costs follow the usage the server reported at the chat's model's price: a call
/// with `small` (cached prompt tokens at their own price), `/model big`, a call with
/// `big` (no cached price: cached tokens at the input price). The store's dollars of
/// the person, the chat and the bot's month, `/usage`, the status API and
/// `lull_cost_usd_total{model}` all match an independent computation.
async fn costs_follow_usage(postgres: Option<String>) {
    let bot = HttpBot::new(postgres).await;
    bot.model.fallback(Behavior::Billed {
        prompt: PROMPT,
        completion: COMPLETION,
        cached: CACHED,
        delay: Duration::ZERO,
    });
    let lull = start(&bot, "money", &[]).await;
    say(&bot, &lull, "c1", "ann", "one").await;
    wait_received(&bot, "c1", 1).await;
    say(&bot, &lull, "c1", "ann", "/model big").await;
    wait_received(&bot, "c1", 2).await;
    say(&bot, &lull, "c1", "ann", "two").await;
    wait_received(&bot, "c1", 3).await;
    let models: Vec<String> = bot
        .model
        .requests()
        .iter()
        .map(|r| r.body["model"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(models, ["small", "big"], "the switch reached the model");

    // The independent computation, in dollars.
    let per_m = |tokens: u64, price: f64| tokens as f64 * price / 1e6;
    let small =
        per_m(PROMPT - CACHED, SMALL.0) + per_m(CACHED, SMALL.2) + per_m(COMPLETION, SMALL.1);
    let big = per_m(PROMPT, BIG.0) + per_m(COMPLETION, BIG.1);
    let nanos = |usd: f64| (usd * 1e9).round() as u64;
    eprintln!(
        "small call ${small}, big call ${big}, together ${}",
        small + big
    );
    for scope in ["user:http:ann", "bot", "month:bot"] {
        assert_eq!(cost_of(&bot, scope), nanos(small + big), "{scope}");
    }
    let chat = db::rows(
        &bot.database,
        "SELECT cost FROM token_usage WHERE scope LIKE 'conversation:%'",
    );
    assert_eq!(chat[0][0].parse::<u64>().unwrap(), nanos(small + big));

    let metrics = lull.metrics().await.unwrap();
    let metric = |model: &str| metrics[&format!("lull_cost_usd_total{{model=\"{model}\"}}")];
    assert!((metric("small") - small).abs() < 1e-9, "{metrics:?}");
    assert!((metric("big") - big).abs() < 1e-9, "{metrics:?}");

    say(&bot, &lull, "c1", "ann", "/usage").await;
    let usage = wait_received(&bot, "c1", 4).await.pop().unwrap();
    eprintln!("/usage: {usage}");
    assert!(
        usage.contains("you: 2400 tokens (no limit), $0.039 (no limit)"),
        "{usage}"
    );

    let status: serde_json::Value = bot
        .client
        .get(format!("{}/api/status", lull.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let today = status["store"]["tokens_per_day"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(
        (today["cost"].as_f64().unwrap() - (small + big)).abs() < 1e-9,
        "{today}"
    );
    assert!((status["store"]["month_cost"].as_f64().unwrap() - (small + big)).abs() < 1e-9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costs_follow_the_reported_usage_and_the_chats_model() {
    costs_follow_usage(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_costs_follow_the_reported_usage_and_the_chats_model() {
    let Some(database) = crate::support::postgres::fresh_database() else {
        return;
    };
    costs_follow_usage(Some(database)).await;
}

/// What one person's chats answered at once over two processes spent.
#[derive(Debug)]
struct Overspend {
    budget: u64,
    spent: u64,
    reservation: u64,
    answered: usize,
    held: usize,
}

/// Call cost at `small` for the usage the race's model reports (20 prompt tokens, 150
/// completion, none cached): 20 × $2 + 150 × $8 per million.
const RACE_CALL: u64 = 1_240_000;
/// `LULL_USER_DAILY_USD` in the race: four calls' worth.
const RACE_BUDGET: &str = "0.005";
const CHATS: usize = 12;

/// One person writes in twelve chats at once, six to each of two processes; the model
/// takes half a second. Every chat is answered or told the budget is spent, once.
async fn race(postgres: Option<String>, extra: &[(&str, &str)]) -> Race {
    let bot = HttpBot::new(postgres).await;
    bot.model.fallback(Behavior::Billed {
        prompt: 20,
        completion: 150,
        cached: 0,
        delay: Duration::from_millis(500),
    });
    let mut env = vec![
        ("LULL_USER_DAILY_USD", RACE_BUDGET),
        ("LULL_MAX_TOKENS", "200"),
        ("LULL_SYSTEM_PROMPT", "Be brief."),
    ];
    env.extend_from_slice(extra);
    let a = start(&bot, "a", &env).await;
    let b = start(&bot, "b", &env).await;
    let chats: Vec<String> = (0..CHATS).map(|n| format!("c{n:02}")).collect();
    futures_util::future::join_all(chats.iter().enumerate().map(|(n, chat)| {
        let lull = if n % 2 == 0 { &a } else { &b };
        say(&bot, lull, chat, "ann", "hello there")
    }))
    .await;
    let mut answered = 0;
    let mut held = 0;
    for chat in &chats {
        let got = wait_received(&bot, chat, 1).await;
        if got[0].starts_with("[model]") {
            answered += 1;
        } else {
            assert!(got[0].contains("daily dollar budget"), "{got:?}");
            held += 1;
        }
    }
    // Nothing more comes: each chat was answered or told once (a round crowded out by
    // others' reservations waits a moment and tries again, telling nobody).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    for chat in &chats {
        let got = wait_received(&bot, chat, 1).await;
        assert_eq!(got.len(), 1, "{chat}: {got:?}");
    }
    if let Some(told) = bot
        .webhook
        .received()
        .iter()
        .find(|r| !r.text.starts_with("[model]"))
    {
        eprintln!("told: {}", told.text);
    }
    // The worst case a round reserved: the prompt as estimated and the reply's most.
    let reserved = db::rows(&bot.database, "SELECT COUNT(*) FROM token_reservations");
    assert_eq!(reserved[0][0], "0", "every reservation settled");
    let overspend = Overspend {
        budget: 5_000_000,
        spent: cost_of(&bot, "user:http:ann"),
        // 200 reply tokens at $8 and a prompt under 60 tokens at $2, per million.
        reservation: 200 * 8_000 + 60 * 2_000,
        answered,
        held,
    };
    eprintln!("{overspend:?}");
    assert_eq!(overspend.spent, answered as u64 * RACE_CALL);
    Race {
        overspend,
        bot,
        _lulls: [a, b],
    }
}

/// A race run, its harness kept for what a test asks next.
struct Race {
    overspend: Overspend,
    bot: HttpBot,
    _lulls: [LullProcess; 2],
}

/// The dollar budget holds across two processes: spent never passes it by more than
/// one reservation, the chats past it are told once, and a message after it is spent
/// gets the notice and no model request.
async fn budget_holds(postgres: Option<String>) {
    let race = race(postgres, &[]).await;
    let o = &race.overspend;
    assert!(
        o.spent <= o.budget + o.reservation,
        "overspent by more than one reservation: {o:?}"
    );
    assert!(o.answered >= 1 && o.held >= 1, "{o:?}");
    // Messages in new chats, one at a time, spend what is left (each reply capped to
    // it) until one is told the budget is spent; then the next is told too, and the
    // model is not asked.
    let bot = &race.bot;
    let lull = &race._lulls[0];
    let mut n = 0;
    loop {
        n += 1;
        let chat = format!("d{n:02}");
        say(bot, lull, &chat, "ann", "one more").await;
        if !wait_received(bot, &chat, 1).await[0].starts_with("[model]") {
            break;
        }
        assert!(n < 10, "the budget never ran out");
    }
    let asked = bot.model.requests().len();
    say(bot, lull, "e01", "ann", "still there?").await;
    let told = wait_received(bot, "e01", 1).await;
    assert!(told[0].contains("daily dollar budget"), "{told:?}");
    assert_eq!(
        bot.model.requests().len(),
        asked,
        "no model request once spent"
    );
    let spent = cost_of(bot, "user:http:ann");
    eprintln!("spent in the end: {spent} of {} nano-dollars", o.budget);
    assert!(spent <= o.budget + o.reservation, "{spent}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dollar_budget_holds_across_two_processes() {
    budget_holds(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_dollar_budget_holds_across_two_processes() {
    let Some(database) = crate::support::postgres::fresh_database() else {
        return;
    };
    budget_holds(Some(database)).await;
}

/// Counter-test: the peers' "check, then bill" lets the chats answered at once spend
/// past the budget by several calls, and the check above catches it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_test_checking_without_reserving_overspends() {
    let race = race(None, &[("LULL_TEST_UNRESERVED_DOLLARS", "1")]).await;
    let o = &race.overspend;
    assert!(
        o.spent > o.budget + o.reservation,
        "the unreserved check should overspend: {o:?}"
    );
}

/// A model priced 0/0 (a local one) is counted, costs nothing and is never held by
/// a dollar budget, however small.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_model_costs_nothing_and_is_never_held() {
    let bot = HttpBot::new(None).await;
    let lull = start(
        &bot,
        "free",
        &[
            ("LULL_PRICES", "small=0/0,big=0/0"),
            ("LULL_USER_DAILY_USD", "0.000001"),
        ],
    )
    .await;
    for n in 1..=3 {
        say(&bot, &lull, "c1", "ann", &format!("message {n}")).await;
        let got = wait_received(&bot, "c1", n).await;
        assert!(got[n - 1].starts_with("[model]"), "{got:?}");
    }
    assert_eq!(cost_of(&bot, "user:http:ann"), 0);
    let tokens = db::rows(
        &bot.database,
        "SELECT SUM(tokens) FROM token_usage WHERE scope = 'user:http:ann'",
    );
    assert!(
        tokens[0][0].parse::<u64>().unwrap() > 0,
        "still counted in tokens"
    );
}

/// `lull check` shows the price list and warns of a model lull may ask that has no
/// price (its calls count as $0, so the dollar budget cannot bound them); a malformed
/// entry refuses, naming the variable, the entry and the expected form.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_an_unpriced_model_and_refuses_a_malformed_price_list() {
    let dir = tempfile::tempdir().unwrap();
    let model = crate::support::fakes::openai::FakeOpenAi::start().await;
    let webhook = crate::support::fakes::webhook::Webhook::start().await;
    let env = |prices: &str| {
        vec![
            (
                "DATABASE_URL",
                format!("sqlite:{}", dir.path().join("lull.db").display()),
            ),
            ("OPENAI_BASE_URL", model.base_url.clone()),
            ("OPENAI_API_KEY", "sk-money-check".into()),
            ("OPENAI_MODEL", "fake-model".into()),
            ("LULL_MODELS", "fake-model,big".into()),
            ("LULL_WEBHOOK_URL", webhook.url.clone()),
            ("LULL_DAILY_USD", "1".into()),
            ("LULL_PRICES", prices.into()),
        ]
    };
    let (code, report) =
        crate::check::lull_check(env("fake-model=0.15/0.6,whisper-1=0.006/min")).await;
    eprintln!("{report}");
    assert_eq!(code, Some(0), "a warning is not a failure:\n{report}");
    assert!(
        report.contains("ok    prices        fake-model $0.15/$0.6 per million tokens in/out; whisper-1 $0.006 per minute of audio"),
        "{report}"
    );
    assert!(
        report.contains("warn  prices        LULL_PRICES has no price for big (LULL_MODELS): its calls count as $0, so LULL_DAILY_USD cannot bound them"),
        "{report}"
    );
    let (code, report) = crate::check::lull_check(env("fake-model=0.15")).await;
    eprintln!("{report}");
    assert_ne!(code, Some(0), "{report}");
    assert!(
        report.contains("LULL_PRICES: \"fake-model=0.15\" is not a price"),
        "{report}"
    );
}

/// A summary is priced at `LULL_SUMMARY_MODEL`, a reply at the chat's model: with
/// both priced apart, the bot's month is every chat call's cost at one price and every
/// summary call's at the other, to the nano-dollar (the summary's worst case charged
/// first, then settled to what was reported).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_is_priced_at_the_summary_model() {
    let bot = HttpBot::new(None).await;
    let billed = |prompt, completion| Behavior::Billed {
        prompt,
        completion,
        cached: 0,
        delay: Duration::ZERO,
    };
    bot.model.fallback(billed(300, 20));
    bot.model.route_model("summarizer", billed(900, 100));
    let lull = start(
        &bot,
        "summaries",
        &[
            ("LULL_SUMMARY", "on"),
            ("LULL_SUMMARY_MODEL", "summarizer"),
            ("LULL_HISTORY_MESSAGES", "2"),
            ("LULL_PRICES", "small=1/4,summarizer=3/9"),
        ],
    )
    .await;
    for n in 1..=6 {
        say(&bot, &lull, "c1", "ann", &format!("fact number {n}")).await;
        wait_received(&bot, "c1", n).await;
    }
    // In nano-dollars: $1/$4 per million for the chat model, $3/$9 for the summariser.
    let expected_of = |chats: u64, summaries: u64| {
        chats * (300 * 1_000 + 20 * 4_000) + summaries * (900 * 3_000 + 100 * 9_000)
    };
    // Every summary asked for has its outcome counted, and no later one is under way
    // (its worst case charged before its request): the books are settled.
    let deadline = std::time::Instant::now() + SECS(20);
    let (chats, summaries) = loop {
        let asked = bot.model.requests_for("summarizer").len();
        let counted: f64 = lull
            .metrics()
            .await
            .unwrap_or_default()
            .iter()
            .filter(|(k, _)| k.starts_with("lull_summaries_total{"))
            .map(|(_, v)| v)
            .sum();
        let summaries = asked as u64;
        let chats = bot.model.requests().len() as u64 - summaries;
        let settled = cost_of(&bot, "month:bot") == expected_of(chats, summaries);
        if asked > 0 && counted as usize >= asked && settled {
            break (chats, summaries);
        }
        if std::time::Instant::now() > deadline {
            break (chats, summaries);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(summaries > 0, "no summary settled");
    let expected = expected_of(chats, summaries);
    eprintln!("{chats} chat calls, {summaries} summaries: {expected} nano-dollars");
    assert_eq!(cost_of(&bot, "month:bot"), expected);
    let metrics = lull.metrics().await.unwrap();
    let summarizer = metrics["lull_cost_usd_total{model=\"summarizer\"}"];
    assert!(
        (summarizer - summaries as f64 * 0.0036).abs() < 1e-12,
        "{summarizer}"
    );
}
