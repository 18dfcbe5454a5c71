//! Pictures inside a burst, end to end: the real `lull` binary against the Telegram
//! fake (which serves `getFile` and file downloads) and the OpenAI-compatible fake
//! (which records image parts, and can refuse them as a model without vision).

use std::time::{Duration, Instant};

use base64::Engine as _;

use crate::support::db;
use crate::support::fakes::openai::FakeOpenAi;
use crate::support::fakes::telegram::{
    BOT_USERNAME, Fault, TelegramFake, photo_message, text_message, voice_message,
};
use crate::support::process::LullProcess;

const SECS: fn(u64) -> Duration = Duration::from_secs;

/// A tiny PNG (its signature and a few bytes: the fakes do not decode images).
fn png(tag: u8) -> Vec<u8> {
    let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
    bytes.extend([tag; 32]);
    bytes
}

fn data_url(bytes: &[u8]) -> String {
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

struct Run {
    dir: tempfile::TempDir,
    fake: TelegramFake,
    model: FakeOpenAi,
    lull: LullProcess,
}

/// `lull run` on the Telegram fake with the OpenAI fake as its model; images up to
/// 10 000 bytes.
async fn start(extra: &[(&str, &str)]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let fake = TelegramFake::start().await;
    let model = FakeOpenAi::start().await;
    let mut vars: Vec<(&str, &str)> = vec![
        ("LULL_LLM", "openai"),
        ("OPENAI_BASE_URL", &model.base_url),
        ("OPENAI_API_KEY", "sk-media-test"),
        ("LULL_STREAM", "off"),
        ("LULL_MAX_IMAGE_BYTES", "10000"),
    ];
    vars.extend_from_slice(extra);
    let env = crate::telegram::env(dir.path(), &fake, &vars);
    let begun = Instant::now();
    let lull = LullProcess::start(dir.path(), "lull", &["run"], &env);
    crate::telegram::wait_polling(&fake, begun).await;
    Run {
        dir,
        fake,
        model,
        lull,
    }
}

impl Run {
    fn db(&self) -> std::path::PathBuf {
        self.dir.path().join("lull.db")
    }

    fn finish(self) {
        let secret = self.fake.token.split_once(':').unwrap().1.to_owned();
        let logs = self.lull.logs();
        assert!(
            !logs.contains(&secret),
            "the bot token leaked into the logs:\n{logs}"
        );
    }
}

/// A photo with its caption and the two lines typed after it are one burst: one model
/// call carrying the image (the largest size under LULL_MAX_IMAGE_BYTES, fetched once)
/// and all the text, and one reply covering the three messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_photo_its_caption_and_two_lines_get_one_reply_that_saw_the_image() {
    let run = start(&[]).await;
    let chat = 4601;
    let image = png(7);
    run.fake.add_file("photo-m", image.clone());
    run.fake.add_file("photo-l", vec![0; 20_000]);
    run.fake.push_message(photo_message(
        chat,
        chat,
        Some("what's wrong with this error?"),
        &[
            ("photo-s", 20),
            ("photo-m", image.len()),
            ("photo-l", 20_000),
        ],
    ));
    run.fake
        .push_message(text_message(chat, chat, "it happens at start"));
    run.fake
        .push_message(text_message(chat, chat, "only on the server"));
    let sent = run.fake.wait_sent(chat, 1, SECS(15)).await;
    let verdict = db::settled(&run.db(), SECS(10)).await;
    assert_eq!(verdict.counts(), (3, 1, 0, 0, 0), "{verdict:?}");
    let requests = run.model.requests();
    assert_eq!(requests.len(), 1, "one model call");
    assert_eq!(run.model.images(0), [data_url(&image)]);
    let turn = run.model.without_history(0).unwrap();
    assert_eq!(
        turn,
        "[image] what's wrong with this error?\nit happens at start\nonly on the server"
    );
    assert!(
        sent[0].text.starts_with("[model] [image] what's wrong"),
        "{}",
        sent[0].text
    );
    assert_eq!(
        run.fake.downloads(),
        ["photos/photo-m.jpg"],
        "fetched once, at generation"
    );
    assert_eq!(run.fake.sent_to(chat).len(), 1);

    // The next turn's history keeps the marker, not the image.
    run.fake.push_message(text_message(chat, chat, "and now?"));
    run.fake.wait_sent(chat, 2, SECS(15)).await;
    assert!(run.model.images(1).is_empty(), "history carries no image");
    let history = run.model.messages(1);
    assert!(
        history
            .iter()
            .any(|(role, text)| role == "user" && text.starts_with("[image] what's wrong")),
        "{history:?}"
    );
    run.finish();
}

