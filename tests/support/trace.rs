//! A scripted typing trace: people who write one complete message at a time, people
//! who type a thought in 2–5 fragments, and people who send a photo and then its
//! caption, each over several turns. The latency bench (`benches/typing.rs`) replays it
//! through the http adapter; the debounce tests (`tests/it/debounce.rs`) replay parts
//! of it at a smaller scale.
//!
//! Gaps between the fragments of one burst are drawn from a **log-normal**
//! distribution: the time to type the next fragment is a product of many small
//! factors (its length, a pause to think, a correction), which makes it right-skewed
//! with a heavy tail — most fragments follow quickly, a few take several times the
//! median. A fixed debounce set at twice the median still misses that tail; that is
//! the case a learned window must handle. Turns are far apart (a person reads the
//! reply, then writes again), so a new turn is never part of the last burst.
//!
//! The http adapter carries text only: a photo is sent as the text the store keeps
//! for a captionless photo (`[image]`), and its caption as the next message.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

/// How a person writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    /// One complete message per turn.
    Complete,
    /// Most turns are 2–5 fragments; some a single complete message.
    Fragments,
    /// Some turns are a photo followed by its caption; the others complete messages.
    Photo,
    /// Complete messages for the first half of the turns, then a thought in 2–5
    /// fragments each turn: the rhythm learned from the first half must not split the
    /// second (issue 37).
    Switching,
}

/// One message of the trace: when it is sent (from the start of the replay), its
/// platform id and text.
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    pub at: Duration,
    pub id: String,
    pub text: String,
}

/// One burst: the messages one reply should cover.
#[derive(Debug, Clone)]
pub(crate) struct Burst {
    pub messages: Vec<Sent>,
}

/// One person in their own conversation.
#[derive(Debug, Clone)]
pub(crate) struct Person {
    pub conversation: String,
    pub style: Style,
    pub bursts: Vec<Burst>,
}

/// The shape of a trace: the log-normal gap inside bursts (median, sigma, and the
/// clamp applied to a draw), the pause between turns, turns per person.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub gap_median: Duration,
    pub gap_sigma: f64,
    pub gap_clamp: (Duration, Duration),
    /// A photo's caption follows after a log-normal gap of this median (same sigma).
    pub caption_median: Duration,
    /// From the last message of a burst to the first of the next turn: this, plus up to
    /// half of it again at random.
    pub between_turns: Duration,
    pub turns: usize,
}

impl Shape {
    /// Human timing: fragments 600 ms apart at the median (p90 about 1.1 s, p99 about
    /// 1.9 s, clamped to 6 s), captions 1.2 s after their photo, turns 6–9 s apart.
    pub(crate) fn human() -> Shape {
        Shape {
            gap_median: Duration::from_millis(600),
            gap_sigma: 0.5,
            gap_clamp: (Duration::from_millis(80), Duration::from_secs(6)),
            caption_median: Duration::from_millis(1200),
            between_turns: Duration::from_secs(6),
            turns: 6,
        }
    }
}

/// A log-normal draw of median `median` and shape `sigma` (Box–Muller), clamped.
pub(crate) fn lognormal(
    rng: &mut fastrand::Rng,
    median: Duration,
    sigma: f64,
    clamp: (Duration, Duration),
) -> Duration {
    let (u1, u2) = (rng.f64().max(1e-12), rng.f64());
    let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
    let ms = median.as_secs_f64() * 1000.0 * (sigma * z).exp();
    Duration::from_millis(ms.round() as u64).clamp(clamp.0, clamp.1)
}

const TOPICS: &[&str] = &[
    "Rome",
    "sourdough",
    "my bike",
    "the tax form",
    "our trip",
    "this error",
    "the garden",
    "my laptop",
    "the new job",
    "a birthday gift",
];

fn complete(rng: &mut fastrand::Rng) -> String {
    let topic = TOPICS[rng.usize(..TOPICS.len())];
    match rng.usize(..5) {
        0 => format!("Could you suggest something about {topic}?"),
        1 => "thanks, that helps!".to_owned(),
        2 => format!("What should I know about {topic} before I start?"),
        3 => format!("I finally sorted out {topic}."),
        _ => format!("Is it worth spending money on {topic}?"),
    }
}

