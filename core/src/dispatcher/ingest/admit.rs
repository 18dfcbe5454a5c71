//! The admission steps of ingest, each a small policy that passes an update on or
//! ends its ingest with the adapter's answer: `platform`, `thread`, `overheard`,
//! `access`, `content`, `command`, `idle` (the order is the parent's list).

use lull_port::{Accepted, Command, Incoming, IncomingKind, IngestError};

use super::{Admission, Arriving, Step};
use crate::access::{CONSOLE_OPERATOR, Sender};
use crate::dispatcher::not_stored::not_stored;
use crate::dispatcher::{Dispatcher, commands, notices, overheard, threads};
use crate::domain::Timestamp;
use crate::metrics as names;
use crate::store::{IdleForget, StoreError};
use crate::texts;

impl Admission {
    /// The step's name, as the parent's module doc lists it.
    pub(super) fn name(self) -> &'static str {
        match self {
            Admission::Platform => "platform",
            Admission::Thread => "thread",
            Admission::Overheard => "overheard",
            Admission::Access => "access",
            Admission::Content => "content",
            Admission::Command => "command",
            Admission::Idle => "idle",
        }
    }
}

impl Arriving<'_> {
    /// Run one admission step.
    pub(super) async fn admit(&mut self, step: Admission) -> Result<Step, IngestError> {
        match step {
            Admission::Platform => self.platform(),
            Admission::Thread => self.thread().await,
            Admission::Overheard => self.overheard().await,
            Admission::Access => self.access().await,
            Admission::Content => self.content().await,
            Admission::Command => self.command().await,
            Admission::Idle => self.idle().await,
        }
    }

    /// An update from a platform this process does not run is refused; so is one whose
    /// sender claims the console operator's id (only the console writes as it).
    fn platform(&self) -> Result<Step, IngestError> {
        let platform = self.incoming.conversation.platform;
        if !self.dispatcher.outbounds.contains_key(&platform) {
            return Err(IngestError::UnknownPlatform(platform));
        }
        if self.incoming.user_id == CONSOLE_OPERATOR {
            tracing::warn!(%platform, "an update sent as the console's operator was refused: only the console writes as it");
            metrics::counter!(names::LIMITED, "reason" => "denied").increment(1);
            return Ok(Step::Done(Accepted::Denied));
        }
        Ok(Step::Next)
    }

    /// A message that opened a Discord thread, or one in a thread lull opened, is a
    /// new message (see `threads`).
    async fn thread(&mut self) -> Result<Step, IngestError> {
        self.incoming.kind = threads::admit(self.dispatcher, &self.incoming).await?;
        Ok(Step::Next)
    }

    /// An overheard group message is kept as context at most, never answered.
    async fn overheard(&mut self) -> Result<Step, IngestError> {
        if self.incoming.kind != IncomingKind::Overheard {
            return Ok(Step::Next);
        }
        let overheard = overheard::overhear(self.dispatcher, &self.incoming).await?;
        Ok(Step::Done(overheard))
    }

    /// A sender who is not admitted is told how to get access (once per
    /// conversation), and nothing is stored. The sender's role is read here, once.
    async fn access(&mut self) -> Result<Step, IngestError> {
        let d = self.dispatcher;
        let rules = d.access_rules().await.map_err(not_stored)?;
        let sender = Sender::of(&self.incoming);
        self.admin = d.settings.access.is_admin(sender);
        if d.settings.access.allows(sender, &rules) {
            return Ok(Step::Next);
        }
        metrics::counter!(names::LIMITED, "reason" => "denied").increment(1);
        if self.incoming.kind == IncomingKind::New {
            deny(d, &self.incoming, self.now)
                .await
                .map_err(not_stored)?;
        }
        Ok(Step::Done(Accepted::Denied))
    }

    /// What lull cannot read is told (a new message only); an empty update, or one
    /// longer than `LULL_MAX_MESSAGE_CHARS`, is refused. Media enter prompts and
    /// history as their marker before the caption, so the model (and `echo`) sees that
    /// something was sent; only the pending batch fetches the bytes. An edited caption
    /// arrives with its media and keeps the marker.
    async fn content(&mut self) -> Result<Step, IngestError> {
        let d = self.dispatcher;
        let incoming = &self.incoming;
        let Some(text) = self.text() else {
            if let lull_port::Content::Unsupported(what) = &incoming.content
                && incoming.kind == IncomingKind::New
            {
                let text = texts::unsupported_text(what);
                notices::answer_message(d, incoming, text, "unsupported", self.now)
                    .await
                    .map_err(not_stored)?;
            }
            return Ok(Step::Done(Accepted::Unsupported));
        };
        if text.trim().is_empty() && incoming.media.is_empty() {
            return Err(IngestError::Empty);
        }
        let chars = lull_port::split::char_len(text);
        let max = d.settings.max_message_chars;
        if chars > max {
            return Err(IngestError::TooLong { chars, max });
        }
        self.text = with_markers(&incoming.media, text);
        Ok(Step::Next)
    }

    /// A command (a new message without media) is answered at once, without the
    /// model, and never joins a burst.
    async fn command(&mut self) -> Result<Step, IngestError> {
        let incoming = &self.incoming;
        let text = self.text().unwrap_or_default();
        if incoming.kind != IncomingKind::New || !incoming.media.is_empty() {
            return Ok(Step::Next);
        }
        let Some(command) = Command::parse(text) else {
            return Ok(Step::Next);
        };
        commands::answer(self.dispatcher, incoming, command, text, self.now)
            .await
            .map_err(not_stored)?;
        Ok(Step::Done(Accepted::Command(command)))
    }

    /// `LULL_IDLE_RESET`: a conversation silent that long starts afresh (history
    /// only; no message is dropped).
    async fn idle(&mut self) -> Result<Step, IngestError> {
        let d = self.dispatcher;
        let Some(idle) = d.settings.controls.idle_reset else {
            return Ok(Step::Next);
        };
        if self.incoming.kind != IncomingKind::New {
            return Ok(Step::Next);
        }
        let forget = IdleForget {
            conversation: &self.incoming.conversation,
            idle,
            now: self.now,
        };
        if d.store.forget_if_idle(forget).await.map_err(not_stored)? {
            tracing::info!(conversation = %self.incoming.conversation, "idle longer than LULL_IDLE_RESET: a fresh context");
        }
        Ok(Step::Next)
    }
}

/// `text` after one marker per piece of media (`[image] what is this?`).
fn with_markers(media: &[lull_port::Media], text: &str) -> String {
    let markers: Vec<&str> = media.iter().map(|m| m.kind.marker()).collect();
    match (markers.is_empty(), text.trim().is_empty()) {
        (true, _) => text.to_owned(),
        (false, true) => markers.join(" "),
        (false, false) => format!("{} {text}", markers.join(" ")),
    }
}

/// Tell a user who is not admitted how to get access: once per conversation, whatever
/// they send, and nothing reaches the model.
async fn deny(
    dispatcher: &Dispatcher,
    incoming: &Incoming,
    now: Timestamp,
) -> Result<(), StoreError> {
    let platform = incoming.conversation.platform;
    tracing::info!(%platform, user = %incoming.user_id, chats = ?incoming.chats, "message from a user not admitted (LULL_ALLOWED_USERS, LULL_ALLOWED_CHATS, /allow)");
    let chat = incoming.chats.last().map(String::as_str);
    let text = texts::denial_text(platform, &incoming.user_id, chat);
    let dedupe_key = format!("denied/{}/{}", incoming.conversation, incoming.user_id);
    notices::answer(dispatcher, incoming, text, dedupe_key, now).await
}