/// A model that refuses images (a 400) still answers the text, told that it could not
/// see the image; the user is told once per conversation that this model cannot see
/// images.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_refuses_images_still_answers_the_text() {
    let run = start(&[]).await;
    run.model.refuse_images(true);
    let chat = 4602;
    run.fake.add_file("p1", png(1));
    run.fake.add_file("p2", png(2));
    run.fake.push_message(photo_message(
        chat,
        chat,
        Some("what is this?"),
        &[("p1", png(1).len())],
    ));
    let sent = run.fake.wait_sent(chat, 2, SECS(15)).await;
    assert!(
        sent[0].text.contains("cannot see images"),
        "{}",
        sent[0].text
    );
    assert!(
        sent[1].text.starts_with("[model] [image] what is this?"),
        "{}",
        sent[1].text
    );
    assert_eq!(run.model.requests().len(), 2, "one refused, one answered");
    assert!(run.model.images(1).is_empty());
    assert!(
        run.model
            .messages(1)
            .last()
            .unwrap()
            .1
            .contains("could not be shown to you"),
        "the model is told"
    );

    run.fake.push_message(photo_message(
        chat,
        chat,
        Some("and this?"),
        &[("p2", png(2).len())],
    ));
    let sent = run.fake.wait_sent(chat, 3, SECS(15)).await;
    assert!(
        sent[2].text.starts_with("[model] [image] and this?"),
        "{}",
        sent[2].text
    );
    let verdict = db::settled(&run.db(), SECS(10)).await;
    assert_eq!(verdict.counts(), (2, 2, 0, 0, 0), "{verdict:?}");
    assert_eq!(run.fake.sent_to(chat).len(), 3, "told once, not twice");
    assert_eq!(
        run.model.requests().len(),
        3,
        "a model that refused images is sent none again"
    );
    assert!(run.model.images(2).is_empty());
    run.finish();
}

/// A photo over LULL_MAX_IMAGE_BYTES in every size is not read: the user is told
/// plainly, and the rest of the burst (its caption, the next line) gets its reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_image_is_refused_plainly_and_the_burst_is_answered() {
    let run = start(&[]).await;
    let chat = 4603;
    run.fake.add_file("huge", vec![0; 50_000]);
    run.fake.push_message(photo_message(
        chat,
        chat,
        Some("look at this"),
        &[("huge", 50_000)],
    ));
    run.fake
        .push_message(text_message(chat, chat, "what do you think?"));
    let sent = run.fake.wait_sent(chat, 2, SECS(15)).await;
    assert!(
        sent[0].text.contains("too large") && sent[0].text.contains("the limit is"),
        "{}",
        sent[0].text
    );
    assert_eq!(
        sent[1].text,
        "[model] [image] look at this\nwhat do you think?\n\n[An image the user sent was too large to read; they have been told.]"
    );
    assert!(run.fake.downloads().is_empty(), "never downloaded");
    assert_eq!(run.model.requests().len(), 1);
    assert!(run.model.images(0).is_empty());
    let verdict = db::settled(&run.db(), SECS(10)).await;
    assert_eq!(verdict.counts(), (2, 1, 0, 0, 0), "{verdict:?}");
    run.finish();
}

/// LULL_VISION=off: nothing is fetched and the model sees the "[image]" marker only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_vision_off_no_image_is_fetched() {
    let run = start(&[("LULL_VISION", "off")]).await;
    let chat = 4604;
    run.fake.add_file("p", png(3));
    run.fake
        .push_message(photo_message(chat, chat, None, &[("p", png(3).len())]));
    let sent = run.fake.wait_sent(chat, 1, SECS(15)).await;
    assert_eq!(sent[0].text, "[model] [image]");
    assert!(run.fake.downloads().is_empty());
    assert!(run.model.images(0).is_empty());
    run.finish();
}

