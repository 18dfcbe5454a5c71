//! `/healthz` tells the truth about the database: a damaged file is refused at start
//! (naming `DATABASE_URL`), and damage found while running turns health 503, logged
//! once, not once per refused message.

use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use crate::support::db;
use crate::support::fakes::webhook::Webhook;
use crate::support::process::{LullProcess, post_message};

fn env(dir: &Path, webhook: &Webhook) -> Vec<(&'static str, String)> {
    vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.join("lull.db").display()),
        ),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
        ("LULL_DEBOUNCE_MS", "100".into()),
        ("LULL_MAX_WAIT_MS", "2000".into()),
        ("RUST_LOG", "info".into()),
    ]
}

/// Overwrite every page but the first (the header, which keeps the file recognisable
/// as SQLite) with bytes that are no B-tree page: what a failing disk or a botched
/// copy leaves. The WAL is checkpointed first, so every page is read from the file.
pub(crate) fn damage(path: &Path) {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    let (busy, _, _): (i64, i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap();
    assert_eq!(busy, 0, "checkpoint blocked");
    let page_size = conn
        .query_row("PRAGMA page_size", [], |r| r.get::<_, i64>(0))
        .unwrap() as u64;
    let len = std::fs::metadata(path).unwrap().len();
    assert!(
        len > 2 * page_size,
        "a file of one page has nothing to damage"
    );
    let mut file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.seek(SeekFrom::Start(page_size)).unwrap();
    file.write_all(&vec![0xA5; (len - page_size) as usize])
        .unwrap();
    file.sync_all().unwrap();
    // A change every connection notices (it touches only page 1): readers drop their
    // cached pages and read the damaged file.
    conn.execute_batch("PRAGMA user_version = 4242").unwrap();
}

async fn healthz(lull: &LullProcess) -> (u16, serde_json::Value) {
    let r = reqwest::get(format!("{}/healthz", lull.base_url()))
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_found_while_running_turns_health_503_and_is_logged_once() {
    let dir = tempfile::tempdir().unwrap();
    let webhook = Webhook::start().await;
    let mut lull = LullProcess::start(dir.path(), "lull", &["run"], &env(dir.path(), &webhook));
    lull.wait_healthy(Duration::from_secs(20)).await;
    let client = reqwest::Client::new();
    for i in 0..20 {
        let r = post_message(
            &client,
            &lull.base_url(),
            &format!("c{i}"),
            "1",
            &"x".repeat(2000),
        )
        .await
        .unwrap();
        assert_eq!(r.status(), 202);
    }
    webhook.wait_replies(20, Duration::from_secs(20)).await;
    db::settled(&dir.path().join("lull.db"), Duration::from_secs(10)).await;
    assert_eq!(healthz(&lull).await.0, 200);

    damage(&dir.path().join("lull.db"));
    for i in 0..5 {
        let r = post_message(&client, &lull.base_url(), "new", &format!("m{i}"), "hello")
            .await
            .unwrap();
        assert_eq!(r.status(), 503, "a damaged database refuses the message");
    }
    let (status, body) = healthz(&lull).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["database"].as_str().unwrap().contains("damaged"),
        "{body}"
    );
    let logs = lull.logs();
    let reports = logs
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains("the database is failing"))
        .count();
    assert_eq!(
        reports, 1,
        "one report per change, not per message:\n{logs}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_file_is_refused_at_start_naming_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let webhook = Webhook::start().await;
    let env = env(dir.path(), &webhook);
    let mut lull = LullProcess::start(dir.path(), "first", &["run"], &env);
    lull.wait_healthy(Duration::from_secs(20)).await;
    let client = reqwest::Client::new();
    for i in 0..10 {
        post_message(
            &client,
            &lull.base_url(),
            &format!("c{i}"),
            "1",
            &"y".repeat(3000),
        )
        .await
        .unwrap();
    }
    webhook.wait_replies(10, Duration::from_secs(20)).await;
    lull.signal("TERM");
    assert_eq!(lull.wait_exit(Duration::from_secs(20)), Some(0));

    damage(&dir.path().join("lull.db"));
    let mut second = LullProcess::start(dir.path(), "second", &["run"], &env);
    let code = second.wait_exit(Duration::from_secs(20));
    assert!(matches!(code, Some(c) if c != 0), "exit {code:?}");
    let logs = second.logs();
    assert!(
        logs.contains("DATABASE_URL") && logs.contains("damaged"),
        "{logs}"
    );
}
