//! The status page of a real `lull run`: a scripted run (three conversations, a burst in
//! one, a reply dropped as stale, a model failure), then `GET /` loaded in headless
//! Chromium and its numbers checked against what the run did and what the database
//! holds, with a screenshot saved; `GET /api/status` checked the same way; and the
//! access rules (open on loopback; off loopback: 403 without `LULL_HTTP_TOKEN`, else the
//! bearer token or the login form's cookie).
//!
//! Chromium (`/usr/bin/chromium`, or `chromium` on `PATH`) missing: the browser part
//! prints one line and is skipped, unless `LULL_REQUIRE_CHROMIUM=1` (CI), where it
//! fails. `LULL_SCREENSHOT_DIR` set: the screenshot is copied there too.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::fakes::openai::{Behavior, FakeOpenAi};
use crate::support::fakes::telegram::TelegramFake;
use crate::support::fakes::webhook::Webhook;
use crate::support::process::{LullProcess, free_port, post_message};

const TOKEN: &str = "status-page-test-token";

/// The Chromium binary, if installed; `None` prints the skip line (and panics when
/// `LULL_REQUIRE_CHROMIUM=1`).
pub(crate) fn chromium() -> Option<PathBuf> {
    let found = std::iter::once(PathBuf::from("/usr/bin/chromium"))
        .chain(
            std::env::var_os("PATH")
                .map(|path| {
                    std::env::split_paths(&path)
                        .map(|dir| dir.join("chromium"))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default(),
        )
        .find(|path| path.is_file());
    if found.is_none() {
        assert!(
            !std::env::var("LULL_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1"),
            "LULL_REQUIRE_CHROMIUM=1 but no chromium was found (apt-get install chromium)"
        );
        crate::support::skip::skipped(
            "the status page's browser check",
            "needs chromium (apt-get install chromium)",
        );
    }
    found
}

/// Run headless Chromium on `url` with `args` and a fresh profile; its stdout.
fn run_chromium(chromium: &Path, profile: &Path, args: &[String], url: &str) -> String {
    let mut child = std::process::Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start chromium");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if child.try_wait().expect("waiting for chromium").is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not finish within 90 s on {url}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    out
}

/// The `data-value` of the element with `id` in `dom`.
fn value_of(dom: &str, id: &str) -> u64 {
    attribute(dom, &format!("id=\"{id}\""), "data-value")
        .unwrap_or_else(|| panic!("no element {id} with a data-value in the page"))
        .parse()
        .unwrap()
}

/// The attribute `name` of the first tag containing `marker`.
fn attribute(dom: &str, marker: &str, name: &str) -> Option<String> {
    let at = dom.find(marker)?;
    let start = dom[..at].rfind('<')?;
    let end = at + dom[at..].find('>')?;
    let tag = &dom[start..end];
    let (_, rest) = tag.split_once(&format!("{name}=\""))?;
    Some(rest.split('"').next()?.to_owned())
}

/// Every tag containing `marker`, e.g. each bar of a chart.
fn tags<'a>(dom: &'a str, marker: &str) -> Vec<&'a str> {
    dom.match_indices(marker)
        .filter_map(|(at, _)| {
            let start = dom[..at].rfind('<')?;
            let end = at + dom[at..].find('>')?;
            Some(&dom[start..end])
        })
        .collect()
}

fn attr(tag: &str, name: &str) -> String {
    tag.split_once(&format!("{name}=\""))
        .and_then(|(_, rest)| rest.split('"').next())
        .unwrap_or_else(|| panic!("no {name} in {tag}"))
        .to_owned()
}

async fn say(client: &reqwest::Client, lull: &LullProcess, conversation: &str, id: &str) {
    let r = post_message(
        client,
        &lull.base_url(),
        conversation,
        id,
        &format!("message {id}"),
    )
    .await
    .unwrap();
    assert_eq!(r.status().as_u16(), 202);
}

async fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Tokens (the wallet's total, as `/usage` counts them) and replies per conversation
/// key, as the database holds them (an independent read of what the page must show).
fn tokens_in(db: &Path) -> Vec<(String, u64, u64)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.prepare(
        "SELECT c.key, u.tokens,
             (SELECT COUNT(*) FROM outbox o WHERE o.conversation_id = c.id AND o.kind = 'reply')
         FROM token_usage u JOIN conversations c ON u.scope = 'conversation:' || c.platform || ':' || c.key
         ORDER BY c.key",
    )
    .unwrap()
    .query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? as u64, r.get::<_, i64>(2)? as u64)))
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// What the stored replies report spending (the page's count before issue 37), and the
/// bot's wallet total.
/// A wallet scope's dollars in the database, nano-dollars, all days together.
fn cost_in(db: &Path, scope: &str) -> u64 {
    let conn = rusqlite::Connection::open(db).unwrap();
    conn.query_row(
        "SELECT COALESCE(SUM(cost), 0) FROM token_usage WHERE scope = ?1",
        [scope],
        |r| r.get::<_, i64>(0),
    )
    .unwrap() as u64
}

fn reply_and_wallet_tokens(db: &Path) -> (u64, u64) {
    let conn = rusqlite::Connection::open(db).unwrap();
    let count = |sql: &str| conn.query_row(sql, [], |r| r.get::<_, i64>(0)).unwrap() as u64;
    (
        count(
            "SELECT COALESCE(SUM(COALESCE(prompt_tokens, 0) + COALESCE(completion_tokens, 0)), 0)
             FROM outbox WHERE kind = 'reply'",
        ),
        count("SELECT COALESCE(SUM(tokens), 0) FROM token_usage WHERE scope = 'bot'"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_a_scripted_run() {
    let dir = tempfile::tempdir().unwrap();
    let webhook = Webhook::start().await;
    let model = FakeOpenAi::start().await;
    let telegram = TelegramFake::start().await;
    let env = vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        ),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
        ("OPENAI_BASE_URL", model.base_url.clone()),
        ("OPENAI_API_KEY", "sk-status-page-test".into()),
        ("OPENAI_MODEL", "fake-model".into()),
        ("LULL_PRICES", "fake-model=2/8".into()),
        ("LULL_MONTHLY_USD", "10".into()),
        ("LULL_LLM_RETRIES", "0".into()),
        ("TELEGRAM_BOT_TOKEN", telegram.token.clone()),
        ("TELEGRAM_API_URL", telegram.url.clone()),
        ("LULL_DEBOUNCE_MS", "200".into()),
        ("LULL_MAX_WAIT_MS", "8000".into()),
        ("RUST_LOG", "info".into()),
    ];
    let mut lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
    lull.wait_healthy(Duration::from_secs(20)).await;
    let client = reqwest::Client::new();

    // A model failure: the first request of c3 fails (a notice, a retry after backoff),
    // the retry is answered.
    model.script([Behavior::Status(503)]);
    say(&client, &lull, "c3", "c3-1").await;
    wait_for("the model-down notice", Duration::from_secs(20), || {
        webhook.received().iter().any(|r| r.kind == "notice")
    })
    .await;
    webhook.wait_replies(1, Duration::from_secs(30)).await;

    // A burst of three in c1: one reply.
    for id in ["c1-1", "c1-2", "c1-3"] {
        say(&client, &lull, "c1", id).await;
    }
    webhook.wait_replies(2, Duration::from_secs(20)).await;

    // c2: a message arrives while the model answers the first, so that generation is
    // stopped (overtaken: its reply is dropped as stale before it is written, the
    // request counted `cancelled`) and one reply covers both.
    model.script([Behavior::Slow(Duration::from_millis(1500))]);
    let asked = model.requests().len();
    say(&client, &lull, "c2", "c2-1").await;
    wait_for("the slow request", Duration::from_secs(10), || {
        model.requests().len() > asked
    })
    .await;
    say(&client, &lull, "c2", "c2-2").await;
    let replies = webhook.wait_replies(3, Duration::from_secs(20)).await;
    let c2 = replies.iter().find(|r| r.conversation == "c2").unwrap();
    assert_eq!(c2.covers, ["c2-1", "c2-2"]);
    assert_eq!(webhook.replies().len(), 3, "one reply per conversation");

    // The JSON twin, once every round has settled (the snapshot is kept 2 s).
    let status_url = format!("{}/api/status", lull.base_url());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status: Value = loop {
        let status: Value = client
            .get(&status_url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if status["store"]["sent"]["day"] == 3 && status["store"]["answering"] == 0 {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the status never settled: {status:#}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let store = &status["store"];
    let db_tokens = tokens_in(&dir.path().join("lull.db"));
    let total: u64 = db_tokens.iter().map(|(_, t, _)| t).sum();
    assert_eq!(db_tokens.len(), 3, "{db_tokens:?}");
    // One total, named the same everywhere: the wallet's, which counts the stopped
    // generation of c2 too (the stored replies alone report less).
    let (in_replies, wallet) = reply_and_wallet_tokens(&dir.path().join("lull.db"));
    assert_eq!(total, wallet);
    assert!(wallet > in_replies, "{wallet} {in_replies}");
    assert_eq!(store["pending"], 0, "{status:#}");
    assert_eq!(store["held"], 0);
    assert_eq!(store["retrying"], 0);
    assert_eq!(store["sent"]["hour"], 3);
    assert_eq!(store["failed"]["day"], 0);
    assert_eq!(store["generated"]["day"], 3);
    assert_eq!(store["model_failures"]["day"], 1);
    assert_eq!(store["replies_per_hour"][23], 3);
    assert_eq!(store["tokens_per_day"][29]["tokens"], total);
    assert_eq!(status["process"]["replies_dropped_stale"], 1);
    // What runs, and the alerts judged on these numbers: one model failure told
    // among three replies is no alert.
    assert_eq!(status["running"]["version"], env!("CARGO_PKG_VERSION"));
    let alerts = status["alerts"].as_array().unwrap();
    assert!(alerts.iter().all(|a| a["firing"] == false), "{status:#}");
    assert!(
        alerts.iter().any(|a| a["name"] == "LullModelFailing"),
        "{status:#}"
    );
    assert_eq!(status["process"]["llm_requests"]["ok"], 3, "{status:#}");
    assert_eq!(
        status["process"]["llm_requests"]["cancelled"], 1,
        "{status:#}"
    );
    let top: Vec<(String, u64, u64)> = store["top_conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["key"].as_str().unwrap().to_owned(),
                c["tokens"].as_u64().unwrap(),
                c["replies"].as_u64().unwrap(),
            )
        })
        .collect();
    let mut sorted = top.clone();
    sorted.sort();
    assert_eq!(
        sorted, db_tokens,
        "the top conversations are the database's"
    );
    assert!(
        top.windows(2).all(|w| w[0].1 >= w[1].1),
        "most tokens first"
    );
    let me = status["process"]["holder"].as_str().unwrap().to_owned();
    assert_eq!(
        store["connections"][0]["resource"], "poller/telegram",
        "{status:#}"
    );
    assert_eq!(store["connections"][0]["holder"], me.as_str());
    assert_eq!(status["platforms"]["telegram"], "up");
    assert_eq!(status["platforms"]["http"], "up");

    // The page in a browser shows the same numbers.
    let Some(chromium) = chromium() else {
        return;
    };
    let page = format!("{}/", lull.base_url());
    let profile = tempfile::tempdir().unwrap();
    let dom = tokio::task::spawn_blocking({
        let (chromium, profile, page) = (chromium.clone(), profile.path().to_owned(), page.clone());
        move || run_chromium(&chromium, &profile, &["--dump-dom".into()], &page)
    })
    .await
    .unwrap();
    assert!(dom.contains("lull status"), "{dom}");
    for external in ["<script", "src=\"http", "href=\"http", "@import"] {
        assert!(!dom.contains(external), "nothing is fetched: {external}");
    }
    for (id, expected) in [
        ("pending", 0),
        ("answering", 0),
        ("held", 0),
        ("retrying", 0),
        ("sent-hour", 3),
        ("sent-day", 3),
        ("failed-day", 0),
        ("generated-day", 3),
        ("model-failures-day", 1),
        ("stale-process", 1),
        ("llm-ok-process", 3),
        ("replies-24h", 3),
        ("tokens-today", total),
        ("alerts-firing", 0),
        ("approvals-waiting", 0),
    ] {
        assert_eq!(value_of(&dom, id), expected, "#{id} on the page");
    }
    assert!(
        dom.contains(&format!(
            "<span id=\"version\">{}</span>",
            env!("CARGO_PKG_VERSION")
        )),
        "the version on the overview"
    );
    assert_eq!(
        tags(&dom, "data-alert=").len(),
        7,
        "every rule judged here is listed"
    );
    let bars = tags(&dom, "class=\"bar\"");
    assert_eq!(bars.len(), 30, "a bar per day");
    assert_eq!(attr(bars[29], "data-tokens"), total.to_string());
    // Dollars: today's bar and the month so far are the wallet's, at LULL_PRICES.
    let dollars = |scope: &str| cost_in(&dir.path().join("lull.db"), scope) as f64 / 1e9;
    let (today, month) = (dollars("bot"), dollars("month:bot"));
    assert!(today > 0.0 && today == month, "{today} {month}");
    let cost_bars = tags(&dom, "class=\"cost-bar\"");
    assert_eq!(cost_bars.len(), 30, "a dollar bar per day");
    let shown = |value: String| value.parse::<f64>().unwrap();
    assert_eq!(shown(attr(cost_bars[29], "data-cost")), today);
    assert_eq!(
        attribute(&dom, "id=\"cost-month\"", "data-value").map(shown),
        Some(month)
    );
    assert_eq!(
        attribute(&dom, "id=\"month-budget\"", "data-value").map(shown),
        Some(10.0)
    );
    let points = tags(&dom, "class=\"point\"");
    assert_eq!(points.len(), 24, "a point per hour");
    assert_eq!(attr(points[23], "data-hour"), "0");
    assert_eq!(attr(points[23], "data-replies"), "3");
    let rows = tags(&dom, "data-conversation=");
    let mut shown: Vec<(String, u64, u64)> = rows
        .iter()
        .map(|row| {
            (
                attr(row, "data-key"),
                attr(row, "data-tokens").parse().unwrap(),
                attr(row, "data-replies").parse().unwrap(),
            )
        })
        .collect();
    shown.sort();
    assert_eq!(shown, db_tokens);
    for text in ["message c1-1", "message c2-2"] {
        assert!(!dom.contains(text), "no message text on the page");
    }
    let holder = tags(&dom, &format!("data-holder=\"{me}\""));
    assert_eq!(holder.len(), 1, "this process is listed");
    assert_eq!(attr(holder[0], "data-connections"), "poller/telegram");
    assert_eq!(
        attribute(&dom, "data-platform=\"telegram\"", "data-state").as_deref(),
        Some("up")
    );

    let screenshot = dir.path().join("status-page.png");
    tokio::task::spawn_blocking({
        let (chromium, profile, shot) = (chromium, profile.path().to_owned(), screenshot.clone());
        move || {
            run_chromium(
                &chromium,
                &profile,
                &[
                    format!("--screenshot={}", shot.display()),
                    "--window-size=1280,1900".into(),
                    "--hide-scrollbars".into(),
                ],
                &page,
            )
        }
    })
    .await
    .unwrap();
    let png = std::fs::read(&screenshot).expect("chromium saved the screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    println!("status page screenshot: {}", screenshot.display());
    if let Some(keep) = std::env::var_os("LULL_SCREENSHOT_DIR") {
        let keep = PathBuf::from(keep);
        std::fs::create_dir_all(&keep).unwrap();
        std::fs::copy(&screenshot, keep.join("status-page.png")).unwrap();
        println!("copied to {}", keep.join("status-page.png").display());
    }
}

/// `lull run` named `name` on `0.0.0.0` (reached through 127.0.0.1) with the echo
/// responder, its own SQLite file in `dir`, and `env` on top.
fn off_loopback(dir: &Path, name: &str, mut env: Vec<(&str, String)>) -> LullProcess {
    env.extend([
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.join(format!("{name}.db")).display()),
        ),
        ("LULL_HTTP_ADDR", format!("0.0.0.0:{}", free_port())),
        ("LULL_LLM", "echo".into()),
    ]);
    LullProcess::start(dir, name, &["run"], &env)
}

/// Off loopback (`0.0.0.0`, reached through 127.0.0.1): without `LULL_HTTP_TOKEN` the
/// page is 403 naming the variable; with it, the bearer token or the login form's
/// cookie opens it, a wrong token does not; `/healthz` and `/metrics` stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn off_loopback_the_page_needs_the_token() {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    // No token: Telegram alone (the http adapter would refuse to start off loopback).
    let dir = tempfile::tempdir().unwrap();
    let telegram = TelegramFake::start().await;
    let mut closed = off_loopback(
        dir.path(),
        "closed",
        vec![
            ("TELEGRAM_BOT_TOKEN", telegram.token.clone()),
            ("TELEGRAM_API_URL", telegram.url.clone()),
        ],
    );
    closed.wait_healthy(Duration::from_secs(20)).await;
    for path in ["/", "/api/status", "/login"] {
        let r = client
            .get(format!("{}{path}", closed.base_url()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 403, "{path}");
        assert!(
            r.text().await.unwrap().contains("LULL_HTTP_TOKEN"),
            "{path}"
        );
    }
    let r = client
        .get(format!("{}/", closed.base_url()))
        .bearer_auth("anything")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403, "no token set: nothing opens it");
    for path in ["/healthz", "/metrics"] {
        let r = client
            .get(format!("{}{path}", closed.base_url()))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{path} keeps its behaviour");
    }
    drop(closed);

    // A token: the http adapter on 0.0.0.0 too.
    let webhook = Webhook::start().await;
    let mut open = off_loopback(
        dir.path(),
        "token",
        vec![
            ("LULL_HTTP_TOKEN", TOKEN.into()),
            ("LULL_WEBHOOK_URL", webhook.url.clone()),
        ],
    );
    open.wait_healthy(Duration::from_secs(20)).await;
    let base = open.base_url();
    let get = |path: &str| client.get(format!("{base}{path}"));

    let r = get("/").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    let form = r.text().await.unwrap();
    assert!(
        form.contains("action=\"/login\"") && !form.contains(TOKEN),
        "{form}"
    );
    assert_eq!(
        get("/api/status").send().await.unwrap().status().as_u16(),
        401
    );
    assert_eq!(get("/login").send().await.unwrap().status().as_u16(), 200);
    let r = get("/api/status").bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let status: Value = r.json().await.unwrap();
    assert_eq!(status["database"], "ok");
    // Read again at once: the same snapshot (kept 2 s), not another read of the store.
    let again: Value = get("/api/status")
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(again["generated_at"], status["generated_at"]);
    assert_eq!(
        get("/")
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    for wrong in ["wrong", "status-page-test-toke", "status-page-test-tokenX"] {
        let r = get("/").bearer_auth(wrong).send().await.unwrap();
        assert_eq!(r.status().as_u16(), 401, "{wrong}");
    }

    // The login form: a wrong token sets nothing; the right one sets the cookie.
    let login = |token: &str| {
        client
            .post(format!("{base}/login"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={token}"))
    };
    let r = login("wrong").send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert!(r.headers().get("set-cookie").is_none());
    let r = login(TOKEN).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(r.headers()["location"], "/");
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    assert!(cookie.contains("SameSite=Strict"), "{cookie}");
    assert!(
        !cookie.contains(TOKEN),
        "the cookie is not the token: {cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_owned();
    let r = get("/").header("cookie", &pair).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.text().await.unwrap().contains("id=\"pending\""));
    let forged = format!("{}x", &pair[..pair.len() - 1]);
    let r = get("/").header("cookie", forged).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401, "a forged cookie is refused");
    // The session expires (before issue 37 the cookie was good for ever), and is
    // `Secure` when a proxy says the login came over HTTPS.
    assert!(cookie.contains("Max-Age=43200"), "{cookie}");
    assert!(!cookie.contains("Secure"), "plain HTTP: {cookie}");
    let r = login(TOKEN)
        .header("x-forwarded-proto", "https")
        .send()
        .await
        .unwrap();
    let secure = r.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(secure.contains("; Secure"), "{secure}");
    // Wrong tokens are limited: ten a minute (one was tried above), then 429 even for
    // the right one.
    for n in 0..9 {
        let r = login("wrong").send().await.unwrap();
        assert_eq!(r.status().as_u16(), 401, "wrong token {n}");
    }
    let r = login(TOKEN).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert!(r.headers().get("retry-after").is_some());
    // Bearer tokens are guessed no faster (three wrong ones were tried above): after
    // ten, even the right one is told to wait; a logged-in browser is not.
    for n in 0..7 {
        let r = get("/").bearer_auth("wrong").send().await.unwrap();
        assert_eq!(r.status().as_u16(), 401, "wrong bearer {n}");
    }
    let r = get("/api/status").bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert!(r.headers().get("retry-after").is_some());
    let r = get("/").header("cookie", &pair).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200, "a session is no guess");
    for path in ["/healthz", "/metrics"] {
        assert_eq!(
            get(path).send().await.unwrap().status().as_u16(),
            200,
            "{path}"
        );
    }
    assert!(!open.logs().contains(TOKEN), "the token is never logged");
}
