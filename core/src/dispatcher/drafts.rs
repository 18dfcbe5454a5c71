//! Live drafts: while a round generates, the reply so far is shown as a draft on
//! platforms that have them (Telegram's private chats, `lull chat` on a terminal),
//! with `LULL_STREAM=auto`. A draft is a preview, never a message: nothing here
//! decides what is committed or sent. The final check alone decides whether the reply
//! becomes a real message, through the outbox as without drafts; a reply found stale
//! leaves only a draft behind, which the next batch's draft replaces.
//!
//! - **One draft per batch.** Its id comes from the batch's version
//!   ([`DraftId::for_version`]): the placeholder shown when a message is stored and
//!   the round that answers up to that message share it (the platform animates the
//!   placeholder into the reply), and a newer batch never reuses an older one's id.
//! - **Paced per conversation,** by this process: at most one draft call every
//!   [`DRAFT_EVERY`], for placeholders and rounds together; after a 429 the next call
//!   waits as long as the platform asked and the pace halves (down to one call every
//!   [`SLOWEST`]), recovering a quarter with each draft that goes through. A draft the text has not outgrown is not sent again, except to keep
//!   it from lapsing ([`REFRESH`]).
//! - **Best effort, never in the way.** Drafting runs beside the generation and is
//!   dropped with it, so a slow or rate-limited draft never delays the final message;
//!   a failing draft never fails the round. A platform that refuses drafts for good
//!   ([`SendError::Permanent`]) gets "typing…" instead for the rest of the round.
//! - **Stale drafts stop.** A round stops updating its draft as soon as a newer
//!   message of its conversation is stored in this process (its reply will be
//!   dropped, or forced out by the cap): that message's placeholder replaces the
//!   draft. A round in another process learns it only at its final check; the next
//!   round then shows its own placeholder at once.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use super::Event;
use super::background::Background;
use crate::domain::{ConversationId, ConversationRef, Platform, Version};
use lull_port::{DraftId, Outbound, SendError};

/// The most draft calls per conversation: one a second. Telegram publishes no limit
/// for drafts; one message per second per chat is what it asks of bots, and a draft
/// update costs it as much.
pub const DRAFT_EVERY: Duration = Duration::from_secs(1);

/// The slowest pace, after repeated 429s.
pub const SLOWEST: Duration = Duration::from_secs(8);

/// A draft lapses on its own (Telegram: a 30-second preview): one unchanged this long
/// is shown again.
pub const REFRESH: Duration = Duration::from_secs(20);

/// One draft call's time limit: a slow one must not hold back the next.
const CALL_LIMIT: Duration = Duration::from_secs(5);

/// Conversations whose pacing is kept before idle ones are forgotten.
const KEEP_CONVERSATIONS: usize = 256;

/// The drafts of this process: which conversations get them, and their pacing.
pub(super) struct Drafts {
    /// `LULL_STREAM=auto`.
    enabled: bool,
    /// Per conversation. A std mutex: held to read or change a few fields, never
    /// across an await.
    paces: Mutex<HashMap<ConversationRef, Pace>>,
    /// Where placeholders are paced: tracked, cancelled at once at shutdown.
    background: Background,
}

/// One conversation's draft pacing and what it shows.
#[derive(Debug)]
struct Pace {
    /// The earliest moment the next draft call may start.
    next_at: Instant,
    /// Between two calls: [`DRAFT_EVERY`], longer after a 429.
    every: Duration,
    /// The draft shown last, and when.
    shown: Option<(DraftId, Instant)>,
    /// The newest batch version a round drafts for: a placeholder for it or an older
    /// one would only hide the round's draft.
    claimed: Version,
    /// A stored message whose placeholder waits for a free slot (the newest).
    waiting: Option<Version>,
}

impl Pace {
    fn new(now: Instant) -> Self {
        Self {
            next_at: now,
            every: DRAFT_EVERY,
            shown: None,
            claimed: Version::default(),
            waiting: None,
        }
    }

