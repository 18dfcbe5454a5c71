//! The dispatcher: the core's one engine, one job per module.
//!
//! - `ingest`: an inbound update walks one chain of admission steps, then is stored
//!   in one transaction (version bump, timer armed) and its after-store effects run;
//!   or a step answers it at once (a command, a denial); nothing waits for the model.
//!   `not_stored`: what ingest and the rooms it hands updates to answer when the store
//!   could not take an update.
//! - `commands`: what each chat command does and answers, at ingest; `controls`: the
//!   commands that change what lull does in a conversation (`/model`, `/persona`,
//!   `/prompt`, `/stop`, `/status`).
//! - `console`: the operator's console's changes to a chat, through the chat
//!   commands' own store operations.
//! - `notices`: the one builder of notices (ingest's and rounds'), stored at most
//!   once per dedupe key.
//! - `scheduler`: sleeps until the earliest deadline (woken at once for work this
//!   process armed, polling for work other processes armed) and starts a round per
//!   due conversation.
//! - `round`: under the conversation's lease, its stages in order over one state
//!   (approvals, pay, transcribe, context, recall, images, reserve, generate, settle, report,
//!   commit: the reply committed only if the conversation has not moved on, the final
//!   check); then delivers. `tool_refusals`: the models that refused tools, offered
//!   none for a while.
//! - `interrupt`: why a step under the lease ended a round early (rounds and
//!   delivery share it); `bounds`: the one cut of a reply and its draft.
//! - `drafts`: shows a reply as a live draft while it is written (where the platform
//!   has drafts), paced per conversation; a preview that decides nothing.
//! - `delivery`: sends outbox rows in order, part by part, recording every attempt,
//!   retrying with backoff, dead-lettering what cannot go out.
//! - `sessions`: elects the one process that holds a platform connection and runs
//!   the adapter's sessions.
//! - `background`: the work beside the rounds (ack reactions, draft placeholders),
//!   tracked and stopped after the rounds at shutdown: nothing is detached.
//! - `acks`: the ack reaction on a burst's message while lull waits, set once per
//!   burst and taken off when the reply covering it is delivered; never in the way.
//! - `job_commands`: `/remind`, `/schedule`, `/jobs`, `/timezone`, answered at ingest;
//!   `job_tools`: the model's `lull__schedule`, `lull__jobs`, `lull__cancel_job`.
//! - `jobs`: due job occurrences fired, each once, at the scheduler's look (a
//!   reminder's notice, a task's message); missed ones said once, never one a slot.
//! - `memory`: facts remembered as rows of a person's or a chat's scope, shown in the
//!   system prompt, staged by the model's `lull__remember` and `lull__forget` and
//!   written with the reply; `/memory` and `/forgetme`.
//! - `summaries`: a long conversation's summary, made after a reply when the history
//!   fills its window, under its own lease, stored only if it covers more.
//! - `retention`: `LULL_RETENTION_DAYS`, old texts removed in small batches beside
//!   the rounds, on one process at a time.
//! - `overheard`: group context, the recent group messages not addressed to lull,
//!   kept (bounded) for the prompt; never a message to answer.
//! - `threads`: the Discord threads lull opened, where a message needs no mention.
//! - `titles`: each chat's name as its platform shows it, noted for the console when it
//!   changed.
//! - `lease_keeper`: claims a lease and renews it for as long as the work it protects.
//! - `wallet`: who pays for a round, what it reserves before the model is asked, and
//!   the settle after; token budgets that never hold a conversation for good nor let
//!   it spend past them.
//!
//! - [`events`]: what the dispatcher did, broadcast for observers (`lull chat`, tests).
//!
//! [`Dispatcher`] holds what they share; it is also the adapters' [`lull_port::Intake`].

