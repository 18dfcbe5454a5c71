//! Telegram in webhook mode, through the real binary: every replica receives, none
//! polls (replicas on several hosts). Progress is observed through the fake and the
//! database. (Discord's shards, the other half of several hosts, are tested in
//! `discord`.)

use std::path::Path;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use crate::support::db;
use crate::support::fakes::telegram::{TelegramFake, text_message};
use crate::support::process::{LullProcess, free_port};
use crate::telegram::{health, stored};

const SECS: fn(u64) -> Duration = Duration::from_secs;
/// The path lull serves the Telegram webhook at in these tests.
const HOOK_PATH: &str = "/telegram/hook";

/// A `lull run` in Telegram webhook mode on a port chosen here: the webhook URL names
/// `url_port` (the process's own unless a test puts a balancer in front).
fn webhook_process(
    dir: &Path,
    fake: &TelegramFake,
    name: &str,
    url_port: Option<u16>,
) -> LullProcess {
    webhook_process_with(dir, fake, name, url_port, &[])
}

/// [`webhook_process`] with `extra` variables.
pub(crate) fn webhook_process_with(
    dir: &Path,
    fake: &TelegramFake,
    name: &str,
    url_port: Option<u16>,
    extra: &[(&str, &str)],
) -> LullProcess {
    let port = free_port();
    let url = format!("http://127.0.0.1:{}{HOOK_PATH}", url_port.unwrap_or(port));
    let addr = format!("127.0.0.1:{port}");
    let mut vars = vec![
        ("LULL_TELEGRAM_WEBHOOK_URL", url.as_str()),
        ("LULL_HTTP_ADDR", addr.as_str()),
        ("LULL_LEASE_TTL_MS", "3000"),
    ];
    vars.extend_from_slice(extra);
    let env = crate::telegram::env(dir, fake, &vars);
    LullProcess::start(dir, name, &["run"], &env)
}

/// Wait until the fake has a webhook registered.
pub(crate) async fn wait_registered(fake: &TelegramFake) {
    fake.wait_for("the webhook registered", SECS(20), |f| f.webhook())
        .await;
}

/// A fresh database folder, fake and one webhook-mode process, healthy and with its
/// webhook registered.
pub(crate) async fn started() -> (tempfile::TempDir, TelegramFake, LullProcess) {
    let dir = tempfile::tempdir().unwrap();
    let fake = TelegramFake::start().await;
    let mut lull = webhook_process(dir.path(), &fake, "lull", None);
    lull.wait_healthy(SECS(20)).await;
    wait_registered(&fake).await;
    (dir, fake, lull)
}

/// Neither the bot token nor the webhook's secret token in any log line.
pub(crate) fn assert_secrets_absent(fake: &TelegramFake, logs: &str) {
    let token = fake.token.split_once(':').unwrap().1;
    let secret = lull_adapters::telegram::webhook_secret(&SecretString::from(fake.token.clone()));
    assert!(!logs.is_empty(), "no logs captured");
    assert!(!logs.contains(token), "the bot token leaked:\n{logs}");
    assert!(
        !logs.contains(secret.expose_secret()),
        "the webhook secret leaked:\n{logs}"
    );
}

/// Webhook mode: the webhook is registered with the secret derived from the token and
/// the update types lull reads; a burst POSTed by Telegram is stored and answered
/// once; a request with a wrong or missing secret gets 401 and stores nothing; and no
/// `getUpdates` is ever called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_mode_answers_a_burst_once_and_never_polls() {
    let (dir, fake, lull) = started().await;
    let db_path = dir.path().join("lull.db");

    let sets = fake.webhook_sets();
    let set = &sets[0];
    assert_eq!(set.url, format!("{}{HOOK_PATH}", lull.base_url()));
    let expected = lull_adapters::telegram::webhook_secret(&SecretString::from(fake.token.clone()));
    assert_eq!(set.secret_token.as_deref(), Some(expected.expose_secret()));
    assert_eq!(
        set.allowed_updates.as_deref(),
        Some(
            &[
                "message".to_owned(),
                "edited_message".to_owned(),
                "callback_query".to_owned()
            ][..]
        )
    );
    assert!(!set.drop_pending_updates, "pending updates are kept");

    let chat = 5101;
    for text in ["one", "two", "three"] {
        fake.push_message(text_message(chat, chat, text));
    }
    let sent = fake.wait_sent(chat, 1, SECS(20)).await;
    assert_eq!(sent[0].text, "[echo] 3 messages:\none\ntwo\nthree");

    // Forged requests: nothing stored, nothing answered.
    let forged = 5102;
    assert_eq!(
        fake.forge(text_message(forged, forged, "wrong"), Some("wrong-secret"))
            .await,
        401
    );
    assert_eq!(
        fake.forge(text_message(forged, forged, "none"), None).await,
        401
    );
    let verdict = db::settled(&db_path, SECS(10)).await;
    assert_eq!(verdict.counts(), (3, 1, 0, 0, 0), "{verdict:?}");
    assert!(stored(&db_path, &forged.to_string()).is_empty());
    assert!(fake.sent_to(forged).is_empty());
    assert_eq!(fake.sent_to(chat).len(), 1);

    assert!(fake.calls("getUpdates").is_empty(), "webhook mode polled");
    assert!(
        fake.deliveries().iter().all(|d| d.status == 200),
        "{:?}",
        fake.deliveries()
    );
    assert_eq!(health(&lull).await["adapters"]["telegram"], "up");
    assert_secrets_absent(&fake, &lull.logs());
}

