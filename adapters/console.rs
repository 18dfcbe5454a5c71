//! The console adapter behind `lull chat`: each line of input is one message of the
//! local user; every reply is printed to standard output (which carries replies
//! only; logs go to standard error).
//!
//! On a terminal, a reply being written is shown as a live draft: its last lines,
//! dimmed, redrawn in place, then replaced by the reply. To redraw exactly, the draft
//! is wrapped here at [`DRAFT_COLUMNS`] and the terminal's own line wrapping is off
//! while it is shown (a narrower terminal cuts its lines instead of wrapping them).
//! Piped output never gets drafts: it carries the replies, line for line.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

use lull_port::domain::{ConversationRef, DraftId, Platform, Timestamp};
use lull_port::{Content, Incoming, IncomingKind, Outbound, OutgoingPart, SendError};
use lull_port::{IngestError, Intake};

/// Width of a draft's lines on a terminal.
pub const DRAFT_COLUMNS: usize = 76;
/// Lines of a draft shown: its last ones, where the words are being written.
pub const DRAFT_LINES: usize = 8;

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

/// Prints replies, one per paragraph block, separated by a blank line; on a terminal,
/// drafts too.
pub struct ConsoleOutbound {
    /// A std mutex: a reply or draft is written in one locked call, never across an
    /// await.
    screen: Mutex<Screen>,
}

struct Screen {
    out: Box<dyn Write + Send>,
    /// Drafts are drawn only on a terminal.
    terminal: bool,
    /// Lines of the draft on screen (0: none). The cursor is at the end of its last.
    draft_lines: usize,
}

impl Screen {
    /// Remove the draft, if one is shown, and turn line wrapping back on.
    fn erase_draft(&mut self) -> std::io::Result<()> {
        if self.draft_lines == 0 {
            return Ok(());
        }
        let up = self.draft_lines - 1;
        self.draft_lines = 0;
        if up > 0 {
            write!(self.out, "\r\x1b[{up}A\x1b[J\x1b[?7h")
        } else {
            write!(self.out, "\r\x1b[J\x1b[?7h")
        }
    }

    fn draw_draft(&mut self, text: &str) -> std::io::Result<()> {
        self.erase_draft()?;
        let lines = draft_lines(text);
        // Wrapping off, dimmed: the line count is exact, and the draft looks like one.
        write!(self.out, "\x1b[?7l\x1b[2m{}\x1b[0m", lines.join("\n"))?;
        self.draft_lines = lines.len();
        self.out.flush()
    }
}

/// What marks a reply apart from the lines typed at a terminal: `lull ›` in bold
/// before its first line, the others indented under it.
const REPLY_MARK: &str = "\x1b[1mlull ›\x1b[0m ";
/// The width of [`REPLY_MARK`] as shown.
const REPLY_INDENT: &str = "       ";

/// A reply as printed: at a terminal marked apart from what the user types (they
/// share the screen); into a pipe or a file, as is (scripts read replies alone).
pub fn reply_text(text: &str, terminal: bool) -> String {
    if !terminal {
        return text.to_owned();
    }
    let mut lines = text.split('\n');
    let mut shown = format!("{REPLY_MARK}{}", lines.next().unwrap_or_default());
    for line in lines {
        shown.push('\n');
        if !line.is_empty() {
            shown.push_str(REPLY_INDENT);
        }
        shown.push_str(line);
    }
    shown
}

/// The last [`DRAFT_LINES`] lines of `text` wrapped at [`DRAFT_COLUMNS`] characters.
pub fn draft_lines(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for line in text.split('\n') {
        let chars: Vec<char> = line.chars().filter(|c| !c.is_control()).collect();
        if chars.is_empty() {
            lines.push(String::new());
        }
        lines.extend(chars.chunks(DRAFT_COLUMNS).map(|row| row.iter().collect()));
    }
    let skip = lines.len().saturating_sub(DRAFT_LINES);
    lines.split_off(skip)
}

impl ConsoleOutbound {
    /// Standard output; drafts are shown if it is a terminal.
    pub fn stdout() -> Self {
        let terminal = std::io::stdout().is_terminal();
        Self::new(Box::new(std::io::stdout()), terminal)
    }

    pub fn new(out: Box<dyn Write + Send>, terminal: bool) -> Self {
        Self {
            screen: Mutex::new(Screen {
                out,
                terminal,
                draft_lines: 0,
            }),
        }
    }

    /// Remove a draft still shown (the chat ends): the terminal is left as found.
    pub fn end_draft(&self) {
        let mut screen = self.screen.lock().expect("console output poisoned");
        let _ = screen.erase_draft().and_then(|()| screen.out.flush());
    }
}

impl Drop for ConsoleOutbound {
    fn drop(&mut self) {
        self.end_draft();
    }
}

