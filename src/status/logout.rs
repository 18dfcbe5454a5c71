//! Logging out of the console: `GET /logout` shows a form (with this browser's form
//! token, as every change carries), and `POST /logout` ends the browser's session
//! ([`login::Sessions::revoke`](super::login::Sessions::revoke)), clears its cookie and
//! goes to the login form. With no token set (the open loopback console) there is no
//! session to end, and the page says so.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::forms::with_token;
use super::page::{document, nav};
use super::{Access, COOKIE, StatusPage, cookies, forms, html, set_cookie};

/// `GET /logout`: the form that logs out.
pub(super) async fn form(State(status): State<StatusPage>, headers: HeaderMap) -> Response {
    if let Some(refused) = status.refusal(&headers, false) {
        return refused;
    }
    if !matches!(status.inner.access, Access::Token { .. }) {
        return html(StatusCode::OK, open_page());
    }
    with_token(&headers, |csrf| {
        document(
            "lull — log out",
            &format!(
                "<header><h1>lull console</h1>{}</header><main><section><h2>Log out</h2>\
                 <p>End this browser's session of the console.</p>\
                 <form method=\"post\" action=\"/logout\" id=\"logout\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
                 <button type=\"submit\">Log out</button></form></section></main>",
                nav("/logout")
            ),
        )
    })
}

/// `POST /logout`: the session ended here and its cookie cleared; then the login form.
pub(super) async fn end(
    State(status): State<StatusPage>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(refused) = forms::checked(&status, &headers, body) {
        return *refused;
    }
    let Access::Token { sessions, .. } = &status.inner.access else {
        return html(StatusCode::OK, open_page());
    };
    let now = status.inner.clock.now();
    for session in cookies(&headers, COOKIE) {
        sessions.revoke(&session, now);
    }
    tracing::info!("a console session was logged out");
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/login")]).into_response();
    if let Some(cleared) = set_cookie(COOKIE, "", Some(0), false) {
        response.headers_mut().insert(header::SET_COOKIE, cleared);
    }
    response
}

/// What `/logout` says where no token is set.
fn open_page() -> String {
    document(
        "lull — log out",
        &format!(
            "<header><h1>lull console</h1>{}</header><main><section><h2>Nothing to log out of</h2>\
             <p>This console is open on a loopback address without <code>LULL_HTTP_TOKEN</code>: \
             there is no session. Set the token to need a login.</p></section></main>",
            nav("/logout")
        ),
    )
}
