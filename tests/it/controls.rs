//! The controls people expect (issue 22), through the real binary and the fakes:
//! `/model` changes the model the fake server receives for that conversation only,
//! across a restart and from another process, admins only in groups, an inline-keyboard
//! pick applied once when tapped twice; a persona's prompt and a chat's own prompt
//! reach the model; `/stop` during a generation (on this process or another) drops it
//! and closes the pending messages, and the next message is answered normally; a
//! setting changed mid-generation makes that generation stale. The counter-tests turn
//! the version bump of controls off (`LULL_TEST_UNFENCED_CONTROLS=1`) and show the
//! checks catch it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::support::fakes::openai::{Behavior, FakeOpenAi};
use crate::support::fakes::telegram::{TelegramFake, callback_query, mention, text_message};
use crate::support::fakes::webhook::{Received, Webhook};
use crate::support::process::LullProcess;

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// The models `LULL_MODELS` offers in these tests; the first is the default.
const MODELS: &str = "fake-model,big-model";

/// How long the model takes to answer when a test stops or changes it mid-generation.
const SLOW: Duration = Duration::from_millis(2500);

/// When a control comes, after the model was asked, to find the batch past a 1 s cap.
const AFTER_CAP: Duration = Duration::from_millis(1200);

/// Processes on one SQLite file behind the http adapter, answering with the fake model.
struct Bots {
    dir: tempfile::TempDir,
    webhook: Webhook,
    model: FakeOpenAi,
    client: reqwest::Client,
}

impl Bots {
    async fn new() -> Bots {
        Bots {
            dir: tempfile::tempdir().unwrap(),
            webhook: Webhook::start().await,
            model: FakeOpenAi::start().await,
            client: reqwest::Client::new(),
        }
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("lull.db")
    }

    async fn start(&self, name: &str, extra: &[(&str, &str)]) -> LullProcess {
        self.start_unsetting(name, extra, &[]).await
    }

    /// [`Bots::start`], with the variables `unset` left out.
    async fn start_unsetting(
        &self,
        name: &str,
        extra: &[(&str, &str)],
        unset: &[&str],
    ) -> LullProcess {
        let mut env = vec![
            ("DATABASE_URL", format!("sqlite:{}", self.db().display())),
            ("LULL_WEBHOOK_URL", self.webhook.url.clone()),
            ("OPENAI_BASE_URL", self.model.base_url.clone()),
            ("OPENAI_API_KEY", "sk-controls-test".into()),
            ("LULL_MODELS", MODELS.into()),
            ("LULL_STREAM", "off".into()),
            ("LULL_DEBOUNCE_MS", "150".into()),
            ("LULL_MAX_WAIT_MS", "8000".into()),
            ("LULL_POLL_MS", "150".into()),
            ("RUST_LOG", "debug".into()),
        ];
        env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        env.retain(|(k, _)| !unset.contains(k));
        let mut lull = LullProcess::start(self.dir.path(), name, &["run"], &env);
        lull.wait_healthy(SECS(20)).await;
        lull
    }

