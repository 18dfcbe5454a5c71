//! A conversation's rhythm: what lull has learned about how its people write (one
//! complete message at a time, or a thought in fragments), and the wait it picks from
//! that for the next message, as pure functions of their inputs.
//!
//! The summary ([`Rhythm`]) is stored with the conversation. It is learned where a
//! batch is known: when a reply is committed, from the arrival times of the messages it
//! covers (the gaps inside the burst) and from the gap to the burst answered before it
//! (a burst that went on after its reply was answered too early: that gap counts as a
//! gap inside a burst). Ingest reads it with the conversation row it already updates
//! and arms the timer with [`TimerPolicy::debounce_for`](crate::timing::TimerPolicy::debounce_for).
//!
//! Invariant: every wait picked here lies in `[LULL_DEBOUNCE_MIN_MS, LULL_DEBOUNCE_MS]`;
//! the cap (`first pending + LULL_MAX_WAIT_MS`) is applied after it, by the timer policy,
//! so no rhythm can delay a reply past the cap.

use std::time::Duration;

use crate::domain::Timestamp;

/// `LULL_DEBOUNCE`: how each wait is picked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DebounceMode {
    /// From the conversation's rhythm, within `[LULL_DEBOUNCE_MIN_MS, LULL_DEBOUNCE_MS]`.
    #[default]
    Adaptive,
    /// Always `LULL_DEBOUNCE_MS`.
    Fixed,
}

impl DebounceMode {
    pub fn as_str(self) -> &'static str {
        match self {
            DebounceMode::Adaptive => "adaptive",
            DebounceMode::Fixed => "fixed",
        }
    }
}

/// How long a typing author holds a pending burst's timer: Discord shows "typing…" for
/// 10 s after each `TYPING_START` and repeats the event while the person types.
pub const TYPING_HOLD: Duration = Duration::from_secs(10);

/// How many bursts a conversation must have shown before its rhythm replaces the
/// cautious prior (the full window).
pub const KNOWN_AFTER: u32 = 2;

/// How many bursts a conversation must have shown before its burst window may be
/// shorter than the full one: a window learned from the gaps of one or two bursts
/// splits the next burst whose gaps are longer (measured on the typing trace: with the
/// window learned after two bursts, 7 of 79 bursts split against 6 with the fixed
/// debounce).
pub const WINDOW_KNOWN_AFTER: u32 = 4;

/// Below this share of bursts with more than one message, a conversation is one of
/// complete messages and waits the shortest window; at [`FRAGMENTS_FROM`] and above it
/// gets its whole learned window; in between, a share of it.
pub const SINGLES_BELOW: u32 = 50;
/// See [`SINGLES_BELOW`] (per mille).
pub const FRAGMENTS_FROM: u32 = 300;

/// The summary of a conversation's rhythm, as stored with it.
///
/// Invariant: `gap_ms` only ever holds gaps seen inside bursts (no gap between
/// bursts that were rightly answered apart), so a person who never fragments keeps
/// `gap_ms == 0` and waits the shortest window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rhythm {
    /// Bursts learned from (saturating).
    pub bursts: u32,
    /// An upper estimate of the gaps between messages inside this conversation's
    /// bursts (an asymmetric moving average that rises by half a sample's excess and
    /// falls by an eighth: it tracks about the 85th percentile), in milliseconds; 0
    /// before any gap was seen.
    pub gap_ms: u32,
    /// The share of bursts with more than one message, per mille (a moving average,
    /// a quarter per burst).
    pub multi_permille: u32,
    /// When the last message of the last burst learned from arrived.
    pub last_at: Option<Timestamp>,
}

/// A gap sample never counts for more than this many windows: one very slow fragment
/// must not keep the window at its longest for many bursts.
const SAMPLE_CAP_WINDOWS: u32 = 2;