/// `n` fragments of one thought: an opener, middles (some ending with "," or ":"),
/// and a closing question.
fn fragments(rng: &mut fastrand::Rng, n: usize) -> Vec<String> {
    let topic = TOPICS[rng.usize(..TOPICS.len())];
    let openers = ["hey", "so", "ok so", "quick question"];
    let middles = [
        format!("I was looking at {topic}"),
        "and the thing is".to_owned(),
        "it keeps going wrong when I try".to_owned(),
        "not sure why,".to_owned(),
        "here is what I did:".to_owned(),
        "tried twice already".to_owned(),
    ];
    let closers = [
        "any idea what I should do?",
        "what do you think?",
        "is that normal?",
    ];
    let mut out = vec![openers[rng.usize(..openers.len())].to_owned()];
    while out.len() < n - 1 {
        out.push(middles[rng.usize(..middles.len())].clone());
    }
    out.push(closers[rng.usize(..closers.len())].to_owned());
    out
}

/// The trace of `people` people (their styles in turn: complete, fragments, complete,
/// fragments, photo, …), each in conversation `<prefix><n>`, from `seed`.
pub(crate) fn trace(seed: u64, prefix: &str, people: usize, shape: Shape) -> Vec<Person> {
    let styles = [
        Style::Complete,
        Style::Fragments,
        Style::Complete,
        Style::Fragments,
        Style::Photo,
    ];
    (0..people)
        .map(|n| {
            person(
                seed + n as u64,
                format!("{prefix}{n}"),
                styles[n % styles.len()],
                shape,
            )
        })
        .collect()
}

/// `people` people of [`Style::Switching`], each in conversation `<prefix><n>`, from
/// `seed`.
pub(crate) fn switchers(seed: u64, prefix: &str, people: usize, shape: Shape) -> Vec<Person> {
    (0..people)
        .map(|n| {
            person(
                seed + n as u64,
                format!("{prefix}{n}"),
                Style::Switching,
                shape,
            )
        })
        .collect()
}

/// One person of style `style`.
pub(crate) fn person(seed: u64, conversation: String, style: Style, shape: Shape) -> Person {
    let mut rng = fastrand::Rng::with_seed(seed);
    // People start at different times, so rounds do not all fall together.
    let mut t = Duration::from_millis(rng.u64(0..2000));
    let mut bursts = Vec::new();
    let mut id = 0;
    let gap = |rng: &mut fastrand::Rng| {
        lognormal(rng, shape.gap_median, shape.gap_sigma, shape.gap_clamp)
    };
    for turn in 0..shape.turns {
        let texts: Vec<(Duration, String)> = match style {
            Style::Complete => vec![(Duration::ZERO, complete(&mut rng))],
            Style::Fragments if rng.f64() < 0.2 => vec![(Duration::ZERO, complete(&mut rng))],
            Style::Switching if turn < shape.turns / 2 => {
                vec![(Duration::ZERO, complete(&mut rng))]
            }
            Style::Fragments | Style::Switching => {
                let n = rng.usize(2..=5);
                fragments(&mut rng, n)
                    .into_iter()
                    .enumerate()
                    .map(|(i, text)| {
                        (
                            if i == 0 {
                                Duration::ZERO
                            } else {
                                gap(&mut rng)
                            },
                            text,
                        )
                    })
                    .collect()
            }
            Style::Photo if rng.bool() => {
                let caption = lognormal(
                    &mut rng,
                    shape.caption_median,
                    shape.gap_sigma,
                    shape.gap_clamp,
                );
                vec![
                    (Duration::ZERO, "[image]".to_owned()),
                    (caption, "what is this plant?".to_owned()),
                ]
            }
            Style::Photo => vec![(Duration::ZERO, complete(&mut rng))],
        };
        let mut messages = Vec::new();
        for (after, text) in texts {
            t += after;
            id += 1;
            messages.push(Sent {
                at: t,
                id: format!("m{id}"),
                text,
            });
        }
        bursts.push(Burst { messages });
        let pause = shape.between_turns.as_millis() as u64;
        t += Duration::from_millis(pause + rng.u64(0..=pause / 2));
    }
    Person {
        conversation,
        style,
        bursts,
    }
}