    async fn say(&self, lull: &LullProcess, conversation: &str, id: &str, text: &str) {
        let r = self
            .client
            .post(format!("{}/api/messages", lull.base_url()))
            .json(&serde_json::json!({
                "conversation": conversation, "user": "u1", "text": text, "id": id
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202, "{text}");
    }

    /// Everything delivered to `conversation` so far, of `kind` (`reply`, `notice`).
    fn received(&self, conversation: &str, kind: &str) -> Vec<Received> {
        self.webhook
            .received()
            .into_iter()
            .filter(|r| r.conversation == conversation && r.kind == kind)
            .collect()
    }

    /// The first row delivered to `conversation` whose text contains `text`.
    async fn wait_text(&self, conversation: &str, text: &str) -> Received {
        until(&format!("{text:?} in {conversation}"), || {
            self.webhook
                .received()
                .into_iter()
                .find(|r| r.conversation == conversation && r.text.contains(text))
        })
        .await
    }

    /// The model request whose last user turn contains `text`: its model and system
    /// prompt, once it arrived.
    async fn request_for(&self, text: &str) -> (String, String) {
        until(&format!("a request with {text:?}"), || {
            let requests = self.model.requests();
            (0..requests.len()).rev().find_map(|n| {
                let messages = self.model.messages(n);
                let user = messages.iter().rev().find(|(role, _)| role == "user")?;
                user.1.contains(text).then(|| {
                    let system = messages.iter().find(|(role, _)| role == "system");
                    (
                        requests[n].body["model"].as_str().unwrap().to_owned(),
                        system.map(|(_, s)| s.clone()).unwrap_or_default(),
                    )
                })
            })
        })
        .await
    }

    /// Once the model has received `n` requests.
    async fn wait_requests(&self, n: usize) {
        until(&format!("{n} model requests"), || {
            (self.model.requests().len() >= n).then_some(())
        })
        .await
    }
}

/// What `found` finds, once it finds it (within 15 s).
async fn until<T>(what: &str, mut found: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + SECS(15);
    loop {
        if let Some(value) = found() {
            return value;
        }
        assert!(Instant::now() < deadline, "no {what} within 15 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Without `LULL_MODELS`, `/model` lists the model server's models. A list the
/// server fails (a 500) is said to the user and not kept: the next `/model` asks
/// again and lists; a list it gave is kept, so a third `/model` asks nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_list_the_server_fails_is_said_and_asked_for_again() {
    let b = Bots::new().await;
    b.model.fail_model_lists(&[500]);
    let lull = b.start_unsetting("lull", &[], &["LULL_MODELS"]).await;
    b.say(&lull, "m1", "1", "/model").await;
    let failed = b.wait_text("m1", "can't list the models").await;
    assert!(!failed.text.contains("sk-controls-test"), "{}", failed.text);
    b.say(&lull, "m1", "2", "/model").await;
    b.wait_text("m1", "fake-model").await;
    b.say(&lull, "m1", "3", "/model").await;
    until("the second list", || {
        let lists = b.webhook.received().into_iter();
        (lists
            .filter(|r| r.conversation == "m1" && r.text.contains("fake-model"))
            .count()
            == 2)
            .then_some(())
    })
    .await;
    assert_eq!(b.model.model_lists(), 2, "{}", lull.logs());
}

/// A model list that never comes is given up after `LULL_LLM_TIMEOUT_MS`, and one
/// that is not a list (a damaged body) is refused: each is said to the user and not
/// kept, and the next `/model` asks again and lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_list_that_hangs_or_is_damaged_is_said_and_asked_for_again() {
    use crate::support::fakes::openai::ListAnswer;
    let b = Bots::new().await;
    b.model
        .script_model_lists(&[ListAnswer::Hang, ListAnswer::Damaged]);
    let lull = b
        .start_unsetting("lull", &[("LULL_LLM_TIMEOUT_MS", "1500")], &["LULL_MODELS"])
        .await;
    b.say(&lull, "m1", "1", "/model").await;
    b.say(&lull, "m2", "1", "/model").await;
    b.wait_text("m1", "can't list the models").await;
    b.wait_text("m2", "can't list the models").await;
    b.say(&lull, "m3", "1", "/model").await;
    b.wait_text("m3", "fake-model").await;
    assert_eq!(b.model.model_lists(), 3, "{}", lull.logs());
}

/// A server offering hundreds of models: `/model` lists the first
/// `texts::MODELS_LISTED` with a button each and counts the rest, in one short
/// message; a model past them is still picked by its number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_model_list_is_cut_to_one_message() {
    use crate::support::fakes::openai::ListAnswer;
    let b = Bots::new().await;
    b.model.script_model_lists(&[ListAnswer::Many(300)]);
    let lull = b.start_unsetting("lull", &[], &["LULL_MODELS"]).await;
    b.say(&lull, "m1", "1", "/model").await;
    let listed = b.wait_text("m1", "…and 280 more.").await;
    assert!(
        listed.text.contains("/model 20: model-0020"),
        "{}",
        listed.text
    );
    assert!(!listed.text.contains("model-0021"), "{}", listed.text);
    b.say(&lull, "m1", "2", "/model 250").await;
    b.wait_text("m1", "now uses the model model-0250").await;
}

/// `/model NAME` changes the model the server receives for that conversation only; the
/// pick holds on another process and after a restart; an unknown name is refused with
/// the list, and `/model` lists the models with the one in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_picked_model_answers_that_conversation_alone_everywhere_and_after_a_restart() {
    let b = Bots::new().await;
    let mut one = b.start("one", &[]).await;
    b.say(&one, "c1", "1", "/model big-model").await;
    b.wait_text("c1", "now uses the model big-model").await;
    b.say(&one, "c1", "2", "first from c1").await;
    b.say(&one, "c2", "1", "first from c2").await;
    assert_eq!(b.request_for("first from c1").await.0, "big-model");
    assert_eq!(
        b.request_for("first from c2").await.0,
        "fake-model",
        "another conversation keeps the default"
    );

    let two = b.start("two", &[]).await;
    b.say(&two, "c1", "3", "second from c1").await;
    assert_eq!(b.request_for("second from c1").await.0, "big-model");

    one.restart();
    one.wait_healthy(SECS(20)).await;
    b.say(&one, "c1", "4", "third from c1").await;
    assert_eq!(b.request_for("third from c1").await.0, "big-model");

    b.say(&one, "c1", "5", "/model nope").await;
    b.wait_text(
        "c1",
        "There is no model nope here. The models: fake-model, big-model.",
    )
    .await;
    b.say(&two, "c1", "6", "/model").await;
    let list = b.wait_text("c1", "Pick a model").await;
    assert!(
        list.text.contains("/model 2: big-model (in use)"),
        "{}",
        list.text
    );
    assert_eq!(b.received("c1", "reply").len(), 3);
    b.say(&one, "c1", "7", "/status").await;
    let status = b.wait_text("c1", "Model: ").await.text;
    for line in [
        "Model: big-model",
        "Persona: default",
        "This chat: http:c1",
        "You: http:u1",
    ] {
        assert!(status.contains(line), "{line}: {status}");
    }
}

/// `LULL_IDLE_RESET`: after the chat was idle that long, the model sees no history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_chat_starts_from_a_fresh_context() {
    let b = Bots::new().await;
    let one = b.start("one", &[("LULL_IDLE_RESET", "1500ms")]).await;
    b.say(&one, "c1", "1", "first").await;
    b.wait_text("c1", "[model] first").await;
    b.say(&one, "c1", "2", "second").await;
    b.wait_text("c1", "[model] second").await;
    assert_eq!(
        b.model.without_history(1),
        None,
        "within the idle time: history"
    );
    tokio::time::sleep(Duration::from_millis(1600)).await;
    b.say(&one, "c1", "3", "third").await;
    b.wait_text("c1", "[model] third").await;
    assert_eq!(
        b.model.without_history(2).as_deref(),
        Some("third"),
        "a fresh context"
    );
}

