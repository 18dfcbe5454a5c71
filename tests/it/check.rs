//! `lull check` against loopback fakes, with a good and a broken configuration, and
//! `lull healthcheck` against a running and a missing process.

use std::process::Command;
use std::time::Duration;

use crate::support::fakes::discord::DiscordFake;
use crate::support::fakes::openai::FakeOpenAi;
use crate::support::fakes::telegram::{BOT_USERNAME, TelegramFake};
use crate::support::fakes::webhook::Webhook;
use crate::support::process::{LullProcess, free_port};

const DISCORD_TOKEN: &str = "discord-secret-token";

/// The same fakes the adapter tests use: each accepts only its own token.
pub(crate) async fn platform_fakes() -> (TelegramFake, DiscordFake) {
    (
        TelegramFake::start().await,
        DiscordFake::start(DISCORD_TOKEN).await,
    )
}

pub(crate) async fn lull_check(env: Vec<(&'static str, String)>) -> (Option<i32>, String) {
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
    let (telegram, discord) = platform_fakes().await;
    let model = FakeOpenAi::start().await;
    let webhook = Webhook::start().await;
    let (code, report) = lull_check(vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        ),
        ("TELEGRAM_BOT_TOKEN", telegram.token.clone()),
        ("TELEGRAM_API_URL", telegram.url.clone()),
        ("DISCORD_BOT_TOKEN", DISCORD_TOKEN.into()),
        ("DISCORD_API_URL", discord.api_url.clone()),
        ("OPENAI_BASE_URL", model.base_url.clone()),
        ("OPENAI_MODEL", "fake-model".into()),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
        (
            "LULL_TELEGRAM_WEBHOOK_URL",
            "https://bot.example/telegram".into(),
        ),
        ("LULL_DISCORD_SHARDS", "2".into()),
        ("LULL_MAX_IMAGE_BYTES", "5000000".into()),
    ])
    .await;
    assert_eq!(code, Some(0), "{report}");
    let telegram_ok = format!("ok    telegram      the token belongs to @{BOT_USERNAME}");
    for expected in [
        "ok    configuration adapters: telegram (webhook at https://bot.example/telegram), discord (2 shards), http",
        "; images to the model up to 5000000 bytes, 4 a reply (20971520 bytes in all); voice transcribed by whisper-1 up to 300 s",
        "ok    database",
        "does not exist yet",
        telegram_ok.as_str(),
        "ok    discord       the token belongs to lull",
        "ok    http adapter",
        "ok    menus         telegram private chats /new /stop /retry /model /persona /usage /status /remind /schedule /jobs /timezone /memory /forgetme /help, group admins /new",
        "discord slash commands /new /stop /retry /model /persona /usage /status /remind /schedule /jobs /timezone /memory /forgetme /help; ack reaction 👀 while a reply is pending",
        "ok    jobs          none active",
        "ok    model         fake-model is served by",
        "all checks passed",
    ] {
        assert!(
            report.contains(expected),
            "missing '{expected}' in:\n{report}"
        );
    }
    // The check changes nothing: no database file was created.
    let created: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(created.is_empty(), "{created:?}");
}

