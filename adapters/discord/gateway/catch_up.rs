//! Catch-up after a fresh session (READY): the gateway does not replay what was
//! sent while no session was connected, so the channels with recent activity whose
//! events belong to this shard are read back from history, after the last message
//! the core stored there, oldest first.
//!
//! It runs inside the [`Feeder`] before any live event queued after READY is stored:
//! storing one first would move a channel's catch-up point past the gap.

use std::time::Duration;

use serenity::all::{ChannelId, Message, MessageId, MessagePagination};

use super::feeder::{Feeder, STORE_BACKOFF};
use crate::discord::outbound::from_serenity;
use crate::discord::translate;
use crate::discord::{Place, channel_of, shard_of};
use lull_port::domain::{Platform, Timestamp, millis};
use lull_port::{Backoff, RecentConversation, SendError};

/// How far back catch-up looks for channels with activity.
const CATCH_UP_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);
/// At most this many channels are read back after a (re)connect, most recent first.
const CATCH_UP_CHANNELS: usize = 100;
/// Messages per history request (Discord's maximum).
const PAGE: u8 = 100;
/// At most this many pages per channel: a busy guild channel is mostly chatter lull
/// ignores, and reading it all back would spend the rate limit.
const CATCH_UP_PAGES: usize = 10;
/// Waits between attempts to read a page of history.
const HISTORY_BACKOFF: Backoff = Backoff::new(Duration::from_millis(300), Duration::from_secs(1));
/// Attempts to read a page of history before giving up on a channel's catch-up.
const HISTORY_ATTEMPTS: u32 = 3;

impl Feeder<'_> {
    /// Read back what was sent while no process was connected: for each channel with
    /// recent activity, the messages after the last one stored, oldest first.
    pub(super) async fn catch_up(&self) {
        let now = Timestamp::now();
        let since = Timestamp(now.0.saturating_sub(millis(CATCH_UP_WINDOW)));
        // Retried like a message that cannot be stored yet: live events wait behind
        // it, and storing them first would move the catch-up point past the gap.
        let mut failures = 0;
        let recent = loop {
            match self
                .intake
                .recent_conversations(Platform::Discord, since, CATCH_UP_CHANNELS)
                .await
            {
                Ok(recent) => break recent,
                Err(e) => {
                    failures += 1;
                    let wait = STORE_BACKOFF.delay(failures);
                    tracing::warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "cannot list recent Discord conversations yet; retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        };
        let shard = self.session.shard();
        let (mut read, mut channels) = (0, 0);
        for conversation in &recent {
            if !self.on_this_shard(conversation).await {
                continue;
            }
            channels += 1;
            read += self.catch_up_channel(conversation).await;
        }
        tracing::info!(
            %shard,
            channels,
            messages = read,
            "caught up with Discord channels"
        );
    }

    /// Whether a conversation's events arrive on this session's shard, so its
    /// catch-up is this session's to do: DMs on shard 0, a guild channel on its
    /// guild's shard. A channel whose guild cannot be learnt is read back anyway: a
    /// second reader costs a request, the core stores each message once.
    async fn on_this_shard(&self, recent: &RecentConversation) -> bool {
        let shard = self.session.shard();
        if shard.total() == 1 {
            return true;
        }
        let Some(channel) = channel_of(&recent.conversation.key) else {
            return true;
        };
        let guild = if recent.is_group {
            match self.channels.place(&self.rest, channel).await {
                Ok(Place::Guild(guild)) => guild,
                Ok(Place::Dm) => None,
                Err(error) => {
                    tracing::debug!(
                        channel = channel.get(),
                        error,
                        "cannot tell a channel's guild; reading it back on this shard too"
                    );
                    return true;
                }
            }
        } else {
            None
        };
        if recent.is_group && guild.is_none() {
            return true;
        }
        shard_of(guild, shard.total()) == shard.index()
    }

    /// Returns how many messages were handed to the core.
    async fn catch_up_channel(&self, recent: &RecentConversation) -> usize {
        let key = &recent.conversation.key;
        // The last stored may be a click (`interaction:<id>`): its snowflake is as good.
        let (Some(channel), Some(mut after)) = (
            channel_of(key),
            translate::snowflake(&recent.last_message_id),
        ) else {
            tracing::warn!(conversation = %recent.conversation, "not a Discord channel and message id; skipping catch-up");
            return 0;
        };
        let place = if recent.is_group {
            Place::Guild(None)
        } else {
            Place::Dm
        };
        self.channels.remember(channel, place);
        // Read back over REST, messages carry no server (what LULL_ALLOWED_CHATS may
        // name): ask for it once.
        let guild = match self.channels.place(&self.rest, channel).await {
            Ok(Place::Guild(guild)) if recent.is_group => guild,
            _ => None,
        };
        let mut handed = 0;
        for _ in 0..CATCH_UP_PAGES {
            let Some(mut page) = self.history_after(channel, after).await else {
                return handed;
            };
            let full = page.len() >= usize::from(PAGE);
            // Discord lists newest first; store oldest first.
            page.sort_by_key(|m| m.id);
            for message in &mut page {
                message.guild_id = message.guild_id.or(guild);
                after = after.max(message.id.get());
                // A mention a thread was started from was stored in that thread's
                // conversation when it came (the thread's id is the message's): not
                // again here. A mention missed while down is answered where it is,
                // without a thread.
                if self.auto_thread && message.thread.is_some() {
                    continue;
                }
                if let Some(incoming) = self.translated(message, recent.is_group) {
                    handed += 1;
                    self.store(incoming).await;
                }
            }
            if !full {
                return handed;
            }
        }
        tracing::warn!(conversation = %recent.conversation, pages = CATCH_UP_PAGES, "stopped reading a busy channel's history; older missed messages there are not answered");
        handed
    }

    /// One page of history after `after`, with a few retries.
    async fn history_after(&self, channel: ChannelId, after: u64) -> Option<Vec<Message>> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let error = match self
                .rest
                .http
                .get_messages(
                    channel,
                    Some(MessagePagination::After(MessageId::new(after.max(1)))),
                    Some(PAGE),
                )
                .await
            {
                Ok(page) => return Some(page),
                Err(e) => from_serenity(&e, &self.rest.redactor),
            };
            let wait = match &error {
                SendError::Permanent(_) => None,
                _ if attempts >= HISTORY_ATTEMPTS => None,
                SendError::RetryAfter(asked) => {
                    Some(HISTORY_BACKOFF.delay_honouring(attempts, Some(*asked)))
                }
                SendError::Transient(_) => Some(HISTORY_BACKOFF.delay(attempts)),
            };
            let Some(wait) = wait else {
                tracing::warn!(channel = channel.get(), error = %error, "cannot read a Discord channel's history; messages sent there while disconnected are not answered");
                return None;
            };
            tokio::time::sleep(wait).await;
        }
    }
}