/// Who may use a command is decided once for every adapter: through the http adapter a
/// person who is no admin may not set a chat's system prompt, in a private chat or a
/// group (before issue 37 the http adapter took it and the next request's system prompt
/// was theirs), nor pick a persona or start afresh in a group; `/persona NAME` with no
/// personas set up says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_adapter_keeps_the_admins_commands_for_admins() {
    let b = Bots::new().await;
    let one = b.start("one", &[]).await;
    b.say(&one, "c1", "1", "/prompt You are a cat.").await;
    b.wait_text("c1", "only the bot's admins can use /prompt")
        .await;
    b.say(&one, "c1", "2", "/persona pirate").await;
    b.wait_text("c1", "no personas are set up").await;
    for (id, command) in [
        ("g1", "/prompt You are a cat."),
        ("g2", "/persona x"),
        ("g3", "/new"),
    ] {
        let r = b
            .client
            .post(format!("{}/api/messages", one.base_url()))
            .json(&serde_json::json!({
                "conversation": "g", "user": "u2", "text": command, "id": id, "group": true
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 202);
    }
    let word = |c: &str| c.split_whitespace().next().unwrap().to_owned();
    for command in ["/prompt", "/persona", "/new"] {
        b.wait_text(
            "g",
            &format!("only the bot's admins can use {}", word(command)),
        )
        .await;
    }
    b.say(&one, "c1", "3", "hello").await;
    let (_, system) = b.request_for("hello").await;
    assert_eq!(system, lull_core::texts::DEFAULT_SYSTEM_PROMPT);
}

/// A persona's prompt (and its model) reach the model; a chat's own prompt replaces
/// it, and `/prompt clear` brings the persona's back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persona_and_a_chat_prompt_reach_the_model() {
    let b = Bots::new().await;
    let personas = b.dir.path().join("personas.json");
    std::fs::write(
        &personas,
        r#"{"pirate": {"prompt": "You talk like a pirate.", "model": "big-model"}}"#,
    )
    .unwrap();
    // `/prompt` is for admins on every adapter, the http adapter too.
    let one = b
        .start(
            "one",
            &[
                ("LULL_PERSONAS", personas.to_str().unwrap()),
                ("LULL_ADMINS", "http:u1"),
            ],
        )
        .await;
    b.say(&one, "c1", "1", "before").await;
    let (model, system) = b.request_for("before").await;
    assert_eq!(model, "fake-model");
    assert_eq!(system, lull_core::texts::DEFAULT_SYSTEM_PROMPT);

    b.say(&one, "c1", "2", "/persona pirate").await;
    b.wait_text("c1", "now uses the persona pirate").await;
    b.say(&one, "c1", "3", "ahoy").await;
    assert_eq!(
        b.request_for("ahoy").await,
        ("big-model".to_owned(), "You talk like a pirate.".to_owned())
    );

    b.say(&one, "c1", "4", "/prompt Answer in one word.").await;
    b.wait_text("c1", "own system prompt").await;
    b.say(&one, "c1", "5", "why").await;
    assert_eq!(b.request_for("why").await.1, "Answer in one word.");
    b.say(&one, "c1", "6", "/prompt clear").await;
    b.wait_text("c1", "default system prompt again").await;
    b.say(&one, "c1", "7", "and now").await;
    assert_eq!(b.request_for("and now").await.1, "You talk like a pirate.");
    b.say(&one, "c1", "8", "/persona nobody").await;
    b.wait_text(
        "c1",
        "There is no persona nobody here. The personas: pirate.",
    )
    .await;
}

