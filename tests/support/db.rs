//! Reading a lull database from the outside, to check the invariants against what
//! was stored: which replies (and give-up notices) exist, what each covered, and
//! whether any message was covered twice or never.
//!
//! The same checks read a SQLite file (a path) or a PostgreSQL database (a
//! [`Postgres`] URL, read with `psql`): every function takes either ([`Database`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use rusqlite::{Connection, OpenFlags};

/// A PostgreSQL database of the test cluster, by URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Postgres(pub String);

/// A database the checker reads: a SQLite file or a PostgreSQL database.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Db<'a> {
    Sqlite(&'a Path),
    Postgres(&'a str),
}

/// Anything that names a database: a SQLite path or a [`Postgres`] URL.
pub(crate) trait Database {
    fn db(&self) -> Db<'_>;
}

impl Database for Path {
    fn db(&self) -> Db<'_> {
        Db::Sqlite(self)
    }
}

impl Database for PathBuf {
    fn db(&self) -> Db<'_> {
        Db::Sqlite(self)
    }
}

impl Database for Postgres {
    fn db(&self) -> Db<'_> {
        Db::Postgres(&self.0)
    }
}

/// A database by its `DATABASE_URL` (`sqlite:PATH` or `postgres://…`), owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Location {
    Sqlite(PathBuf),
    Postgres(Postgres),
}

impl Location {
    pub(crate) fn from_url(url: &str) -> Location {
        match url.strip_prefix("sqlite:") {
            Some(path) => Location::Sqlite(PathBuf::from(path.trim_start_matches("//"))),
            None => Location::Postgres(Postgres(url.to_owned())),
        }
    }

    pub(crate) fn url(&self) -> String {
        match self {
            Location::Sqlite(path) => format!("sqlite:{}", path.display()),
            Location::Postgres(db) => db.0.clone(),
        }
    }
}

impl Database for Location {
    fn db(&self) -> Db<'_> {
        match self {
            Location::Sqlite(path) => Db::Sqlite(path),
            Location::Postgres(db) => Db::Postgres(&db.0),
        }
    }
}

impl Database for Db<'_> {
    fn db(&self) -> Db<'_> {
        *self
    }
}

impl<T: Database + ?Sized> Database for &T {
    fn db(&self) -> Db<'_> {
        (**self).db()
    }
}

