//! The http adapter: a generic JSON integration point (a website chat, a bridge, the
//! stress test's way in).
//!
//! Inbound: `POST /api/messages` with `{"conversation","user","text","id"}` (optional
//! `"name"`, the display name, and `"group": true` for multi-user conversations) →
//! `202` once the message is stored; idempotent on `id` within a conversation.
//! Outbound ([`webhook`]): every reply and notice is POSTed to `LULL_WEBHOOK_URL` by the
//! Standard Webhooks convention.

pub mod webhook;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::json;

pub use webhook::{WebhookOutbound, WebhookSecret, WebhookSettings};

use crate::dispatcher::{Accepted, Dispatcher, IngestError};
use crate::domain::{ConversationRef, Platform};
use crate::platform::{Content, Incoming, IncomingKind};
use crate::store::StoreError;

/// Largest request body accepted; larger ones get `413`.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

#[derive(Clone)]
struct Api {
    dispatcher: Arc<Dispatcher>,
    token: Option<Arc<SecretString>>,
}

/// The adapter's routes. With a token, every request needs `Authorization: Bearer`.
pub fn routes(dispatcher: Arc<Dispatcher>, token: Option<SecretString>) -> Router {
    Router::new()
        .route("/api/messages", post(post_message))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(Api {
            dispatcher,
            token: token.map(Arc::new),
        })
}

/// The inbound message body.
#[derive(Debug, Deserialize)]
struct MessageIn {
    conversation: String,
    user: String,
    text: String,
    id: serde_json::Value,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    group: bool,
}

/// A refused request: status and a message saying what to fix.
#[derive(Debug)]
enum ApiError {
    Unauthorized,
    BadRequest(String),
    TooLarge(String),
    Unavailable(String),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, message) = match self {
            ApiError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                "missing or wrong bearer token".to_owned(),
            ),
            ApiError::BadRequest(m) => (StatusCode::BAD_REQUEST, m),
            ApiError::TooLarge(m) => (StatusCode::PAYLOAD_TOO_LARGE, m),
            ApiError::Unavailable(m) => (StatusCode::SERVICE_UNAVAILABLE, m),
        };
        let mut response = (status, axum::Json(json!({ "error": message }))).into_response();
        match status {
            StatusCode::UNAUTHORIZED => {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            StatusCode::SERVICE_UNAVAILABLE => {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        response
    }
}

/// Compares without stopping at the first difference, so response time does not
/// reveal how much of a guessed token was right.
fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

fn authorized(headers: &HeaderMap, token: &SecretString) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| same_secret(given.trim().as_bytes(), token.expose_secret().as_bytes()))
}

fn parse(body: &[u8]) -> Result<MessageIn, ApiError> {
    let message: MessageIn = serde_json::from_slice(body).map_err(|e| {
        use serde_json::error::Category;
        ApiError::BadRequest(match e.classify() {
            Category::Data => format!("invalid message: {e}"),
            Category::Syntax | Category::Eof => format!("malformed JSON: {e}"),
            Category::Io => format!("unreadable body: {e}"),
        })
    })?;
    for (field, value) in [
        ("conversation", &message.conversation),
        ("user", &message.user),
    ] {
        if value.trim().is_empty() {
            return Err(ApiError::BadRequest(format!("`{field}` must not be empty")));
        }
    }
    Ok(message)
}

fn message_id(id: &serde_json::Value) -> Result<String, ApiError> {
    match id {
        serde_json::Value::String(s) if !s.trim().is_empty() => Ok(s.clone()),
        serde_json::Value::Number(n) => Ok(n.to_string()),
        _ => Err(ApiError::BadRequest(
            "`id` must be a non-empty string or a number, unique within the conversation".into(),
        )),
    }
}

async fn post_message(
    State(api): State<Api>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match accept(&api, &headers, body).await {
        Ok(accepted) => (StatusCode::ACCEPTED, axum::Json(accepted)).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn accept(
    api: &Api,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<serde_json::Value, ApiError> {
    if let Some(token) = &api.token {
        if !authorized(headers, token) {
            return Err(ApiError::Unauthorized);
        }
    }
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::TooLarge(format!(
                "request body too large (the limit is {} KiB)",
                MAX_BODY_BYTES / 1024
            ))
        } else {
            ApiError::BadRequest(rejection.body_text())
        }
    })?;
    let message = parse(&body)?;
    let incoming = Incoming {
        conversation: ConversationRef::new(Platform::Http, message.conversation.clone()),
        is_group: message.group,
        user_id: message.user.clone(),
        author: message.name.clone().unwrap_or_else(|| message.user.clone()),
        message_id: message_id(&message.id)?,
        content: Content::Text(message.text),
        kind: IncomingKind::New,
    };
    let accepted = api.dispatcher.ingest(incoming).await.map_err(|e| match e {
        IngestError::Empty => ApiError::BadRequest("`text` is empty".into()),
        IngestError::TooLong { .. } => ApiError::TooLarge(e.to_string()),
        IngestError::Store(StoreError::Busy | StoreError::Full | StoreError::Pool(_)) => {
            ApiError::Unavailable(format!("{e}; the message was not stored, send it again"))
        }
        other => {
            tracing::error!(error = %other, "http adapter could not store a message");
            ApiError::Unavailable(format!(
                "{other}; the message was not stored, send it again"
            ))
        }
    })?;
    Ok(match accepted {
        Accepted::Stored { version, .. } => json!({ "status": "stored", "version": version.0 }),
        Accepted::Duplicate => json!({ "status": "duplicate" }),
        Accepted::EditIgnored => json!({ "status": "ignored" }),
        Accepted::Command(c) => json!({ "status": "command", "command": c.name() }),
        Accepted::Unsupported => json!({ "status": "unsupported" }),
        Accepted::Denied => json!({ "status": "denied" }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_compare_by_content() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abd", b"abc"));
        assert!(!same_secret(b"ab", b"abc"));
    }

    #[test]
    fn ids_may_be_strings_or_numbers() {
        assert_eq!(message_id(&json!("m-1")).unwrap(), "m-1");
        assert_eq!(message_id(&json!(42)).unwrap(), "42");
        assert!(message_id(&json!("")).is_err());
        assert!(message_id(&json!(null)).is_err());
    }
}