pub use console::ConsoleChange;
pub use jobs::{JOB_MIN_INTERVAL, JOBS_PER_CHAT, JobSettings, MissedPolicy};
pub use memory::{MEMORY_CHARS, MemorySettings};
pub use summaries::{SUMMARY_MAX_CHARS, SummarySettings};
mod acks;
mod background;
mod bounds;
mod commands;
mod console;
mod controls;
mod delivery;
pub mod drafts;
pub mod events;
mod ingest;
mod interrupt;
mod job_commands;
mod job_tools;
mod jobs;
mod lease_keeper;
mod memory;
mod not_stored;
mod notices;
mod overheard;
mod retention;
mod round;
mod scheduler;
mod sessions;
mod summaries;
mod threads;
mod titles;
mod tool_refusals;
mod wallet;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use lull_port::{Health, Inbound, Incoming, Outbound};
use tokio::sync::{Notify, broadcast};
use tokio_util::sync::CancellationToken;

pub use events::Event;
pub use lull_port::{Accepted, IngestError};
pub use sessions::SessionsEnded;

use crate::access::{Access, AccessRule};
use crate::clock::Clock;
use crate::controls::Controls;
use crate::domain::{HolderId, Platform, Timestamp};
use crate::limits::Limits;
use crate::llm::transcribe::Transcriber;
use crate::llm::{HistoryBudget, Responder};
use crate::refreshed::Refreshed;
use crate::store::{RecentQuery, Store, StoreError, Typing};
use crate::timing::{LeaseTiming, TimerPolicy};
use crate::tools::web::Web;
use crate::tools::{ToolSettings, Toolbox};

/// The dispatcher's settings, validated before they get here. The one declaration of
/// the core's settings: the binary fills it from the environment, tests from
/// [`Default`] (the contract's defaults).
#[derive(Debug, Clone)]
pub struct DispatchSettings {
    /// The capped debounce. The store arms timers with it: it is opened with it
    /// ([`crate::store::open`]).
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
    /// Who may talk to the bot and who administers it.
    pub access: Access,
    /// What the bot may spend.
    pub limits: Limits,
    /// Longest message text accepted, in characters.
    pub max_message_chars: usize,
    /// Longest reply committed, in characters: a longer one is cut, with a note.
    pub max_reply_chars: usize,
    /// `LULL_STREAM=auto`: replies are shown as live drafts while they are written,
    /// where the platform has drafts (`off`: never).
    pub drafts: bool,
    /// `LULL_VISION=auto`: images of the pending batch are fetched and sent to the
    /// model as image parts (`off`: the model sees only their `[image]` marker).
    pub vision: bool,
    /// `LULL_MAX_IMAGE_BYTES`: the largest image fetched; a larger one is not read,
    /// and the user is told.
    pub max_image_bytes: u64,
    /// `LULL_MAX_AUDIO_SECONDS`: the longest voice note or audio file transcribed; a
    /// longer one is not, and the user is told.
    pub max_audio_seconds: u32,
    /// Stop a generation as soon as a newer message makes its reply stale (on this
    /// process at once, through the event bus; on another, found at the next poll),
    /// unless the cap forces the round: the covering round starts without waiting
    /// for a reply that was always going to be dropped. Off only in counter-tests.
    pub cancel_overtaken: bool,
    /// How rounds run tools (`LULL_TOOL_STEPS`, `LULL_TOOL_TIMEOUT_MS`,
    /// `LULL_APPROVAL_TTL`), when a toolbox is set ([`DispatcherBuilder::toolbox`]).
    pub tools: ToolSettings,
    /// What a conversation may choose (`LULL_MODELS`, `LULL_PERSONAS`) and
    /// `LULL_IDLE_RESET`.
    pub controls: Controls,
    /// `LULL_ACK_REACTION`: the emoji lull reacts with to a stored message whose reply
    /// is not immediate, until the reply is delivered; `None` (`off`): no reaction.
    pub ack_reaction: Option<String>,
    /// `LULL_GROUP_CONTEXT`: how many recent group messages not addressed to lull are
    /// kept per conversation and shown to the model when it is addressed; 0: none.
    pub group_context: usize,
    /// `LULL_DISCORD_AUTO_THREAD`: a mention in a Discord channel is answered in a
    /// thread lull opens for it, where messages then need no mention.
    pub discord_auto_thread: bool,
    /// `LULL_JOBS`: reminders and scheduled tasks; `None` (`off`): no job fires, and
    /// the job commands say they are off.
    pub jobs: Option<JobSettings>,
    /// `LULL_MEMORY`: facts remembered as rows, shown in the system prompt; `None`
    /// (`off`): nothing shown, the memory tools not offered, the commands say so.
    pub memory: Option<MemorySettings>,
    /// `LULL_TOOLS=auto`: lull's own tools (memory's) are offered to the model, with
    /// or without MCP servers; `off`: no tool at all.
    pub builtin_tools: bool,
    /// `LULL_SUMMARY`: a long conversation's summary, made after a reply when the
    /// history fills its window, shown before the exchanges after it; `None` (`off`):
    /// the newest exchanges only, as without summaries.
    pub summary: Option<SummarySettings>,
    /// `LULL_RETENTION_DAYS`: texts of answered messages and delivered replies older
    /// than this are removed (rows kept); `None`: everything is kept.
    pub retention: Option<Duration>,
}

