//! The console adapter behind `lull chat`: each line of input is one message of the
//! local user; every reply is printed to standard output (which carries replies
//! only; logs go to standard error).

use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

use lull_port::domain::{ConversationRef, Platform, Timestamp};
use lull_port::{Content, Incoming, IncomingKind, Outbound, OutgoingPart, SendError};
use lull_port::{IngestError, Intake};

/// The one conversation of the console: the local user and lull. It persists in the
/// database, so a later `lull chat` continues it (`/reset` starts afresh).
pub fn conversation() -> ConversationRef {
    ConversationRef::new(Platform::Console, "local")
}

/// The local user's name, from the environment.
fn local_user() -> String {
    std::env::var("USER")
        .or_else(|_| std::env::var("USERNAME"))
        .unwrap_or_else(|_| "you".into())
}

/// Prints replies, one per paragraph block, separated by a blank line.
pub struct ConsoleOutbound {
    /// A std mutex: a reply is written in one locked call, never across an await.
    out: Mutex<Box<dyn Write + Send>>,
}

impl ConsoleOutbound {
    pub fn stdout() -> Self {
        Self::new(Box::new(std::io::stdout()))
    }

    pub fn new(out: Box<dyn Write + Send>) -> Self {
        Self {
            out: Mutex::new(out),
        }
    }
}

#[async_trait]
impl Outbound for ConsoleOutbound {
    fn platform(&self) -> Platform {
        Platform::Console
    }

    fn split(&self, text: &str) -> Vec<String> {
        // A terminal has no length limit.
        vec![text.to_owned()]
    }

    async fn send(&self, part: &OutgoingPart<'_>) -> Result<(), SendError> {
        let mut out = self.out.lock().expect("console output poisoned");
        writeln!(out, "{}\n", part.text)
            .and_then(|()| out.flush())
            .map_err(|e| SendError::Permanent(format!("cannot write to standard output: {e}")))
    }

    async fn typing(&self, _conversation: &ConversationRef) -> Result<(), SendError> {
        Ok(())
    }

    fn typing_every(&self) -> Option<Duration> {
        None
    }
}

/// Feed every line of `input` to the core as a message of the local user,
/// until end of input. Blank lines are skipped; a refused line is reported on
/// standard error and the rest go on.
pub async fn read_messages<R>(intake: &dyn Intake, input: R) -> std::io::Result<usize>
where
    R: AsyncBufRead + Unpin,
{
    let user = local_user();
    // Unique across runs on the same database: the console has no message ids.
    let session = Timestamp::now().0;
    let mut lines = input.lines();
    let mut stored = 0;
    let mut number = 0u64;
    while let Some(line) = lines.next_line().await? {
        number += 1;
        if line.trim().is_empty() {
            continue;
        }
        let incoming = Incoming {
            conversation: conversation(),
            is_group: false,
            user_id: user.clone(),
            author: user.clone(),
            message_id: format!("{session}-{number}"),
            content: Content::Text(line),
            kind: IncomingKind::New,
        };
        match intake.ingest(incoming).await {
            Ok(_) => stored += 1,
            Err(e @ IngestError::NotStored(_)) => {
                // Not stored: say so, so the user can send it again.
                tracing::error!(line = number, error = %e, "message not stored; please send it again");
            }
            Err(e) => tracing::warn!(line = number, error = %e, "message refused"),
        }
    }
    Ok(stored)
}