/// What a control sent mid-generation left: every reply delivered to `c1`, and the
/// model requests.
struct MidGeneration {
    replies: Vec<Received>,
    requests: usize,
    last_model: String,
}

/// `q1` is being answered by process one (slowly) when `control` arrives, through
/// process two when `elsewhere`, else through one; then, once the slow answer would
/// have been written, `q2`.
async fn control_mid_generation(
    control: &str,
    elsewhere: bool,
    extra: &[(&str, &str)],
) -> MidGeneration {
    control_after(control, Duration::ZERO, elsewhere, extra).await
}

/// [`control_mid_generation`], the control sent `delay` after the model was asked.
async fn control_after(
    control: &str,
    delay: Duration,
    elsewhere: bool,
    extra: &[(&str, &str)],
) -> MidGeneration {
    let b = Bots::new().await;
    let one = b.start("one", extra).await;
    let two = if elsewhere {
        Some(b.start("two", extra).await)
    } else {
        None
    };
    b.model.script([Behavior::Slow(SLOW)]);
    b.say(&one, "c1", "q1", "question one").await;
    b.wait_requests(1).await;
    tokio::time::sleep(delay).await;
    let sent_at = Instant::now();
    b.say(two.as_ref().unwrap_or(&one), "c1", "ctl", control)
        .await;
    // Long enough for the slow answer to have been written and delivered, were it not
    // dropped.
    tokio::time::sleep((SLOW + Duration::from_millis(1200)).saturating_sub(sent_at.elapsed()))
        .await;
    b.say(&one, "c1", "q2", "question two").await;
    b.wait_text("c1", "question two").await;
    let requests = b.model.requests();
    MidGeneration {
        replies: b.received("c1", "reply"),
        requests: requests.len(),
        last_model: requests.last().unwrap().body["model"]
            .as_str()
            .unwrap()
            .to_owned(),
    }
}