/// The rows of `sql` (portable SQL: the same text runs on both backends), every
/// value as text (`NULL` as empty, booleans as `1`/`0`).
pub(crate) fn rows(db: &(impl Database + ?Sized), sql: &str) -> Vec<Vec<String>> {
    match db.db() {
        Db::Sqlite(path) => {
            let conn = open(path);
            let mut stmt = conn.prepare(sql).unwrap();
            let columns = stmt.column_count();
            stmt.query_map([], |r| {
                (0..columns)
                    .map(|i| {
                        Ok(match r.get_ref(i)? {
                            rusqlite::types::ValueRef::Null => String::new(),
                            rusqlite::types::ValueRef::Integer(n) => n.to_string(),
                            rusqlite::types::ValueRef::Real(x) => x.to_string(),
                            rusqlite::types::ValueRef::Text(t) => {
                                String::from_utf8_lossy(t).into_owned()
                            }
                            rusqlite::types::ValueRef::Blob(_) => "<blob>".into(),
                        })
                    })
                    .collect()
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
        }
        Db::Postgres(url) => {
            let bin = crate::support::postgres::binaries()
                .expect("a PostgreSQL database without PostgreSQL's binaries");
            // Unit and record separators: texts may hold `|` and newlines.
            let output = Command::new(bin.join("psql"))
                .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1"])
                .args(["-F", "\u{1f}", "-R", "\u{1e}", "-P", "null="])
                .args(["-d", url, "-c", sql])
                .output()
                .expect("run psql");
            assert!(
                output.status.success(),
                "psql failed on {sql}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            let text = String::from_utf8(output.stdout).expect("psql prints UTF-8");
            let text = text.strip_suffix('\n').unwrap_or(&text);
            text.split('\u{1e}')
                .filter(|row| !row.is_empty())
                .map(|row| {
                    row.split('\u{1f}')
                        .map(|v| match v {
                            "t" => "1".to_owned(),
                            "f" => "0".to_owned(),
                            v => v.to_owned(),
                        })
                        .collect()
                })
                .collect()
        }
    }
}

fn int(value: &str) -> i64 {
    if value.is_empty() {
        return 0;
    }
    value
        .parse()
        .unwrap_or_else(|_| panic!("not a number: {value}"))
}

fn flag(value: &str) -> bool {
    value == "1"
}

/// A committed reply and the messages it was generated from; or a give-up notice
/// (`kind == "notice"`) and the messages it ended.
#[derive(Debug, Clone)]
pub(crate) struct ReplyRow {
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
pub(crate) struct MessageRow {
    pub conversation: String,
    pub message_id: String,
    pub text: String,
    pub version: i64,
    pub received_at: i64,
}

pub(crate) fn open(path: &Path) -> Connection {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .expect("open db read-only");
    conn.busy_timeout(std::time::Duration::from_secs(5))
        .unwrap();
    conn
}

/// Take the SQLite file's write lock from a connection of the test's own (as another
/// process would) and hold it for `hold` on a thread of its own; returns once the lock
/// is held.
pub(crate) fn hold_write_lock(path: &Path, hold: std::time::Duration) {
    assert!(
        try_hold_write_lock(path, hold, std::time::Duration::from_secs(30)),
        "the write lock not taken within 30 s"
    );
}

/// [`hold_write_lock`], waiting at most `wait` for the lock: `false` (nothing held) if
/// other writers kept it longer.
pub(crate) fn try_hold_write_lock(
    path: &Path,
    hold: std::time::Duration,
    wait: std::time::Duration,
) -> bool {
    let path = path.to_owned();
    let (locked, is_locked) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let conn = Connection::open(&path).expect("open db");
        conn.busy_timeout(wait).unwrap();
        if conn.execute_batch("BEGIN IMMEDIATE").is_err() {
            locked.send(false).unwrap();
            return;
        }
        locked.send(true).unwrap();
        std::thread::sleep(hold);
        conn.execute_batch("COMMIT")
            .expect("give the write lock back");
    });
    is_locked.recv().expect("the lock taken or not")
}

pub(crate) fn replies(db: &(impl Database + ?Sized)) -> Vec<ReplyRow> {
    answers(db)
        .into_iter()
        .filter(|r| r.kind == "reply")
        .collect()
}

/// Give-up notices: notices that cover the messages of a batch the model could not
/// answer.
pub(crate) fn give_ups(db: &(impl Database + ?Sized)) -> Vec<ReplyRow> {
    answers(db)
        .into_iter()
        .filter(|r| r.kind == "notice")
        .collect()
}

/// Every outbox row that answers messages: replies and give-up notices, in order.
pub(crate) fn answers(db: &(impl Database + ?Sized)) -> Vec<ReplyRow> {
    let db = db.db();
    let mut rows: Vec<ReplyRow> = rows(
        &db,
        "SELECT o.id, c.key, o.text, o.version, o.lease_token, o.forced, o.created_at,
                CASE WHEN o.sent_at IS NOT NULL THEN 1 ELSE 0 END, o.kind
         FROM outbox o JOIN conversations c ON c.id = o.conversation_id
         WHERE o.kind = 'reply'
            OR EXISTS (SELECT 1 FROM reply_covers rc WHERE rc.outbox_id = o.id)
         ORDER BY o.id",
    )
    .into_iter()
    .map(|r| ReplyRow {
        kind: r[8].clone(),
        id: int(&r[0]),
        conversation: r[1].clone(),
        text: r[2].clone(),
        version: int(&r[3]),
        token: int(&r[4]),
        forced: flag(&r[5]),
        created_at: int(&r[6]),
        sent: flag(&r[7]),
        covers: Vec::new(),
    })
    .collect();
    let mut covers: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for r in rows_of_covers(&db) {
        covers.entry(int(&r[0])).or_default().push(r[1].clone());
    }
    for row in &mut rows {
        row.covers = covers.remove(&row.id).unwrap_or_default();
    }
    rows
}

fn rows_of_covers(db: &Db<'_>) -> Vec<Vec<String>> {
    rows(
        db,
        "SELECT rc.outbox_id, m.platform_message_id FROM reply_covers rc
         JOIN messages m ON m.id = rc.message_id ORDER BY rc.outbox_id, m.id",
    )
}

pub(crate) fn messages(db: &(impl Database + ?Sized)) -> Vec<MessageRow> {
    rows(
        db,
        "SELECT c.key, m.platform_message_id, m.text, m.version, m.received_at
         FROM messages m JOIN conversations c ON c.id = m.conversation_id ORDER BY m.id",
    )
    .into_iter()
    .map(|r| MessageRow {
        conversation: r[0].clone(),
        message_id: r[1].clone(),
        text: r[2].clone(),
        version: int(&r[3]),
        received_at: int(&r[4]),
    })
    .collect()
}

pub(crate) fn count(db: &(impl Database + ?Sized), sql: &str) -> i64 {
    int(&rows(db, sql)[0][0])
}

/// What the invariant checker found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Verdict {
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
    pub(crate) fn counts(&self) -> (usize, usize, usize, usize, usize) {
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
///   grow (a reply and the notices stored with it for the messages it left out, a
///   group member over budget, are one commit: they share its token, and together
///   cover the batch).
pub(crate) fn check(db: &(impl Database + ?Sized)) -> Verdict {
    let messages = messages(db);
    let replies = answers(db);
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
        let mut previous: Option<(i64, i64)> = None;
        for (n, reply) in replies.iter().enumerate() {
            // A reply and the notices for the messages it left out (a group member
            // over budget) are one commit: one token, one version, stored together.
            let same_commit =
                reply.kind == "notice" && previous == Some((reply.token, reply.version));
            if !same_commit && previous.is_some_and(|(token, _)| reply.token <= token) {
                verdict.token_regressions += 1;
            }
            previous = Some((reply.token, reply.version));
            if reply.kind == "reply" && !reply.forced {
                let commit: Vec<&str> = replies[n..]
                    .iter()
                    .take_while(|r| {
                        r.id == reply.id
                            || (r.kind == "notice"
                                && r.token == reply.token
                                && r.version == reply.version)
                    })
                    .flat_map(|r| r.covers.iter().map(String::as_str))
                    .collect();
                let expected: Vec<&str> = messages
                    .iter()
                    .filter(|m| {
                        m.conversation == conversation
                            && m.version > previous_version
                            && m.version <= reply.version
                    })
                    .map(|m| m.message_id.as_str())
                    .collect();
                if expected.iter().any(|id| !commit.contains(id)) {
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
pub(crate) async fn settled(db: &(impl Database + ?Sized), limit: std::time::Duration) -> Verdict {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let open = count(
            db,
            "SELECT (SELECT COUNT(*) FROM timers)
                  + (SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL AND failed_at IS NULL)",
        );
        if open == 0 {
            return check(db);
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
pub(crate) async fn wait_for_lease(
    db: &(impl Database + ?Sized),
    conversation: Option<&str>,
    limit: std::time::Duration,
) {
    let deadline = std::time::Instant::now() + limit;
    let key = conversation.unwrap_or("%");
    let sql = format!(
        "SELECT COUNT(*) FROM leases l JOIN conversations c ON l.conversation_id = c.id
         WHERE c.key LIKE '{key}' AND l.holder IS NOT NULL"
    );
    while count(db, &sql) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no lease held on {key} within {limit:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
