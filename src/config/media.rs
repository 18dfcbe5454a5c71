//! Media: whether the model is shown images and how large an image is read; the
//! transcription of voice messages and audio files, and how long one may be.

use clap::Args;
use lull_core::dispatcher;
use lull_core::llm::transcribe::TranscribeSettings;

use super::{ConfigError, LlmConfig, http_url};

/// `LULL_TRANSCRIBE_MODEL`.
const DEFAULT_TRANSCRIBE_MODEL: &str = "whisper-1";

/// `LULL_VISION`, `LULL_MAX_IMAGE_BYTES`, `LULL_TRANSCRIBE_*`, `LULL_MAX_AUDIO_SECONDS`.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Pictures and voice")]
pub(crate) struct MediaArgs {
    /// Images: `auto` sends the images of the messages being answered to the model (OpenAI-style image parts; a model that refuses them gets the text, and the user is told once); `off` shows the model only an "[image]" marker.
    #[arg(long, global = true, env = "LULL_VISION", default_value = "auto")]
    pub vision: VisionMode,
    /// Largest image read, in bytes: Telegram photos are taken in the largest size under it; a larger image is not read and the user is told.
    #[arg(
        long,
        global = true,
        env = "LULL_MAX_IMAGE_BYTES",
        default_value_t = dispatcher::MAX_IMAGE_BYTES
    )]
    pub max_image_bytes: u64,
    /// Transcription model for voice messages and audio files (an OpenAI-compatible `/audio/transcriptions`); with `LULL_LLM=echo` nothing is transcribed.
    #[arg(
        long,
        global = true,
        env = "LULL_TRANSCRIBE_MODEL",
        default_value = DEFAULT_TRANSCRIBE_MODEL
    )]
    pub transcribe_model: String,
    /// API base of the transcription server (a local whisper server); default: OPENAI_BASE_URL, with the same key.
    #[arg(long, global = true, env = "LULL_TRANSCRIBE_BASE_URL")]
    pub transcribe_base_url: Option<String>,
    /// Longest voice message or audio file transcribed, in seconds; a longer one is not, and the user is told.
    #[arg(
        long,
        global = true,
        env = "LULL_MAX_AUDIO_SECONDS",
        default_value_t = dispatcher::MAX_AUDIO_SECONDS
    )]
    pub max_audio_seconds: u32,
}

/// `LULL_VISION`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum VisionMode {
    /// Images of the messages being answered go to the model as image parts.
    Auto,
    /// The model sees only an "[image]" marker; no image is fetched.
    Off,
}

impl MediaArgs {
    /// How voice messages are transcribed with `llm` (`None` with the echo
    /// responder: they reach it as their marker), and `LULL_MAX_AUDIO_SECONDS`.
    pub(crate) fn transcribe(
        &self,
        llm: &LlmConfig,
    ) -> Result<Option<TranscribeSettings>, ConfigError> {
        let s = self;
        let transcribe = match &llm {
            LlmConfig::Echo(_) => None,
            LlmConfig::OpenAi(openai) => {
                if s.transcribe_model.trim().is_empty() {
                    return Err(ConfigError(
                        "LULL_TRANSCRIBE_MODEL must not be empty".into(),
                    ));
                }
                Some(TranscribeSettings {
                    base_url: match &s.transcribe_base_url {
                        Some(url) => http_url("LULL_TRANSCRIBE_BASE_URL", url)?,
                        None => openai.base_url.clone(),
                    },
                    api_key: openai.api_key.clone(),
                    model: s.transcribe_model.trim().to_owned(),
                    timeout: openai.timeout,
                })
            }
        };
        if s.max_audio_seconds == 0 {
            return Err(ConfigError(
                "LULL_MAX_AUDIO_SECONDS must be a positive number of seconds, got 0".into(),
            ));
        }
        Ok(transcribe)
    }

    /// `LULL_MAX_IMAGE_BYTES`, positive.
    pub(crate) fn max_image_bytes(&self) -> Result<u64, ConfigError> {
        positive_bytes("LULL_MAX_IMAGE_BYTES", self.max_image_bytes)
    }
}

/// A byte count that must be positive, or an error naming the variable.
fn positive_bytes(name: &str, bytes: u64) -> Result<u64, ConfigError> {
    if bytes == 0 {
        return Err(ConfigError(format!(
            "{name} must be a positive number of bytes, got 0"
        )));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::super::tests::assert_errors_name;

    #[test]
    fn errors_name_the_variable() {
        assert_errors_name(&[
            (&["--max-image-bytes", "0"], "LULL_MAX_IMAGE_BYTES"),
            (&["--max-audio-seconds", "0"], "LULL_MAX_AUDIO_SECONDS"),
            (
                &[
                    "--llm",
                    "openai",
                    "--openai-api-key",
                    "k",
                    "--transcribe-model",
                    " ",
                ],
                "LULL_TRANSCRIBE_MODEL",
            ),
        ]);
    }
}
