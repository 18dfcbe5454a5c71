//! `lull_ingest_many` stores a group as sets (schema V16), `lull_ingest_rows` row by
//! row (V15's function; the store picks by the group's size): each must leave the
//! same messages, versions, due times and timers as `lull_ingest` storing the group's
//! messages one by one, in their order. One seeded sequence of calls (new and known
//! conversations, duplicates inside a group and across groups, groups flagged late,
//! stored waits, a held timer, the batch limit reached, clocks that step back) goes
//! through both, on two fresh databases; every answer and the rows left behind must
//! agree. The counter-test
//! breaks one rule of the set-based body (the pending count) and shows the comparison
//! finds it.

use std::collections::BTreeMap;

use tokio_postgres::{Client, NoTls};

use crate::support::postgres::fresh_database;

const MAX_WAIT_MS: i64 = 10_000;
const MAX_BATCH: i64 = 8;
/// Every this many messages a conversation is answered (as a round's commit leaves
/// it: answered up to its version, its timer gone), so pending counts start afresh.
const ANSWER_EVERY: usize = 20;
const BASE: i64 = 1_800_000_000_000;

/// One message's arguments, as the store passes them.
#[derive(Debug, Clone)]
struct Call {
    platform: String,
    key: String,
    is_group: bool,
    message_id: String,
    now: Option<i64>,
    wait: (i64, i64),
}

/// What a message was answered: conversation (by platform and key), version, due
/// time, now.
type Answer = (String, Option<i64>, Option<i64>, i64);

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("connect");
    tokio::spawn(connection);
    client
}

/// A fresh migrated database with the same known conversations (same ids): one with
/// stored waits, one whose messages were answered up to version 3, one with a timer
/// held far ahead and a failure's backoff.
async fn prepared() -> Option<(String, Client)> {
    let url = fresh_database()?;
    drop(
        lull_core::store::PostgresStore::open(
            &url,
            lull_core::store::conformance::policy(),
            lull_core::store::TimeSource::Database,
        )
        .await
        .expect("migrate"),
    );
    let client = connect(&url).await;
    client
        .batch_execute(&format!(
            "INSERT INTO conversations (platform, key, created_at, rhythm_first_ms, rhythm_burst_ms)
                 VALUES ('http', 'k0', 0, 400, 900);
             INSERT INTO conversations (platform, key, created_at, version, answered_version)
                 VALUES ('http', 'k1', 0, 3, 3);
             INSERT INTO conversations (platform, key, created_at, is_group)
                 VALUES ('telegram', 'k2', 0, TRUE);
             INSERT INTO timers (conversation_id, platform, due_at, armed_version, armed_at,
                                 armed_by, retry_at, held_until)
                 SELECT id, 'telegram', {held}, 0, 0, 'before', {retry}, {held}
                   FROM conversations WHERE key = 'k2';",
            held = BASE + 60_000,
            retry = BASE + 5_000,
        ))
        .await
        .expect("known conversations");
    Some((url, client))
}

/// The seeded sequence: 400 messages over 8 conversations on two platforms.
fn calls(seed: u64) -> Vec<Call> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut sent: Vec<(String, String, String)> = Vec::new();
    let mut now = BASE;
    (0..400)
        .map(|i| {
            let k = rng.usize(0..8);
            let platform = if k == 2 || k == 6 { "telegram" } else { "http" };
            let key = format!("k{k}");
            // About one in eight is a redelivery of a message sent before.
            let message_id = match sent.iter().rfind(|s| s.1 == key) {
                Some(earlier) if rng.u8(0..8) == 0 => earlier.2.clone(),
                _ => format!("m{i}"),
            };
            sent.push((platform.into(), key.clone(), message_id.clone()));
            // Mostly forward, sometimes a step back (another process's clock).
            now += rng.i64(-300..2_500);
            let wait = if rng.bool() {
                (1500, 1500)
            } else {
                (300, 1500)
            };
            Call {
                platform: platform.into(),
                key,
                is_group: rng.u8(0..10) == 0,
                message_id,
                now: Some(now),
                wait,
            }
        })
        .collect()
}