/// A control that made the reply in flight stale: q1 answered once, by the round after
/// it (q1 twice, the first dropped, then q2), with `model` when one was picked.
fn assert_written_again(changed: &MidGeneration, model: Option<&str>) {
    let first: Vec<&Received> = changed
        .replies
        .iter()
        .filter(|r| r.covers.contains(&"q1".to_owned()))
        .collect();
    assert_eq!(first.len(), 1, "q1 answered once: {:#?}", changed.replies);
    assert_eq!(changed.requests, 3, "q1 twice (the first dropped), then q2");
    if let Some(model) = model {
        assert_eq!(changed.last_model, model);
    }
}

/// `/stop` mid-generation: the reply being written is never sent, the message it
/// answered is closed (the next reply covers only the next message), one confirmation.
async fn assert_stopped(stopped: &MidGeneration) {
    let texts: Vec<&str> = stopped.replies.iter().map(|r| r.text.as_str()).collect();
    assert_eq!(
        texts,
        ["[model] question two"],
        "only the next message is answered"
    );
    assert_eq!(stopped.replies[0].covers, ["q2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_drops_the_generation_and_closes_the_pending_messages() {
    let stopped = control_mid_generation("/stop", false, &[]).await;
    assert_stopped(&stopped).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_on_another_process_drops_the_generation_there() {
    let stopped = control_mid_generation("/stop", true, &[]).await;
    assert_stopped(&stopped).await;
}

/// The counter-test of the two above: with controls unfenced, the generation `/stop`
/// should have dropped is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_test_unfenced_stop_lets_the_generation_through() {
    let stopped =
        control_mid_generation("/stop", true, &[("LULL_TEST_UNFENCED_CONTROLS", "1")]).await;
    assert!(
        stopped
            .replies
            .iter()
            .any(|r| r.covers.contains(&"q1".to_owned())),
        "without the version bump the stopped reply goes out: {:#?}",
        stopped.replies
    );
}

/// A model picked on another process while a reply is written makes that reply stale,
/// like a new message: it is written again by the picked model, and sent once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_picked_mid_generation_makes_it_stale() {
    let changed = control_mid_generation("/model big-model", true, &[]).await;
    assert_written_again(&changed, Some("big-model"));
}

/// Its counter-test: unfenced, the reply written by the old model goes out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_test_unfenced_pick_sends_the_old_models_reply() {
    let changed = control_mid_generation(
        "/model big-model",
        true,
        &[("LULL_TEST_UNFENCED_CONTROLS", "1")],
    )
    .await;
    assert_eq!(
        changed.requests, 2,
        "without the version bump q1's reply by the old model is sent"
    );
}

/// `/new` while a reply is written (on another process): that reply, written from the
/// history `/new` forgot, is dropped; the message is answered again in the fresh
/// context, once. Before issue 37 `/new` left the version alone and the old reply was
/// delivered after "I've forgotten our conversation so far" (2 requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_mid_generation_drops_the_reply_written_before_it() {
    let reset = control_mid_generation("/new", true, &[]).await;
    assert_written_again(&reset, None);
}

/// Its counter-test: unfenced, the reply written before `/new` goes out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_test_unfenced_new_sends_the_reply_written_before_it() {
    let reset = control_mid_generation("/new", true, &[("LULL_TEST_UNFENCED_CONTROLS", "1")]).await;
    assert_eq!(reset.requests, 2, "the reply from before /new is sent");
}

/// A model picked while a reply is written whose message has already waited the cap
/// (the pick comes 1.2 s into the 2.5 s answer, the cap is 1 s): the change fences even
/// that forced reply (README: "dropped and written again"); the message is answered
/// again by the picked model, once. Before issue 37 the old model's reply went out (2
/// requests).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_picked_mid_generation_at_the_cap_makes_it_stale() {
    let at_cap = [("LULL_MAX_WAIT_MS", "1000")];
    let changed = control_after("/model big-model", AFTER_CAP, true, &at_cap).await;
    assert_written_again(&changed, Some("big-model"));
}

/// Its counter-test: unfenced, the forced reply of the old model goes out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_test_unfenced_pick_at_the_cap_sends_the_old_models_reply() {
    let unfenced = [
        ("LULL_MAX_WAIT_MS", "1000"),
        ("LULL_TEST_UNFENCED_CONTROLS", "1"),
    ];
    let changed = control_after("/model big-model", AFTER_CAP, true, &unfenced).await;
    assert_eq!(changed.requests, 2, "the old model's forced reply is sent");
}