/// On an existing database the check reads, verifies and changes nothing: the file's
/// bytes are the same afterwards and no journal is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_leaves_an_existing_database_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lull.db");
    let timers = lull_core::dispatcher::DispatchSettings::default().timers;
    drop(lull_core::store::SqliteStore::open(&path, timers).unwrap());
    // The pool closes its connections in the background; the last one removes the WAL.
    let wal = dir.path().join("lull.db-wal");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while wal.exists() {
        assert!(std::time::Instant::now() < deadline, "the WAL stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let before = std::fs::read(&path).unwrap();
    let files_before: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let webhook = Webhook::start().await;
    let (code, report) = lull_check(vec![
        ("DATABASE_URL", format!("sqlite:{}", path.display())),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
    ])
    .await;
    assert_eq!(code, Some(0), "{report}");
    assert!(
        report.contains(&format!(
            "is sound: 0 conversations, schema {}",
            lull_core::store::SQLITE_SCHEMA
        )),
        "{report}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), before, "the file changed");
    let files_after: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(files_before, files_after);
}

/// A `LULL_*` name no setting reads stops lull at start, naming the setting it most
/// likely meant (a typo in a budget must not leave the budget off); a name listed in
/// `LULL_IGNORE` passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_lull_variable_is_named_and_refused() {
    let dir = tempfile::tempdir().unwrap();
    let database = (
        "DATABASE_URL",
        format!("sqlite:{}", dir.path().join("lull.db").display()),
    );
    let (code, report) = lull_check(vec![
        database.clone(),
        ("LULL_USER_DAILY_TOKEN", "500".into()),
    ])
    .await;
    assert_eq!(code, Some(2), "{report}");
    assert!(
        report.contains(
            "LULL_USER_DAILY_TOKEN is not a lull setting; did you mean LULL_USER_DAILY_TOKENS?"
        ),
        "{report}"
    );
    assert!(report.contains("LULL_IGNORE"), "{report}");
    let (code, report) = lull_check(vec![
        database,
        ("LULL_SIDECAR_PORT", "9000".into()),
        ("LULL_IGNORE", "LULL_SIDECAR_PORT".into()),
    ])
    .await;
    assert!(!report.contains("not a lull setting"), "{report}");
    assert_ne!(code, Some(2), "{report}");
}

/// The job table is read back: active jobs and the next due, and a job whose stored
/// schedule this build cannot read is named (it would be paused when due).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reads_the_job_table_back() {
    use lull_core::store::{JobKind, JobStore, NewJob};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("lull.db");
    let timers = lull_core::dispatcher::DispatchSettings::default().timers;
    let store = lull_core::store::SqliteStore::open(&path, timers).unwrap();
    let now = lull_core::domain::Timestamp::now();
    for (origin, schedule) in [("a", "every 1h"), ("b", "every blue moon")] {
        let job = NewJob {
            conversation: lull_core::domain::ConversationRef::new(
                lull_core::domain::Platform::Http,
                "c1",
            ),
            is_group: false,
            creator: "u1".into(),
            creator_name: "Ann".into(),
            kind: JobKind::Reminder,
            schedule: schedule.into(),
            timezone: "UTC".into(),
            text: "stretch".into(),
            first_at: now.plus(Duration::from_secs(3600)),
            max_per_chat: 10,
            origin: origin.into(),
            now,
        };
        store.create_job(job).await.unwrap();
    }
    drop(store);
    let webhook = Webhook::start().await;
    let (code, report) = lull_check(vec![
        ("DATABASE_URL", format!("sqlite:{}", path.display())),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
    ])
    .await;
    assert_ne!(code, Some(0), "{report}");
    assert!(
        report.contains("2 active; unreadable schedule or time zone: #2"),
        "{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_what_to_fix_in_a_broken_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let (telegram, discord) = platform_fakes().await;
    let model = FakeOpenAi::start().await;
    let (code, report) = lull_check(vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("missing/lull.db").display()),
        ),
        ("TELEGRAM_BOT_TOKEN", "999:wrong-telegram-token".into()),
        ("TELEGRAM_API_URL", telegram.url.clone()),
        ("DISCORD_BOT_TOKEN", "wrong-discord-token".into()),
        ("DISCORD_API_URL", discord.api_url.clone()),
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
    // Nothing would run: no adapter is configured.
    assert!(
        report.contains("FAIL  adapters") && report.contains("`lull run` would stop at once"),
        "{report}"
    );

    // A Bot API that cannot be reached (offline): the report says so, and does not
    // send the user to a setting that is fine; a token of the wrong shape is caught
    // before anything is asked, naming the variable and not the token.
    let unreachable = format!("http://127.0.0.1:{}", free_port());
    let (code, report) = lull_check(vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        ),
        (
            "TELEGRAM_BOT_TOKEN",
            "110201543:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw".into(),
        ),
        ("TELEGRAM_API_URL", unreachable.clone()),
    ])
    .await;
    assert_eq!(code, Some(1), "{report}");
    assert!(
        report.contains("FAIL  telegram")
            && report.contains("cannot reach the Telegram Bot API")
            && report.contains("is this machine online?"),
        "{report}"
    );
    assert!(
        !report.contains("AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"),
        "{report}"
    );
    let (code, report) = lull_check(vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        ),
        (
            "TELEGRAM_BOT_TOKEN",
            "bot110201543:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw".into(),
        ),
    ])
    .await;
    assert_eq!(code, Some(1), "{report}");
    assert!(
        report.contains("TELEGRAM_BOT_TOKEN does not look like a bot token"),
        "{report}"
    );
    assert!(
        !report.contains("AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw"),
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
    let out = healthcheck(addr.clone()).await.unwrap();
    assert_eq!(out.status.code(), Some(1));
    // Nothing listens: it says what to check.
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!("nothing listens on {addr}: is `lull run` running")),
        "{said}"
    );
}

