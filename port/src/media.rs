//! Media a user sent with a message (a photo, an image file, a voice note, an audio
//! file), kept as the platform's durable reference. Ingest stores the reference only, so the acknowledgement stays
//! fast; the bytes are fetched through [`crate::Outbound::fetch_media`] when the reply
//! is generated, and only for the batch being answered.

use std::fmt;

/// What a piece of media is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MediaKind {
    /// A picture: sent to vision models as an image part.
    Image,
    /// A voice note: transcribed once, and the transcript answered as text.
    Voice,
    /// An audio file: transcribed like a voice note.
    Audio,
}

impl MediaKind {
    /// The stable name stored with the message.
    pub fn as_str(self) -> &'static str {
        match self {
            MediaKind::Image => "image",
            MediaKind::Voice => "voice",
            MediaKind::Audio => "audio",
        }
    }

    /// Whether the core transcribes it (voice notes and audio files).
    pub fn is_audio(self) -> bool {
        matches!(self, MediaKind::Voice | MediaKind::Audio)
    }

    /// The marker the message's text carries in prompts and history (`[image]`), so
    /// the model and `echo` see that something was sent even where the bytes are not.
    pub fn marker(self) -> &'static str {
        match self {
            MediaKind::Image => "[image]",
            MediaKind::Voice => "[voice message]",
            MediaKind::Audio => "[audio]",
        }
    }

    pub fn parse(s: &str) -> Option<MediaKind> {
        match s {
            "image" => Some(MediaKind::Image),
            "voice" => Some(MediaKind::Voice),
            "audio" => Some(MediaKind::Audio),
            _ => None,
        }
    }
}

impl fmt::Display for MediaKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A platform's durable reference to one piece of media. The reference stays valid
/// after a crash (Telegram's `file_id`, Discord's attachment URL), so a message whose
/// reply comes later, from another process, can still be answered with its media.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Media {
    pub kind: MediaKind,
    /// The adapter's own encoding of where the bytes are; the core treats it as
    /// opaque and hands it back to [`crate::Outbound::fetch_media`].
    pub reference: String,
    /// The size in bytes, if the platform said.
    pub size: Option<u64>,
    /// The MIME type, if the platform said (`image/jpeg`).
    pub mime: Option<String>,
    /// How long a voice note or audio file plays, in seconds, if the platform said.
    pub duration_secs: Option<u32>,
}

/// The bytes of a piece of media, fetched at generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MediaBytes {
    pub bytes: Vec<u8>,
    /// The MIME type the platform served (or the one stored with the reference).
    pub mime: String,
}

/// Why media could not be fetched, by what the core does about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MediaError {
    /// Larger than the limit (known from the platform, or found while reading): the
    /// user is told plainly; the rest of the burst is answered.
    #[error("the file is too large ({size} bytes; at most {max} are read)")]
    TooBig { size: u64, max: u64 },
    /// The platform no longer has it, or refuses it (4xx): the model is told it is
    /// missing.
    #[error("the file is no longer available: {0}")]
    Gone(String),
    /// A network error, a timeout or a server error: retried like other transient
    /// failures of a round.
    #[error("temporary failure fetching the file: {0}")]
    Transient(String),
}

/// Read `response`'s body, at most `max` bytes: the limit is enforced while the body
/// streams in (a server that lies about or omits `Content-Length` still cannot make
/// lull read more than `max`). Adapters call this with the response of their platform's
/// download.
pub async fn read_limited<S, E>(
    mut chunks: S,
    declared: Option<u64>,
    max: u64,
) -> Result<Vec<u8>, MediaError>
where
    S: ChunkSource<Error = E>,
    E: fmt::Display,
{
    if let Some(size) = declared.filter(|&s| s > max) {
        return Err(MediaError::TooBig { size, max });
    }
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0).min(max) as usize);
    while let Some(chunk) = chunks
        .next_chunk()
        .await
        .map_err(|e| MediaError::Transient(e.to_string()))?
    {
        let size = bytes.len() as u64 + chunk.len() as u64;
        if size > max {
            return Err(MediaError::TooBig { size, max });
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// A body read chunk by chunk (an HTTP response): what [`read_limited`] reads.
#[async_trait::async_trait]
pub trait ChunkSource: Send {
    type Error;
    /// The next chunk, `None` at the end.
    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, Self::Error>;
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Chunks(Vec<Vec<u8>>);

    #[async_trait::async_trait]
    impl ChunkSource for Chunks {
        type Error = String;
        async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, String> {
            Ok((!self.0.is_empty()).then(|| self.0.remove(0)))
        }
    }

    #[tokio::test]
    async fn the_limit_holds_while_streaming_whatever_the_server_declares() {
        let body = || Chunks(vec![vec![1; 4], vec![2; 4], vec![3; 4]]);
        assert_eq!(read_limited(body(), None, 12).await.unwrap().len(), 12);
        assert_eq!(
            read_limited(body(), Some(1), 10).await,
            Err(MediaError::TooBig { size: 12, max: 10 })
        );
        assert_eq!(
            read_limited(body(), Some(100), 10).await,
            Err(MediaError::TooBig { size: 100, max: 10 })
        );
    }
}