/// In a Telegram group only admins pick the model, by command or by button; `/model`
/// shows an inline keyboard, and an admin's pick tapped twice is applied once; the
/// group's next answer comes from the picked model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_group_only_admins_pick_and_a_pick_tapped_twice_is_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let fake = TelegramFake::start().await;
    let model = FakeOpenAi::start().await;
    let (group, admin, member) = (-100_5501, 5501, 5502);
    let admins = format!("telegram:{admin}");
    let env = crate::telegram::env(
        dir.path(),
        &fake,
        &[
            ("LULL_LLM", "openai"),
            ("OPENAI_BASE_URL", &model.base_url),
            ("OPENAI_API_KEY", "sk-controls-test"),
            ("LULL_MODELS", MODELS),
            ("LULL_ADMINS", &admins),
            ("LULL_STREAM", "off"),
            ("LULL_DEBOUNCE_MS", "150"),
        ],
    );
    let lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
    let texts = |n: usize| {
        let fake = &fake;
        async move { fake.wait_sent(group, n, SECS(15)).await }
    };
    fake.push_message(text_message(group, member, "/model big-model"));
    let refused = texts(1).await.remove(0);
    assert!(
        refused
            .text
            .contains("only the bot's admins can use /model"),
        "{}",
        refused.text
    );

    fake.push_message(text_message(group, admin, "/model"));
    let list = texts(2).await.remove(1);
    assert_eq!(
        list.buttons(),
        [
            ("fake-model".to_owned(), "/model 1".to_owned()),
            ("big-model".to_owned(), "/model 2".to_owned())
        ],
        "{}",
        lull.logs()
    );
    fake.push_callback(callback_query("cbq-member", member, &list, "/model 2"));
    let refused = texts(3).await.remove(2);
    assert!(
        refused.text.contains("only the bot's admins"),
        "a button grants nothing"
    );
    fake.push_callback(callback_query("cbq-1", admin, &list, "/model 2"));
    fake.push_callback(callback_query("cbq-2", admin, &list, "/model 2"));
    let sent = texts(5).await;
    let answers: Vec<&str> = sent[3..].iter().map(|s| s.text.as_str()).collect();
    assert!(
        answers[0].contains("now uses the model big-model"),
        "{answers:?}"
    );
    assert!(
        answers[1].contains("already uses the model big-model"),
        "applied once: {answers:?}"
    );

    fake.push_message(mention(group, member, "which model?"));
    texts(6).await;
    let last = model.requests().last().unwrap().body["model"].clone();
    assert_eq!(last, "big-model");
    fake.push_message(text_message(group, member, "/prompt Be rude."));
    let refused = texts(7).await.remove(6);
    assert!(
        refused
            .text
            .contains("only the bot's admins can use /prompt")
    );
}

/// `/retry` answers the last batch again: one new reply covering the same message,
/// written without the old reply in its history; the old one stays where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_writes_one_new_reply_to_the_last_batch() {
    let b = Bots::new().await;
    let one = b.start("one", &[]).await;
    b.say(&one, "c1", "m1", "tell me a joke").await;
    b.wait_requests(1).await;
    b.wait_text("c1", "[model] tell me a joke").await;
    b.model.script([Behavior::Content("a better joke".into())]);
    b.say(&one, "c1", "r1", "/retry").await;
    b.wait_text("c1", "Writing that answer again").await;
    b.wait_text("c1", "a better joke").await;
    let replies = b.received("c1", "reply");
    assert_eq!(replies.len(), 2, "{replies:#?}");
    assert_eq!(replies[1].covers, ["m1"]);
    assert_eq!(
        b.model.without_history(1).as_deref(),
        Some("tell me a joke"),
        "the old reply left the history"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(b.received("c1", "reply").len(), 2, "one new reply");
    assert_eq!(b.model.requests().len(), 2);
}

