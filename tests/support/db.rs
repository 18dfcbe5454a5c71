//! Reading a lull database from the outside, to check the invariants against what
//! was stored: which replies (and give-up notices) exist, what each covered, and
//! whether any message was covered twice or never.

use std::collections::BTreeMap;
use std::path::Path;

use rusqlite::{Connection, OpenFlags};

/// A committed reply and the messages it was generated from; or a give-up notice
/// (`kind == "notice"`) and the messages it ended.
#[derive(Debug, Clone)]
pub struct ReplyRow {
    pub kind: String,
    pub id: i64,
    pub conversation: String,
    pub text: String,
    pub version: i64,
    pub token: i64,
    pub forced: bool,
    pub created_at: i64,
    pub sent: bool,
    /// Platform message ids, oldest first.
    pub covers: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct MessageRow {
    pub conversation: String,
    pub message_id: String,
    pub text: String,
    pub version: i64,
    pub received_at: i64,
}

pub fn open(path: &Path) -> Connection {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .expect("open db read-only");
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .unwrap();
    conn
}

pub fn replies(path: &Path) -> Vec<ReplyRow> {
    answers(path)
        .into_iter()
        .filter(|r| r.kind == "reply")
        .collect()
}

/// Give-up notices: notices that cover the messages of a batch the model could not
/// answer.
pub fn give_ups(path: &Path) -> Vec<ReplyRow> {
    answers(path)
        .into_iter()
        .filter(|r| r.kind == "notice")
        .collect()
}

/// Every outbox row that answers messages: replies and give-up notices, in order.
pub fn answers(path: &Path) -> Vec<ReplyRow> {
    let conn = open(path);
    let mut stmt = conn
        .prepare(
            "SELECT o.id, c.key, o.text, o.version, o.lease_token, o.forced, o.created_at, o.sent_at IS NOT NULL,
                    o.kind
             FROM outbox o JOIN conversations c ON c.id = o.conversation_id
             WHERE o.kind = 'reply'
                OR EXISTS (SELECT 1 FROM reply_covers rc WHERE rc.outbox_id = o.id)
             ORDER BY o.id",
        )
        .unwrap();
    let mut rows: Vec<ReplyRow> = stmt
        .query_map([], |r| {
            Ok(ReplyRow {
                kind: r.get(8)?,
                id: r.get(0)?,
                conversation: r.get(1)?,
                text: r.get(2)?,
                version: r.get(3)?,
                token: r.get(4)?,
                forced: r.get(5)?,
                created_at: r.get(6)?,
                sent: r.get(7)?,
                covers: Vec::new(),
            })
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut covers = conn
        .prepare(
            "SELECT m.platform_message_id FROM reply_covers rc JOIN messages m ON m.id = rc.message_id
             WHERE rc.outbox_id = ?1 ORDER BY m.id",
        )
        .unwrap();
    for row in &mut rows {
        row.covers = covers
            .query_map([row.id], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
    }
    rows
}

pub fn messages(path: &Path) -> Vec<MessageRow> {
    let conn = open(path);
    let mut stmt = conn
        .prepare(
            "SELECT c.key, m.platform_message_id, m.text, m.version, m.received_at
             FROM messages m JOIN conversations c ON c.id = m.conversation_id ORDER BY m.id",
        )
        .unwrap();
    stmt.query_map([], |r| {
        Ok(MessageRow {
            conversation: r.get(0)?,
            message_id: r.get(1)?,
            text: r.get(2)?,
            version: r.get(3)?,
            received_at: r.get(4)?,
        })
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

pub fn count(path: &Path, sql: &str) -> i64 {
    open(path).query_row(sql, [], |r| r.get(0)).unwrap()
}

/// What the invariant checker found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub messages: usize,
    pub replies: usize,
    /// Give-up notices: batches the model could not answer, told to the user.
    pub give_ups: usize,
    /// Messages covered more than once (by replies or give-up notices).
    pub duplicates: usize,
    /// Messages covered by no delivered reply or give-up notice.
    pub lost: usize,
    /// Unforced replies that missed a message existing when they were committed.
    pub stale: usize,
    /// Replies committed with a fencing token not larger than an earlier reply's.
    pub token_regressions: usize,
}

impl Verdict {
    /// `(messages, replies, duplicates, lost, stale)`: what a test usually compares.
    pub fn counts(&self) -> (usize, usize, usize, usize, usize) {
        (
            self.messages,
            self.replies,
            self.duplicates,
            self.lost,
            self.stale,
        )
    }
}

/// Check the stored replies and give-up notices against the stored messages:
/// - no duplicate: each message is covered at most once, by a reply or a give-up
///   notice;
/// - no loss: each message is covered by a delivered reply or give-up notice;
/// - fresh: an unforced reply at version v covers every message of its conversation
///   with a version in (previous reply's or give-up's v, v];
/// - exclusive: per conversation, the fencing tokens of replies and give-ups strictly
///   grow.
pub fn check(path: &Path) -> Verdict {
    let messages = messages(path);
    let replies = answers(path);
    let mut covered: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut delivered: BTreeMap<(String, String), bool> = BTreeMap::new();
    for reply in &replies {
        for id in &reply.covers {
            let key = (reply.conversation.clone(), id.clone());
            *covered.entry(key.clone()).or_default() += 1;
            *delivered.entry(key).or_default() |= reply.sent;
        }
    }
    let mut verdict = Verdict {
        messages: messages.len(),
        replies: replies.iter().filter(|r| r.kind == "reply").count(),
        give_ups: replies.iter().filter(|r| r.kind == "notice").count(),
        ..Verdict::default()
    };
    for m in &messages {
        let key = (m.conversation.clone(), m.message_id.clone());
        match covered.get(&key) {
            Some(n) if *n > 1 => verdict.duplicates += n - 1,
            _ => {}
        }
        if !delivered.get(&key).copied().unwrap_or(false) {
            verdict.lost += 1;
        }
    }
    let mut by_conversation: BTreeMap<&str, Vec<&ReplyRow>> = BTreeMap::new();
    for reply in &replies {
        by_conversation
            .entry(&reply.conversation)
            .or_default()
            .push(reply);
    }
    for (conversation, replies) in by_conversation {
        let mut previous_version = 0;
        let mut previous_token = 0;
        for reply in replies {
            if reply.token <= previous_token {
                verdict.token_regressions += 1;
            }
            previous_token = reply.token;
            if reply.kind == "reply" && !reply.forced {
                let expected: Vec<&str> = messages
                    .iter()
                    .filter(|m| {
                        m.conversation == conversation
                            && m.version > previous_version
                            && m.version <= reply.version
                    })
                    .map(|m| m.message_id.as_str())
                    .collect();
                if expected
                    .iter()
                    .any(|id| !reply.covers.iter().any(|c| c == id))
                {
                    verdict.stale += 1;
                }
            }
            previous_version = previous_version.max(reply.version);
        }
    }
    verdict
}

/// Wait until nothing is pending (no timer) and nothing is left to deliver, then
/// check the invariants. A reply is marked sent one short transaction after the
/// platform got it, so a test that just saw a reply waits here before checking.
pub async fn settled(path: &Path, limit: std::time::Duration) -> Verdict {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let open = count(
            path,
            "SELECT (SELECT COUNT(*) FROM timers)
                  + (SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL AND failed_at IS NULL)",
        );
        if open == 0 {
            return check(path);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "work left after {limit:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Wait until some process holds a conversation lease (a round is running): of the
/// conversation with platform key `conversation`, or of any conversation.
pub async fn wait_for_lease(path: &Path, conversation: Option<&str>, limit: std::time::Duration) {
    let deadline = std::time::Instant::now() + limit;
    let key = conversation.unwrap_or("%");
    let sql = format!(
        "SELECT COUNT(*) FROM leases l JOIN conversations c ON l.conversation_id = c.id
         WHERE c.key LIKE '{key}' AND l.holder IS NOT NULL"
    );
    while count(path, &sql) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no lease held on {key} within {limit:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
