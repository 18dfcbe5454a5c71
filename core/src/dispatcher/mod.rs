//! The dispatcher: ingest, scheduler, lease, final check, delivery.
//!
//! - [`Dispatcher::ingest`] stores a message in one transaction (version bump, timer
//!   armed) and returns; it never waits for the model.
//! - [`Dispatcher::run`] is the scheduler: it sleeps until the earliest due timer
//!   (woken at once for timers this process armed, polling for timers other processes
//!   armed) and starts a round per due conversation.
//! - A round (`round.rs`) claims the conversation's lease, delivers any committed but
//!   undelivered replies, collects the pending messages, generates one reply while
//!   renewing the lease, and commits it only if the conversation has not moved on.

mod delivery;
pub mod events;
mod lease_keeper;
mod round;
mod scheduler;
mod sessions;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, broadcast};

pub use events::Event;
pub use lease_keeper::LeaseKeeper;

use crate::access::AccessList;
use crate::clock::Clock;
use crate::commands::{self, Command};
use crate::domain::{ConversationId, HolderId, LeaseKey, Platform, Timestamp};
use crate::llm::Responder;
use crate::metrics as names;
use crate::store::{IngestOutcome, MessageEdit, NewMessage, NewNotice, Store, StoreError};
use crate::timing::{LeaseTiming, TimerPolicy};
use lull_port::{Content, Incoming, IncomingKind, Outbound};

/// The dispatcher's settings, validated before they get here.
#[derive(Debug, Clone)]
pub struct DispatchSettings {
    pub timers: TimerPolicy,
    pub lease: LeaseTiming,
    /// How often to look for work armed by other processes (and for leases of
    /// crashed processes that expired). Timers this process arms wake it at once;
    /// another process's work becomes due here this much later than for its owner.
    pub poll_every: Duration,
    /// How many earlier exchanges the model sees.
    pub history: usize,
    /// Rounds running at once in this process.
    pub max_rounds: usize,
    /// How long rounds in flight may finish after shutdown begins.
    pub shutdown_grace: Duration,
    pub access: AccessList,
    /// Longest message text accepted, in characters.
    pub max_message_chars: usize,
    /// Longest reply committed, in characters: a longer one is cut, with a note.
    pub max_reply_chars: usize,
}

impl DispatchSettings {
    /// Settings with the contract's defaults, for tests and embedding.
    pub fn defaults() -> Self {
        Self {
            timers: TimerPolicy::new(
                Duration::from_millis(1500),
                Duration::from_millis(10_000),
                20,
            )
            .expect("default timer policy is valid"),
            lease: LeaseTiming::with_ttl(Duration::from_secs(30))
                .expect("default lease timing is valid"),
            poll_every: Duration::from_secs(1),
            history: 10,
            max_rounds: 32,
            shutdown_grace: Duration::from_secs(10),
            access: AccessList::default(),
            max_message_chars: MAX_MESSAGE_CHARS,
            max_reply_chars: MAX_REPLY_CHARS,
        }
    }
}

/// The longest message lull accepts by default (Telegram's own limit is 4096, a
/// Discord message with Nitro 4000); longer ones are refused, not cut.
pub const MAX_MESSAGE_CHARS: usize = 16_000;

/// The longest reply lull sends by default (`LULL_MAX_REPLY_CHARS`): four Telegram
/// messages, eight Discord ones.
pub const MAX_REPLY_CHARS: usize = 16_000;

/// The smallest `LULL_MAX_REPLY_CHARS`: room for some reply and the note that it was cut.
pub const MIN_REPLY_CHARS: usize = 100;

pub use lull_port::{Accepted, IngestError};

impl From<StoreError> for IngestError {
    fn from(e: StoreError) -> Self {
        IngestError::NotStored(e.to_string())
    }
}