/// Every message through `lull_ingest`, one by one.
async fn one_by_one(client: &Client, calls: &[Call]) -> Vec<Answer> {
    let statement = client
        .prepare(
            "SELECT o_conversation, o_version, o_due_at, o_now FROM lull_ingest(
                 $1, $2, $3, $4, 'u', 'U', 'text', NULL, 'holder', $5, $6, $7, $8, $9)",
        )
        .await
        .expect("prepare");
    let mut answers = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        answer_at(client, i).await;
        let row = client
            .query_one(
                &statement,
                &[
                    &c.platform,
                    &c.key,
                    &c.is_group,
                    &c.message_id,
                    &c.now,
                    &c.wait.0,
                    &c.wait.1,
                    &MAX_WAIT_MS,
                    &MAX_BATCH,
                ],
            )
            .await
            .expect("lull_ingest");
        let key = key_of(client, row.get(0)).await;
        answers.push((key, row.get(1), row.get(2), row.get(3)));
    }
    answers
}

/// Before message `i`: every `ANSWER_EVERY` messages, one conversation answered.
async fn answer_at(client: &Client, i: usize) {
    if i == 0 || !i.is_multiple_of(ANSWER_EVERY) {
        return;
    }
    let key = format!("k{}", (i / ANSWER_EVERY) % 8);
    client
        .execute(
            "WITH answered AS (
                 UPDATE conversations SET answered_version = version WHERE key = $1 RETURNING id)
             DELETE FROM timers WHERE conversation_id IN (SELECT id FROM answered)",
            &[&key],
        )
        .await
        .expect("answer a conversation");
}

/// A conversation's key (read after the call: a conversation the call created is not
/// in its own statement's snapshot).
async fn key_of(client: &Client, conversation: i64) -> String {
    client
        .query_one(
            "SELECT key FROM conversations WHERE id = $1",
            &[&conversation],
        )
        .await
        .expect("the conversation")
        .get(0)
}

/// The same messages through `function` (`lull_ingest_many` or `lull_ingest_rows`),
/// in groups of 1 to 24.
async fn in_groups(client: &Client, function: &str, calls: &[Call], seed: u64) -> Vec<Answer> {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5e75);
    let mut answers = Vec::new();
    let mut rest = calls;
    let mut sent = 0;
    while !rest.is_empty() {
        answer_at(client, sent).await;
        // A group never spans an answer: both stores see it between the same messages.
        let to_answer = ANSWER_EVERY - sent % ANSWER_EVERY;
        let size = rng.usize(1..=24).min(rest.len()).min(to_answer);
        let (group, after) = rest.split_at(size);
        rest = after;
        sent += size;
        let column = |f: fn(&Call) -> String| group.iter().map(f).collect::<Vec<String>>();
        let n = group.len();
        let rows = client
            .query(
                &format!(
                    "SELECT o_index, o_conversation, o_version, o_due_at, o_now FROM {function}(
                         $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
                       ORDER BY o_index"
                ),
                &[
                    &column(|c| c.platform.clone()),
                    &column(|c| c.key.clone()),
                    &group.iter().map(|c| c.is_group).collect::<Vec<_>>(),
                    &column(|c| c.message_id.clone()),
                    &vec!["u"; n],
                    &vec!["U"; n],
                    &vec!["text"; n],
                    &vec![None::<String>; n],
                    &vec!["holder"; n],
                    &group.iter().map(|c| c.now).collect::<Vec<_>>(),
                    &group.iter().map(|c| c.wait.0).collect::<Vec<_>>(),
                    &group.iter().map(|c| c.wait.1).collect::<Vec<_>>(),
                    &MAX_WAIT_MS,
                    &MAX_BATCH,
                ],
            )
            .await
            .expect("a group stored");
        assert_eq!(rows.len(), n, "an answer for each message of the group");
        for (i, row) in rows.iter().enumerate() {
            assert_eq!(row.get::<_, i32>(0) as usize, i + 1);
            let key = key_of(client, row.get(1)).await;
            answers.push((key, row.get(2), row.get(3), row.get(4)));
        }
    }
    answers
}

