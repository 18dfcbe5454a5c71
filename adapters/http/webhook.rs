//! The http adapter's outbound half: every reply and notice is POSTed to
//! `LULL_WEBHOOK_URL` by the [Standard Webhooks](https://www.standardwebhooks.com)
//! convention.
//!
//! The body is JSON `{"conversation","text","covers","reply_id","kind"}`; `covers`
//! lists the ids of the messages a reply answers as the client sent them (same JSON
//! type and value), `kind` is `reply` or `notice`. The headers:
//! - `webhook-id`: names the outbox row, so it is the same on every attempt, from
//!   every process, and the receiver's idempotency key;
//! - `webhook-timestamp`: this attempt's time, in Unix seconds;
//! - `webhook-signature` (with `LULL_WEBHOOK_SECRET`): `v1,` and the base64 HMAC-SHA256
//!   of `{webhook-id}.{webhook-timestamp}.{body}`.
//!
//! Delivery is at least once. Anything but a 2xx (a 4xx too, a redirect, a timeout, a
//! connection error) is a failed attempt, which the core records and retries
//! with backoff until `LULL_WEBHOOK_MAX_AGE`, then gives up on (dead-letters). A POST
//! that timed out may still have been processed, and a process may die between the
//! POST and recording it: a receiver that must never show a reply twice deduplicates
//! on `webhook-id`.

use std::fmt;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use axum::http::{HeaderValue, header};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretSlice};
use serde::Serialize;
use sha2::Sha256;

use super::client_id;
use lull_port::domain::{ConversationRef, Platform};
use lull_port::{Outbound, OutgoingPart, SendError};

/// Standard base64, padding optional when decoding (a secret pasted without its `=`).
const BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// The key that signs webhook requests, from a `whsec_…` secret. Never printed: its
/// `Debug` says only that it is there.
pub struct WebhookSecret {
    key: SecretSlice<u8>,
}

impl Clone for WebhookSecret {
    fn clone(&self) -> Self {
        Self {
            key: self.key.expose_secret().to_vec().into(),
        }
    }
}

impl fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WebhookSecret(<redacted>)")
    }
}

impl WebhookSecret {
    pub const PREFIX: &'static str = "whsec_";
    /// The key sizes Standard Webhooks allows for HMAC-SHA256 (192 to 512 bits).
    const KEY_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

    /// Parse `whsec_` followed by the base64 key. The error says what is wrong without
    /// quoting any of the secret.
    pub fn parse(secret: &str) -> Result<Self, String> {
        let encoded = secret.trim().strip_prefix(Self::PREFIX).ok_or_else(|| {
            format!(
                "must start with `{}` followed by the base64 key (Standard Webhooks format)",
                Self::PREFIX
            )
        })?;
        let key = BASE64
            .decode(encoded)
            .map_err(|_| format!("the part after `{}` is not valid base64", Self::PREFIX))?;
        if !Self::KEY_BYTES.contains(&key.len()) {
            return Err(format!(
                "the key is {} bytes; Standard Webhooks keys are {} to {} bytes (for example `{}` and the base64 of 32 random bytes)",
                key.len(),
                Self::KEY_BYTES.start(),
                Self::KEY_BYTES.end(),
                Self::PREFIX
            ));
        }
        Ok(Self { key: key.into() })
    }

    /// The `webhook-signature` value for one request: `v1,` and the base64
    /// HMAC-SHA256 of `{id}.{timestamp}.{body}`.
    pub fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(self.key.expose_secret())
            .expect("HMAC takes a key of any length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", BASE64.encode(mac.finalize().into_bytes()))
    }
}

/// Where and how replies are POSTed.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    pub url: String,
    /// Signs every request when set.
    pub secret: Option<WebhookSecret>,
    /// One POST's time limit; a POST that takes longer is a failed attempt.
    pub timeout: Duration,
    /// How long a reply may keep failing before it is given up.
    pub max_age: Duration,
}

impl WebhookSettings {
    /// The Standard Webhooks recommendation is 15 to 30 seconds.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
    /// A receiver down for less than a day misses nothing.
    pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(24 * 60 * 60);
}

/// What the webhook receives.
#[derive(Debug, Serialize)]
struct ReplyOut<'a> {
    conversation: &'a str,
    text: &'a str,
    covers: Vec<serde_json::Value>,
    reply_id: i64,
    kind: &'a str,
}

/// The `webhook-id` of a part: the outbox row's id and its creation time exactly as
/// the database stored it (`stored_at`, never translated to a process's timeline), so
/// it is the same on every attempt and in every process, whatever their clocks say,
/// and a fresh database (whose ids start again at 1) does not reuse one a receiver has
/// seen. Not `created_at`: on PostgreSQL that is moved onto the caller's timeline by
/// an offset measured afresh in each transaction, so it differs between attempts. The
/// http adapter never splits a reply, so a row is one request. No `.` (the signed
/// content is `.`-delimited).
pub(super) fn webhook_id(part: &OutgoingPart<'_>) -> String {
    format!("msg_{}_{}", part.outbox_id.0, part.stored_at.0)
}

/// Delivers replies by POSTing them to the webhook.
pub struct WebhookOutbound {
    client: reqwest::Client,
    settings: WebhookSettings,
}