/// `lull check` prints the controls in force; a personas file that cannot be used
/// stops the start with a message naming `LULL_PERSONAS`.
#[test]
fn check_prints_the_controls_and_a_bad_personas_file_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("personas.json");
    std::fs::write(&good, r#"{"pirate": {"prompt": "Arr."}}"#).unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"pirate": {"prompt": ""}}"#).unwrap();
    let run = |command: &str, personas: &std::path::Path| {
        std::process::Command::new(crate::support::process::binary())
            .arg(command)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env(
                "DATABASE_URL",
                format!("sqlite:{}", dir.path().join("lull.db").display()),
            )
            .env("LULL_MODELS", MODELS)
            .env("LULL_PERSONAS", personas)
            .env("LULL_IDLE_RESET", "6h")
            .output()
            .unwrap()
    };
    let report = String::from_utf8(run("check", &good).stdout).unwrap();
    assert!(
        report.contains(
            "ok    controls      /model picks fake-model, big-model (default fake-model); \
             personas pirate; a fresh context after 6h idle"
        ),
        "{report}"
    );
    let refused = run("chat", &bad);
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8(refused.stderr).unwrap();
    assert!(
        stderr.contains("LULL_PERSONAS") && stderr.contains("empty prompt"),
        "{stderr}"
    );
}

/// On Discord `/model` offers one button per model, and a pick clicked twice is applied
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discord_model_pick_clicked_twice_is_applied_once() {
    use crate::discord::{ALICE, Harness, WAIT};
    use crate::support::fakes::discord::{ChannelKind, Say};
    let mut h = Harness::new().await;
    let channel = h.fake.channel(ChannelKind::Dm);
    h.start("lull", &[("LULL_MODELS", MODELS)]).await;
    h.fake.wait_connected(1, WAIT).await;
    h.fake.say(Say::new(channel, ALICE, "/model"));
    let list = h.fake.wait_sent(channel, 1, WAIT).await.remove(0);
    assert_eq!(
        list.buttons(),
        [
            ("fake-model".to_owned(), "/model 1".to_owned()),
            ("big-model".to_owned(), "/model 2".to_owned())
        ]
    );
    for _ in 0..2 {
        let click = h.fake.click(channel, ALICE, list.id, "/model 2");
        h.fake.dispatch_interaction(&click);
    }
    let sent = h.fake.wait_sent(channel, 3, WAIT).await;
    assert!(
        sent[1].content.contains("now uses the model big-model"),
        "{}",
        sent[1].content
    );
    assert!(
        sent[2].content.contains("already uses the model big-model"),
        "{}",
        sent[2].content
    );
}

/// A `/stop` its platform delivers again (same message id) after the user wrote on acts
/// once: the message sent after it is still answered. Without the claim
/// (`LULL_TEST_NO_COMMAND_CLAIM=1`) the late `/stop` closes it.
async fn stop_redelivered_after_a_new_message(extra: &[(&str, &str)]) -> Vec<Received> {
    let b = Bots::new().await;
    let mut env = vec![("LULL_DEBOUNCE_MS", "1500")];
    env.extend_from_slice(extra);
    let one = b.start("one", &env).await;
    b.say(&one, "c1", "s1", "/stop").await;
    b.wait_text("c1", "Stopped.").await;
    b.say(&one, "c1", "h1", "hello again").await;
    // The redelivery, while "hello again" waits for its lull.
    b.say(&one, "c1", "s1", "/stop").await;
    // A later message: once a reply covers it, h1 was answered (before it or with it)
    // or closed.
    b.say(&one, "c1", "n1", "next one").await;
    until("a reply covering n1", || {
        b.received("c1", "reply")
            .iter()
            .any(|r| r.covers.contains(&"n1".to_owned()))
            .then_some(())
    })
    .await;
    b.received("c1", "reply")
}

fn covering<'a>(replies: &'a [Received], id: &str) -> Vec<&'a Received> {
    replies
        .iter()
        .filter(|r| r.covers.iter().any(|c| c == id))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redelivered_stop_acts_once() {
    let replies = stop_redelivered_after_a_new_message(&[]).await;
    assert_eq!(
        covering(&replies, "h1").len(),
        1,
        "h1 answered once: {replies:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counter_test_an_unclaimed_redelivered_stop_closes_the_next_message() {
    let replies =
        stop_redelivered_after_a_new_message(&[("LULL_TEST_NO_COMMAND_CLAIM", "1")]).await;
    assert!(
        covering(&replies, "h1").is_empty(),
        "without the claim the late /stop closes h1: {replies:#?}"
    );
}
