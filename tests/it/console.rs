//! The operator's console (issue 44), through the real binary and the http adapter:
//! behind `LULL_HTTP_TOKEN` on loopback too, a login that sets a session, a chat's
//! model changed from `/chats/{id}` and the next model request using it; a forged form
//! (no token of this browser's) refused and nothing changed; a session past its end
//! refused.

use std::time::Duration;

use serde_json::json;

use crate::support::db;
use crate::support::http_bot::HttpBot;
use crate::support::process::LullProcess;

const TOKEN: &str = "console-test-token";
const SECS: fn(u64) -> Duration = Duration::from_secs;

/// A client that follows no redirect (the test reads each answer itself).
fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn start(bot: &HttpBot, name: &str, extra: &[(&str, &str)]) -> LullProcess {
    let mut env = vec![
        ("LULL_HTTP_TOKEN", TOKEN),
        ("OPENAI_MODEL", "small"),
        ("LULL_MODELS", "small,big"),
        ("LULL_SUMMARY", "off"),
        ("LULL_TOOLS", "off"),
        ("LULL_DEBOUNCE_MS", "100"),
    ];
    env.extend_from_slice(extra);
    bot.start(name, &env).await
}

/// Post `text` in the chat `c1` (the http adapter wants the token too), and wait for
/// the `n`th reply there.
async fn say(bot: &HttpBot, lull: &LullProcess, id: &str, text: &str, n: usize) {
    let r = bot
        .client
        .post(format!("{}/api/messages", lull.base_url()))
        .bearer_auth(TOKEN)
        .json(&json!({ "conversation": "c1", "user": "ann", "text": text, "id": id, "title": "Team notes" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    bot.webhook.wait_replies(n, SECS(20)).await;
}

/// The value of the cookie `name` a response sets.
fn set_cookie(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get_all(reqwest::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix(&format!("{name}=")))
        .map(|v| v.split(';').next().unwrap_or_default().to_owned())
}

/// `GET url` with `cookies` (none: empty), which must answer 200: this browser's form
/// token (given now, or held), and the page.
async fn open_page(url: String, cookies: &str) -> (String, String) {
    let mut get = client().get(url);
    if !cookies.is_empty() {
        get = get.header(reqwest::header::COOKIE, cookies);
    }
    let r = get.send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    // A browser that holds a form token keeps it.
    let held = cookies
        .split("; ")
        .find_map(|c| c.strip_prefix("lull_csrf="))
        .map(str::to_owned);
    let csrf = set_cookie(&r, "lull_csrf").or(held).expect("a form token");
    (csrf, r.text().await.unwrap())
}

/// The status `GET url` with `cookies` is answered with.
async fn status_of(url: String, cookies: &str) -> u16 {
    let r = client().get(url).header(reqwest::header::COOKIE, cookies);
    r.send().await.unwrap().status().as_u16()
}

/// Log in with the token: the session cookie.
async fn log_in(lull: &LullProcess) -> String {
    let r = client()
        .post(format!("{}/login", lull.base_url()))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    set_cookie(&r, "lull_status").expect("the login sets the session cookie")
}

/// `POST /chats/{id}` with `cookies` and the form `fields`: the answer.
async fn post(
    lull: &LullProcess,
    id: &str,
    cookies: &str,
    fields: &[(&str, &str)],
) -> reqwest::Response {
    client()
        .post(format!("{}/chats/{id}", lull.base_url()))
        .header(reqwest::header::COOKIE, cookies)
        .form(fields)
        .send()
        .await
        .unwrap()
}

fn chat_model(bot: &HttpBot, id: &str) -> String {
    let rows = db::rows(
        &bot.database,
        &format!(
            "SELECT COALESCE(model, '') FROM conversation_settings WHERE conversation_id = {id}"
        ),
    );
    rows.first().map(|r| r[0].clone()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_changes_a_chats_model_once_logged_in_and_refuses_a_forged_form() {
    let bot = HttpBot::new(None).await;
    let lull = start(&bot, "console", &[]).await;
    say(&bot, &lull, "m1", "hello", 1).await;
    let id = db::rows(
        &bot.database,
        "SELECT id FROM conversations WHERE key = 'c1'",
    )[0][0]
        .clone();

    // On loopback too, the token is needed once it is set.
    let r = client()
        .get(format!("{}/chats", lull.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401, "no session: the login form");
    let session = log_in(&lull).await;

    // The list and the chat's page; the page gives this browser its form token.
    let r = client()
        .get(format!("{}/chats", lull.base_url()))
        .header(reqwest::header::COOKIE, format!("lull_status={session}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let csrf = set_cookie(&r, "lull_csrf").expect("a form token");
    let list = r.text().await.unwrap();
    assert!(list.contains(&format!("data-chat=\"{id}\"")), "{list}");
    assert!(
        list.contains("<td class=\"title\">Team notes</td>"),
        "the chat's name, as the client gave it: {list}"
    );
    let cookies = format!("lull_status={session}; lull_csrf={csrf}");
    let page = open_page(format!("{}/chats/{id}", lull.base_url()), &cookies)
        .await
        .1;
    assert!(
        page.contains(&format!("name=\"csrf\" value=\"{csrf}\""))
            && page.contains("<option value=\"big\">"),
        "{page}"
    );

    // Forged: no form token, another token, or the right one without the browser's
    // cookie (what another site can post). Each is refused and changes nothing.
    let session_only = format!("lull_status={session}");
    for (cookies, fields) in [
        (
            cookies.as_str(),
            vec![("action", "model"), ("value", "big")],
        ),
        (
            cookies.as_str(),
            vec![
                ("action", "model"),
                ("value", "big"),
                ("csrf", "0123456789abcdef0123456789abcdef"),
            ],
        ),
        (
            session_only.as_str(),
            vec![
                ("action", "model"),
                ("value", "big"),
                ("csrf", csrf.as_str()),
            ],
        ),
    ] {
        let r = post(&lull, &id, cookies, &fields).await;
        assert_eq!(r.status().as_u16(), 403, "{fields:?}");
    }
    assert_eq!(chat_model(&bot, &id), "", "nothing changed");

    // The real form: saved, redirected back saying so; the next reply uses it.
    let r = post(
        &lull,
        &id,
        &cookies,
        &[("action", "model"), ("value", "big"), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(r.status().as_u16(), 303);
    let back = location(&r);
    assert!(
        back.starts_with(&format!("/chats/{id}?done=saved")),
        "{back}"
    );
    assert_eq!(chat_model(&bot, &id), "big");
    say(&bot, &lull, "m2", "and now?", 2).await;
    let models: Vec<String> = bot
        .model
        .requests()
        .iter()
        .map(|r| r.body["model"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        models,
        ["small", "big"],
        "the next model request uses the change"
    );

    // A model not offered is refused, saying why; /stop and access decisions work.
    let r = post(
        &lull,
        &id,
        &cookies,
        &[("action", "model"), ("value", "huge"), ("csrf", &csrf)],
    )
    .await;
    let back = location(&r);
    assert!(back.contains("not+saved"), "{back}");
    assert_eq!(chat_model(&bot, &id), "big");
    let r = post(&lull, &id, &cookies, &[("action", "deny"), ("csrf", &csrf)]).await;
    assert_eq!(r.status().as_u16(), 303);
    let rules = db::rows(
        &bot.database,
        "SELECT kind, subject, allowed, set_by FROM access_rules",
    );
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(rules[0][0], "chat");
    assert_eq!(rules[0][1], "c1");
    assert_eq!(rules[0][3], "console");

    // Logging out: a post without the form token is refused; the form's ends the
    // session, clears the cookie and leads to the login form; the session is refused.
    let (out_csrf, page) = open_page(format!("{}/logout", lull.base_url()), &cookies).await;
    assert!(page.contains("id=\"logout\""), "{page}");
    let logout = |fields: Vec<(&'static str, String)>| {
        client()
            .post(format!("{}/logout", lull.base_url()))
            .header(reqwest::header::COOKIE, &cookies)
            .form(&fields)
            .send()
    };
    let forged = logout(vec![("csrf", "0".repeat(32))]).await.unwrap();
    assert_eq!(forged.status().as_u16(), 403);
    let r = logout(vec![("csrf", out_csrf)]).await.unwrap();
    assert_eq!(r.status().as_u16(), 303);
    assert_eq!(r.headers()[reqwest::header::LOCATION], "/login");
    assert_eq!(
        set_cookie(&r, "lull_status").as_deref(),
        Some(""),
        "cleared"
    );
    let url = format!("{}/chats", lull.base_url());
    assert_eq!(status_of(url, &cookies).await, 401, "a logged-out session");
    drop(lull);

    // Thirteen hours later (sessions last twelve), the same cookie is refused.
    let later = start(&bot, "later", &[("LULL_TEST_CLOCK_OFFSET_MS", "46800000")]).await;
    let url = format!("{}/chats/{id}", later.base_url());
    assert_eq!(status_of(url, &cookies).await, 401, "an expired session");
    let r = post(
        &later,
        &id,
        &cookies,
        &[("action", "model"), ("value", "small"), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(
        r.status().as_u16(),
        401,
        "no change with an expired session"
    );
    assert_eq!(chat_model(&bot, &id), "big");
}

/// A session cookie for `token` signed as the console signs one (`status::login`), an
/// hour past its end: only its end is wrong.
fn expired_session(token: &str) -> String {
    use hmac::{Hmac, Mac};
    use sha2::{Digest, Sha256};
    let mut key = Sha256::new();
    key.update(b"lull status page session\0");
    key.update(token.as_bytes());
    let key: [u8; 32] = key.finalize().into();
    let ended = lull_core::domain::Timestamp::now().0 - 3_600_000;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(ended.to_string().as_bytes());
    let mac: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{ended}.{mac}")
}

/// puppeteer-core's `node_modules` (`LULL_PUPPETEER`, from `scripts/puppeteer`), if
/// installed; `None` prints the skip line (and panics when `LULL_REQUIRE_PUPPETEER=1`).
fn puppeteer() -> Option<std::path::PathBuf> {
    let found = std::env::var_os("LULL_PUPPETEER")
        .map(std::path::PathBuf::from)
        .filter(|dir| dir.join("puppeteer-core").is_dir());
    if found.is_none() {
        assert!(
            !std::env::var("LULL_REQUIRE_PUPPETEER").is_ok_and(|v| v == "1"),
            "LULL_REQUIRE_PUPPETEER=1 but LULL_PUPPETEER names no puppeteer-core (eval \"$(scripts/puppeteer)\")"
        );
        crate::support::skip::skipped(
            "the console's browser test",
            "needs puppeteer-core (eval \"$(scripts/puppeteer)\") and chromium",
        );
    }
    found
}

/// In a real browser (headless Chromium driven by puppeteer-core): the login form,
/// the log in, the chats, the chat's model changed with its form and the next model
/// request using it, the same form again changing nothing, a forged post from the
/// page refused. A screenshot of each page is saved (to `LULL_SCREENSHOT_DIR` too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_browser_the_console_logs_in_and_changes_a_chats_model() {
    let (Some(chromium), Some(modules)) = (crate::status_page::chromium(), puppeteer()) else {
        return;
    };
    use crate::support::fakes::openai::Behavior;
    let bot = HttpBot::new(None).await;
    // lull's own tools on, and the test's MCP server, for the tools page and an approval.
    let mcp = crate::tools::counter_config(bot.dir.path(), 2000);
    let mcp = mcp.display().to_string();
    let lull = start(
        &bot,
        "browser",
        &[("LULL_TOOLS", "auto"), ("LULL_MCP_CONFIG", &mcp)],
    )
    .await;
    say(&bot, &lull, "m1", "hello", 1).await;
    // A reminder for the jobs page to cancel (its confirmation is a notice).
    let r = bot
        .client
        .post(format!("{}/api/messages", lull.base_url()))
        .bearer_auth(TOKEN)
        .json(&json!({ "conversation": "c1", "user": "ann", "text": "/remind in 2h stretch", "id": "m0" }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    bot.webhook.wait_notices(1, SECS(10)).await;
    let id = db::rows(
        &bot.database,
        "SELECT id FROM conversations WHERE key = 'c1'",
    )[0][0]
        .clone();
    // A destructive call waiting for a yes in another chat, for the approvals page.
    bot.model.fallback(Behavior::Agent(crate::tools::deleter()));
    let r = bot
        .client
        .post(format!("{}/api/messages", lull.base_url()))
        .bearer_auth(TOKEN)
        .json(
            &json!({ "conversation": "c2", "user": "ann", "text": "delete my notes", "id": "d1" }),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 202);
    let notices = bot.webhook.wait_notices(2, SECS(20)).await;
    let approval = crate::tools::approval_id(&notices[1].text);
    bot.webhook.wait_replies(2, SECS(20)).await;
    bot.model.fallback(Behavior::Answer);
    let shots = bot.dir.path().join("shots");
    std::fs::create_dir_all(&shots).unwrap();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/console_browser.mjs");
    let out = tokio::process::Command::new("node")
        .arg(&script)
        .env("LULL_PUPPETEER", &modules)
        .env("CHROMIUM", &chromium)
        .env("BASE", lull.base_url())
        .env("TOKEN", TOKEN)
        .env("CHAT", &id)
        .env("APPROVAL", &approval)
        .env("EXPIRED", expired_session(TOKEN))
        .env("SHOTS", &shots)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    eprintln!("the browser saw: {seen}");
    assert_eq!(seen["unauthenticated"], 401);
    assert_eq!(seen["after_login"], "/");
    assert_eq!(seen["chats"], 200);
    assert!(
        seen["listed"].as_array().unwrap().contains(&json!(id)),
        "{seen}"
    );
    assert_eq!(seen["done"], "saved: model is now big");
    assert_eq!(seen["model"], "big");
    assert_eq!(seen["again"], "nothing to change: model was big already");
    assert_eq!(seen["forged"], 403);
    for path in ["/", "/chats", "/approvals"] {
        assert_eq!(
            seen[format!("phone{path}")],
            "fits",
            "{path} on a phone: {seen}"
        );
    }
    assert_eq!(
        (seen["after_logout"].clone(), seen["logged_out"].clone()),
        (json!("/login"), json!(401)),
        "logged out: {seen}"
    );
    assert_eq!(
        (seen["people"].clone(), seen["tools"].clone()),
        (json!(200), json!(200))
    );
    let listed = seen["tools_listed"].as_array().unwrap();
    for tool in ["counter__delete", "lull__schedule", "lull__remember"] {
        assert!(
            listed.contains(&json!(tool)),
            "{tool} on the tools page: {seen}"
        );
    }
    assert_eq!(seen["jobs"].as_array().map(Vec::len), Some(1), "{seen}");
    assert!(
        seen["cancelled"]
            .as_str()
            .unwrap()
            .starts_with("Stopped job #"),
        "{seen}"
    );
    assert_eq!(seen["jobs_after"], 0);
    assert_eq!(seen["memories"], 200);
    assert_eq!(
        db::rows(&bot.database, "SELECT state FROM jobs")[0][0],
        "cancelled",
        "the same store operation as /jobs cancel"
    );
    assert_eq!(chat_model(&bot, &id), "big");
    // Approved once, though clicked twice and again from a second tab: one answer
    // stored, the call run once, and the chat told.
    assert_eq!(seen["approvals"], json!([approval]), "{seen}");
    for said in [&seen["approved"], &seen["approved_again"]] {
        let said = said.as_str().unwrap();
        assert!(
            said.starts_with(&format!("Approved #{approval}"))
                || said.contains("already answered")
                || said.starts_with("No approval"),
            "{seen}"
        );
    }
    // Bob, denied then allowed from the people page: refused, then answered.
    assert_eq!(
        (seen["bob_denied"].clone(), seen["bob_allowed"].clone()),
        (json!("denied"), json!("stored")),
        "{seen}"
    );
    assert!(
        seen["allowed"]
            .as_str()
            .unwrap()
            .starts_with("saved: http:bob"),
        "{seen}"
    );
    let replies = bot.webhook.wait_replies(4, SECS(20)).await;
    assert!(
        replies
            .iter()
            .any(|r| r.conversation == "c2" && r.text.contains("✓ counter__delete")),
        "{replies:?}"
    );
    assert!(
        replies
            .iter()
            .any(|r| r.conversation == "c3" && r.covers == ["b2"]),
        "bob's allowed message answered: {replies:?}"
    );
    assert_eq!(seen["expired"], 401, "an expired session: {seen}");
    let answers = db::rows(
        &bot.database,
        "SELECT platform_message_id FROM messages WHERE user_id = 'lull:console'",
    );
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(crate::tools::executed_in(bot.dir.path(), "delete"), 1);
    say(&bot, &lull, "m2", "and now?", 5).await;
    let last = bot.model.requests().last().unwrap().body["model"].clone();
    assert_eq!(last, "big", "the next model request uses the change");
    for name in [
        "login",
        "overview",
        "chats",
        "chat",
        "chat-saved",
        "jobs",
        "people",
        "memories",
        "approvals",
        "approvals-answered",
        "tools",
        "phone",
    ] {
        let png = std::fs::read(shots.join(format!("console-{name}.png"))).unwrap();
        assert!(png.starts_with(b"\x89PNG"), "{name}");
    }
    if let Some(keep) = std::env::var_os("LULL_SCREENSHOT_DIR") {
        let keep = std::path::PathBuf::from(keep);
        std::fs::create_dir_all(&keep).unwrap();
        for entry in std::fs::read_dir(&shots).unwrap().flatten() {
            std::fs::copy(entry.path(), keep.join(entry.file_name())).unwrap();
        }
    }
}

/// The people page admits a Telegram user nobody listed: their first message gets the
/// bot's "private" answer; allowed from the console (a form with this browser's
/// token), their next message is answered. A forged post is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_people_page_allows_a_user_whose_next_message_is_answered() {
    use crate::support::fakes::telegram::text_message;
    let tg = crate::telegram::start(&[("LULL_ALLOWED_USERS", "")]).await;
    let base = tg.lull.base_url();
    tg.fake.push_message(text_message(4801, 4801, "hello?"));
    let sent = tg.fake.wait_sent(4801, 1, SECS(15)).await;
    assert!(
        sent[0].text.contains("this bot is private"),
        "{}",
        sent[0].text
    );

    // No token set, loopback: open; the page gives the browser its form token.
    let r = client().get(format!("{base}/people")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let csrf = set_cookie(&r, "lull_csrf").expect("a form token");
    let page = r.text().await.unwrap();
    assert!(
        page.contains("LULL_ALLOWED_USERS</th><td>local users only"),
        "{page}"
    );
    let cookies = format!("lull_csrf={csrf}");
    let forged = client()
        .post(format!("{base}/people"))
        .form(&[("action", "allow"), ("user", "telegram:4801")])
        .send()
        .await
        .unwrap();
    assert_eq!(
        forged.status().as_u16(),
        403,
        "a post without the browser's token"
    );
    let r = client()
        .post(format!("{base}/people"))
        .header(reqwest::header::COOKIE, &cookies)
        .form(&[
            ("action", "allow"),
            ("user", "telegram:4801"),
            ("csrf", &csrf),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let back = location(&r);
    assert!(back.starts_with("/people?done=saved"), "{back}");
    let page = open_page(format!("{base}/people"), &cookies).await.1;
    assert!(
        page.contains("data-subject=\"telegram:4801\" data-allowed=\"true\""),
        "{page}"
    );
    // Admitted at once here (other processes read the decisions within LULL_POLL_MS).
    tg.fake.push_message(text_message(4801, 4801, "now?"));
    let sent = tg.fake.wait_sent(4801, 2, SECS(15)).await;
    assert!(sent[1].text.contains("now?"), "answered: {}", sent[1].text);
    // The private chat is named after the person, as Telegram shows them.
    let (_, chats) = open_page(format!("{base}/chats"), &cookies).await;
    assert!(
        chats.contains("<td class=\"title\">User4801</td>"),
        "{chats}"
    );
}

/// The memories page: a person's memories shown on request, one forgotten with its
/// button as `/memory forget N` does (a forged post refused first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memories_page_shows_a_persons_memories_and_forgets_one() {
    use crate::support::fakes::openai::{Agent, Behavior};
    let bot = HttpBot::new(None).await;
    bot.model.fallback(Behavior::Agent(Agent {
        calls: vec![("lull__remember".into(), json!({ "text": "" }))],
        newest_field: Some("text"),
        only_if: Some("remember:"),
        ..Agent::default()
    }));
    let lull = start(&bot, "memories", &[("LULL_TOOLS", "auto")]).await;
    say(&bot, &lull, "m1", "remember: likes green tea", 1).await;
    let stored = db::rows(&bot.database, "SELECT id, text FROM memories");
    assert_eq!(stored.len(), 1, "{stored:?}");
    let id = stored[0][0].clone();

    let session = log_in(&lull).await;
    let url = format!("{}/memories?scope=person:http:ann", lull.base_url());
    let (csrf, page) = open_page(url, &format!("lull_status={session}")).await;
    assert!(
        page.contains(&format!("data-memory=\"{id}\"")) && page.contains("likes green tea"),
        "{page}"
    );
    let cookies = format!("lull_status={session}; lull_csrf={csrf}");
    let forget = |csrf: &str| {
        vec![
            ("scope", "person:http:ann".to_owned()),
            ("action", "forget".to_owned()),
            ("id", id.clone()),
            ("csrf", csrf.to_owned()),
        ]
    };
    let forged = client()
        .post(format!("{}/memories", lull.base_url()))
        .header(reqwest::header::COOKIE, format!("lull_status={session}"))
        .form(&forget(&csrf))
        .send()
        .await
        .unwrap();
    assert_eq!(
        forged.status().as_u16(),
        403,
        "without the browser's cookie"
    );
    assert_eq!(db::rows(&bot.database, "SELECT id FROM memories").len(), 1);
    let r = client()
        .post(format!("{}/memories", lull.base_url()))
        .header(reqwest::header::COOKIE, &cookies)
        .form(&forget(&csrf))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 303);
    let back = location(&r);
    assert!(
        back.starts_with("/memories?scope=person%3Ahttp%3Aann&done="),
        "{back}"
    );
    assert!(
        db::rows(&bot.database, "SELECT id FROM memories").is_empty(),
        "forgotten"
    );
}

/// Where a redirect sends the browser.
fn location(r: &reqwest::Response) -> String {
    r.headers()[reqwest::header::LOCATION]
        .to_str()
        .unwrap()
        .to_owned()
}

/// The `done` a console change's redirect says.
fn done_of(r: &reqwest::Response) -> String {
    assert_eq!(r.status().as_u16(), 303);
    let back = location(r);
    reqwest::Url::parse(&format!("http://console{back}"))
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == "done")
        .map(|(_, v)| v.into_owned())
        .unwrap_or_default()
}

/// The approvals page answers a destructive call as an admin would in the chat: it is
/// listed with its chat and call; approved from the console, the call runs once and
/// the chat is told (the same answer posted again, or after the round decided, does
/// nothing more); another, cancelled from the console, never runs. A forged post is
/// refused, and an update a platform sends as the console's operator is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_approvals_page_approves_a_call_once_and_cancels_another() {
    use crate::tools::{Setup, ToolBot, approval_id, ask_to_delete, deleter};
    const LONG: Duration = Duration::from_secs(40);
    let bot = ToolBot::start(Setup {
        agent: deleter(),
        ..Setup::default()
    })
    .await;
    let base = bot.lulls[0].base_url();
    let id = ask_to_delete(&bot, "c1").await;

    // Listed, with this browser's form token (open on loopback: no token is set).
    let (csrf, page) = open_page(format!("{base}/approvals"), "").await;
    assert!(
        page.contains(&format!("data-approval=\"{id}\"")) && page.contains("counter__delete"),
        "{page}"
    );
    let answer = |id: String, answer: &'static str, cookies: String| {
        let csrf = csrf.clone();
        let base = base.clone();
        async move {
            client()
                .post(format!("{base}/approvals"))
                .header(reqwest::header::COOKIE, cookies)
                .form(&[("action", id.as_str()), ("answer", answer), ("csrf", &csrf)])
                .send()
                .await
                .unwrap()
        }
    };
    let cookies = format!("lull_csrf={csrf}");
    let forged = answer(id.clone(), "approve", String::new()).await;
    assert_eq!(
        forged.status().as_u16(),
        403,
        "without the browser's cookie"
    );

    // Approved twice in a row (a double click): answered once, run once.
    let first = done_of(&answer(id.clone(), "approve", cookies.clone()).await);
    let second = done_of(&answer(id.clone(), "approve", cookies.clone()).await);
    assert!(first.starts_with(&format!("Approved #{id}")), "{first}");
    assert!(
        second.contains("already answered") || second.starts_with("No approval"),
        "{second}"
    );
    let replies = bot.wait_shown(2, LONG).await;
    assert!(
        replies[1].text.contains("✓ counter__delete"),
        "the chat is told: {:?}",
        replies[1]
    );
    let third = done_of(&answer(id.clone(), "approve", cookies.clone()).await);
    assert!(third.starts_with(&format!("No approval #{id}")), "{third}");
    let page = open_page(format!("{base}/approvals"), "").await.1;
    assert!(
        !page.contains("data-approval=\""),
        "no longer waiting: {page}"
    );

    // Another, cancelled from the console: never run, and the chat is told.
    bot.say("c2", "1", "delete my notes").await;
    let notices = bot.webhook.wait_notices(2, LONG).await;
    let other = approval_id(&notices[1].text);
    bot.wait_shown(3, LONG).await;
    let cancelled = done_of(&answer(other.clone(), "cancel", cookies.clone()).await);
    assert!(
        cancelled.starts_with(&format!("Cancelled #{other}")),
        "{cancelled}"
    );
    let replies = bot.wait_shown(4, LONG).await;
    assert!(
        replies[3].text.contains("not approved, not run"),
        "{:?}",
        replies[3]
    );

    // A platform's update sent as the console's operator: refused, nothing stored.
    let forged = reqwest::Client::new()
        .post(format!("{base}/api/messages"))
        .json(&json!({ "conversation": "c3", "user": "lull:console", "text": "/approve 1", "id": "x1" }))
        .send()
        .await
        .unwrap();
    let said: serde_json::Value = forged.json().await.unwrap();
    assert_eq!(said["status"], "denied", "{said}");
    assert!(
        db::rows(
            &bot.database,
            "SELECT id FROM messages WHERE user_id = 'lull:console' AND platform_message_id = 'x1'"
        )
        .is_empty()
    );
    bot.assert_invariants(4).await;
    assert_eq!(bot.executed("delete"), 1, "{:#?}", bot.executions());
}
