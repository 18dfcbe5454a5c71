//! The web tools (issue 42), through the real binary, the http adapter and loopback
//! fakes: `lull__fetch` refuses every written form of a private, loopback, link-local
//! or metadata address — a loopback listener proves no connection was made — a name
//! that resolves to loopback, and a redirect to a refused address at the hop; with the
//! loopback range allowed, a page's text reaches the model, a 20 MB body is cut, a
//! hanging server is given up in bounded time and a PDF is described, not dumped.
//! `lull__search` through a fake SearXNG: results reach the model, and a 500, a hang
//! and a malformed answer each become a tool result while the reply still arrives.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::Query;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use crate::support::fakes::openai::{Agent, Behavior, FakeOpenAi};
use crate::support::fakes::webhook::Webhook;
use crate::support::process::LullProcess;

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// A lull process whose model calls one web tool with each message's text.
struct WebBot {
    _dir: tempfile::TempDir,
    lull: LullProcess,
    webhook: Webhook,
    model: FakeOpenAi,
    client: reqwest::Client,
}

impl WebBot {
    async fn start(tool: &str, field: &'static str, extra: &[(&str, String)]) -> WebBot {
        let dir = tempfile::tempdir().unwrap();
        let webhook = Webhook::start().await;
        let model = FakeOpenAi::start().await;
        model.fallback(Behavior::Agent(Agent {
            calls: vec![(tool.to_owned(), json!({}))],
            newest_field: Some(field),
            ..Agent::default()
        }));
        let mut env = vec![
            (
                "DATABASE_URL",
                format!("sqlite:{}", dir.path().join("lull.db").display()),
            ),
            ("LULL_WEBHOOK_URL", webhook.url.clone()),
            ("OPENAI_BASE_URL", model.base_url.clone()),
            ("OPENAI_API_KEY", "sk-web-test".into()),
            ("LULL_STREAM", "off".into()),
            ("LULL_DEBOUNCE", "fixed".into()),
            ("LULL_DEBOUNCE_MS", "100".into()),
            ("LULL_LEASE_TTL_MS", "5000".into()),
            ("RUST_LOG", "info,lull_core=debug".into()),
        ];
        env.extend(extra.iter().cloned());
        let mut lull = LullProcess::start(dir.path(), "lull0", &["run"], &env);
        lull.wait_healthy(SECS(30)).await;
        WebBot {
            _dir: dir,
            lull,
            webhook,
            model,
            client: reqwest::Client::new(),
        }
    }

    /// Each text in a conversation of its own, then every reply: the tool result the
    /// model was sent for each text, by text.
    async fn ask_each(&self, texts: &[String], limit: Duration) -> BTreeMap<String, String> {
        for (n, text) in texts.iter().enumerate() {
            let r = self
                .client
                .post(format!("{}/api/messages", self.lull.base_url()))
                .json(&json!({ "conversation": format!("c{n}"), "user": "ann",
                               "text": text, "id": format!("m{n}") }))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status().as_u16(), 202, "{text}");
        }
        let replies = self.webhook.wait_replies(texts.len(), limit).await;
        assert_eq!(replies.len(), texts.len(), "every message answered");
        let mut results = BTreeMap::new();
        for request in self.model.requests() {
            let messages = request.body["messages"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let asked = messages.iter().find_map(|m| {
                (m["role"] == "assistant").then(|| {
                    m["tool_calls"][0]["function"]["arguments"]
                        .as_str()
                        .and_then(|a| serde_json::from_str::<Value>(a).ok())
                })?
            });
            let result = messages.iter().find(|m| m["role"] == "tool");
            if let (Some(asked), Some(result)) = (asked, result) {
                let key = asked.as_object().and_then(|o| o.values().next().cloned());
                if let Some(Value::String(key)) = key {
                    results.insert(key, result["content"].as_str().unwrap_or("").to_owned());
                }
            }
        }
        results
    }
}

/// A loopback listener that counts the connections it accepts (and answers none).
async fn counting_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            drop(socket);
        }
    });
    (port, accepted)
}

/// Serve `router` on a loopback port.
async fn serve(router: Router) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    port
}