impl Rhythm {
    /// The summary after one more burst: `received`, the arrival times of the messages
    /// a committed reply covers (any order). `window` is `LULL_DEBOUNCE_MS`: a burst
    /// that began less than a window after the previous burst's last message is the
    /// same burst, answered too early, and that gap is learned as one inside a burst.
    #[must_use]
    pub fn learn(self, received: &[Timestamp], window: Duration) -> Rhythm {
        let mut times: Vec<i64> = received.iter().map(|t| t.0).collect();
        times.sort_unstable();
        let (Some(&first), Some(&last)) = (times.first(), times.last()) else {
            return self;
        };
        let window_ms = window.as_millis().min(u32::MAX as u128) as u32;
        let mut gaps: Vec<u32> = times
            .windows(2)
            .map(|w| (w[1] - w[0]).clamp(0, u32::MAX as i64) as u32)
            .collect();
        // A burst that went on after its reply: answered too early.
        let too_early = self.last_at.and_then(|before| {
            let gap = first - before.0;
            (0..window_ms as i64).contains(&gap).then_some(gap as u32)
        });
        gaps.extend(too_early);
        let cap = window_ms.saturating_mul(SAMPLE_CAP_WINDOWS);
        let mut gap_ms = self.gap_ms;
        for gap in gaps.iter().map(|g| (*g).min(cap)) {
            gap_ms = if gap_ms == 0 {
                gap.max(1)
            } else if gap > gap_ms {
                gap_ms + (gap - gap_ms) / 2
            } else {
                gap_ms - (gap_ms - gap) / 8
            };
        }
        let target = if gaps.is_empty() { 0 } else { 1000 };
        let multi_permille = if self.bursts == 0 || too_early.is_some() {
            // A split burst teaches at once: the next wait is not short again.
            target
        } else {
            (self.multi_permille as i64 + (target as i64 - self.multi_permille as i64) / 4) as u32
        };
        if let Some(gap) = too_early {
            // And its gap is waited for in full the next time, not a share of it.
            gap_ms = gap_ms.max(gap.min(cap));
        }
        Rhythm {
            bursts: self.bursts.saturating_add(1),
            gap_ms,
            multi_permille,
            last_at: Some(Timestamp(last)),
        }
    }

    /// Whether enough bursts were seen for the rhythm to decide.
    pub fn known(&self) -> bool {
        self.bursts >= KNOWN_AFTER
    }

    /// The window a burst of this conversation needs between two of its messages: twice
    /// the learned gap (for log-normal gaps of shape 0.5, about the 99th percentile),
    /// within `[min, max]`; the full window until [`WINDOW_KNOWN_AFTER`] bursts were seen
    /// (a conversation that never fragmented has no gap to wait for).
    pub fn burst_window(&self, min: Duration, max: Duration) -> Duration {
        if self.bursts < WINDOW_KNOWN_AFTER && self.gap_ms > 0 {
            return max;
        }
        let gap = Duration::from_millis(self.gap_ms as u64 * 2);
        gap.clamp(min, max)
    }

    /// The wait after a message that starts a burst (or may be its only one): the
    /// shortest window for a conversation of complete messages, its burst window for one
    /// of fragments, a share of it in between (see [`SINGLES_BELOW`]).
    pub fn first_wait(&self, min: Duration, max: Duration) -> Duration {
        let full = self.burst_window(min, max);
        let m = self.multi_permille;
        if m <= SINGLES_BELOW {
            return min;
        }
        let share = (m - SINGLES_BELOW).min(FRAGMENTS_FROM - SINGLES_BELOW);
        min + (full - min) * share / (FRAGMENTS_FROM - SINGLES_BELOW)
    }
}

/// What one message says about whether its thought is finished, from its text alone.
///
/// Invariant: only a message that reads complete may wait less than the full window; a
/// fragment waits at least what the fixed debounce waits, whatever the rhythm learned,
/// so adaptive waiting never splits a burst the fixed window would answer once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cue {
    /// It reads complete (closing punctuation, a question, an emoji, a link or a code
    /// block alone, or a long sentence that does not end on a joining word): the
    /// rhythm decides the wait.
    Complete,
    /// The thought goes on: a short message without closing punctuation ("so", "I was
    /// thinking"), one ending on a joining word ("… and", "… because the") or with ":",
    /// ",", "…", "-", or only a photo or a voice note whose words usually follow. It
    /// waits the full window.
    Unfinished,
}

