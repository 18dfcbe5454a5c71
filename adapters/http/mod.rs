//! The http adapter: a generic JSON integration point (a website chat, a bridge, the
//! stress test's way in).
//!
//! Inbound: `POST /api/messages` with `{"conversation","user","text","id"}` (optional
//! `"name"`, the display name, `"title"`, the conversation's name as the console shows
//! it, and `"group": true` for multi-user conversations) →
//! `202` once the message is stored; idempotent on `id` within a conversation. `id` is
//! a string or an integer, and the two are different ids (`"7"` is not `7`).
//! Outbound (`webhook`): every reply and notice is POSTed to `LULL_WEBHOOK_URL` by the
//! Standard Webhooks convention, `covers` giving the ids back as the client sent them.

mod webhook;

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

use lull_port::domain::{ConversationRef, Platform};
use lull_port::{Accepted, IngestError, Intake};
use lull_port::{Content, Incoming, IncomingKind};

/// Largest request body accepted; larger ones get `413`.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

#[derive(Clone)]
struct Api {
    intake: Arc<dyn Intake>,
    token: Option<Arc<SecretString>>,
}

/// The adapter's routes. With a token, every request needs `Authorization: Bearer`.
pub fn routes(intake: Arc<dyn Intake>, token: Option<SecretString>) -> Router {
    Router::new()
        .route("/api/messages", post(post_message))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(Api {
            intake,
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
    title: Option<String>,
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
pub fn same_secret(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len()
        && given
            .iter()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// `Authorization: Bearer <token>`; the scheme name is case-insensitive (RFC 9110).
fn authorized(headers: &HeaderMap, token: &SecretString) -> bool {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim_start().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .is_some_and(|(_, given)| {
            same_secret(given.trim().as_bytes(), token.expose_secret().as_bytes())
        })
}

/// Longest `conversation`, `user` and `id`, in bytes (UTF-8).
pub const MAX_ID_BYTES: usize = 256;
/// Longest `name` and `title`, in bytes (UTF-8).
pub const MAX_NAME_BYTES: usize = 128;

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
    for (field, value, max) in [
        ("conversation", message.conversation.as_str(), MAX_ID_BYTES),
        ("user", message.user.as_str(), MAX_ID_BYTES),
        (
            "name",
            message.name.as_deref().unwrap_or_default(),
            MAX_NAME_BYTES,
        ),
        (
            "title",
            message.title.as_deref().unwrap_or_default(),
            MAX_NAME_BYTES,
        ),
    ] {
        if value.len() > max {
            return Err(ApiError::BadRequest(format!(
                "`{field}` is too long ({} bytes; at most {max} are accepted)",
                value.len()
            )));
        }
    }
    Ok(message)
}

/// The stored form of a client's message id: its canonical JSON text. A string id is
/// kept quoted (`"7"`), an integer id bare (`7`), so `"7"` and `7` are two ids, and
/// [`client_id`] gives the client its id back with the JSON type it sent. Integers must
/// fit `i64` or `u64` exactly: larger numbers and floats would round (two ids could
/// become one), so they are refused, as are booleans, null, arrays and objects.
fn message_id(id: &serde_json::Value) -> Result<String, ApiError> {
    let refused = |why: &str| {
        ApiError::BadRequest(format!(
            "`id` must be a non-empty string or an integer (at most 64 bits), unique within the conversation; {why}"
        ))
    };
    match id {
        serde_json::Value::String(s) if s.trim().is_empty() => Err(refused("got an empty string")),
        serde_json::Value::String(s) if s.len() > MAX_ID_BYTES => Err(refused(&format!(
            "got {} bytes (at most {MAX_ID_BYTES} are accepted)",
            s.len()
        ))),
        serde_json::Value::Number(n) if !(n.is_i64() || n.is_u64()) => Err(refused(&format!(
            "got {n}, a float or a number out of range (send large ids as strings)"
        ))),
        serde_json::Value::String(_) | serde_json::Value::Number(_) => Ok(id.to_string()),
        serde_json::Value::Null => Err(refused("got null")),
        serde_json::Value::Bool(_) => Err(refused("got a boolean")),
        serde_json::Value::Array(_) | serde_json::Value::Object(_) => {
            Err(refused("got an array or an object"))
        }
    }
}

/// A stored message id back as the client sent it (see [`message_id`]). Rows stored
/// before ids were kept as JSON text hold the bare string; those are given back as
/// strings (a bare `7` among them reads as the integer it looks like).
pub(crate) fn client_id(stored: &str) -> serde_json::Value {
    match serde_json::from_str::<serde_json::Value>(stored) {
        Ok(id @ (serde_json::Value::String(_) | serde_json::Value::Number(_))) => id,
        _ => serde_json::Value::String(stored.to_owned()),
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
    if let Some(token) = &api.token
        && !authorized(headers, token)
    {
        return Err(ApiError::Unauthorized);
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
        // The http platform is local (admitted by default) and names no chats.
        chats: Vec::new(),
        author: message.name.clone().unwrap_or_else(|| message.user.clone()),
        title: message.title.clone().filter(|t| !t.trim().is_empty()),
        message_id: message_id(&message.id)?,
        content: Content::Text(message.text),
        media: Vec::new(),
        kind: IncomingKind::New,
    };
    let accepted = api.intake.ingest(incoming).await.map_err(|e| match e {
        IngestError::Empty => ApiError::BadRequest("`text` is empty".into()),
        IngestError::TooLong { .. } => ApiError::TooLarge(e.to_string()),
        // Nothing was stored: the client sends it again. (The core logs a failing
        // database once per change, not once per message.)
        IngestError::NotStored(_) | IngestError::UnknownPlatform(_) => {
            ApiError::Unavailable(e.to_string())
        }
    })?;
    Ok(match accepted {
        Accepted::Stored { version, .. } => json!({ "status": "stored", "version": version.0 }),
        Accepted::Duplicate => json!({ "status": "duplicate" }),
        Accepted::EditIgnored => json!({ "status": "ignored" }),
        Accepted::Command(c) => json!({ "status": "command", "command": c.name() }),
        Accepted::Unsupported => json!({ "status": "unsupported" }),
        Accepted::Denied => json!({ "status": "denied" }),
        Accepted::Overheard => json!({ "status": "overheard" }),
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
    fn the_bearer_scheme_is_case_insensitive() {
        let token = SecretString::from("t0k3n");
        for value in [
            "Bearer t0k3n",
            "bearer t0k3n",
            "BEARER t0k3n",
            "  bEaReR   t0k3n ",
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
            assert!(authorized(&headers, &token), "{value}");
        }
        for value in ["Basic t0k3n", "Bearer t0k3", "Bearert0k3n", "t0k3n"] {
            let mut headers = HeaderMap::new();
            headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
            assert!(!authorized(&headers, &token), "{value}");
        }
    }

    #[test]
    fn ids_are_stored_as_json_text_and_given_back_with_their_type() {
        assert_eq!(message_id(&json!("m-1")).unwrap(), r#""m-1""#);
        assert_eq!(message_id(&json!("7")).unwrap(), r#""7""#);
        assert_eq!(message_id(&json!(7)).unwrap(), "7");
        assert_eq!(message_id(&json!(-7)).unwrap(), "-7");
        assert_eq!(
            message_id(&json!(u64::MAX)).unwrap(),
            "18446744073709551615"
        );
        for id in [
            json!("m-1"),
            json!("7"),
            json!(7),
            json!(u64::MAX),
            json!(i64::MIN),
        ] {
            assert_eq!(client_id(&message_id(&id).unwrap()), id);
        }
        // Rows stored before: the bare string.
        assert_eq!(client_id("m-1"), json!("m-1"));
    }

    #[test]
    fn ids_that_could_collide_or_round_are_refused() {
        let above_u64: serde_json::Value = serde_json::from_str("18446744073709551616").unwrap();
        for id in [
            json!(""),
            json!("  "),
            json!(null),
            json!(true),
            json!(1.5),
            json!(7.0),
            above_u64,
            json!([1]),
            json!({"a": 1}),
            json!("x".repeat(MAX_ID_BYTES + 1)),
        ] {
            assert!(message_id(&id).is_err(), "{id}");
        }
        assert!(message_id(&json!("x".repeat(MAX_ID_BYTES))).is_ok());
    }
}
