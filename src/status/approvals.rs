//! The console's approvals page: `GET /approvals` lists every chat's tool calls waiting
//! for a yes, oldest first; `POST /approvals` (`action` the approval's id, `answer`
//! `approve` or `cancel`, and the form's `csrf`) answers one as an admin would in the
//! chat: `/approve ID` (or `/cancel ID`) written there as the console's operator, so the
//! chat's next round decides it once, under its lease, and tells the chat
//! (`Dispatcher::console_answer_approval`). The same answer posted again changes
//! nothing. Answered by a redirect back saying what was done.

use std::fmt::Write as _;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use lull_core::domain::Timestamp;
use lull_core::limits::TimeZone;
use lull_core::store::{ActionState, WaitingApproval};

use super::forms::Done;
use super::page::{document, esc, nav};
use super::{StatusPage, forms};

/// The most characters of a call's arguments the page shows.
const ARGUMENTS_SHOWN: usize = 300;

/// `GET /approvals`.
pub(super) async fn page(
    State(status): State<StatusPage>,
    Query(done): Query<Done>,
    headers: HeaderMap,
) -> Response {
    let Some(console) = status.inner.console.clone() else {
        return forms::no_changes();
    };
    let now = status.inner.clock.now();
    let read = console.console_approvals();
    forms::page(
        &status,
        &headers,
        "lull — approvals",
        read,
        |waiting, csrf| {
            let shown = Shown {
                tz: &status.inner.timezone,
                now,
                csrf,
            };
            render(&waiting, &shown, done.done.as_deref())
        },
    )
    .await
}

/// `POST /approvals`: answer one; refused without the session (off loopback, or with
/// a token set) or with a form token that is not the browser's (403).
pub(super) async fn answer(
    State(status): State<StatusPage>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (posted, console) = match forms::console_change(&status, &headers, body) {
        Ok(checked) => checked,
        Err(refused) => return *refused,
    };
    let id = posted.field("action").and_then(|v| v.parse::<i64>().ok());
    let approve = match posted.field("answer").as_deref() {
        Some("approve") => Some(true),
        Some("cancel") => Some(false),
        _ => None,
    };
    let said = match (id, approve) {
        (Some(id), Some(approve)) => console
            .console_answer_approval(id, approve)
            .await
            .unwrap_or_else(|e| format!("not answered: {e}")),
        _ => "not answered: the form names no approval and answer".to_owned(),
    };
    forms::back_to("/approvals", &said)
}

/// How the page shows times and forms.
struct Shown<'a> {
    tz: &'a TimeZone,
    now: Timestamp,
    csrf: &'a str,
}

fn render(waiting: &[WaitingApproval], shown: &Shown<'_>, done: Option<&str>) -> String {
    let done = done
        .map(|d| format!("<p class=\"done\" id=\"done\">{}</p>", esc(d)))
        .unwrap_or_default();
    let mut out = format!(
        "<header><h1>lull approvals</h1><p>{} tool call(s) waiting for a yes, oldest first</p>{}</header><main>\
         <section class=\"wide\">{done}<p class=\"muted\">An answer here is <code>/approve ID</code> (or <code>/cancel ID</code>) \
         written in the chat as the operator, an admin: the chat's next round decides it once and tells the chat.</p>\
         <table id=\"approvals\"><tr><th>approval</th><th>chat</th><th>call</th><th>asked by</th><th>asked</th>\
         <th>open until</th><th></th></tr>",
        waiting.len(),
        nav("/approvals")
    );
    for w in waiting {
        row(&mut out, w, shown);
    }
    out.push_str("</table></section></main>");
    document("lull — approvals", &out)
}

/// One approval's row, with its two answers.
fn row(out: &mut String, w: &WaitingApproval, shown: &Shown<'_>) {
    let a = &w.action;
    let button = |answer: &str, label: &str| {
        format!(
            "<form method=\"post\" action=\"/approvals\" id=\"{answer}-{id}\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <input type=\"hidden\" name=\"action\" value=\"{id}\"><input type=\"hidden\" name=\"answer\" value=\"{answer}\">\
             <button type=\"submit\">{label}</button></form>",
            id = a.id,
            csrf = shown.csrf
        )
    };
    let mut arguments: String = a.arguments.chars().take(ARGUMENTS_SHOWN).collect();
    if arguments.len() < a.arguments.len() {
        arguments.push('…');
    }
    let until = match a.state {
        ActionState::Approved => "approved, not yet run".to_owned(),
        _ => shown.tz.show(a.expires_at, shown.now),
    };
    // Answered here, not yet decided: the chat's round takes it in a moment. A cancel
    // may still follow an approve (in the same batch it wins, as in the chat).
    let (answers, state) = match w.console_answer {
        None => (
            format!(
                "{}{}",
                button("approve", "Approve"),
                button("cancel", "Cancel")
            ),
            String::new(),
        ),
        Some(true) => (
            button("cancel", "Cancel"),
            "<p class=\"done\">approved here: the chat's round runs it</p>".to_owned(),
        ),
        Some(false) => (
            String::new(),
            "<p class=\"done\">cancelled here: the chat's round refuses it</p>".to_owned(),
        ),
    };
    let _ = write!(
        out,
        "<tr data-approval=\"{id}\"><td>#{id}</td><td><a href=\"/chats/{chat}\">#{chat}</a> <code>{key}</code></td>\
         <td><code>{tool}</code> <code>{arguments}</code></td><td>{askers}</td><td>{asked}</td><td>{until}</td>\
         <td>{state}<div class=\"answers\">{answers}</div></td></tr>",
        id = a.id,
        chat = a.conversation_id.0,
        key = esc(&w.conversation.to_string()),
        tool = esc(&a.tool),
        arguments = esc(&arguments),
        askers = esc(&a.askers().0.join(", ")),
        asked = esc(&shown.tz.show(a.created_at, shown.now)),
        until = esc(&until),
    );
}
