//! `lull check` against loopback fakes, with a good and a broken configuration, and
//! `lull healthcheck` against a running and a missing process.

use std::process::Command;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use serde_json::json;

use crate::support::openai_fake::FakeOpenAi;
use crate::support::process::{LullProcess, free_port};
use crate::support::webhook::Webhook;

const TELEGRAM_TOKEN: &str = "123456:telegram-secret";
const DISCORD_TOKEN: &str = "discord-secret-token";

/// Minimal Telegram getMe and Discord users/@me that accept only the right tokens.
async fn platform_fakes() -> String {
    let router = Router::new()
        .route(
            "/{bot}/getMe",
            get(|axum::extract::Path(bot): axum::extract::Path<String>| async move {
                if bot == format!("bot{TELEGRAM_TOKEN}") {
                    (StatusCode::OK, axum::Json(json!({"ok": true, "result": {"id": 1, "is_bot": true, "first_name": "lull", "username": "lull_bot"}})))
                } else {
                    (StatusCode::UNAUTHORIZED, axum::Json(json!({"ok": false, "error_code": 401, "description": "Unauthorized"})))
                }
            }),
        )
        .route(
            "/api/v10/users/@me",
            get(|headers: HeaderMap| async move {
                if headers.get("authorization").and_then(|v| v.to_str().ok()) == Some(&format!("Bot {DISCORD_TOKEN}")) {
                    (StatusCode::OK, axum::Json(json!({"id": "1", "username": "lull", "discriminator": "0"})))
                } else {
                    (StatusCode::UNAUTHORIZED, axum::Json(json!({"message": "401: Unauthorized", "code": 0})))
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    url
}

async fn lull_check(env: Vec<(&'static str, String)>) -> (Option<i32>, String) {
    tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_lull"))
            .arg("check")
            .env_clear()
            .envs(env)
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.code(), text)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_a_good_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let fakes = platform_fakes().await;
    let model = FakeOpenAi::start().await;
    let webhook = Webhook::start().await;
    let (code, report) = lull_check(vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        ),
        ("TELEGRAM_BOT_TOKEN", TELEGRAM_TOKEN.into()),
        ("TELEGRAM_API_URL", fakes.clone()),
        ("DISCORD_BOT_TOKEN", DISCORD_TOKEN.into()),
        ("DISCORD_API_URL", fakes),
        ("OPENAI_BASE_URL", model.base_url.clone()),
        ("OPENAI_MODEL", "fake-model".into()),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
    ])
    .await;
    assert_eq!(code, Some(0), "{report}");
    for expected in [
        "ok    configuration adapters: telegram, discord, http",
        "ok    database",
        "ok    telegram      the token belongs to @lull_bot",
        "ok    discord       the token belongs to lull",
        "ok    http adapter",
        "ok    model         fake-model is served by",
        "all checks passed",
    ] {
        assert!(
            report.contains(expected),
            "missing '{expected}' in:\n{report}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_what_to_fix_in_a_broken_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let fakes = platform_fakes().await;
    let model = FakeOpenAi::start().await;
    let (code, report) = lull_check(vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("missing/lull.db").display()),
        ),
        ("TELEGRAM_BOT_TOKEN", "999:wrong-telegram-token".into()),
        ("TELEGRAM_API_URL", fakes.clone()),
        ("DISCORD_BOT_TOKEN", "wrong-discord-token".into()),
        ("DISCORD_API_URL", fakes),
        ("OPENAI_BASE_URL", model.base_url.clone()),
        ("OPENAI_MODEL", "no-such-model".into()),
    ])
    .await;
    assert_eq!(code, Some(1), "{report}");
    for expected in [
        "FAIL  database",
        "DATABASE_URL",
        "FAIL  telegram",
        "TELEGRAM_BOT_TOKEN",
        "FAIL  discord",
        "DISCORD_BOT_TOKEN",
        "FAIL  model",
        "OPENAI_MODEL=no-such-model",
        "fake-model",
    ] {
        assert!(
            report.contains(expected),
            "missing '{expected}' in:\n{report}"
        );
    }
    assert!(
        !report.contains("wrong-telegram-token") && !report.contains("wrong-discord-token"),
        "{report}"
    );

    // Unreachable servers and an invalid setting are reported too.
    let (code, report) = lull_check(vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        ),
        (
            "OPENAI_BASE_URL",
            format!("http://127.0.0.1:{}/v1", free_port()),
        ),
        ("LULL_MAX_BATCH", "0".into()),
    ])
    .await;
    assert_eq!(code, Some(1), "{report}");
    assert!(
        report.contains("FAIL  configuration LULL_MAX_BATCH"),
        "{report}"
    );
    let (code, report) = lull_check(vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        ),
        (
            "OPENAI_BASE_URL",
            format!("http://127.0.0.1:{}/v1", free_port()),
        ),
    ])
    .await;
    assert_eq!(code, Some(1), "{report}");
    assert!(
        report.contains("FAIL  model") && report.contains("OPENAI_BASE_URL"),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthcheck_follows_the_running_process() {
    let dir = tempfile::tempdir().unwrap();
    let webhook = Webhook::start().await;
    let mut lull = LullProcess::start(
        dir.path(),
        "lull",
        &["run"],
        &[
            (
                "DATABASE_URL",
                format!("sqlite:{}", dir.path().join("lull.db").display()),
            ),
            ("LULL_WEBHOOK_URL", webhook.url.clone()),
        ],
    );
    lull.wait_healthy(Duration::from_secs(20)).await;
    let addr = format!("127.0.0.1:{}", lull.port);
    let healthcheck = |addr: String| {
        tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_lull"))
                .args(["healthcheck"])
                .env_clear()
                .env("LULL_HTTP_ADDR", addr)
                .output()
                .unwrap()
        })
    };
    let out = healthcheck(addr.clone()).await.unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"status\":\"ok\""));
    lull.kill9();
    let out = healthcheck(addr).await.unwrap();
    assert_eq!(out.status.code(), Some(1));
}