impl Default for DispatchSettings {
    fn default() -> Self {
        Self {
            timers: timer_policy(
                TimerPolicy::new(
                    Duration::from_millis(DEBOUNCE_MS),
                    Duration::from_millis(MAX_WAIT_MS),
                    MAX_BATCH,
                )
                .expect("default timer policy is valid"),
                DEBOUNCE,
                None,
            )
            .expect("default adaptive waiting is valid"),
            lease: LeaseTiming::with_ttl(Duration::from_millis(LEASE_TTL_MS))
                .expect("default lease timing is valid"),
            poll_every: Duration::from_millis(POLL_MS),
            history: HistoryBudget {
                messages: HISTORY_MESSAGES,
                chars: HISTORY_CHARS,
            }
            .exchanges(),
            max_rounds: 32,
            shutdown_grace: Duration::from_millis(SHUTDOWN_GRACE_MS),
            access: Access::default(),
            limits: Limits::default(),
            max_message_chars: MAX_MESSAGE_CHARS,
            max_reply_chars: MAX_REPLY_CHARS,
            drafts: true,
            vision: true,
            max_image_bytes: MAX_IMAGE_BYTES,
            max_audio_seconds: MAX_AUDIO_SECONDS,
            cancel_overtaken: true,
            tools: ToolSettings::default(),
            controls: Controls::default(),
            ack_reaction: Some(ACK_REACTION.to_owned()),
            group_context: 0,
            discord_auto_thread: false,
            jobs: Some(JobSettings::default()),
            memory: Some(MemorySettings::default()),
            builtin_tools: true,
            summary: Some(SummarySettings {
                model: None,
                history: HistoryBudget {
                    messages: HISTORY_MESSAGES,
                    chars: HISTORY_CHARS,
                },
            }),
            retention: None,
        }
    }
}

/// `policy` with `LULL_DEBOUNCE` applied: fixed as it is, or adaptive with the shortest
/// wait `min` (default [`DEBOUNCE_MIN_MS`], or the debounce itself when that is
/// shorter). Refused, naming `LULL_DEBOUNCE_MIN_MS`, when a `min` given is longer than
/// the debounce.
pub fn timer_policy(
    policy: TimerPolicy,
    mode: crate::rhythm::DebounceMode,
    min: Option<Duration>,
) -> Result<TimerPolicy, crate::timing::TimingError> {
    match mode {
        crate::rhythm::DebounceMode::Fixed => Ok(policy),
        crate::rhythm::DebounceMode::Adaptive => policy.adaptive(
            min.unwrap_or_else(|| Duration::from_millis(DEBOUNCE_MIN_MS).min(policy.debounce())),
        ),
    }
}