/// A voice note is transcribed once (the transcript stored with the message) and the
/// reply answers what was said; the next turn's history carries the transcript.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voice_note_is_transcribed_once_and_answered() {
    let run = start(&[]).await;
    let chat = 4605;
    let audio = b"OggS fake voice".to_vec();
    run.fake.add_file("v1", audio.clone());
    run.model.transcript(&audio, "remind me to buy milk");
    run.fake
        .push_message(voice_message(chat, chat, "v1", audio.len(), 3));
    let sent = run.fake.wait_sent(chat, 1, SECS(15)).await;
    assert_eq!(
        sent[0].text,
        "[model] [voice message]: remind me to buy milk"
    );
    assert_eq!(
        run.model.transcriptions(),
        [("whisper-1".to_owned(), audio.clone())]
    );
    assert_eq!(
        db::count(
            &run.db(),
            "SELECT COUNT(*) FROM messages WHERE transcript = 'remind me to buy milk'"
        ),
        1,
        "stored with the message"
    );
    run.fake.push_message(text_message(chat, chat, "and eggs"));
    run.fake.wait_sent(chat, 2, SECS(15)).await;
    assert!(
        run.model
            .messages(1)
            .iter()
            .any(|(role, text)| role == "user" && text == "[voice message]: remind me to buy milk"),
        "history carries the transcript"
    );
    assert_eq!(
        run.model.transcriptions().len(),
        1,
        "never transcribed twice"
    );
    run.finish();
}

/// A transcription server that answers a runaway transcript (1 MB) has it cut before it
/// is stored: the voice note is answered, and no prompt carries a megabyte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_transcript_is_cut_before_it_is_stored() {
    let run = start(&[]).await;
    let chat = 4611;
    let audio = b"OggS runaway voice".to_vec();
    run.fake.add_file("v9", audio.clone());
    run.model.transcript(&audio, &"blah ".repeat(200_000));
    run.fake
        .push_message(voice_message(chat, chat, "v9", audio.len(), 3));
    run.fake.wait_sent(chat, 1, SECS(15)).await;
    assert_eq!(run.model.transcriptions().len(), 1);
    let longest = db::count(
        &run.db(),
        "SELECT COALESCE(MAX(LENGTH(transcript)), 0) FROM messages",
    );
    assert!(
        (1..=20_000).contains(&longest),
        "stored transcript of {longest} characters"
    );
    run.finish();
}

/// A transcription server that refuses the audio (4xx) does not stall the
/// conversation: it is asked once, the reply comes without the transcript (the model
/// is told a voice message could not be transcribed), and nothing is stored as one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_transcription_is_answered_without_it() {
    let run = start(&[]).await;
    let chat = 4612;
    let audio = b"OggS refused voice".to_vec();
    run.fake.add_file("v10", audio.clone());
    run.model.fail_transcriptions(&[400]);
    run.fake
        .push_message(voice_message(chat, chat, "v10", audio.len(), 3));
    let sent = run.fake.wait_sent(chat, 1, SECS(15)).await;
    assert_eq!(sent.len(), 1);
    assert_eq!(run.model.transcriptions().len(), 1, "a 4xx is not retried");
    assert!(
        run.model
            .messages(0)
            .iter()
            .any(|(_, text)| text.contains("could not be transcribed")),
        "{:?}",
        run.model.messages(0)
    );
    assert_eq!(
        db::count(
            &run.db(),
            "SELECT COUNT(*) FROM messages WHERE transcript IS NOT NULL"
        ),
        0
    );
    run.finish();
}

