//! `lull backup PATH` through the real binary: a copy taken while another process
//! stores messages holds every message acknowledged before it began, passes SQLite's
//! integrity check, and a `lull run` started on it answers them; it never overwrites a
//! file; for PostgreSQL it names `pg_dump` and fails.

use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::http_api::start_with;
use crate::support::db;
use crate::support::fakes::webhook::Webhook;
use crate::support::process::{LullProcess, binary, post_message};

/// Run `lull backup` with `database_url`; (exit code, stdout, stderr).
fn lull_backup(database_url: &str, target: &std::path::Path) -> (Option<i32>, String, String) {
    let out = Command::new(binary())
        .arg("backup")
        .arg(target)
        .env_clear()
        .env("DATABASE_URL", database_url)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output()
        .expect("run lull backup");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_taken_while_messages_arrive_restores_with_every_acknowledged_one() {
    let app = start_with(Webhook::start().await, &[("LULL_ECHO_DELAY_MS", "20")]).await;
    let url = app.lull.base_url();
    // Messages keep arriving, in several conversations, before, during and after the
    // backup; each is recorded with the moment its 202 came.
    let acked: Arc<Mutex<Vec<(String, String, Instant)>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender = {
        let (acked, stop) = (acked.clone(), stop.clone());
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let conversation = format!("c{}", n % 7);
                let id = n.to_string();
                let r = post_message(&client, &url, &conversation, &id, "hello")
                    .await
                    .unwrap();
                assert_eq!(r.status(), 202);
                acked
                    .lock()
                    .unwrap()
                    .push((conversation, id, Instant::now()));
                n += 1;
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let copy = app.dir.path().join("backup.db");
    let begun = Instant::now();
    let database = format!("sqlite:{}", app.db().display());
    let (code, stdout, stderr) = tokio::task::spawn_blocking(move || lull_backup(&database, &copy))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    sender.await.unwrap();
    println!("{stdout}{stderr}");
    assert_eq!(code, Some(0), "{stdout}{stderr}");
    assert!(stdout.contains("integrity check ok"), "{stdout}");

    let copy = app.dir.path().join("backup.db");
    let acked = acked.lock().unwrap().clone();
    let before: Vec<_> = acked.iter().filter(|(_, _, at)| *at < begun).collect();
    let after = acked.len() - before.len();
    assert!(
        before.len() > 20 && after > 5,
        "{} before, {after} after",
        before.len()
    );
    // The http adapter stores a client's string id as its JSON text ("7" quoted).
    let stored: std::collections::BTreeSet<(String, String)> = db::messages(&copy)
        .into_iter()
        .map(|m| (m.conversation, m.message_id))
        .collect();
    let missing: Vec<_> = before
        .iter()
        .filter(|(c, id, _)| !stored.contains(&(c.clone(), format!("\"{id}\""))))
        .map(|(c, id, _)| format!("{c}/{id}"))
        .collect();
    assert!(
        missing.is_empty(),
        "{} acknowledged before the backup are not in it, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    println!(
        "backup: {} messages in the copy; {} acknowledged before it began, all there; {after} after",
        stored.len(),
        before.len()
    );
    assert!(
        !copy.with_extension("db-wal").exists(),
        "the copy is a whole file"
    );
    // The copy has an idempotency salt of its own: restored, it never sends a tool
    // server the keys its original sent for other calls.
    let salt = |path: &std::path::Path| db::rows(path, "SELECT salt FROM instance")[0][0].clone();
    assert_eq!(salt(&copy).len(), 32);
    assert_ne!(salt(&copy), salt(&app.db()), "the copy's salt is its own");

    // Restored: a fresh process on the copy alone answers what it holds, once.
    let restored = tempfile::tempdir().unwrap();
    std::fs::copy(&copy, restored.path().join("lull.db")).unwrap();
    let webhook = Webhook::start().await;
    let env = vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", restored.path().join("lull.db").display()),
        ),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
        ("LULL_DEBOUNCE_MS", "200".into()),
    ];
    let mut lull = LullProcess::start(restored.path(), "restored", &["run"], &env);
    lull.wait_healthy(Duration::from_secs(20)).await;
    let verdict = db::settled(&restored.path().join("lull.db"), Duration::from_secs(30)).await;
    assert_eq!((verdict.duplicates, verdict.lost), (0, 0), "{verdict:?}");
}

#[test]
fn a_backup_never_overwrites_and_postgres_is_pointed_to_pg_dump() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("taken.db");
    std::fs::write(&target, b"an earlier backup").unwrap();
    let (code, _, stderr) = lull_backup(
        &format!("sqlite:{}", dir.path().join("missing.db").display()),
        &dir.path().join("new.db"),
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no database at"), "{stderr}");
    let source = dir.path().join("lull.db");
    rusqlite::Connection::open(&source)
        .unwrap()
        .execute_batch(
            "CREATE TABLE conversations (id INTEGER); CREATE TABLE messages (id INTEGER);",
        )
        .unwrap();
    let (code, _, stderr) = lull_backup(&format!("sqlite:{}", source.display()), &target);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("never overwrites"), "{stderr}");
    assert_eq!(std::fs::read(&target).unwrap(), b"an earlier backup");
    // A folder that does not exist is named, with how to make it.
    let missing = dir.path().join("backups/daily");
    let (code, _, stderr) = lull_backup(
        &format!("sqlite:{}", source.display()),
        &missing.join("copy.db"),
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "the folder {} does not exist (create it first: mkdir -p",
            missing.display()
        )),
        "{stderr}"
    );
    let (code, _, stderr) = lull_backup(
        "postgres://lull:s3cret-pw@127.0.0.1:9/lull",
        &dir.path().join("pg.db"),
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("pg_dump"), "{stderr}");
    assert!(!stderr.contains("s3cret-pw"), "{stderr}");
}