// The contract's defaults, declared once: the binary's flags take them as their
// default values and [`DispatchSettings::default`] builds from them, so the two
// cannot drift.

/// `LULL_DEBOUNCE_MS`: a reply waits this long after the last message.
pub const DEBOUNCE_MS: u64 = 1500;

/// `LULL_MAX_WAIT_MS`: the debounce's cap, from the oldest unanswered message.
pub const MAX_WAIT_MS: u64 = 10_000;

/// `LULL_DEBOUNCE`: each wait picked from the conversation's rhythm
/// ([`crate::rhythm`]), or always `LULL_DEBOUNCE_MS`.
pub const DEBOUNCE: crate::rhythm::DebounceMode = crate::rhythm::DebounceMode::Adaptive;

/// `LULL_DEBOUNCE_MIN_MS`: the shortest adaptive wait (`LULL_DEBOUNCE_MS` when that is
/// shorter).
pub const DEBOUNCE_MIN_MS: u64 = 300;

/// `LULL_MAX_BATCH`: answered at once when this many messages are pending.
pub const MAX_BATCH: u32 = 20;

/// `LULL_LEASE_TTL_MS`: a lease's lifetime, renewed every third of it.
pub const LEASE_TTL_MS: u64 = 30_000;

/// `LULL_POLL_MS`: how often to look for work armed by other processes.
pub const POLL_MS: u64 = 1000;

/// `LULL_HISTORY_MESSAGES`: earlier messages (user turns and replies) the model sees;
/// read from the store as half as many exchanges.
pub const HISTORY_MESSAGES: usize = 20;

/// `LULL_HISTORY_CHARS`: the character budget of that history.
pub const HISTORY_CHARS: usize = 16_000;

/// `LULL_SHUTDOWN_GRACE_MS`: how long rounds in flight may finish on SIGTERM.
pub const SHUTDOWN_GRACE_MS: u64 = 10_000;

/// `LULL_MAX_AUDIO_SECONDS`: the longest voice message or audio file transcribed.
pub const MAX_AUDIO_SECONDS: u32 = 300;

/// `LULL_ACK_REACTION`: the reaction on a message lull has stored and will answer.
pub const ACK_REACTION: &str = "👀";

/// The longest message lull accepts by default (Telegram's own limit is 4096, a
/// Discord message with Nitro 4000); longer ones are refused, not cut.
pub const MAX_MESSAGE_CHARS: usize = 16_000;

/// The longest reply lull sends by default (`LULL_MAX_REPLY_CHARS`): four Telegram
/// messages, eight Discord ones.
pub const MAX_REPLY_CHARS: usize = 16_000;

/// The largest image fetched by default (`LULL_MAX_IMAGE_BYTES`): 10 MB.
pub const MAX_IMAGE_BYTES: u64 = 10 * 1024 * 1024;

/// The smallest `LULL_MAX_REPLY_CHARS`: room for some reply and the note that it was cut.
pub const MIN_REPLY_CHARS: usize = 100;

impl From<StoreError> for IngestError {
    fn from(e: StoreError) -> Self {
        IngestError::NotStored(e.to_string())
    }
}