/// A transcription server failing (5xx) is retried like the model: the voice note
/// is transcribed once the server is back and answered once, from the transcript.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_transcription_server_is_retried_and_the_voice_note_answered_once() {
    let run = start(&[]).await;
    let chat = 4613;
    let audio = b"OggS flaky voice".to_vec();
    run.fake.add_file("v11", audio.clone());
    run.model.transcript(&audio, "call the plumber");
    run.model.fail_transcriptions(&[503]);
    run.fake
        .push_message(voice_message(chat, chat, "v11", audio.len(), 3));
    // The first failure tells the user their messages are kept (the notice every
    // transient failure of a round sends); the answer follows once the server is back.
    let sent = run.fake.wait_sent(chat, 2, SECS(30)).await;
    assert!(
        sent[0].text.contains("kept your messages"),
        "{:?}",
        sent[0].text
    );
    assert_eq!(sent[1].text, "[model] [voice message]: call the plumber");
    assert_eq!(
        run.model.transcriptions().len(),
        2,
        "one failure, one success"
    );
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let answers = run.fake.wait_sent(chat, 2, SECS(1)).await;
    assert_eq!(answers.len(), 2, "answered once: {answers:?}");
    run.finish();
}

/// A process killed after the transcript was stored (while the model works) loses
/// nothing and costs no second transcription: the next process answers the voice note
/// from the stored transcript.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_transcript_is_stored_does_not_transcribe_again() {
    let mut run = start(&[("LULL_LEASE_TTL_MS", "1500")]).await;
    run.model
        .script([crate::support::fakes::openai::Behavior::Slow(SECS(60))]);
    let chat = 4606;
    let audio = b"OggS crash voice".to_vec();
    run.fake.add_file("v2", audio.clone());
    run.model.transcript(&audio, "what time is it");
    run.fake
        .push_message(voice_message(chat, chat, "v2", audio.len(), 2));
    // Transcribed and stored; the model is now (slowly) asked.
    let transcribed = "SELECT COUNT(*) FROM messages WHERE transcript IS NOT NULL";
    run.fake
        .wait_for(
            "the transcript stored and the model asked",
            SECS(15),
            |_| {
                (db::count(&run.db(), transcribed) == 1 && !run.model.requests().is_empty())
                    .then_some(())
            },
        )
        .await;
    run.lull.kill9();

    let begun = Instant::now();
    let env = crate::telegram::env(
        run.dir.path(),
        &run.fake,
        &[
            ("LULL_LLM", "openai"),
            ("OPENAI_BASE_URL", &run.model.base_url),
            ("OPENAI_API_KEY", "sk-media-test"),
            ("LULL_STREAM", "off"),
            ("LULL_LEASE_TTL_MS", "1500"),
        ],
    );
    run.lull = LullProcess::start(run.dir.path(), "lull-2", &["run"], &env);
    crate::telegram::wait_polling(&run.fake, begun).await;
    let sent = run.fake.wait_sent(chat, 1, SECS(20)).await;
    assert_eq!(sent[0].text, "[model] [voice message]: what time is it");
    assert_eq!(run.model.transcriptions().len(), 1, "transcribed once");
    let verdict = db::settled(&run.db(), SECS(10)).await;
    assert_eq!(verdict.counts(), (1, 1, 0, 0, 0), "{verdict:?}");
    run.finish();
}

/// A voice note over LULL_MAX_AUDIO_SECONDS is not transcribed: the user is told
/// plainly, and the rest of the burst is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_voice_note_over_the_limit_is_refused_plainly() {
    let run = start(&[("LULL_MAX_AUDIO_SECONDS", "60")]).await;
    let chat = 4607;
    run.fake.add_file("v3", vec![1; 100]);
    run.fake
        .push_message(voice_message(chat, chat, "v3", 100, 600));
    run.fake
        .push_message(text_message(chat, chat, "sorry for the long one"));
    let sent = run.fake.wait_sent(chat, 2, SECS(15)).await;
    assert!(
        sent[0].text.contains("too long")
            && sent[0].text.contains("600 s")
            && sent[0].text.contains("60 s"),
        "{}",
        sent[0].text
    );
    assert!(
        sent[1]
            .text
            .starts_with("[model] [voice message]\nsorry for the long one"),
        "{}",
        sent[1].text
    );
    assert!(run.model.transcriptions().is_empty());
    assert!(run.fake.downloads().is_empty());
    let verdict = db::settled(&run.db(), SECS(10)).await;
    assert_eq!(verdict.counts(), (2, 1, 0, 0, 0), "{verdict:?}");
    run.finish();
}