/// A message of at least this many words reads complete without closing punctuation
/// (unless it ends on a joining word): people who never punctuate still write whole
/// sentences; a fragment is usually shorter.
pub const COMPLETE_FROM_WORDS: usize = 8;

/// Words a thought does not end on (English): a message ending with one goes on.
const JOINING_WORDS: &[&str] = &[
    "a", "about", "after", "also", "an", "and", "as", "at", "because", "before", "but", "by",
    "for", "from", "if", "in", "into", "is", "like", "my", "of", "on", "or", "so", "than", "that",
    "the", "then", "to", "was", "were", "when", "where", "which", "while", "with", "your",
];

impl Cue {
    /// The cue of a message as the store keeps it: `text` with its media markers
    /// (`[image] what is this?`), `media` its number of attachments.
    pub fn of(text: &str, media: usize) -> Cue {
        if crate::switches::no_text_cues() {
            return Cue::Complete;
        }
        let mut rest = text.trim();
        let mut marked = false;
        loop {
            let before = rest;
            for marker in ["[image]", "[voice message]", "[audio]"] {
                if let Some(r) = rest.strip_prefix(marker) {
                    rest = r.trim_start();
                    marked = true;
                }
            }
            if rest == before {
                break;
            }
        }
        if rest.is_empty() {
            return if marked || media > 0 {
                Cue::Unfinished
            } else {
                Cue::Complete
            };
        }
        if reads_complete(rest) {
            Cue::Complete
        } else {
            Cue::Unfinished
        }
    }
}

/// Whether `text` (trimmed, not empty) reads as a finished thought (see [`Cue`]).
fn reads_complete(text: &str) -> bool {
    let Some(last) = text.chars().next_back() else {
        return true;
    };
    if matches!(
        last,
        ':' | ',' | '…' | '-' | '–' | '—' | '&' | '+' | '/' | '('
    ) {
        return false;
    }
    if matches!(
        last,
        '.' | '!' | '?' | ')' | ']' | '"' | '\'' | '”' | '’' | '»' | ';'
    ) {
        // "etc." and "e.g." end sentences too; "..." is "…".
        return !text.ends_with("..");
    }
    // A code block, or a link alone.
    if text.starts_with("```") && text.ends_with("```") && text.len() > 6 {
        return true;
    }
    let mut words = text.split_whitespace();
    let first = words.next().unwrap_or("");
    if words.next().is_none() && (first.starts_with("http://") || first.starts_with("https://")) {
        return true;
    }
    // An emoji or another symbol closes a thought as punctuation does.
    if !last.is_alphanumeric() && !last.is_ascii_punctuation() {
        return true;
    }
    let words: Vec<&str> = text.split_whitespace().collect();
    let last_word = words
        .last()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric())
                .to_lowercase()
        })
        .unwrap_or_default();
    words.len() >= COMPLETE_FROM_WORDS && !JOINING_WORDS.contains(&last_word.as_str())
}

/// The two waits a known rhythm allows ([`Rhythm::first_wait`], [`Rhythm::burst_window`]),
/// worked out when the rhythm is learned and stored beside it, so that an ingest picks
/// one by the number of pending messages alone ([`Waits::pick`]) without reading the
/// rhythm: on PostgreSQL the whole ingest is one statement, which picks in SQL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waits {
    /// The wait after a message that starts a burst, in milliseconds.
    pub first_ms: u32,
    /// The wait inside a burst already under way, in milliseconds.
    pub burst_ms: u32,
}

impl Rhythm {
    /// The waits this rhythm allows within `[min, max]`; `None` while it is not known
    /// (then every wait is the full window).
    pub fn waits(&self, min: Duration, max: Duration) -> Option<Waits> {
        let ms = |d: Duration| d.as_millis().min(u32::MAX as u128) as u32;
        self.known().then(|| Waits {
            first_ms: ms(self.first_wait(min, max)),
            burst_ms: ms(self.burst_window(min, max)),
        })
    }
}

