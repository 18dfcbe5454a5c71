//! Transcribing voice notes and audio files: one `POST {base}/audio/transcriptions`
//! (multipart: `model` and `file`), as OpenAI, whisper.cpp's server, faster-whisper
//! servers and vLLM serve it. The round calls it once per message, before the model:
//! the transcript is stored with the message and never asked for again.
//!
//! Failures are [`LlmError`]s classified like the model's: a timeout, a network
//! error, a 429 or a 5xx is transient (the round fails and is retried with backoff,
//! the messages kept pending); any other 4xx is a refusal. The key goes in the
//! `Authorization` header only, and error texts are redacted.

use std::time::Duration;

use async_trait::async_trait;
use secrecy::{ExposeSecret, SecretString};

use super::LlmError;
use super::openai::HttpFailure;

/// Something that turns audio into text.
#[async_trait]
pub trait Transcriber: Send + Sync + 'static {
    /// The text spoken in `audio` (of MIME type `mime`).
    async fn transcribe(&self, audio: &[u8], mime: &str) -> Result<String, LlmError>;

    /// The model that transcribes, as `LULL_PRICES` names its price (per second of
    /// audio); `""` when there is none to price.
    fn model(&self) -> &str {
        ""
    }
}

/// How to reach the transcription server.
#[derive(Debug, Clone)]
pub struct TranscribeSettings {
    /// The API base (`LULL_TRANSCRIBE_BASE_URL`, else `OPENAI_BASE_URL`).
    pub base_url: String,
    pub api_key: Option<SecretString>,
    /// `LULL_TRANSCRIBE_MODEL` (`whisper-1`).
    pub model: String,
    pub timeout: Duration,
}

/// An OpenAI-compatible `/audio/transcriptions` client.
pub struct OpenAiTranscriber {
    http: reqwest::Client,
    settings: TranscribeSettings,
}

impl OpenAiTranscriber {
    /// Registers the key for redaction ([`lull_port::secrets::register`]).
    pub fn new(settings: TranscribeSettings) -> Result<Self, String> {
        if let Some(key) = &settings.api_key {
            lull_port::secrets::register(key);
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(settings.timeout)
            .build()
            .map_err(|e| format!("cannot build the transcription client: {e}"))?;
        Ok(Self { http, settings })
    }
}

/// The multipart body of a transcription request, and its boundary.
fn multipart(model: &str, audio: &[u8], mime: &str) -> (String, Vec<u8>) {
    let boundary = format!("lull-{:016x}", fastrand::u64(..));
    let extension = match mime {
        "audio/ogg" | "audio/opus" => "ogg",
        "audio/mpeg" | "audio/mp3" => "mp3",
        "audio/mp4" | "audio/m4a" | "audio/x-m4a" => "m4a",
        "audio/wav" | "audio/x-wav" => "wav",
        "audio/webm" => "webm",
        _ => "ogg",
    };
    let mut body = Vec::with_capacity(audio.len() + 512);
    body.extend(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{model}\r\n\
             --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"audio.{extension}\"\r\n\
             Content-Type: {mime}\r\n\r\n"
        )
        .into_bytes(),
    );
    body.extend_from_slice(audio);
    body.extend(format!("\r\n--{boundary}--\r\n").into_bytes());
    (boundary, body)
}

#[async_trait]
impl Transcriber for OpenAiTranscriber {
    async fn transcribe(&self, audio: &[u8], mime: &str) -> Result<String, LlmError> {
        let (boundary, body) = multipart(&self.settings.model, audio, mime);
        let url = format!(
            "{}/audio/transcriptions",
            self.settings.base_url.trim_end_matches('/')
        );
        let mut request = self
            .http
            .post(url)
            .header(
                reqwest::header::CONTENT_TYPE,
                format!("multipart/form-data; boundary={boundary}"),
            )
            .body(body);
        if let Some(key) = &self.settings.api_key {
            request = request.bearer_auth(key.expose_secret());
        }
        let response = request.send().await.map_err(|e| {
            if e.is_timeout() {
                LlmError::Timeout(self.settings.timeout)
            } else {
                LlmError::Connect(lull_port::secrets::redact(e.without_url().to_string()))
            }
        })?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| lull_port::retry::parse_retry_after(v, std::time::SystemTime::now()));
        let text = response.text().await.map_err(|e| {
            LlmError::Connect(lull_port::secrets::redact(e.without_url().to_string()))
        })?;
        if !(200..300).contains(&status) {
            let failure = HttpFailure::read(status, retry_after, &text);
            return Err(LlmError::Status {
                status,
                message: failure.message,
                retry_after,
            });
        }
        let json: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| LlmError::Malformed(format!("transcription: {e}")))?;
        json["text"]
            .as_str()
            .map(|t| t.trim().to_owned())
            .ok_or_else(|| LlmError::Malformed("transcription without text".into()))
    }

    fn model(&self) -> &str {
        &self.settings.model
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_body_has_the_model_and_the_file() {
        let (boundary, body) = super::multipart("whisper-1", b"OggS..", "audio/ogg");
        let body = String::from_utf8(body).unwrap();
        assert!(body.starts_with(&format!("--{boundary}\r\n")));
        assert!(body.contains("name=\"model\"\r\n\r\nwhisper-1\r\n"));
        assert!(
            body.contains("filename=\"audio.ogg\"\r\nContent-Type: audio/ogg\r\n\r\nOggS..\r\n")
        );
        assert!(body.ends_with(&format!("--{boundary}--\r\n")));
    }
}
