//! The console's jobs page: `GET /jobs` lists every chat's active reminders and tasks,
//! the next to fire first; `POST /jobs` (`job` the id, `chat` its chat's row id, and
//! the form's `csrf`) cancels one as `/jobs cancel N` does in the chat (the same store
//! operation: a job being fired meanwhile either fired first or finds itself
//! cancelled), answered by a redirect back saying what was done.

use std::fmt::Write as _;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use lull_core::domain::Timestamp;
use lull_core::limits::TimeZone;
use lull_core::store::{JobKind, JobRow};

use super::forms::Done;
use super::page::{document, esc, nav};
use super::{StatusPage, forms};

/// The most jobs the page lists.
const LIMIT: usize = 500;

/// `GET /jobs`.
pub(super) async fn page(
    State(status): State<StatusPage>,
    Query(done): Query<Done>,
    headers: HeaderMap,
) -> Response {
    let now = status.inner.clock.now();
    let read = status.inner.store.all_jobs(LIMIT);
    forms::page(&status, &headers, "lull — jobs", read, |jobs, csrf| {
        render(
            &jobs,
            &status.inner.timezone,
            now,
            csrf,
            done.done.as_deref(),
            status.inner.console.is_some(),
        )
    })
    .await
}

/// `POST /jobs`: cancel a job; refused without the session (off loopback) or with a
/// form token that is not the browser's (403).
pub(super) async fn cancel(
    State(status): State<StatusPage>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (posted, console) = match forms::console_change(&status, &headers, body) {
        Ok(checked) => checked,
        Err(refused) => return *refused,
    };
    let field = |name: &str| posted.field(name).and_then(|v| v.parse::<i64>().ok());
    let said = match (field("job"), field("chat")) {
        (Some(job), Some(chat)) => {
            let now = status.inner.clock.now();
            let found = status
                .inner
                .store
                .chats(Some(lull_core::domain::ConversationId(chat)), 1, now)
                .await;
            match found.map(|mut rows| rows.pop()) {
                Ok(Some(row)) => match row.platform.parse() {
                    Ok(platform) => {
                        let chat = lull_core::domain::ConversationRef::new(platform, row.key);
                        console
                            .console_cancel_job(&chat, job)
                            .await
                            .unwrap_or_else(|e| format!("not cancelled: {e}"))
                    }
                    Err(_) => format!("not cancelled: unknown platform {}", row.platform),
                },
                Ok(None) => format!("not cancelled: no chat #{chat}"),
                Err(e) => format!("not cancelled: {e}"),
            }
        }
        _ => "not cancelled: the form names no job".to_owned(),
    };
    forms::back_to("/jobs", &said)
}

fn render(
    jobs: &[JobRow],
    tz: &TimeZone,
    now: Timestamp,
    csrf: &str,
    done: Option<&str>,
    changes: bool,
) -> String {
    let done = done
        .map(|d| format!("<p class=\"done\" id=\"done\">{}</p>", esc(d)))
        .unwrap_or_default();
    let mut out = format!(
        "<header><h1>lull jobs</h1><p>{} active reminder(s) and task(s), the next to fire first</p>{}</header><main>\
         <section class=\"wide\">{done}<table id=\"jobs\"><tr><th>job</th><th>chat</th><th>kind</th><th>by</th>\
         <th>text</th><th>next</th><th></th></tr>",
        jobs.len(),
        nav("/jobs")
    );
    for j in jobs {
        let cancel = if changes {
            format!(
                "<form method=\"post\" action=\"/jobs\" id=\"cancel-{id}\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
                 <input type=\"hidden\" name=\"job\" value=\"{id}\"><input type=\"hidden\" name=\"chat\" value=\"{chat}\">\
                 <button type=\"submit\">Cancel</button></form>",
                id = j.id,
                chat = j.conversation_id.0
            )
        } else {
            String::new()
        };
        let _ = write!(
            out,
            "<tr data-job=\"{id}\"><td>#{id}</td><td><a href=\"/chats/{chat}\">#{chat}</a> <code>{key}</code></td><td>{kind}</td>\
             <td>{by}</td><td>{text}</td><td>{next}</td><td>{cancel}</td></tr>",
            id = j.id,
            chat = j.conversation_id.0,
            key = esc(&j.conversation.to_string()),
            kind = match j.kind {
                JobKind::Reminder => "reminder",
                JobKind::Task => "task",
            },
            by = esc(&j.creator_name),
            text = esc(&j.text),
            next = esc(&j
                .next_at
                .map_or_else(|| "—".to_owned(), |at| tz.show(at, now))),
        );
    }
    out.push_str("</table></section></main>");
    document("lull — jobs", &out)
}