/// `lull check` on PostgreSQL: it connects and reads the schema version, and creates
/// nothing (an empty database stays empty; `lull run` migrates it); an unreachable
/// server fails naming DATABASE_URL, without the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_inspects_a_postgres_database_read_only() {
    use crate::support::db::{self, Postgres};
    let Some(url) = crate::support::postgres::fresh_database() else {
        return;
    };
    let webhook = Webhook::start().await;
    let tables = "SELECT COUNT(*) FROM pg_tables WHERE schemaname = 'public'";
    let (code, report) = lull_check(vec![
        ("DATABASE_URL", url.clone()),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
    ])
    .await;
    assert_eq!(code, Some(0), "{report}");
    assert!(report.contains("(PostgreSQL 1"), "{report}");
    assert!(
        report.contains(&format!(
            "schema 0 (`lull run` migrates it to {})",
            lull_core::store::POSTGRES_SCHEMA
        )),
        "{report}"
    );
    assert_eq!(
        db::count(&Postgres(url.clone()), tables),
        0,
        "check created something"
    );

    let timers = lull_core::dispatcher::DispatchSettings::default().timers;
    drop(
        lull_core::store::PostgresStore::open(&url, timers, lull_core::store::TimeSource::Database)
            .await
            .unwrap(),
    );
    let created = db::count(&Postgres(url.clone()), tables);
    let (code, report) = lull_check(vec![
        ("DATABASE_URL", url.clone()),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
    ])
    .await;
    assert_eq!(code, Some(0), "{report}");
    assert!(
        report.contains(&format!(": schema {}\n", lull_core::store::POSTGRES_SCHEMA)),
        "{report}"
    );
    assert_eq!(db::count(&Postgres(url), tables), created);

    let port = free_port();
    let (code, report) = lull_check(vec![
        (
            "DATABASE_URL",
            format!("postgres://lull:hunter2-secret@127.0.0.1:{port}/lull"),
        ),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
    ])
    .await;
    assert_eq!(code, Some(1), "{report}");
    assert!(
        report.contains("FAIL  database") && report.contains("DATABASE_URL"),
        "{report}"
    );
    assert!(!report.contains("hunter2"), "{report}");
}

/// A `.env` line that does not parse is named by its number, and never shown (it may
/// hold a secret); lull exits 2 before doing anything.
#[test]
fn a_broken_env_file_is_named_by_line_and_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join(".env"),
        "OPENAI_MODEL=gpt-4.1-mini\n# a comment\n\nOPENAI_API_KEY=\"sk-never-shown\n",
    )
    .unwrap();
    let out = std::process::Command::new(crate::support::process::binary())
        .arg("check")
        .current_dir(dir.path())
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("line 4 does not parse"), "{stderr}");
    assert!(!stderr.contains("sk-never-shown"), "{stderr}");
}

/// A newcomer's configurations that run but are not what they meant: Telegram with
/// nobody admitted and the echo responder answering it, replies posted back to lull
/// itself. Each is a `warn` line naming what to set; warnings alone pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_warns_of_a_newcomers_configurations() {
    let dir = tempfile::tempdir().unwrap();
    let (telegram, _discord) = platform_fakes().await;
    let port = free_port();
    let (code, report) = lull_check(vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        ),
        ("TELEGRAM_BOT_TOKEN", telegram.token.clone()),
        ("TELEGRAM_API_URL", telegram.url.clone()),
        ("LULL_HTTP_ADDR", format!("127.0.0.1:{port}")),
        (
            "LULL_WEBHOOK_URL",
            format!("http://localhost:{port}/replies"),
        ),
    ])
    .await;
    eprintln!("{report}");
    assert_eq!(code, Some(0), "warnings alone pass:\n{report}");
    for expected in [
        "warn  access        nobody on Telegram can use the bot",
        "LULL_ALLOWED_USERS=telegram:<your id>",
        "warn  model         the offline echo responder answers Telegram",
        "warn  http adapter  LULL_WEBHOOK_URL",
        "replies would be posted back to lull",
    ] {
        assert!(
            report.contains(expected),
            "missing '{expected}' in:\n{report}"
        );
    }
    // Admitting someone there ends the first warning.
    let (_, report) = lull_check(vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        ),
        ("TELEGRAM_BOT_TOKEN", telegram.token.clone()),
        ("TELEGRAM_API_URL", telegram.url.clone()),
        ("LULL_ALLOWED_USERS", "telegram:42".into()),
    ])
    .await;
    assert!(!report.contains("nobody on Telegram"), "{report}");
}

/// Each subcommand's `--help` lists the settings it reads: `healthcheck` its address,
/// `backup` its database (both still accept the rest, so one environment serves
/// all); `run` every one.
#[test]
fn each_subcommands_help_lists_its_own_settings() {
    let help = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_lull"))
            .args(args)
            .env_clear()
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let healthcheck = help(&["healthcheck", "--help"]);
    assert!(healthcheck.contains("--http-addr"), "{healthcheck}");
    assert!(
        !healthcheck.contains("--telegram-bot-token"),
        "{healthcheck}"
    );
    assert!(!healthcheck.contains("--database-url"), "{healthcheck}");
    let backup = help(&["backup", "--help"]);
    assert!(
        backup.contains("--database-url") && !backup.contains("--openai-model"),
        "{backup}"
    );
    let run = help(&["run", "--help"]);
    assert!(run.contains("--telegram-bot-token") && run.contains("--database-url"));
    // The rest is still accepted: one environment serves every subcommand.
    let out = Command::new(env!("CARGO_BIN_EXE_lull"))
        .args([
            "healthcheck",
            "--openai-model",
            "x",
            "--http-addr",
            "127.0.0.1:1",
        ])
        .env_clear()
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("nothing listens on 127.0.0.1:1"),
        "{stderr}"
    );
}