/// An album is one batch: its photos (one captioned) reach the model in one call, in
/// order; an edit of the caption while the burst is pending bumps the version like a
/// text edit, and the reply answers the new caption with the images kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_album_with_an_edited_caption_is_one_batch() {
    let run = start(&[("LULL_DEBOUNCE_MS", "800")]).await;
    let chat = 4608;
    let (first, second) = (png(11), png(12));
    run.fake.add_file("a1", first.clone());
    run.fake.add_file("a2", second.clone());
    let mut captioned = photo_message(chat, chat, Some("which is better?"), &[("a1", first.len())]);
    captioned["media_group_id"] = serde_json::json!("album-1");
    let mut other = photo_message(chat, chat, None, &[("a2", second.len())]);
    other["media_group_id"] = serde_json::json!("album-1");
    run.fake.push_message(captioned.clone());
    run.fake.push_message(other);
    let mut edited = captioned;
    edited["caption"] = serde_json::json!("which one is sharper?");
    edited["edit_date"] = serde_json::json!(1_700_000_000);
    run.fake.push("edited_message", edited);
    let sent = run.fake.wait_sent(chat, 1, SECS(15)).await;
    assert_eq!(
        sent[0].text,
        "[model] [image] which one is sharper?\n[image]"
    );
    assert_eq!(run.model.requests().len(), 1, "one model call");
    assert_eq!(run.model.images(0), [data_url(&first), data_url(&second)]);
    let verdict = db::settled(&run.db(), SECS(10)).await;
    assert_eq!(verdict.counts(), (2, 1, 0, 0, 0), "{verdict:?}");
    run.finish();
}

/// An image whose file server keeps failing holds the burst only for a few rounds
/// (retried with backoff, the user told once that the reply is delayed); then the
/// burst is answered without it, the model told the image could not be fetched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_that_cannot_be_fetched_does_not_hold_the_burst_for_good() {
    let run = start(&[]).await;
    let chat = 4609;
    run.fake.add_file("flaky", png(9));
    run.fake.fail("getFile", Fault::Garbage, 100);
    run.fake.push_message(photo_message(
        chat,
        chat,
        Some("is this fine?"),
        &[("flaky", png(9).len())],
    ));
    let sent = run.fake.wait_sent(chat, 2, SECS(30)).await;
    assert!(sent[0].text.contains("right now"), "{}", sent[0].text);
    assert_eq!(
        sent[1].text,
        "[model] [image] is this fine?\n\n[An image the user sent could not be fetched.]"
    );
    assert_eq!(
        run.fake.faulted("getFile").len(),
        4,
        "three rounds failed on it, the fourth tried once more and answered"
    );
    assert_eq!(run.model.requests().len(), 1);
    let verdict = db::settled(&run.db(), SECS(10)).await;
    assert_eq!(verdict.counts(), (1, 1, 0, 0, 0), "{verdict:?}");
    run.finish();
}

/// In a group, the reply to a voice message opens with what was heard, quoted, so the
/// chat sees what the bot answers; a private chat's reply does not (see
/// `a_voice_note_is_transcribed_once_and_answered`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_reply_to_a_voice_message_quotes_the_transcript() {
    let run = start(&[]).await;
    let chat = -100_4610;
    let audio = b"OggS group voice".to_vec();
    run.fake.add_file("g1", audio.clone());
    run.model.transcript(&audio, "who wants pizza tonight");
    let mut voice = voice_message(chat, 21, "g1", audio.len(), 2);
    voice["chat"] = crate::support::fakes::telegram::chat(chat, false);
    voice["caption"] = serde_json::json!(format!("@{BOT_USERNAME} count me in"));
    voice["caption_entities"] =
        serde_json::json!([{"type": "mention", "offset": 0, "length": BOT_USERNAME.len() + 1}]);
    run.fake.push_message(voice);
    let sent = run.fake.wait_sent(chat, 1, SECS(15)).await;
    assert!(
        sent[0]
            .text
            .starts_with("<blockquote>🎤 User21: who wants pizza tonight</blockquote>"),
        "{}",
        sent[0].text
    );
    assert!(
        sent[0]
            .text
            .contains("[model] User21: [voice message] count me in: who wants pizza tonight"),
        "{}",
        sent[0].text
    );
    run.finish();
}

