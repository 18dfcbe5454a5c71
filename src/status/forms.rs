//! What every console page and change shares: a page refused without the session
//! before anything is read, rendered with this browser's form token ([`page`],
//! [`with_token`]); a change's checks (the session off loopback, the form token of this
//! browser) and the redirect back after it, saying what was done ([`Done`]).

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use std::sync::Arc;

use lull_core::dispatcher::Dispatcher;

use super::{StatusPage, csrf, html, over_https};

/// A posted form (`application/x-www-form-urlencoded`).
pub(super) struct Posted(Bytes);

impl Posted {
    /// The value of the field `name`, if the form has it.
    pub(super) fn field(&self, name: &str) -> Option<String> {
        url::form_urlencoded::parse(&self.0)
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.into_owned())
    }
}

/// The form posted to `status` with `headers`, once it may change something: the
/// session (off loopback, or with a token set) and this browser's form token
/// ([`csrf`]). `Err`: the answer that refuses it (the login form, or 403).
pub(super) fn checked(
    status: &StatusPage,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<Posted, Box<Response>> {
    if let Some(refused) = status.refusal(headers, false) {
        return Err(Box::new(refused));
    }
    let posted = Posted(body);
    if !csrf::checked(headers, posted.field("csrf").as_deref()) {
        tracing::warn!("a console change without this browser's form token was refused");
        return Err(Box::new(
            (
                StatusCode::FORBIDDEN,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                "Refused: this form is not one this console gave your browser (reload the page and try again).\n",
            )
                .into_response(),
        ));
    }
    Ok(posted)
}

/// [`checked`], and the dispatcher that makes console changes: `Err` the answer that
/// refuses the form, or says changes are not available in this process.
pub(super) fn console_change(
    status: &StatusPage,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<(Posted, Arc<Dispatcher>), Box<Response>> {
    let posted = checked(status, headers, body)?;
    match status.inner.console.clone() {
        Some(console) => Ok((posted, console)),
        None => Err(Box::new(no_changes())),
    }
}

/// The answer to a change: back to `page`, saying `said` (`?done=…`).
pub(super) fn back_to(page: &str, said: &str) -> Response {
    let joint = if page.contains('?') { '&' } else { '?' };
    let location = format!(
        "{page}{joint}done={}",
        url::form_urlencoded::byte_serialize(said.as_bytes()).collect::<String>()
    );
    (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response()
}

/// The page `title` when the database did not answer: 503, saying why.
pub(super) fn unavailable(title: &str, error: &lull_core::store::StoreError) -> Response {
    super::html(
        StatusCode::SERVICE_UNAVAILABLE,
        super::page::document(
            title,
            &format!(
                "<main><p class=\"bad\">{}</p></main>",
                super::page::esc(&error.to_string())
            ),
        ),
    )
}

/// The answer to a change posted to a process without a dispatcher to make it.
pub(super) fn no_changes() -> Response {
    (StatusCode::NOT_FOUND, "changes are not available here\n").into_response()
}

/// What the redirect after a change says (`?done=…`).
#[derive(serde::Deserialize)]
pub(super) struct Done {
    pub(super) done: Option<String>,
}

/// The page `render` makes with this browser's form token, giving it one first if it
/// has none.
pub(super) fn with_token(headers: &HeaderMap, render: impl FnOnce(&str) -> String) -> Response {
    let (token, new) = match csrf::from_cookie(headers) {
        Some(token) => (token, false),
        None => (csrf::new_token(), true),
    };
    let mut response = html(StatusCode::OK, render(&token));
    if new && let Some(cookie) = csrf::set_cookie(&token, over_https(headers)) {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response
}

/// A console page: refused without the session (the login form, off loopback or with a
/// token set) before anything is read; else what `read` found, rendered with this
/// browser's form token, or 503 saying why the database did not answer.
pub(super) async fn page<T>(
    status: &StatusPage,
    headers: &HeaderMap,
    title: &str,
    read: impl std::future::Future<Output = Result<T, lull_core::store::StoreError>>,
    render: impl FnOnce(T, &str) -> String,
) -> Response {
    if let Some(refused) = status.refusal(headers, false) {
        return refused;
    }
    match read.await {
        Ok(found) => with_token(headers, |csrf| render(found, csrf)),
        Err(e) => unavailable(title, &e),
    }
}