/// The core of lull: what ingest, the scheduler, rounds, delivery and platform
/// sessions share. Shared by the adapters (through [`lull_port::Intake`]) and the
/// scheduler task ([`Dispatcher::run`]).
pub struct Dispatcher {
    store: Arc<dyn Store>,
    responder: Arc<dyn Responder>,
    /// Transcribes voice notes and audio at the start of a round; unset (the `echo`
    /// responder), they reach the model as their marker only.
    transcriber: Option<Arc<dyn Transcriber>>,
    /// The tools the model may call (MCP servers); unset, rounds offer none.
    toolbox: Option<Arc<dyn Toolbox>>,
    /// lull's web tools (`lull__fetch`, `lull__search`), beside the toolbox's.
    web: Option<Arc<Web>>,
    /// Set once the model refused image parts (a model without vision): later rounds
    /// of this process send it no images (a restart, perhaps with another model,
    /// tries again).
    images_refused: std::sync::atomic::AtomicBool,
    /// Set when shutdown begins: rounds in flight finish what they can without
    /// waiting to retry a failed send (the row stays in the outbox for the next
    /// start), so an unreachable receiver does not hold the stop for the whole grace.
    draining: CancellationToken,
    /// Models that refused `tools` (without tool support): later rounds of this
    /// process offer them none for a while (module docs of `tool_refusals`).
    tool_refusals: tool_refusals::ToolRefusals,
    /// The database's salt for the idempotency keys tool servers see, read once.
    idempotency_salt: tokio::sync::OnceCell<String>,
    outbounds: HashMap<Platform, Arc<dyn Outbound>>,
    settings: DispatchSettings,
    clock: Arc<dyn Clock>,
    /// This process as a lease holder; unique per start.
    holder: HolderId,
    /// Wakes the scheduler: a timer armed or a notice queued here that is due before
    /// it would wake anyway, a round that ended.
    wake: Notify,
    /// Live drafts: which conversations show them, and their pacing.
    drafts: Arc<drafts::Drafts>,
    /// Ack reactions: set on a burst while it waits, taken off when it is answered.
    acks: Arc<acks::Acks>,
    /// The work beside the rounds (acks, draft placeholders), stopped after them.
    background: background::Background,
    /// When the scheduler sleeps until (milliseconds since the epoch); while it is
    /// looking for work, the latest it will wake after the look (a poll interval
    /// from its start), so nothing armed meanwhile and due sooner is missed.
    sleeping_until: AtomicI64,
    /// When the scheduler looks for due jobs next (milliseconds since the epoch): the
    /// earliest job it read, at most a poll away (jobs made by other processes), sooner
    /// when this process makes one ([`Dispatcher::job_armed`]). A look for due work
    /// that comes earlier (a message's timer) does not ask the database for jobs.
    jobs_due_by: AtomicI64,
    /// When the retention sweep runs next here (milliseconds since the epoch): at the
    /// first look, then every `retention::SWEEP_EVERY`.
    retention_due_by: AtomicI64,
    events: broadcast::Sender<Event>,
    /// Events emitted so far: the scheduler reads the pending gauge again only after
    /// something happened here (or, for other processes' work, every
    /// `GAUGE_QUIET_POLLS` polls), so an idle process makes one database call a poll.
    events_emitted: std::sync::atomic::AtomicU64,
    /// The admins' run-time access decisions as last read: read again once older than
    /// `poll_every` (so a decision taken in another process counts here within that),
    /// and at once after this process recorded one.
    access_rules: Refreshed<Vec<AccessRule>, StoreError>,
    /// The server's model list as last read, for `/model` (`controls`): read again
    /// once older than `controls::MODEL_LIST_TTL`. `Err`: why there is none.
    models: Refreshed<Vec<String>, String>,
    /// The chat titles this process noted last (`titles`).
    titles: titles::Titles,
}

/// What a [`Dispatcher`] is built from ([`Dispatcher::builder`]): everything it uses
/// is given before it exists, so nothing is ever set on a running dispatcher.
pub struct DispatcherBuilder {
    store: Arc<dyn Store>,
    responder: Arc<dyn Responder>,
    settings: DispatchSettings,
    clock: Arc<dyn Clock>,
    outbounds: Vec<Arc<dyn Outbound>>,
    transcriber: Option<Arc<dyn Transcriber>>,
    toolbox: Option<Arc<dyn Toolbox>>,
    web: Option<Arc<Web>>,
}

impl DispatcherBuilder {
    /// Offer lull's web tools (`lull__fetch`, `lull__search`) with every round's
    /// tools, with or without a toolbox.
    pub fn web(mut self, web: Arc<Web>) -> Self {
        self.web = (!web.is_empty()).then_some(web);
        self
    }