    /// Take the next slot if it has come: the call may start now.
    fn take_slot(&mut self, now: Instant) -> bool {
        if self.next_at > now {
            return false;
        }
        self.next_at = now + self.every;
        true
    }
}

/// What a placeholder waiting for its slot does next.
enum Step {
    Wait(Instant),
    Show(DraftId),
    Done,
}

impl Drafts {
    pub(super) fn new(enabled: bool) -> Self {
        Self {
            enabled,
            paces: Mutex::new(HashMap::new()),
            background: Background::default(),
        }
    }

    /// Run the placeholders' pacing in `background` (cancelled at once at shutdown:
    /// a placeholder only shows).
    pub(super) fn in_background(mut self, background: Background) -> Self {
        self.background = background;
        self
    }

    /// The outbound that shows drafts in `conversation`, if drafts are on and the
    /// platform shows them there.
    pub(super) fn outbound(
        &self,
        outbounds: &HashMap<Platform, Arc<dyn Outbound>>,
        conversation: &ConversationRef,
    ) -> Option<Arc<dyn Outbound>> {
        if !self.enabled {
            return None;
        }
        outbounds
            .get(&conversation.platform)
            .filter(|o| o.drafts(conversation))
            .cloned()
    }

    /// Run `f` on the pacing of `conversation`.
    fn pace<T>(&self, conversation: &ConversationRef, f: impl FnOnce(&mut Pace) -> T) -> T {
        let now = Instant::now();
        let mut paces = self.paces.lock().expect("draft pacing poisoned");
        if paces.len() > KEEP_CONVERSATIONS {
            // A minute without drafts: nothing worth keeping (a 429's wait is over).
            paces.retain(|_, p| p.waiting.is_some() || p.next_at + SLOWEST * 8 > now);
        }
        f(paces
            .entry(conversation.clone())
            .or_insert_with(|| Pace::new(now)))
    }

    /// Reserve the next free slot of `conversation`; the call may start then.
    fn reserve(&self, conversation: &ConversationRef) -> Instant {
        self.pace(conversation, |pace| {
            let slot = pace.next_at.max(Instant::now());
            pace.next_at = slot + pace.every;
            slot
        })
    }

    /// Record how a draft call went: what is shown (and a pace recovering from a
    /// 429), or, after a 429, a later next slot and a slower pace.
    fn record(
        &self,
        conversation: &ConversationRef,
        draft: DraftId,
        result: &Result<(), SendError>,
    ) {
        self.pace(conversation, |pace| match result {
            Ok(()) => {
                pace.shown = Some((draft, Instant::now()));
                // Back towards the usual pace after a 429, a quarter at a time.
                pace.every = (pace.every - pace.every / 4).max(DRAFT_EVERY);
            }
            Err(SendError::RetryAfter(wait)) => {
                pace.every = (pace.every * 2).min(SLOWEST);
                pace.next_at = pace.next_at.max(Instant::now() + *wait);
                tracing::debug!(%conversation, retry_after_ms = wait.as_millis() as u64, every_ms = pace.every.as_millis() as u64, "drafts rate limited; slowing down");
            }
            Err(e) => tracing::debug!(%conversation, error = %e, "a draft failed"),
        });
    }

    /// A message of `conversation` was stored at `version`: show a placeholder in its
    /// draft until a round shows the reply. It goes out at the conversation's next
    /// free slot (a burst gets one, for its newest message), and not at all once a
    /// round drafts for that version. Ingest never waits for it.
    pub(super) fn placeholder(
        self: &Arc<Self>,
        outbound: Arc<dyn Outbound>,
        conversation: ConversationRef,
        version: Version,
    ) {
        let idle = self.pace(&conversation, |pace| {
            if version <= pace.claimed {
                return false;
            }
            let idle = pace.waiting.is_none();
            pace.waiting = pace.waiting.max(Some(version));
            idle
        });
        if !idle {
            // The placeholder already waiting shows this version instead.
            return;
        }
        let drafts = self.clone();
        self.background.show(async move {
            loop {
                let step = drafts.pace(&conversation, |pace| match pace.waiting {
                    Some(version) if version > pace.claimed => {
                        if pace.take_slot(Instant::now()) {
                            pace.waiting = None;
                            Step::Show(DraftId::for_version(version))
                        } else {
                            Step::Wait(pace.next_at)
                        }
                    }
                    _ => {
                        pace.waiting = None;
                        Step::Done
                    }
                });
                match step {
                    Step::Wait(slot) => tokio::time::sleep_until(slot).await,
                    Step::Done => return,
                    Step::Show(draft) => {
                        let result = call(outbound.as_ref(), &conversation, draft, "").await;
                        drafts.record(&conversation, draft, &result);
                        return;
                    }
                }
            }
        });
    }