/// A database that cannot store the update answers it 503, so Telegram delivers it
/// again; the redelivery, once the database recovers, is stored and answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_failure_answers_non_2xx_and_the_redelivery_is_answered_once() {
    let (dir, fake, lull) = started().await;
    let db_path = dir.path().join("lull.db");

    let chat = 5201;
    let lock = rusqlite::Connection::open(&db_path).unwrap();
    lock.execute_batch("BEGIN IMMEDIATE").unwrap();
    let update = fake.push_message(text_message(chat, chat, "store me later"));
    let refused = fake
        .wait_for("a refused delivery", SECS(20), |f| {
            f.deliveries()
                .into_iter()
                .find(|d| d.update_id == update && d.status != 0)
        })
        .await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(
        fake.confirmed_below() <= update,
        "confirmed though not stored"
    );
    lock.execute_batch("ROLLBACK").unwrap();
    drop(lock);

    let sent = fake.wait_sent(chat, 1, SECS(30)).await;
    assert_eq!(sent[0].text, "[echo] 1 message:\nstore me later");
    let verdict = db::settled(&db_path, SECS(10)).await;
    assert_eq!(verdict.counts(), (1, 1, 0, 0, 0), "{verdict:?}");
    let deliveries: Vec<u16> = fake
        .deliveries()
        .iter()
        .filter(|d| d.update_id == update)
        .map(|d| d.status)
        .collect();
    assert_eq!(deliveries.iter().filter(|s| **s == 200).count(), 1);
    assert!(deliveries.len() >= 2, "{deliveries:?}");
    assert_eq!(fake.sent_to(chat).len(), 1);
    assert!(
        lull.logs()
            .contains("could not store an update; answering 503")
    );
    assert_secrets_absent(&fake, &lull.logs());
}

/// Two replicas on one database behind a load balancer both receive webhooks: bursts
/// split across them are answered once each (the invariant checker reads the
/// database), and neither polls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_webhook_replicas_answer_a_split_burst_once() {
    let dir = tempfile::tempdir().unwrap();
    let db_path = dir.path().join("lull.db");
    let fake = TelegramFake::start().await;
    let mut a = webhook_process(dir.path(), &fake, "a", None);
    a.wait_healthy(SECS(20)).await;
    let mut b = webhook_process(dir.path(), &fake, "b", Some(a.port));
    b.wait_healthy(SECS(20)).await;
    wait_registered(&fake).await;
    fake.balance(&[a.base_url(), b.base_url()]);

    let chats = [5301, 5302, 5303];
    for round in 0..4 {
        for chat in chats {
            fake.push_message(text_message(chat, chat, &format!("m{round}")));
        }
    }
    for chat in chats {
        let sent = fake.wait_sent(chat, 1, SECS(20)).await;
        assert_eq!(sent[0].text, "[echo] 4 messages:\nm0\nm1\nm2\nm3");
    }
    let verdict = db::settled(&db_path, SECS(15)).await;
    assert_eq!(verdict.counts(), (12, 3, 0, 0, 0), "{verdict:?}");
    for chat in chats {
        assert_eq!(fake.sent_to(chat).len(), 1, "chat {chat}");
    }
    let deliveries = fake.deliveries();
    for process in [&a, &b] {
        let received = deliveries
            .iter()
            .filter(|d| d.target.starts_with(&process.base_url()) && d.status == 200)
            .count();
        assert!(
            received >= 4,
            "{} received {received} of 12 updates",
            process.name
        );
    }
    assert!(fake.calls("getUpdates").is_empty(), "webhook mode polled");
    assert_secrets_absent(&fake, &(a.logs() + &b.logs()));
}