impl Waits {
    /// The wait for a message with `pending` messages waiting (it included): the burst
    /// window once a burst is under way, else the first wait; the full window `max`
    /// when nothing was learned; always within `[min, max]` (the bounds of the process
    /// that picks, whatever bounds the stored waits were worked out with). PostgreSQL's
    /// `lull_ingest` spells the same choice in SQL; the conformance checks of adaptive
    /// arming pin the two together.
    pub fn pick(waits: Option<Waits>, pending: u32, min: Duration, max: Duration) -> Duration {
        let learned = waits.map(|w| if pending >= 2 { w.burst_ms } else { w.first_ms });
        learned
            .map_or(max, |ms| Duration::from_millis(ms.into()))
            .clamp(min, max)
    }
}

/// The adaptive wait for a message, within `[min, max]`: the full window until the
/// conversation's rhythm is known or when the message's cue says the thought goes on;
/// inside a burst already under way, the conversation's burst window; otherwise the
/// first wait its rhythm allows.
pub fn adaptive_wait(
    rhythm: &Rhythm,
    cue: Cue,
    pending: u32,
    min: Duration,
    max: Duration,
) -> Duration {
    if cue == Cue::Unfinished {
        return max;
    }
    Waits::pick(rhythm.waits(min, max), pending, min, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    const MIN: Duration = Duration::from_millis(300);
    const MAX: Duration = Duration::from_millis(1500);

    fn learn_all(bursts: &[&[i64]]) -> Rhythm {
        bursts.iter().fold(Rhythm::default(), |r, b| {
            let times: Vec<Timestamp> = b.iter().map(|t| Timestamp(*t)).collect();
            r.learn(&times, MAX)
        })
    }

    #[test]
    fn complete_messages_learn_the_shortest_wait() {
        let r = learn_all(&[&[0], &[20_000], &[45_000], &[70_000]]);
        assert_eq!((r.bursts, r.gap_ms, r.multi_permille), (4, 0, 0));
        assert_eq!(adaptive_wait(&r, Cue::Complete, 1, MIN, MAX), MIN);
    }

    #[test]
    fn fragments_learn_their_window() {
        let r = learn_all(&[
            &[0, 700, 1500],
            &[20_000, 20_600],
            &[40_000, 40_900, 41_500],
        ]);
        assert_eq!(r.multi_permille, 1000);
        assert!(r.gap_ms >= 600 && r.gap_ms <= 900, "{r:?}");
        let wait = adaptive_wait(&r, Cue::Complete, 1, MIN, MAX);
        assert!(wait >= ms(900) && wait <= MAX, "{wait:?}");
        assert_eq!(wait, adaptive_wait(&r, Cue::Complete, 3, MIN, MAX));
    }

    #[test]
    fn an_unknown_conversation_waits_the_full_window() {
        assert_eq!(
            adaptive_wait(&Rhythm::default(), Cue::Complete, 1, MIN, MAX),
            MAX
        );
        let once = learn_all(&[&[0]]);
        assert_eq!(adaptive_wait(&once, Cue::Complete, 1, MIN, MAX), MAX);
    }

    #[test]
    fn a_burst_answered_too_early_is_learned_as_one_burst() {
        // Two "single" bursts 900 ms apart: the second continued the first.
        let r = learn_all(&[&[0], &[900], &[30_000]]);
        assert_eq!(r.gap_ms, 900);
        assert!(r.multi_permille > SINGLES_BELOW, "{r:?}");
        assert!(adaptive_wait(&r, Cue::Complete, 1, MIN, MAX) > MIN);
        // Further apart than a window: answered apart rightly.
        let r = learn_all(&[&[0], &[1600], &[30_000]]);
        assert_eq!((r.gap_ms, r.multi_permille), (0, 0));
    }

    #[test]
    fn waits_stay_within_the_range_whatever_was_learned() {
        let slow = learn_all(&[&[0, 9000], &[20_000, 29_000], &[40_000, 49_000]]);
        assert!(
            slow.gap_ms <= 3000,
            "a sample counts for at most two windows"
        );
        for r in [slow, Rhythm::default(), learn_all(&[&[0], &[99_000]])] {
            for cue in [Cue::Complete, Cue::Unfinished] {
                for pending in [1, 2, 5] {
                    let w = adaptive_wait(&r, cue, pending, MIN, MAX);
                    assert!(w >= MIN && w <= MAX, "{r:?} {cue:?} {pending}: {w:?}");
                }
            }
        }
    }

    #[test]
    fn a_quiet_person_who_starts_fragmenting_is_heard() {
        let r = learn_all(&[&[0], &[20_000], &[40_000]]);
        assert_eq!(adaptive_wait(&r, Cue::Unfinished, 1, MIN, MAX), MAX);
        // A burst under way gets the burst window even before the rhythm says so.
        let r = r.learn(&[Timestamp(60_000), Timestamp(61_000)], MAX);
        assert!(adaptive_wait(&r, Cue::Complete, 1, MIN, MAX) > MIN);
    }

    #[test]
    fn the_share_of_bursts_decays_back() {
        let mut r = learn_all(&[&[0, 800], &[20_000, 20_800]]);
        assert_eq!(r.multi_permille, 1000);
        for i in 1..20 {
            r = r.learn(&[Timestamp(40_000 * i)], MAX);
        }
        assert!(r.multi_permille <= SINGLES_BELOW, "{r:?}");
        assert_eq!(adaptive_wait(&r, Cue::Complete, 1, MIN, MAX), MIN);
    }

    #[test]
    fn cues_of_unfinished_thoughts() {
        for unfinished in [
            "here is the thing:",
            "so,",
            "so",
            "I was thinking",
            "about the trip",
            "hey",
            "wait...",
            "and then I went to the shop to buy the",
            "it broke because",
            "[image]",
            "[voice message]",
        ] {
            assert_eq!(Cue::of(unfinished, 1), Cue::Unfinished, "{unfinished:?}");
        }
        for complete in [
            "[image] what is this?",
            "thanks!",
            "what about the trip?",
            "ok.",
            "sounds good 👍",
            "https://example.com/a/b",
            "```fn main() {}```",
            "I finally sorted out the tax form last night for real",
            "(see above)",
        ] {
            assert_eq!(Cue::of(complete, 0), Cue::Complete, "{complete:?}");
        }
    }

    /// Defect of issue 37: after eight complete questions the learned wait is the
    /// shortest; fragments 400 ms apart must still wait the full window each.
    #[test]
    fn fragments_after_complete_messages_wait_the_full_window() {
        let times: Vec<[i64; 1]> = (0..8).map(|n| [n * 20_000]).collect();
        let bursts: Vec<&[i64]> = times.iter().map(|t| &t[..]).collect();
        let r = learn_all(&bursts);
        assert_eq!(
            adaptive_wait(&r, Cue::of("What is it?", 0), 1, MIN, MAX),
            MIN
        );
        for (pending, text) in [(1, "so"), (2, "I was thinking"), (3, "about the trip")] {
            let wait = adaptive_wait(&r, Cue::of(text, 0), pending, MIN, MAX);
            assert_eq!(wait, MAX, "{text:?}");
        }
    }

    #[test]
    fn a_burst_answered_too_early_teaches_at_once() {
        let times: Vec<[i64; 1]> = (0..8).map(|n| [n * 20_000]).collect();
        let bursts: Vec<&[i64]> = times.iter().map(|t| &t[..]).collect();
        let r = learn_all(&bursts);
        assert_eq!(adaptive_wait(&r, Cue::Complete, 1, MIN, MAX), MIN);
        // The next burst went on 900 ms after its reply's last message.
        let r = r.learn(&[Timestamp(140_000)], MAX);
        let r = r.learn(&[Timestamp(140_900)], MAX);
        assert_eq!(r.multi_permille, 1000, "{r:?}");
        assert!(
            adaptive_wait(&r, Cue::Complete, 1, MIN, MAX) >= ms(900),
            "{r:?}"
        );
    }
}