    /// Deliver to (and take updates from) these platforms' adapters: one per platform.
    pub fn outbounds(mut self, outbounds: Vec<Arc<dyn Outbound>>) -> Self {
        self.outbounds = outbounds;
        self
    }

    /// Transcribe voice notes and audio files with `transcriber`; without one (the
    /// `echo` responder), they reach the model as their marker only.
    pub fn transcriber(mut self, transcriber: Arc<dyn Transcriber>) -> Self {
        self.transcriber = Some(transcriber);
        self
    }

    /// Offer the tools of `toolbox` to the model; without one, rounds offer none.
    pub fn toolbox(mut self, toolbox: Arc<dyn Toolbox>) -> Self {
        self.toolbox = Some(toolbox);
        self
    }

    /// The dispatcher, ready for [`Dispatcher::run`] and for the adapters' ingest.
    pub fn build(self) -> Arc<Dispatcher> {
        let settings = self.settings;
        let (events, _) = broadcast::channel(4096);
        let background = background::Background::default();
        let drafts =
            Arc::new(drafts::Drafts::new(settings.drafts).in_background(background.clone()));
        let acks = acks::Acks::new(
            settings.ack_reaction.clone(),
            self.store.clone(),
            background.clone(),
        );
        Arc::new(Dispatcher {
            store: self.store,
            responder: self.responder,
            transcriber: self.transcriber,
            images_refused: std::sync::atomic::AtomicBool::new(false),
            draining: CancellationToken::new(),
            toolbox: self.toolbox,
            web: self.web,
            tool_refusals: tool_refusals::ToolRefusals::default(),
            idempotency_salt: tokio::sync::OnceCell::new(),
            outbounds: self
                .outbounds
                .into_iter()
                .map(|o| (o.platform(), o))
                .collect(),
            settings,
            clock: self.clock,
            holder: HolderId::generate(),
            wake: Notify::new(),
            drafts,
            acks,
            background,
            sleeping_until: AtomicI64::new(i64::MAX),
            jobs_due_by: AtomicI64::new(i64::MIN),
            retention_due_by: AtomicI64::new(i64::MIN),
            events,
            events_emitted: std::sync::atomic::AtomicU64::new(0),
            access_rules: Refreshed::default(),
            models: Refreshed::default(),
            titles: titles::Titles::default(),
        })
    }
}

impl Dispatcher {
    /// Start building a dispatcher on `store`, answering with `responder` under
    /// `settings`, reading time from `clock` (then [`DispatcherBuilder::build`]).
    pub fn builder(
        store: Arc<dyn Store>,
        responder: Arc<dyn Responder>,
        settings: DispatchSettings,
        clock: Arc<dyn Clock>,
    ) -> DispatcherBuilder {
        DispatcherBuilder {
            store,
            responder,
            settings,
            clock,
            outbounds: Vec::new(),
            transcriber: None,
            toolbox: None,
            web: None,
        }
    }

    /// The toolbox, when tools are on.
    pub fn toolbox(&self) -> Option<&Arc<dyn Toolbox>> {
        self.toolbox.as_ref()
    }

    /// lull's web tools, when on.
    pub fn web(&self) -> Option<&Arc<Web>> {
        self.web.as_ref()
    }

    /// Whether everyone who wrote in `batch` is one of lull's admins: the one rule for
    /// what a burst may have done for it in a group (admins-only tools, the job tools'
    /// changes, the chat's memories).
    fn written_by_admins(&self, batch: &crate::store::Batch) -> bool {
        let platform = batch.conversation.platform;
        batch
            .pending
            .iter()
            .all(|m| self.settings.access.admins.contains(platform, &m.user_id))
    }

    /// The database's idempotency salt
    /// ([`ActionStore::idempotency_salt`](crate::store::ActionStore::idempotency_salt)), read at
    /// most once per process (a failed read is tried again next time).
    pub(super) async fn idempotency_salt(&self) -> Result<&str, StoreError> {
        self.idempotency_salt
            .get_or_try_init(|| self.store.idempotency_salt())
            .await
            .map(String::as_str)
    }