/// Every refused form, with what the model was told, and no connection made to the
/// loopback listener the loopback forms name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_refuses_private_addresses_in_every_form_before_connecting() {
    let (port, accepted) = counting_listener().await;
    let resolve = "public.example.test=127.0.0.1".to_owned();
    let bot = WebBot::start("lull__fetch", "url", &[("LULL_TEST_RESOLVE", resolve)]).await;
    let forms: Vec<String> = [
        "http://127.0.0.1:{P}/",
        "http://localhost:{P}/",
        "http://2130706433:{P}/",
        "http://0177.0.0.1:{P}/",
        "http://0x7f.0.0.1:{P}/",
        "http://127.1:{P}/",
        "http://[::1]:{P}/",
        "http://[::ffff:127.0.0.1]:{P}/",
        "http://0.0.0.0:{P}/",
        "http://public.example.test:{P}/",
        "ftp://127.0.0.1:{P}/",
        "file:///etc/passwd",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::ffff:169.254.169.254]/",
        "http://10.0.0.5/",
        "http://172.16.0.1/",
        "http://192.168.1.1/",
        "http://100.64.0.1/",
        "http://224.0.0.1/",
        "http://[fd00::1]/",
        "http://[fe80::1]/",
    ]
    .iter()
    .map(|f| f.replace("{P}", &port.to_string()))
    .collect();
    let results = bot.ask_each(&forms, SECS(60)).await;
    println!("| URL | what the model was told |\n| --- | --- |");
    for form in &forms {
        let told = results
            .get(form)
            .unwrap_or_else(|| panic!("no result for {form}: {results:?}"));
        println!("| `{form}` | {} |", told.replace('\n', " "));
        assert!(told.contains("refused"), "{form}: {told}");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "no connection was made");
}

/// A page server on loopback: a page, a 20 MB body, a hang, a PDF and redirects.
fn pages() -> Router {
    let page = "<html><head><title>T</title><style>body{color:red}</style>\
                <script>stealCookies()</script></head><body><h1>Lull Gazette</h1>\
                <p>The <b>quiet</b> news.</p></body></html>";
    Router::new()
        .route(
            "/page",
            get(move || async move { ([(header::CONTENT_TYPE, "text/html")], page) }),
        )
        .route(
            "/big",
            get(|| async {
                let body = "all work and no play\n".repeat(1_000_000);
                ([(header::CONTENT_TYPE, "text/plain")], body)
            }),
        )
        .route(
            "/hang",
            get(|| async {
                tokio::time::sleep(SECS(600)).await;
                "late"
            }),
        )
        .route(
            "/pdf",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "application/pdf")],
                    b"%PDF-1.7\n%binary".to_vec(),
                )
            }),
        )
        .route("/to-page", get(|| async { redirect("/page") }))
        .route(
            "/to-metadata",
            get(|| async { redirect("http://169.254.169.254/latest/meta-data/") }),
        )
        .route(
            "/to-private",
            get(|| async { redirect("http://10.0.0.5/admin") }),
        )
}

fn redirect(to: &str) -> Response {
    (StatusCode::FOUND, [(header::LOCATION, to.to_owned())]).into_response()
}

/// With `LULL_FETCH_ALLOW=127.0.0.0/8` (the tests' loopback, as an intranet would be):
/// a page's text reaches the model without its script or style, a 20 MB body is cut,
/// a hanging server is given up within the fetch's deadline, a PDF is described, a
/// redirect is followed, and a redirect to a refused address is refused at the hop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_reads_an_allowed_range_within_its_bounds() {
    let port = serve(pages()).await;
    let bot = WebBot::start(
        "lull__fetch",
        "url",
        &[("LULL_FETCH_ALLOW", "127.0.0.0/8".into())],
    )
    .await;
    let url = |path: &str| format!("http://127.0.0.1:{port}{path}");
    let paths = [
        "/page",
        "/big",
        "/hang",
        "/pdf",
        "/to-page",
        "/to-metadata",
        "/to-private",
    ];
    let urls: Vec<String> = paths.iter().map(|p| url(p)).collect();
    let started = Instant::now();
    let results = bot.ask_each(&urls, SECS(60)).await;
    let took = started.elapsed();
    let told = |path: &str| results.get(&url(path)).cloned().unwrap_or_default();
    for path in paths {
        println!(
            "{path}: {}",
            told(path)
                .chars()
                .take(200)
                .collect::<String>()
                .replace('\n', " ")
        );
    }
    let page = told("/page");
    assert!(
        page.contains("Lull Gazette") && page.contains("quiet"),
        "{page}"
    );
    assert!(
        !page.contains("stealCookies") && !page.contains("color:red"),
        "{page}"
    );
    let big = told("/big");
    assert!(
        big.contains("only its first 2 MB was read"),
        "{}",
        &big[..200]
    );
    assert!(
        big.contains("the rest was cut"),
        "bounded by LULL_TOOL_RESULT_CHARS"
    );
    assert!(big.chars().count() <= 16_000, "{}", big.chars().count());
    assert!(
        told("/hang").contains("did not answer within 10s"),
        "{}",
        told("/hang")
    );
    assert!(
        took < SECS(40),
        "the hang was given up in bounded time: {took:?}"
    );
    assert!(
        told("/pdf").contains("[not text: application/pdf, 16 bytes"),
        "{}",
        told("/pdf")
    );
    assert!(
        told("/to-page").contains("Lull Gazette"),
        "{}",
        told("/to-page")
    );
    for refused in ["/to-metadata", "/to-private"] {
        let why = told(refused);
        assert!(why.contains("refused: a redirect to"), "{refused}: {why}");
    }
}