/// The rows a store leaves behind, by conversation key (ids may differ: conversations
/// are created in another order).
async fn state(client: &Client) -> BTreeMap<&'static str, Vec<String>> {
    let tables = [
        (
            "conversations",
            "SELECT platform, key, version, answered_version, is_group FROM conversations",
        ),
        (
            "messages",
            "SELECT c.key, m.platform_message_id, m.version, m.received_at, m.text, m.user_id
               FROM messages m JOIN conversations c ON c.id = m.conversation_id",
        ),
        (
            "timers",
            "SELECT c.key, t.platform, t.due_at, t.armed_version, t.armed_at, t.armed_by,
                    t.retry_at, t.held_until
               FROM timers t JOIN conversations c ON c.id = t.conversation_id",
        ),
        ("pending", "SELECT SUM(pending)::text FROM pending_shards"),
    ];
    let mut found = BTreeMap::new();
    for (name, sql) in tables {
        let mut rows: Vec<String> = client
            .simple_query(sql)
            .await
            .expect(name)
            .into_iter()
            .filter_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => Some(
                    (0..r.len())
                        .map(|i| r.get(i).unwrap_or("NULL"))
                        .collect::<Vec<_>>()
                        .join("|"),
                ),
                _ => None,
            })
            .collect();
        rows.sort();
        found.insert(name, rows);
    }
    found
}

/// Where storing in groups through `function` and storing one by one disagree, in
/// words (empty: they agree).
async fn differences(
    seed: u64,
    function: &str,
    mutate: Option<(&str, &str)>,
) -> Option<Vec<String>> {
    let (_, single) = prepared().await?;
    let (_, grouped) = prepared().await?;
    if let Some((from, to)) = mutate {
        let definition: String = grouped
            .query_one(
                &format!("SELECT pg_get_functiondef('{function}'::regproc)"),
                &[],
            )
            .await
            .expect("the function")
            .get(0);
        assert!(definition.contains(from), "the mutation applies");
        grouped
            .batch_execute(&definition.replace(from, to))
            .await
            .expect("the mutated function");
    }
    let calls = calls(seed);
    let expected = one_by_one(&single, &calls).await;
    let got = in_groups(&grouped, function, &calls, seed).await;
    let mut found = Vec::new();
    for (i, (e, g)) in expected.iter().zip(&got).enumerate() {
        if e != g {
            found.push(format!(
                "message {i} ({:?}): alone {e:?}, grouped {g:?}",
                calls[i]
            ));
        }
    }
    let (e, g) = (state(&single).await, state(&grouped).await);
    for (table, rows) in &e {
        if g.get(table) != Some(rows) {
            found.push(format!(
                "{table}: alone {rows:?}\ngrouped {:?}",
                g.get(table)
            ));
        }
    }
    Some(found)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_group_stored_as_sets_equals_its_messages_stored_one_by_one() {
    for seed in [1, 2, 3] {
        let Some(found) = differences(seed, "lull_ingest_many", None).await else {
            return;
        };
        assert!(found.is_empty(), "seed {seed}:\n{}", found.join("\n"));
    }
}

/// The small groups' way (`lull_ingest_rows`) against the same one-by-one store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_group_stored_row_by_row_equals_its_messages_stored_one_by_one() {
    let Some(found) = differences(1, "lull_ingest_rows", None).await else {
        return;
    };
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The counter-test: the set-based body counting only the group's own messages as
/// pending (those before it forgotten) answers other due times, which the comparison
/// above finds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_group_stored_as_sets_equals_its_messages_stored_one_by_one_counter_test() {
    let broken = Some(("p.n + k.nth >= 2", "k.nth >= 2"));
    let Some(found) = differences(1, "lull_ingest_many", broken).await else {
        return;
    };
    eprintln!(
        "with the pending count broken: {} difference(s)",
        found.len()
    );
    assert!(!found.is_empty(), "the comparison finds the broken count");
}