/// The core of lull. Shared by the adapters (which call [`Dispatcher::ingest`]) and
/// the scheduler task ([`Dispatcher::run`]).
pub struct Dispatcher {
    store: Arc<dyn Store>,
    responder: Arc<dyn Responder>,
    outbounds: HashMap<Platform, Arc<dyn Outbound>>,
    settings: DispatchSettings,
    clock: Arc<dyn Clock>,
    holder: HolderId,
    /// Wakes the scheduler: a timer armed here, a round that ended.
    wake: Notify,
    events: broadcast::Sender<Event>,
    /// Conversations with a round running in this process, so the scheduler does not
    /// start a second one that would only contend for the lease. A std mutex: held
    /// for a set operation, never across an await.
    in_flight: Mutex<HashSet<ConversationId>>,
    /// Conversations whose last round failed unexpectedly, not retried before the
    /// given time (so a persistent error cannot spin the scheduler).
    cooling: Mutex<HashMap<ConversationId, Timestamp>>,
    round_slots: Semaphore,
}

impl Dispatcher {
    pub fn new(
        store: Arc<dyn Store>,
        responder: Arc<dyn Responder>,
        outbounds: Vec<Arc<dyn Outbound>>,
        settings: DispatchSettings,
        clock: Arc<dyn Clock>,
    ) -> Arc<Self> {
        let (events, _) = broadcast::channel(4096);
        let round_slots = Semaphore::new(settings.max_rounds.max(1));
        Arc::new(Self {
            store,
            responder,
            outbounds: outbounds.into_iter().map(|o| (o.platform(), o)).collect(),
            settings,
            clock,
            holder: HolderId::generate(),
            wake: Notify::new(),
            events,
            in_flight: Mutex::new(HashSet::new()),
            cooling: Mutex::new(HashMap::new()),
            round_slots,
        })
    }