    /// The run-time access decisions, at most `poll_every` old.
    async fn access_rules(&self) -> Result<Arc<Vec<AccessRule>>, StoreError> {
        self.access_rules
            .get(self.settings.poll_every, || self.store.access_rules())
            .await
    }

    /// Forget the cached access decisions (this process just recorded one).
    fn forget_access_rules(&self) {
        self.access_rules.forget();
    }

    /// Observe what the dispatcher does from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// The store this dispatcher works on (for `lull chat`'s "all answered?" check and
    /// for tests; adapters never see it).
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// This process as a lease holder (unique per start): how the status page tells
    /// this process from the other replicas holding leases.
    pub fn holder(&self) -> &HolderId {
        &self.holder
    }

    /// Accept an inbound update. Returns once it is stored (or refused); the reply
    /// comes later, from a round. When this returns `Ok`, the adapter may acknowledge
    /// the update to its platform: it will not be lost.
    pub async fn ingest(&self, incoming: Incoming) -> Result<Accepted, IngestError> {
        ingest::ingest(self, incoming).await
    }

    /// Run the scheduler until `shutdown` fires, then let rounds in flight finish
    /// within the grace period; rounds still running after it are stopped (their
    /// generations and sends cancelled, their outbox rows kept) and hand their leases
    /// back, so another process takes over at once.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        scheduler::Scheduler::new(self).run(shutdown).await
    }

    /// Hold `inbound`'s platform connection whenever this process wins its poller
    /// lease, one session at a time, until `shutdown`; an error when a session says
    /// trying again cannot help (a rejected token). See `sessions`.
    pub async fn serve_platform(
        self: &Arc<Self>,
        inbound: Arc<dyn Inbound>,
        health: Health,
        shutdown: CancellationToken,
    ) -> Result<(), SessionsEnded> {
        sessions::serve(self, inbound, health, shutdown).await
    }

    /// The platforms this process serves: only their timers are taken.
    fn platforms(&self) -> Vec<Platform> {
        let mut platforms: Vec<Platform> = self.outbounds.keys().copied().collect();
        platforms.sort();
        platforms
    }

    /// Wake the scheduler for work due at `due_at`, unless it already wakes by then:
    /// a burst of messages wakes it once, not once per message.
    fn wake_by(&self, due_at: Timestamp) {
        if due_at.0 < self.sleeping_until.load(Ordering::SeqCst) {
            self.wake.notify_one();
        }
    }

    /// A job made here is due at `at`: the scheduler looks for it then, not a poll
    /// later.
    fn job_armed(&self, at: Timestamp) {
        self.jobs_due_by.fetch_min(at.0, Ordering::SeqCst);
        self.wake_by(at);
    }

    fn emit(&self, event: Event) {
        self.events_emitted.fetch_add(1, Ordering::Relaxed);
        // No subscriber is fine.
        let _ = self.events.send(event);
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
            .recent_conversations(RecentQuery {
                platform,
                since,
                limit,
            })
            .await?)
    }

    /// With adaptive waiting, a typing author holds their pending burst's timer for
    /// [`crate::rhythm::TYPING_HOLD`], never past its cap; with a fixed debounce,
    /// typing changes nothing.
    async fn typing(
        &self,
        conversation: lull_port::domain::ConversationRef,
        user_id: String,
    ) -> Result<(), IngestError> {
        if self.settings.timers.mode() != crate::rhythm::DebounceMode::Adaptive {
            return Ok(());
        }
        let now = self.clock.now();
        if let Some(due_at) = self
            .store
            .extend_timer(Typing {
                conversation: &conversation,
                user_id: &user_id,
                hold: crate::rhythm::TYPING_HOLD,
                now,
            })
            .await?
        {
            tracing::debug!(%conversation, due_at = due_at.0, "the author is typing: the timer waits");
        }
        Ok(())
    }
}