#[derive(serde::Deserialize)]
struct Search {
    q: String,
    format: String,
}

/// A fake SearXNG: results for a query, or a 500, a hang or a malformed answer when
/// the query says so.
fn searxng() -> Router {
    Router::new().route(
        "/search",
        get(|Query(asked): Query<Search>| async move {
            assert_eq!(asked.format, "json");
            match asked.q.as_str() {
                q if q.contains("broken") => {
                    (StatusCode::INTERNAL_SERVER_ERROR, "oops").into_response()
                }
                q if q.contains("slowly") => {
                    tokio::time::sleep(SECS(600)).await;
                    "late".into_response()
                }
                q if q.contains("garbled") => "<html>not json</html>".into_response(),
                q => axum::Json(json!({ "query": q, "results": [
                    {"title": "Cats - Wikipedia", "url": "https://en.wikipedia.org/wiki/Cat",
                     "content": "The cat is a small domesticated carnivorous mammal."},
                    {"title": "Cat care", "url": "https://example.org/care", "content": "Feed it."}
                ]}))
                .into_response(),
            }
        }),
    )
}

/// Results reach the model; a 500, a hang and a malformed answer each become a tool
/// result saying so, and every reply still arrives; `/healthz` says how the last
/// search went.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_results_reach_the_model_and_its_failures_are_told() {
    let port = serve(searxng()).await;
    let bot = WebBot::start(
        "lull__search",
        "query",
        &[("LULL_SEARCH_URL", format!("http://127.0.0.1:{port}"))],
    )
    .await;
    let queries: Vec<String> = ["cats", "broken search", "search slowly", "garbled search"]
        .iter()
        .map(|q| q.to_string())
        .collect();
    let results = bot.ask_each(&queries, SECS(60)).await;
    for q in &queries {
        println!(
            "{q}: {}",
            results
                .get(q)
                .cloned()
                .unwrap_or_default()
                .replace('\n', " ")
        );
    }
    let cats = &results["cats"];
    assert!(
        cats.contains("1. Cats - Wikipedia") && cats.contains("https://en.wikipedia.org/wiki/Cat"),
        "{cats}"
    );
    assert!(
        results["broken search"].contains("answered 500"),
        "{:?}",
        results["broken search"]
    );
    assert!(
        results["search slowly"].contains("did not answer within"),
        "{:?}",
        results["search slowly"]
    );
    assert!(
        results["garbled search"].contains("not its JSON"),
        "{:?}",
        results["garbled search"]
    );
    let health: Value = reqwest::get(format!("{}/healthz", bot.lull.base_url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["web"]["fetch"], "on");
    assert!(
        health["web"]["search"].as_str().is_some_and(|s| s != "off"),
        "{health}"
    );
    let metrics = bot.lull.metrics().await.unwrap();
    let calls: f64 = metrics
        .iter()
        .filter(|(k, _)| k.starts_with("lull_tool_calls_total") && k.contains(r#"tool="search""#))
        .map(|(_, v)| v)
        .sum();
    assert_eq!(calls, 4.0, "counted in lull_tool_calls_total");
}

/// `lull check` asks the search service a query: a live one answers, a dead address
/// fails the check naming `LULL_SEARCH_URL`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_says_whether_the_search_service_answers() {
    let port = serve(searxng()).await;
    let dir = tempfile::tempdir().unwrap();
    let webhook = Webhook::start().await;
    let env = |search: String| {
        vec![
            (
                "DATABASE_URL",
                format!("sqlite:{}", dir.path().join("lull.db").display()),
            ),
            ("LULL_WEBHOOK_URL", webhook.url.clone()),
            ("LULL_SEARCH_URL", search),
        ]
    };
    let (code, report) = crate::check::lull_check(env(format!("http://127.0.0.1:{port}"))).await;
    assert_eq!(code, Some(0), "{report}");
    assert!(
        report.contains("lull__fetch on (public addresses only); lull__search through"),
        "{report}"
    );
    let (dead, _) = counting_listener().await;
    let (code, report) = crate::check::lull_check(env(format!("http://127.0.0.1:{dead}"))).await;
    assert_ne!(code, Some(0), "{report}");
    assert!(
        report.contains("lull__search: LULL_SEARCH_URL http://127.0.0.1:"),
        "{report}"
    );
}