fn write_error(e: std::io::Error) -> SendError {
    SendError::Permanent(format!("cannot write to standard output: {e}"))
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
        let mut screen = self.screen.lock().expect("console output poisoned");
        let shown = reply_text(part.text, screen.terminal);
        screen
            .erase_draft()
            .and_then(|()| writeln!(screen.out, "{shown}\n"))
            .and_then(|()| screen.out.flush())
            .map_err(write_error)
    }

    async fn typing(&self, _conversation: &ConversationRef) -> Result<(), SendError> {
        Ok(())
    }

    fn typing_every(&self) -> Option<Duration> {
        None
    }

    fn drafts(&self, _conversation: &ConversationRef) -> bool {
        self.screen
            .lock()
            .expect("console output poisoned")
            .terminal
    }

    /// The draft replaces the one shown. A placeholder is not drawn: the user may be
    /// typing the next line of a burst.
    async fn draft(
        &self,
        _conversation: &ConversationRef,
        _draft: DraftId,
        text: &str,
    ) -> Result<(), SendError> {
        let mut screen = self.screen.lock().expect("console output poisoned");
        if !screen.terminal || text.trim().is_empty() {
            return Ok(());
        }
        screen.draw_draft(text).map_err(write_error)
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
            chats: Vec::new(),
            author: user.clone(),
            title: None,
            message_id: format!("{session}-{number}"),
            content: Content::Text(line),
            media: Vec::new(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A writer the test reads back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn take(&self) -> String {
            String::from_utf8(std::mem::take(&mut *self.0.lock().unwrap())).unwrap()
        }
    }

    fn reply(text: &str) -> OutgoingPart<'_> {
        static CONVERSATION: std::sync::LazyLock<ConversationRef> =
            std::sync::LazyLock::new(conversation);
        OutgoingPart {
            conversation: &CONVERSATION,
            outbox_id: lull_port::OutboxId(1),
            created_at: Timestamp(0),
            stored_at: Timestamp(0),
            kind: lull_port::OutboxKind::Reply,
            index: 0,
            count: 1,
            text,
            reply_to: None,
            covers: &[],
            quick_replies: &[],
        }
    }

    #[tokio::test]
    async fn a_terminal_shows_the_draft_in_place_then_the_reply() {
        let out = Captured::default();
        let console = ConsoleOutbound::new(Box::new(out.clone()), true);
        let draft = DraftId::for_version(lull_port::domain::Version(1));
        assert!(console.drafts(&conversation()));
        console.draft(&conversation(), draft, "").await.unwrap();
        assert_eq!(out.take(), "", "no placeholder");
        console
            .draft(&conversation(), draft, "Hello")
            .await
            .unwrap();
        assert_eq!(out.take(), "\x1b[?7l\x1b[2mHello\x1b[0m");
        console
            .draft(&conversation(), draft, "Hello,\nworld")
            .await
            .unwrap();
        assert_eq!(
            out.take(),
            "\r\x1b[J\x1b[?7h\x1b[?7l\x1b[2mHello,\nworld\x1b[0m",
            "the one-line draft is replaced"
        );
        console.send(&reply("Hello,\nworld!")).await.unwrap();
        assert_eq!(
            out.take(),
            "\r\x1b[1A\x1b[J\x1b[?7h\x1b[1mlull ›\x1b[0m Hello,\n       world!\n\n",
            "two lines erased, wrapping back on, then the reply marked apart from typing"
        );
        console.end_draft();
        assert_eq!(out.take(), "", "nothing left to erase");
    }

    #[tokio::test]
    async fn piped_output_carries_replies_only() {
        let out = Captured::default();
        let console = ConsoleOutbound::new(Box::new(out.clone()), false);
        assert!(!console.drafts(&conversation()));
        let draft = DraftId::for_version(lull_port::domain::Version(1));
        console
            .draft(&conversation(), draft, "Hello")
            .await
            .unwrap();
        console.send(&reply("Hello!")).await.unwrap();
        drop(console);
        assert_eq!(out.take(), "Hello!\n\n");
    }

    #[test]
    fn long_drafts_show_their_last_lines_wrapped() {
        let long = "x".repeat(DRAFT_COLUMNS * 2 + 5);
        assert_eq!(
            draft_lines(&long)
                .iter()
                .map(|l| l.chars().count())
                .collect::<Vec<_>>(),
            [DRAFT_COLUMNS, DRAFT_COLUMNS, 5]
        );
        let many: String = (0..20).map(|i| format!("line {i}\n")).collect();
        let shown = draft_lines(many.trim_end());
        assert_eq!(shown.len(), DRAFT_LINES);
        assert_eq!(shown.last().unwrap(), "line 19");
        assert_eq!(draft_lines("a\n\nb"), ["a", "", "b"]);
    }
}