/// A burst with more images than one reply reads: the first four are fetched and sent
/// (a round's images are bounded in number and bytes), the rest are not fetched at
/// all, the model is told, and the user is told once which were left out; the whole
/// burst is answered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_images_than_one_reply_reads_are_left_out_and_the_user_told() {
    let run = start(&[("LULL_DEBOUNCE_MS", "800")]).await;
    let chat = 4611;
    let images: Vec<Vec<u8>> = (0..6).map(|n| png(40 + n)).collect();
    for (n, image) in images.iter().enumerate() {
        let id = format!("many-{n}");
        run.fake.add_file(&id, image.clone());
        run.fake.push_message(photo_message(
            chat,
            chat,
            (n == 0).then_some("which of these?"),
            &[(id.as_str(), image.len())],
        ));
    }
    let sent = run.fake.wait_sent(chat, 2, SECS(15)).await;
    assert_eq!(run.model.requests().len(), 1, "one model call");
    let sent_images = run.model.images(0);
    assert_eq!(
        sent_images,
        images[..4].iter().map(|i| data_url(i)).collect::<Vec<_>>(),
        "the first four images, no more"
    );
    assert_eq!(run.fake.downloads().len(), 4, "the rest are not fetched");
    assert!(
        sent[0].text.contains("I can look at 4 images at once")
            && sent[0].text.contains("left 2 out"),
        "{}",
        sent[0].text
    );
    assert!(sent[1].text.starts_with("[model] [image] which of these?"));
    let verdict = db::settled(&run.db(), SECS(10)).await;
    assert_eq!(verdict.counts(), (6, 1, 0, 0, 0), "{verdict:?}");
    run.finish();
}

/// Transcriptions count against the token budgets (10 tokens a second of audio): a
/// voice note its sender's budget cannot pay for is not transcribed (the rest is
/// answered, the model told why), a short one is, and its cost is charged with the
/// replies; in dollars, at the transcription model's price per minute
/// (`LULL_PRICES`), apart from the chat model's per token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transcription_is_charged_to_the_budget_and_refused_past_it() {
    let run = start(&[
        ("LULL_USER_DAILY_TOKENS", "400"),
        ("LULL_MAX_TOKENS", "10"),
        // Dollars too: the chat model per token, the transcription per minute.
        ("LULL_PRICES", "gpt-4.1-mini=1/2,whisper-1=0.006/min"),
        // The budget is about the transcript; no tool definitions in the requests.
        ("LULL_TOOLS", "off"),
    ])
    .await;
    let chat = 4612;
    let (long, short) = (b"OggS a long one".to_vec(), b"OggS a short one".to_vec());
    run.fake.add_file("v-long", long.clone());
    run.fake.add_file("v-short", short.clone());
    run.model.transcript(&short, "call me back");
    run.fake
        .push_message(voice_message(chat, chat, "v-long", long.len(), 50));
    let sent = run.fake.wait_sent(chat, 1, SECS(15)).await;
    assert!(
        run.model.transcriptions().is_empty(),
        "500 tokens of audio do not fit 400: not transcribed"
    );
    assert!(
        sent[0]
            .text
            .contains("not transcribed: its sender's token budget"),
        "{}",
        sent[0].text
    );
    run.fake
        .push_message(voice_message(chat, chat, "v-short", short.len(), 3));
    let sent = run.fake.wait_sent(chat, 2, SECS(15)).await;
    assert!(sent[1].text.ends_with("call me back"), "{}", sent[1].text);
    assert_eq!(run.model.transcriptions().len(), 1);
    // The replies as reported (27, then 47 with the first exchange) and 30 tokens
    // for three seconds of audio.
    assert_eq!(
        db::count(
            &run.db(),
            "SELECT SUM(tokens) FROM token_usage WHERE scope = 'user:telegram:4612'"
        ),
        27 + 47 + 30
    );
    // In nano-dollars: 60 prompt tokens at $1 and 14 completion tokens at $2 per
    // million, and three seconds of audio at $0.006 a minute.
    assert_eq!(
        db::count(
            &run.db(),
            "SELECT SUM(cost) FROM token_usage WHERE scope = 'user:telegram:4612'"
        ),
        60 * 1_000 + 14 * 2_000 + 300_000
    );
    run.finish();
}