impl WebhookOutbound {
    pub fn new(settings: WebhookSettings) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .timeout(settings.timeout)
            // A redirect is a failure (Standard Webhooks): following it would turn the
            // POST into a GET, or send a signed reply somewhere else.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("cannot build the webhook client: {e}"))?;
        Ok(Self { client, settings })
    }
}

/// `Retry-After`, in seconds or as an HTTP date (the port's one parser).
fn retry_after(value: &HeaderValue) -> Option<Duration> {
    lull_port::retry::parse_retry_after(value.to_str().ok()?, SystemTime::now())
}

#[async_trait]
impl Outbound for WebhookOutbound {
    fn platform(&self) -> Platform {
        Platform::Http
    }

    fn split(&self, text: &str) -> Vec<String> {
        // JSON has no length limit.
        vec![text.to_owned()]
    }

    async fn send(&self, part: &OutgoingPart<'_>) -> Result<(), SendError> {
        let body = serde_json::to_vec(&ReplyOut {
            conversation: &part.conversation.key,
            text: part.text,
            covers: part.covers.iter().map(|id| client_id(id)).collect(),
            reply_id: part.outbox_id.0,
            kind: part.kind.as_str(),
        })
        .map_err(|e| SendError::Permanent(format!("cannot encode the reply: {e}")))?;
        let id = webhook_id(part);
        let timestamp = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let mut request = self
            .client
            .post(&self.settings.url)
            .header(header::CONTENT_TYPE, "application/json")
            .header("webhook-id", &id)
            .header("webhook-timestamp", timestamp.to_string());
        if let Some(secret) = &self.settings.secret {
            request = request.header("webhook-signature", secret.sign(&id, timestamp, &body));
        }
        let response = request.body(body).send().await.map_err(|e| {
            if e.is_timeout() {
                SendError::Transient(format!(
                    "the webhook did not answer within {} ms",
                    self.settings.timeout.as_millis()
                ))
            } else {
                // The webhook URL may carry a secret in its query: never echo it.
                // The cause chain says why (refused, DNS, TLS), redacted.
                SendError::Transient(format!(
                    "webhook unreachable: {}",
                    lull_port::secrets::redact_error(&e.without_url())
                ))
            }
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(());
        }
        let wait = response
            .headers()
            .get(header::RETRY_AFTER)
            .and_then(retry_after);
        Err(match (status.as_u16(), wait) {
            (429, Some(wait)) => SendError::RetryAfter(wait),
            _ => SendError::Transient(format!("the webhook answered HTTP {status}")),
        })
    }

    async fn typing(&self, _conversation: &ConversationRef) -> Result<(), SendError> {
        Ok(())
    }

    fn typing_every(&self) -> Option<Duration> {
        None
    }

    fn max_age(&self) -> Option<Duration> {
        Some(self.settings.max_age)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    #[test]
    fn secrets_are_checked_and_never_shown() {
        let secret = WebhookSecret::parse(SECRET).unwrap();
        assert_eq!(format!("{secret:?}"), "WebhookSecret(<redacted>)");
        for (bad, why) in [
            ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "must start with"),
            ("whsec_not base64!!", "not valid base64"),
            ("whsec_c2hvcnQ=", "the key is 5 bytes"),
        ] {
            let e = WebhookSecret::parse(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
            assert!(!e.contains("MfKQ") && !e.contains("c2hvcnQ"), "{e}");
        }
    }

    /// A `webhook-id` is made of what never moves: the row's id and its stored time.
    /// Two attempts whose `created_at` disagree (on PostgreSQL each read translates it
    /// by its own clock offset) carry one id; it has no `.` (the signed content is
    /// `.`-delimited).
    #[test]
    fn the_webhook_id_is_the_row_as_stored() {
        let conversation = ConversationRef::new(Platform::Http, "c1");
        let attempt = |created_at: i64| OutgoingPart {
            conversation: &conversation,
            outbox_id: lull_port::OutboxId(7),
            created_at: lull_port::Timestamp(created_at),
            stored_at: lull_port::Timestamp(1_764_000_000_123),
            kind: lull_port::OutboxKind::Reply,
            index: 0,
            count: 1,
            text: "hi",
            reply_to: None,
            covers: &[],
            quick_replies: &[],
        };
        let (first, retry) = (
            webhook_id(&attempt(1_764_000_000_120)),
            webhook_id(&attempt(1_764_000_000_127)),
        );
        assert_eq!(first, "msg_7_1764000000123");
        assert_eq!(first, retry);
        assert!(!first.contains('.'));
    }

    /// The example of the Standard Webhooks reference libraries: this key, id,
    /// timestamp and body give this signature.
    #[test]
    fn the_signature_matches_the_reference_example() {
        let secret = WebhookSecret::parse(SECRET).unwrap();
        let signature = secret.sign(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn retry_after_is_seconds_or_a_date() {
        assert_eq!(
            retry_after(&HeaderValue::from_static("7")),
            Some(Duration::from_secs(7))
        );
        let later = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(90));
        let wait = retry_after(&HeaderValue::from_str(&later).unwrap()).unwrap();
        assert!(wait > Duration::from_secs(80) && wait <= Duration::from_secs(90));
        assert_eq!(retry_after(&HeaderValue::from_static("soon")), None);
    }
}