    /// The drafter of a round answering `conversation` up to `v0`. From now on no
    /// placeholder is shown for `v0` or older: the round's draft is that batch's.
    pub(super) fn for_round(
        self: &Arc<Self>,
        outbound: Arc<dyn Outbound>,
        conversation: ConversationRef,
        v0: Version,
        max_chars: usize,
    ) -> Drafter {
        self.pace(&conversation, |pace| pace.claimed = pace.claimed.max(v0));
        Drafter {
            drafts: self.clone(),
            outbound,
            conversation,
            draft: DraftId::for_version(v0),
            max_chars,
        }
    }
}

/// Shows one round's reply as it is written.
pub(super) struct Drafter {
    drafts: Arc<Drafts>,
    outbound: Arc<dyn Outbound>,
    conversation: ConversationRef,
    draft: DraftId,
    /// `LULL_MAX_REPLY_CHARS`: a draft is cut as the reply will be.
    max_chars: usize,
}

impl Drafter {
    /// Show the text in `text` as it grows, until the generation ends (the caller
    /// drops this future) or a newer message makes the reply stale (`newer`
    /// completes; drafting stops). Returns only if the platform refuses drafts for
    /// good: the caller shows "typing…" instead.
    pub(super) async fn run(&self, text: watch::Receiver<String>, newer: impl Future<Output = ()>) {
        tokio::select! {
            () = self.follow(text) => {}
            () = newer => {
                tracing::debug!(conversation = %self.conversation, draft = %self.draft, "a newer message arrived; the draft stops");
                std::future::pending::<()>().await;
            }
        }
    }

    async fn follow(&self, mut text: watch::Receiver<String>) {
        let conversation = &self.conversation;
        // What this round shows; `None` until its first draft.
        let mut shown: Option<String> = None;
        // The batch's placeholder, if showing, is kept until the first words; any
        // other draft (an older batch's, a lapsed one) is replaced at once.
        let mut refresh_at = self
            .drafts
            .pace(conversation, |pace| match pace.shown {
                Some((draft, at)) if draft == self.draft => Some(at + REFRESH),
                _ => None,
            })
            .unwrap_or_else(Instant::now);
        loop {
            tokio::select! {
                changed = text.changed() => if changed.is_err() {
                    // The generation is over; the caller drops this future.
                    std::future::pending::<()>().await;
                },
                () = tokio::time::sleep_until(refresh_at) => {}
            }
            let slot = self.drafts.reserve(conversation);
            tokio::time::sleep_until(slot).await;
            let current = self.render(&text.borrow_and_update());
            let refresh = Instant::now() >= refresh_at;
            // A request sent again starts its text over: the words shown stay until
            // new ones come.
            let restarted = current.is_empty() && shown.as_ref().is_some_and(|s| !s.is_empty());
            if !refresh && (restarted || shown.as_ref() == Some(&current)) {
                continue;
            }
            let result = call(self.outbound.as_ref(), conversation, self.draft, &current).await;
            self.drafts.record(conversation, self.draft, &result);
            match result {
                Ok(()) => {
                    shown = Some(current);
                    refresh_at = Instant::now() + REFRESH;
                }
                Err(SendError::Permanent(e)) => {
                    tracing::debug!(%conversation, error = %e, "the platform refuses drafts here; showing \"typing…\" instead");
                    return;
                }
                // Tried again at the next slot (a 429 pushed it back).
                Err(_) => {}
            }
        }
    }

