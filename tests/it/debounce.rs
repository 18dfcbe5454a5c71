//! Adaptive waiting, on people of the typing trace (`support::trace`) replayed through
//! the http adapter of real `lull run` processes: a person who sends one complete
//! message at a time is answered sooner than the fixed debounce allows, once their
//! rhythm is known; a person who types in fragments is never answered in the middle
//! of a burst, nor a person who switches from complete messages to fragments. Each
//! check has its counter-test: with `LULL_DEBOUNCE=fixed` the first check fails, with
//! the learned burst window and the text cues switched off (`LULL_TEST_NO_BURST_WINDOW`,
//! `LULL_TEST_NO_TEXT_CUES`) the second does, with the text cues off the third.

use std::time::Duration;

use crate::support::fakes::webhook::Webhook;
use crate::support::process::LullProcess;
use crate::support::trace::{self, Answered, Person, Shape, Style};

/// The trace's gaps are log-normal around their median, with the heavy tail the
/// bench relies on.
#[test]
fn the_trace_gaps_are_log_normal_around_their_median() {
    let mut rng = fastrand::Rng::with_seed(7);
    let shape = Shape::human();
    let mut v: Vec<u128> = (0..4001)
        .map(|_| trace::lognormal(&mut rng, shape.gap_median, 0.5, shape.gap_clamp).as_millis())
        .collect();
    v.sort_unstable();
    assert!((550..=650).contains(&v[2000]), "median {}", v[2000]);
    assert!(v[3600] > 1000, "p90 {}", v[3600]);
}

/// The debounce (and the shortest adaptive wait) every process here runs with.
const DEBOUNCE_MS: u64 = 1500;
const MIN_MS: u64 = 150;

/// Replay `people` into a fresh `lull run` with `env` added, wait until everything is
/// answered and delivered, and read back what became of each burst.
async fn run(people: &[Person], env: &[(&str, &str)]) -> Vec<Answered> {
    let dir = tempfile::tempdir().unwrap();
    let webhook = Webhook::start().await;
    let db = dir.path().join("lull.db");
    let mut vars: Vec<(&str, String)> = vec![
        ("DATABASE_URL", format!("sqlite:{}", db.display())),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
        ("LULL_LLM", "echo".into()),
        ("LULL_DEBOUNCE_MS", DEBOUNCE_MS.to_string()),
        ("LULL_DEBOUNCE_MIN_MS", MIN_MS.to_string()),
    ];
    vars.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
    let mut lull = LullProcess::start(dir.path(), "lull", &["run"], &vars);
    lull.wait_healthy(Duration::from_secs(30)).await;
    trace::replay(people, &lull.base_url()).await;
    let verdict = crate::support::db::settled(&db, Duration::from_secs(30)).await;
    assert_eq!(
        (verdict.duplicates, verdict.lost, verdict.stale),
        (0, 0, 0),
        "{verdict:?}"
    );
    trace::answered(&db, people)
}

/// A person of complete messages: four turns, a little under two seconds apart.
fn quiet_person() -> Vec<Person> {
    let shape = Shape {
        turns: 4,
        between_turns: Duration::from_millis(1800),
        ..Shape::human()
    };
    vec![trace::person(11, "quiet".into(), Style::Complete, shape)]
}

/// Once the rhythm is known (from the third turn), every wait is at most half the
/// fixed debounce.
fn answered_sooner(answered: &[Answered]) -> bool {
    answered[2..]
        .iter()
        .all(|a| a.wait <= Duration::from_millis(DEBOUNCE_MS / 2))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_waiting_answers_single_messages_sooner_than_the_fixed_debounce() {
    let people = quiet_person();
    let answered = run(&people, &[("LULL_DEBOUNCE", "adaptive")]).await;
    assert!(answered.iter().all(|a| a.replies == 1), "{answered:#?}");
    assert!(answered_sooner(&answered), "{answered:#?}");
    // The first two turns, before anything is known, wait the whole window.
    assert!(
        answered[..2]
            .iter()
            .all(|a| a.wait >= Duration::from_millis(DEBOUNCE_MS - 50)),
        "{answered:#?}"
    );
}

/// Counter-test: the same person with the fixed debounce fails the check above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sooner_check_fails_with_the_fixed_debounce() {
    let people = quiet_person();
    let answered = run(&people, &[("LULL_DEBOUNCE", "fixed")]).await;
    assert!(answered.iter().all(|a| a.replies == 1), "{answered:#?}");
    assert!(!answered_sooner(&answered), "{answered:#?}");
}

