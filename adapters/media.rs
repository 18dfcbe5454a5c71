//! Downloading media for the core ([`lull_port::Outbound::fetch_media`]): one GET,
//! the size limit enforced while the body streams in, errors sorted by what the core
//! does about them, and never a URL in an error (a Telegram file URL contains the bot
//! token).

use lull_port::media::{ChunkSource, read_limited};
use lull_port::secrets::Redactor;
use lull_port::{MediaBytes, MediaError};

/// A response body, chunk by chunk.
struct Body(reqwest::Response);

#[async_trait::async_trait]
impl ChunkSource for Body {
    type Error = reqwest::Error;

    async fn next_chunk(&mut self) -> Result<Option<Vec<u8>>, reqwest::Error> {
        Ok(self.0.chunk().await?.map(|b| b.to_vec()))
    }
}

/// GET `url` with `client` (whose own timeout bounds the request) and read at most
/// `max` bytes. 404/403/410 and other 4xx: [`MediaError::Gone`]; 5xx, 429, network
/// errors and timeouts: [`MediaError::Transient`]. `mime` is used when the server
/// names no image type.
pub(crate) async fn download(
    client: &reqwest::Client,
    url: &str,
    max: u64,
    mime: Option<&str>,
    redactor: &Redactor,
) -> Result<MediaBytes, MediaError> {
    let response = client
        .get(url)
        .send()
        .await
        .map_err(|e| MediaError::Transient(redactor.redact(e.without_url().to_string())))?;
    let status = response.status();
    if status.as_u16() == 429 || status.is_server_error() {
        return Err(MediaError::Transient(format!("HTTP {status}")));
    }
    if !status.is_success() {
        return Err(MediaError::Gone(format!("HTTP {status}")));
    }
    let served = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .filter(|t| t.starts_with("image/"))
        .map(|t| t.split(';').next().unwrap_or(t).trim().to_owned());
    let declared = response.content_length();
    let bytes = read_limited(Body(response), declared, max)
        .await
        .map_err(|e| match e {
            MediaError::Transient(why) => MediaError::Transient(redactor.redact(why)),
            other => other,
        })?;
    let mime = served
        .or_else(|| mime.map(str::to_owned))
        .unwrap_or_else(|| sniff(&bytes).to_owned());
    Ok(MediaBytes { bytes, mime })
}

/// The image type by its first bytes, for servers that send `application/octet-stream`
/// (Telegram's file server does).
fn sniff(bytes: &[u8]) -> &'static str {
    match bytes {
        [0x89, b'P', b'N', b'G', ..] => "image/png",
        [b'G', b'I', b'F', ..] => "image/gif",
        [
            b'R',
            b'I',
            b'F',
            b'F',
            _,
            _,
            _,
            _,
            b'W',
            b'E',
            b'B',
            b'P',
            ..,
        ] => "image/webp",
        _ => "image/jpeg",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn image_types_are_sniffed() {
        assert_eq!(super::sniff(b"\x89PNG\r\n"), "image/png");
        assert_eq!(super::sniff(b"GIF89a"), "image/gif");
        assert_eq!(super::sniff(b"RIFF\0\0\0\0WEBPVP8"), "image/webp");
        assert_eq!(super::sniff(b"\xff\xd8\xff"), "image/jpeg");
    }
}