    /// The text as a draft may show it: without any secret or the start of one, and
    /// cut as the reply will be.
    fn render(&self, text: &str) -> String {
        let text = lull_port::secrets::redact_growing(text);
        super::bounds::cut(&text, self.max_chars).unwrap_or(text)
    }
}

/// One draft call within [`CALL_LIMIT`].
async fn call(
    outbound: &dyn Outbound,
    conversation: &ConversationRef,
    draft: DraftId,
    text: &str,
) -> Result<(), SendError> {
    tokio::time::timeout(CALL_LIMIT, outbound.draft(conversation, draft, text))
        .await
        .unwrap_or_else(|_| Err(SendError::Transient("no answer in time".into())))
}

/// Completes when a message of `conversation` newer than `v0` is stored in this
/// process, or the conversation moved past `v0` without one (a setting, `/stop`).
pub(super) async fn newer_message(
    mut events: broadcast::Receiver<Event>,
    conversation: ConversationId,
    v0: Version,
) {
    loop {
        match events.recv().await {
            Ok(
                Event::Ingested {
                    conversation: stored,
                    version,
                }
                | Event::Moved {
                    conversation: stored,
                    version,
                },
            ) if stored == conversation && version > v0 => return,
            Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
            Err(broadcast::error::RecvError::Closed) => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use async_trait::async_trait;
    use lull_port::OutgoingPart;

    use super::*;
    use crate::llm::Partial;

    /// A platform with drafts that records each draft call (draft, text, when) and
    /// answers with the scripted results, then `Ok`.
    #[derive(Default)]
    struct Recorder {
        calls: Mutex<Vec<(u32, String, Instant)>>,
        answers: Mutex<VecDeque<Result<(), SendError>>>,
    }

    #[async_trait]
    impl Outbound for Recorder {
        fn platform(&self) -> Platform {
            Platform::Telegram
        }
        fn split(&self, text: &str) -> Vec<String> {
            vec![text.to_owned()]
        }
        async fn send(&self, _part: &OutgoingPart<'_>) -> Result<(), SendError> {
            Ok(())
        }
        async fn typing(&self, _conversation: &ConversationRef) -> Result<(), SendError> {
            Ok(())
        }
        fn typing_every(&self) -> Option<Duration> {
            None
        }
        fn drafts(&self, _conversation: &ConversationRef) -> bool {
            true
        }
        async fn draft(
            &self,
            _conversation: &ConversationRef,
            draft: DraftId,
            text: &str,
        ) -> Result<(), SendError> {
            let at = Instant::now();
            self.calls
                .lock()
                .unwrap()
                .push((draft.get(), text.to_owned(), at));
            self.answers.lock().unwrap().pop_front().unwrap_or(Ok(()))
        }
    }

    impl Recorder {
        /// The calls so far: draft id, text, milliseconds after `start`.
        fn calls(&self, start: Instant) -> Vec<(u32, String, u64)> {
            self.calls
                .lock()
                .unwrap()
                .iter()
                .map(|(d, t, at)| (*d, t.clone(), (*at - start).as_millis() as u64))
                .collect()
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Time is a source of non-determinism: paused, it advances only when every task
    /// waits, so the pacing is exact.
    #[tokio::test(start_paused = true)]
    async fn a_placeholder_then_the_growing_text_at_one_draft_a_second() {
        let drafts = Arc::new(Drafts::new(true));
        let platform = Arc::new(Recorder::default());
        let chat = ConversationRef::new(Platform::Telegram, "42");
        let start = Instant::now();
        // A burst of three, 100 ms apart: one placeholder at once, one for the newest a
        // second later.
        for version in 1..=3 {
            drafts.placeholder(platform.clone(), chat.clone(), Version(version));
            tokio::time::sleep(ms(100)).await;
        }
        tokio::time::sleep(ms(1200)).await;
        // The round answering the burst: it continues the placeholder of version 3.
        let drafter = drafts.for_round(platform.clone(), chat.clone(), Version(3), 100);
        let (partial, text) = Partial::watched();
        let round = tokio::spawn(async move {
            drafter.run(text, std::future::pending()).await;
        });
        for word in ["Hello ", "there, ", "how ", "are ", "you?"] {
            tokio::time::sleep(ms(400)).await;
            partial.push(word);
        }
        tokio::time::sleep(ms(3000)).await;
        assert_eq!(
            platform.calls(start),
            [
                (1, String::new(), 0),
                (3, String::new(), 1000),
                (3, "Hello ".into(), 2000),
                (3, "Hello there, how ".into(), 3000),
                (3, "Hello there, how are you?".into(), 4000),
            ]
        );
        round.abort();
        // A placeholder for the version the round answers, or an older one, is not shown.
        drafts.placeholder(platform.clone(), chat.clone(), Version(3));
        tokio::time::sleep(ms(2000)).await;
        assert_eq!(platform.calls(start).len(), 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_429_pushes_the_next_draft_back_and_halves_the_pace() {
        let drafts = Arc::new(Drafts::new(true));
        let platform = Arc::new(Recorder::default());
        platform
            .answers
            .lock()
            .unwrap()
            .push_back(Err(SendError::RetryAfter(ms(3000))));
        let chat = ConversationRef::new(Platform::Telegram, "42");
        let start = Instant::now();
        let drafter = drafts.for_round(platform.clone(), chat.clone(), Version(1), 100);
        let (partial, text) = Partial::watched();
        tokio::spawn(async move { drafter.run(text, std::future::pending()).await });
        for i in 0..40 {
            tokio::time::sleep(ms(250)).await;
            partial.push(&format!("{i} "));
        }
        let times: Vec<u64> = platform.calls(start).iter().map(|c| c.2).collect();
        // Refused at once; the next after the 3 s asked; then every 2 s, recovering by a
        // quarter with each draft that goes through (2 s, 1.5 s, 1.125 s, then 1 s).
        assert_eq!(times, [0, 3000, 5000, 6500, 7625, 8625, 9625]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_newer_message_stops_the_draft_and_a_refusal_ends_drafting() {
        let drafts = Arc::new(Drafts::new(true));
        let platform = Arc::new(Recorder::default());
        let chat = ConversationRef::new(Platform::Telegram, "42");
        let start = Instant::now();
        let drafter = drafts.for_round(platform.clone(), chat.clone(), Version(1), 100);
        let (partial, text) = Partial::watched();
        let newer = tokio::time::sleep(ms(1500));
        tokio::spawn(async move { drafter.run(text, newer).await });
        for i in 0..20 {
            tokio::time::sleep(ms(250)).await;
            partial.push(&format!("{i} "));
        }
        assert_eq!(
            platform.calls(start).len(),
            2,
            "{:?}",
            platform.calls(start)
        );

        platform
            .answers
            .lock()
            .unwrap()
            .push_back(Err(SendError::Permanent("no drafts here".into())));
        let other = ConversationRef::new(Platform::Telegram, "43");
        let drafter = drafts.for_round(platform.clone(), other, Version(1), 100);
        let (partial, text) = Partial::watched();
        let ended = tokio::spawn(async move { drafter.run(text, std::future::pending()).await });
        partial.push("words");
        tokio::time::timeout(ms(100), ended)
            .await
            .expect("drafting ends: the round shows \"typing…\" instead")
            .unwrap();
    }

    #[test]
    fn off_means_no_drafts_anywhere() {
        let platform: Arc<dyn Outbound> = Arc::new(Recorder::default());
        let outbounds = HashMap::from([(Platform::Telegram, platform)]);
        let chat = ConversationRef::new(Platform::Telegram, "42");
        assert!(Drafts::new(true).outbound(&outbounds, &chat).is_some());
        assert!(Drafts::new(false).outbound(&outbounds, &chat).is_none());
    }
}