    /// Observe what the dispatcher does from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn holder(&self) -> &HolderId {
        &self.holder
    }

    pub fn settings(&self) -> &DispatchSettings {
        &self.settings
    }

    /// The platforms this process serves: only their timers are taken.
    pub fn platforms(&self) -> Vec<Platform> {
        let mut platforms: Vec<Platform> = self.outbounds.keys().copied().collect();
        platforms.sort();
        platforms
    }

    /// Claim `key` for this process by compare-and-swap and keep it renewed until the
    /// keeper is released or dropped. `Ok(None)`: another process holds it.
    async fn claim(&self, key: LeaseKey) -> Result<Option<LeaseKeeper>, StoreError> {
        let lease = self
            .store
            .claim_lease(
                &key,
                &self.holder,
                self.settings.lease.ttl(),
                self.clock.now(),
            )
            .await?;
        Ok(lease.map(|lease| {
            LeaseKeeper::start(
                self.store.clone(),
                self.clock.clone(),
                lease,
                self.settings.lease,
            )
        }))
    }

    fn emit(&self, event: Event) {
        // No subscriber is fine.
        let _ = self.events.send(event);
    }

    /// Accept an inbound update. Returns once it is stored (or refused); the reply
    /// comes later, from a round. When this returns `Ok`, the adapter may acknowledge
    /// the update to its platform: it will not be lost.
    pub async fn ingest(&self, incoming: Incoming) -> Result<Accepted, IngestError> {
        let platform = incoming.conversation.platform;
        if !self.outbounds.contains_key(&platform) {
            return Err(IngestError::UnknownPlatform(platform));
        }
        let now = self.clock.now();
        if !self.settings.access.allows(platform, &incoming.user_id) {
            if incoming.kind == IncomingKind::New {
                self.deny(&incoming, now).await?;
            }
            return Ok(Accepted::Denied);
        }
        let text = match incoming.content {
            Content::Text(ref text) => text.clone(),
            Content::Unsupported(ref what) => {
                if incoming.kind == IncomingKind::New {
                    self.notify(
                        &incoming,
                        commands::unsupported_text(what),
                        "unsupported",
                        now,
                    )
                    .await?;
                }
                return Ok(Accepted::Unsupported);
            }
        };
        if text.trim().is_empty() {
            return Err(IngestError::Empty);
        }
        let chars = lull_port::split::char_len(&text);
        if chars > self.settings.max_message_chars {
            return Err(IngestError::TooLong {
                chars,
                max: self.settings.max_message_chars,
            });
        }
        if incoming.kind == IncomingKind::New
            && let Some(command) = Command::parse(&text)
        {
            self.command(&incoming, command, now).await?;
            return Ok(Accepted::Command(command));
        }
        let outcome = match incoming.kind {
            IncomingKind::New => {
                let message = NewMessage {
                    conversation: incoming.conversation,
                    is_group: incoming.is_group,
                    message_id: incoming.message_id,
                    user_id: incoming.user_id,
                    author: incoming.author,
                    text,
                };
                self.store
                    .ingest(message, self.settings.timers, &self.holder, now)
                    .await?
            }
            IncomingKind::Edit => {
                let edit = MessageEdit {
                    conversation: incoming.conversation,
                    message_id: incoming.message_id,
                    text,
                };
                self.store
                    .edit(edit, self.settings.timers, &self.holder, now)
                    .await?
            }
        };
        Ok(match outcome {
            IngestOutcome::Stored {
                conversation,
                version,
                due_at,
            } => {
                metrics::counter!(names::MESSAGES_INGESTED).increment(1);
                tracing::debug!(%conversation, %version, due_in_ms = now.until(due_at).as_millis() as u64, "message stored");
                self.emit(Event::Ingested {
                    conversation,
                    version,
                });
                self.wake.notify_one();
                Accepted::Stored {
                    conversation,
                    version,
                }
            }
            IngestOutcome::Duplicate { conversation } => {
                tracing::debug!(%conversation, "redelivered message ignored");
                Accepted::Duplicate
            }
            IngestOutcome::EditIgnored => Accepted::EditIgnored,
        })
    }

    async fn command(
        &self,
        incoming: &Incoming,
        command: Command,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let text = match command {
            Command::Start | Command::Help => commands::HELP_TEXT.to_owned(),
            Command::Reset => {
                self.store
                    .reset_context(&incoming.conversation, incoming.is_group, &self.holder, now)
                    .await?;
                commands::RESET_TEXT.to_owned()
            }
        };
        tracing::info!(conversation = %incoming.conversation, command = command.name(), "command");
        self.notify(incoming, text, command.name(), now).await
    }

    /// Queue a notice answering `incoming`, once per message (a redelivered command
    /// is not answered twice), and wake the scheduler to deliver it.
    async fn notify(
        &self,
        incoming: &Incoming,
        text: String,
        what: &str,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let notice = NewNotice {
            conversation: incoming.conversation.clone(),
            is_group: incoming.is_group,
            text,
            reply_to: incoming.is_group.then(|| incoming.message_id.clone()),
            dedupe_key: format!("{what}/{}/{}", incoming.conversation, incoming.message_id),
        };
        if self.store.enqueue_notice(notice, &self.holder, now).await? {
            self.wake.notify_one();
        }
        Ok(())
    }

    /// Tell an unlisted user how to get access: once a day per user, whatever they
    /// send, and nothing reaches the model.
    async fn deny(&self, incoming: &Incoming, now: Timestamp) -> Result<(), StoreError> {
        let platform = incoming.conversation.platform;
        tracing::info!(%platform, user = %incoming.user_id, "message from a user not in LULL_ALLOWED_USERS");
        let day = now.0 / 86_400_000;
        let notice = NewNotice {
            conversation: incoming.conversation.clone(),
            is_group: incoming.is_group,
            text: AccessList::denial_text(platform, &incoming.user_id),
            reply_to: incoming.is_group.then(|| incoming.message_id.clone()),
            dedupe_key: format!("denied/{platform}/{}/{day}", incoming.user_id),
        };
        if self.store.enqueue_notice(notice, &self.holder, now).await? {
            self.wake.notify_one();
        }
        Ok(())
    }
}

/// The port adapters see: storing updates and the catch-up query, nothing else.
#[async_trait::async_trait]
impl lull_port::Intake for Dispatcher {
    async fn ingest(&self, incoming: Incoming) -> Result<Accepted, IngestError> {
        Dispatcher::ingest(self, incoming).await
    }

    async fn recent_conversations(
        &self,
        platform: Platform,
        since: Timestamp,
        limit: usize,
    ) -> Result<Vec<lull_port::RecentConversation>, IngestError> {
        Ok(self
            .store
            .recent_conversations(platform, since, limit)
            .await?)
    }
}