/// Replay `people` into the http adapter at `base_url` on the trace's own timeline
/// (each message at its `at`, from now on); returns when the last is accepted.
pub(crate) async fn replay(people: &[Person], base_url: &str) {
    let client = reqwest::Client::new();
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let mut tasks = tokio::task::JoinSet::new();
    for person in people.iter().cloned() {
        let (client, base_url) = (client.clone(), base_url.to_owned());
        tasks.spawn(async move {
            for sent in person.bursts.iter().flat_map(|b| &b.messages) {
                tokio::time::sleep_until(start + sent.at).await;
                let r = super::process::post_message(
                    &client,
                    &base_url,
                    &person.conversation,
                    &sent.id,
                    &sent.text,
                )
                .await
                .expect("posting a message");
                assert_eq!(
                    r.status().as_u16(),
                    202,
                    "{}",
                    r.text().await.unwrap_or_default()
                );
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a person's replay");
    }
}

/// What became of one burst of the trace.
#[derive(Debug, Clone)]
pub(crate) struct Answered {
    pub style: Style,
    pub messages: usize,
    /// Replies that covered part of it (1: answered once, as a whole).
    pub replies: usize,
    /// From the arrival of its last message until the model was asked for the reply
    /// that covers it (the reply's commit time less its generation time).
    pub wait: Duration,
}

/// Every burst of `people` as the SQLite database at `db` answered it (after the
/// replay settled): which replies covered its messages, and the wait after its last
/// message. Panics if a message was never answered.
pub(crate) fn answered(db: &Path, people: &[Person]) -> Vec<Answered> {
    let conn = super::db::open(db);
    // (conversation, message id) -> (arrived, reply, reply committed, generation ms).
    let mut rows: BTreeMap<(String, String), (i64, i64, i64, i64)> = BTreeMap::new();
    let mut stmt = conn
        .prepare(
            "SELECT c.key, m.platform_message_id, m.received_at, o.id, o.created_at, o.llm_ms
             FROM messages m JOIN conversations c ON c.id = m.conversation_id
             JOIN reply_covers rc ON rc.message_id = m.id
             JOIN outbox o ON o.id = rc.outbox_id AND o.kind = 'reply'",
        )
        .unwrap();
    let found = stmt
        .query_map([], |r| {
            let id: String = r.get(1)?;
            Ok((
                (r.get::<_, String>(0)?, id.trim_matches('"').to_owned()),
                (
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get::<_, Option<i64>>(5)?.unwrap_or(0),
                ),
            ))
        })
        .unwrap();
    for row in found {
        let (key, value) = row.unwrap();
        rows.insert(key, value);
    }
    let mut out = Vec::new();
    for person in people {
        for burst in &person.bursts {
            let of = |sent: &Sent| {
                rows.get(&(person.conversation.clone(), sent.id.clone()))
                    .copied()
                    .unwrap_or_else(|| {
                        panic!("{} {} was never answered", person.conversation, sent.id)
                    })
            };
            let replies: BTreeSet<i64> = burst.messages.iter().map(|m| of(m).1).collect();
            let (arrived, _, committed, llm_ms) =
                of(burst.messages.last().expect("a burst has messages"));
            out.push(Answered {
                style: person.style,
                messages: burst.messages.len(),
                replies: replies.len(),
                wait: Duration::from_millis((committed - llm_ms - arrived).max(0) as u64),
            });
        }
    }
    out
}

/// The model calls a process made (every outcome of `lull_llm_requests_total`).
pub(crate) async fn model_calls(lull: &super::process::LullProcess) -> f64 {
    lull.metrics()
        .await
        .expect("metrics")
        .iter()
        .filter(|(name, _)| name.starts_with("lull_llm_requests_total"))
        .map(|(_, v)| v)
        .sum()
}

/// The `p`th percentile of `waits` (nearest rank), in milliseconds.
pub(crate) fn percentile_ms(waits: &[Duration], p: f64) -> f64 {
    let mut v: Vec<f64> = waits.iter().map(|w| w.as_secs_f64() * 1000.0).collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    if v.is_empty() {
        return f64::NAN;
    }
    v[(((p / 100.0) * (v.len() - 1) as f64).round() as usize).min(v.len() - 1)]
}