/// A person of fragments: five turns of 2–5 fragments, 250 ms apart at the median
/// (log-normal, clamped to 100–450 ms), far shorter than the debounce and longer than
/// the shortest wait.
fn fragment_person() -> Vec<Person> {
    let shape = Shape {
        gap_median: Duration::from_millis(250),
        gap_sigma: 0.3,
        gap_clamp: (Duration::from_millis(100), Duration::from_millis(450)),
        turns: 5,
        between_turns: Duration::from_millis(2000),
        ..Shape::human()
    };
    let person = trace::person(3, "fragments".into(), Style::Fragments, shape);
    let bursts_after_learning = person.bursts[2..]
        .iter()
        .filter(|b| b.messages.len() >= 2)
        .count();
    assert!(
        bursts_after_learning >= 2,
        "the trace has bursts to split: {person:#?}"
    );
    vec![person]
}

/// Every burst was answered by one reply.
fn no_burst_split(answered: &[Answered]) -> bool {
    answered.iter().all(|a| a.replies == 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_waiting_does_not_split_a_fragment_burst() {
    let people = fragment_person();
    let answered = run(&people, &[("LULL_DEBOUNCE", "adaptive")]).await;
    assert!(no_burst_split(&answered), "{answered:#?}");
    // And once its window is known (from the fifth turn), it waits less than the
    // fixed window after a burst's last fragment.
    let late: Vec<Duration> = answered[4..].iter().map(|a| a.wait).collect();
    assert!(
        late.iter().all(|w| *w < Duration::from_millis(DEBOUNCE_MS)),
        "{answered:#?}"
    );
}

/// Counter-test: with the learned burst window off (a known conversation always waits
/// the shortest window) and the text read for nothing (the trace's fragments read
/// unfinished, which alone would keep them whole), the same person's bursts are split.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debounce_that_only_shortens_splits_the_bursts() {
    let people = fragment_person();
    let answered = run(
        &people,
        &[
            ("LULL_DEBOUNCE", "adaptive"),
            ("LULL_TEST_NO_BURST_WINDOW", "1"),
            ("LULL_TEST_NO_TEXT_CUES", "1"),
        ],
    )
    .await;
    assert!(!no_burst_split(&answered), "{answered:#?}");
}

/// On Discord (the fake): Alice sends a message, then starts typing. With adaptive
/// waiting the typing holds her pending burst's timer, but never past the cap
/// (`LULL_MAX_WAIT_MS` after her message); returns how far after her message the timer
/// is due once the typing was heard (or after a second, if it never moves), and how
/// long after it the reply was sent.
async fn discord_typing(mode: &str) -> (i64, Duration) {
    use crate::discord::{ALICE, Harness, WAIT};
    use crate::support::db::count;
    use crate::support::fakes::discord::{ChannelKind, Say};

    let mut h = Harness::new().await;
    let dm = h.fake.channel(ChannelKind::Dm);
    h.start(
        "lull",
        &[
            ("LULL_DEBOUNCE", mode),
            ("LULL_DEBOUNCE_MS", "1500"),
            ("LULL_MAX_WAIT_MS", "3000"),
        ],
    )
    .await;
    h.fake.wait_connected(1, WAIT).await;
    let said = std::time::Instant::now();
    h.fake.say(Say::new(dm, ALICE, "so here is my question"));
    let due = "SELECT COALESCE((SELECT due_at FROM timers) - (SELECT MIN(received_at) FROM messages), -1)";
    let deadline = std::time::Instant::now() + WAIT;
    while count(&h.db(), due) < 0 {
        assert!(std::time::Instant::now() < deadline, "never stored");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let armed = count(&h.db(), due);
    h.fake.typing_start(dm, ALICE);
    let heard = std::time::Instant::now() + Duration::from_secs(1);
    let mut held = armed;
    while held == armed && std::time::Instant::now() < heard {
        tokio::time::sleep(Duration::from_millis(10)).await;
        held = count(&h.db(), due);
    }
    h.fake.wait_sent(dm, 1, WAIT).await;
    let replied = said.elapsed();
    h.settled().await;
    (held, replied)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discord_typing_event_holds_the_timer_but_never_past_the_cap() {
    let (held, replied) = discord_typing("adaptive").await;
    assert_eq!(held, 3000, "held until the cap, not the 10 s typing hold");
    assert!(replied >= Duration::from_millis(2900), "{replied:?}");
}

/// Counter-test: with the fixed debounce typing is not heard, and the check above
/// fails: the timer stays at the debounce.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_fixed_debounce_typing_holds_nothing() {
    let (held, replied) = discord_typing("fixed").await;
    assert_eq!(held, 1500);
    assert!(replied < Duration::from_millis(2900), "{replied:?}");
}

/// Tokens spent on an overtaken generation (stopped when a newer message came) are
/// counted and shown to an admin by `/usage`, and in `lull_tokens_dropped_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_shows_an_admin_the_tokens_of_an_overtaken_generation() {
    use crate::support::fakes::openai::{Behavior, FakeOpenAi, Stream};
    use crate::support::process::post_message;

    let model = FakeOpenAi::start().await;
    model.fallback(Behavior::Stream(Stream::echo(
        40,
        Duration::from_millis(50),
    )));
    let dir = tempfile::tempdir().unwrap();
    let webhook = Webhook::start().await;
    let vars: Vec<(&str, String)> = vec![
        (
            "DATABASE_URL",
            format!("sqlite:{}", dir.path().join("lull.db").display()),
        ),
        ("LULL_WEBHOOK_URL", webhook.url.clone()),
        ("LULL_LLM", "openai".into()),
        ("OPENAI_BASE_URL", model.base_url.clone()),
        ("LULL_DEBOUNCE", "fixed".into()),
        ("LULL_DEBOUNCE_MS", "100".into()),
        ("LULL_ADMINS", "http:tester".into()),
    ];
    let mut lull = LullProcess::start(dir.path(), "lull", &["run"], &vars);
    lull.wait_healthy(Duration::from_secs(30)).await;
    let client = reqwest::Client::new();
    let post = |id: &'static str, text: &'static str| {
        let (client, base) = (client.clone(), lull.base_url());
        async move {
            let r = post_message(&client, &base, "c1", id, text).await.unwrap();
            assert_eq!(r.status().as_u16(), 202);
        }
    };
    post("m1", "what is a lull?").await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while model.requests().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the model was never asked"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    post("m2", "and why wait?").await;
    let replies = webhook.wait_replies(1, Duration::from_secs(20)).await;
    assert_eq!(replies[0].covers.len(), 2, "one reply covers both");
    assert_eq!(
        model.abandoned().len(),
        1,
        "the overtaken request was dropped"
    );
    post("u1", "/usage").await;
    let usage = webhook
        .wait_until_received(Duration::from_secs(20), |r| {
            r.text.contains("dropped or stopped")
        })
        .await;
    let tokens: u64 = usage
        .text
        .rsplit("came: ")
        .next()
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", usage.text));
    assert!(tokens > 0, "{}", usage.text);
    let metrics = lull.metrics().await.unwrap();
    assert_eq!(
        metrics.get("lull_tokens_dropped_total"),
        Some(&(tokens as f64))
    );
}

/// The defect of issue 37: eight complete questions, each answered (the rhythm learns
/// the shortest wait), then a thought typed in three fragments 400 ms apart. With the
/// fixed window that burst gets one reply; adaptive waiting must not do worse.
fn complete_then_fragments() -> Vec<Person> {
    use crate::support::trace::{Burst, Sent};
    let mut bursts = Vec::new();
    let mut at = Duration::ZERO;
    let mut id = 0;
    let mut sent = |at: Duration, text: &str| {
        id += 1;
        Sent {
            at,
            id: format!("m{id}"),
            text: text.to_owned(),
        }
    };
    for n in 0..8 {
        let text = format!("What is the answer to question {n}?");
        bursts.push(Burst {
            messages: vec![sent(at, &text)],
        });
        at += Duration::from_millis(2500);
    }
    let fragments = ["so", "I was thinking", "about the trip"]
        .iter()
        .enumerate()
        .map(|(n, text)| sent(at + Duration::from_millis(400 * n as u64), text))
        .collect();
    bursts.push(Burst {
        messages: fragments,
    });
    vec![Person {
        conversation: "switching".into(),
        style: Style::Fragments,
        bursts,
    }]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fragments_after_complete_messages_get_one_reply() {
    let answered = run(&complete_then_fragments(), &[("LULL_DEBOUNCE", "adaptive")]).await;
    let last = answered.last().unwrap();
    assert_eq!((last.messages, last.replies), (3, 1), "{answered:#?}");
    // The complete questions after the first two were still answered sooner than the
    // fixed window.
    assert!(
        answered[2..8]
            .iter()
            .all(|a| a.wait < Duration::from_millis(DEBOUNCE_MS / 2)),
        "{answered:#?}"
    );
}

/// Counter-test: reading no text (timing alone, as before issue 37), the same burst is
/// answered in pieces.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_text_cues_the_fragments_are_split() {
    let answered = run(
        &complete_then_fragments(),
        &[
            ("LULL_DEBOUNCE", "adaptive"),
            ("LULL_TEST_NO_TEXT_CUES", "1"),
        ],
    )
    .await;
    let last = answered.last().unwrap();
    assert!(last.replies > 1, "{answered:#?}");
}
