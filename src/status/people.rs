//! The console's people page: `GET /people` shows who may use the bot (the lists and
//! the admins from the environment, read-only; the run-time decisions) and what each
//! person spent today against their budgets; `POST /people` (`action` `allow` or
//! `deny`, `user` as `platform:id`, and the form's `csrf`) decides about a user as
//! `/allow` and `/deny` do, answered by a redirect back saying what was done.

use std::fmt::Write as _;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use lull_core::access::AccessRule;
use lull_core::dispatcher::{ConsoleChange, Dispatcher};
use lull_core::domain::Platform;
use lull_core::store::PersonUsage;

use super::forms::Done;
use super::page::{document, esc, nav};
use super::{StatusPage, forms, html};

/// The most people the page lists.
const LIMIT: usize = 200;

/// `GET /people`.
pub(super) async fn page(
    State(status): State<StatusPage>,
    Query(done): Query<Done>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = status.refusal(&headers, false) {
        return refused;
    }
    let Some(console) = status.inner.console.clone() else {
        return html(
            StatusCode::NOT_FOUND,
            document(
                "lull — people",
                "<main><p>Not available in this process.</p></main>",
            ),
        );
    };
    let store = &status.inner.store;
    let now = status.inner.clock.now();
    let day = console.console_limits().timezone.day(now);
    let read = async {
        Ok::<_, lull_core::store::StoreError>((
            store.access_rules().await?,
            store.people_usage(&day, LIMIT).await?,
        ))
    };
    forms::page(
        &status,
        &headers,
        "lull — people",
        read,
        |(rules, people), csrf| render(&console, &rules, &people, &day, csrf, done.done.as_deref()),
    )
    .await
}

/// `POST /people`: allow or deny a user; refused without the session (off loopback)
/// or with a form token that is not the browser's (403).
pub(super) async fn change(
    State(status): State<StatusPage>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (posted, console) = match forms::console_change(&status, &headers, body) {
        Ok(checked) => checked,
        Err(refused) => return *refused,
    };
    let field = |name: &str| posted.field(name);
    let action = field("action").unwrap_or_default();
    let user = field("user").unwrap_or_default();
    let said = match decide(&console, &action, user.trim()).await {
        Ok(said) => said,
        Err(e) => format!("not saved: {e}"),
    };
    tracing::info!(%action, %user, outcome = %said, "a console change of access");
    forms::back_to("/people", &said)
}

/// Allow or deny `user` (`platform:id`); what the page then says.
async fn decide(
    console: &Dispatcher,
    action: &str,
    user: &str,
) -> Result<String, lull_core::store::StoreError> {
    let allowed = match action {
        "allow" => true,
        "deny" => false,
        other => return Ok(format!("not saved: unknown action {other:?}")),
    };
    let Some((platform, id)) = user
        .split_once(':')
        .and_then(|(p, id)| Some((p.parse::<Platform>().ok()?, id.trim())))
    else {
        return Ok(format!(
            "not saved: {user:?} is not platform:id (telegram:42)"
        ));
    };
    Ok(
        match console.console_user_access(platform, id, allowed).await? {
            ConsoleChange::Refused(why) => format!("not saved: {why}"),
            ConsoleChange::Done { .. } => format!(
                "saved: {platform}:{id} is {}",
                if allowed { "allowed" } else { "denied" }
            ),
        },
    )
}

/// A form posting `action` about `user` (empty: a field to type one).
fn form(csrf: &str, action: &str, user: Option<&str>, label: &str) -> String {
    let user = match user {
        Some(user) => format!(
            "<input type=\"hidden\" name=\"user\" value=\"{}\">",
            esc(user)
        ),
        None => "<input name=\"user\" placeholder=\"telegram:42\" aria-label=\"user\" required>"
            .to_owned(),
    };
    format!(
        "<form method=\"post\" action=\"/people\" class=\"form-{action}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <input type=\"hidden\" name=\"action\" value=\"{action}\">{user}\
         <button type=\"submit\">{label}</button></form>"
    )
}

/// `used` against `limit` (none when zero).
fn against(used: String, limit: Option<String>) -> String {
    match limit {
        Some(limit) => format!("{used} of {limit}"),
        None => used,
    }
}

fn render(
    console: &Dispatcher,
    rules: &[AccessRule],
    people: &[PersonUsage],
    day: &str,
    csrf: &str,
    done: Option<&str>,
) -> String {
    let access = console.console_access_lists();
    let or = |s: String, none: &str| if s.is_empty() { none.to_owned() } else { s };
    let done = done
        .map(|d| format!("<p class=\"done\" id=\"done\">{}</p>", esc(d)))
        .unwrap_or_default();
    let mut out = format!(
        "<header><h1>lull people</h1><p>who may use the bot, and what each spent today ({day})</p>{}</header><main>\
         <section class=\"wide\">{done}<h2>From the environment (read-only)</h2><table id=\"lists\">\
         <tr><th>LULL_ALLOWED_USERS</th><td>{}</td></tr><tr><th>LULL_ALLOWED_CHATS</th><td>{}</td></tr>\
         <tr><th>LULL_ADMINS</th><td>{}</td></tr></table>",
        nav("/people"),
        esc(&or(access.users.describe(), "local users only")),
        esc(&or(access.chats.describe(), "none")),
        esc(&or(access.admins.describe(), "none")),
    );
    out.push_str("<h2>Decided at run time</h2><p>Decisions win over the lists; every process follows them within LULL_POLL_MS.</p>");
    out.push_str(&form(csrf, "allow", None, "Allow"));
    out.push_str(&form(csrf, "deny", None, "Deny"));
    out.push_str("<table id=\"decisions\"><tr><th>who</th><th>decision</th><th>by</th></tr>");
    for r in rules {
        let _ = write!(
            out,
            "<tr data-subject=\"{s}\" data-allowed=\"{a}\"><td>{s}</td><td>{d}</td><td>{by}</td></tr>",
            s = esc(&r.subject.to_string()),
            a = r.allowed,
            d = if r.allowed { "allowed" } else { "denied" },
            by = esc(&r.set_by),
        );
    }
    out.push_str("</table></section>");
    spent(&mut out, people, console.console_limits(), csrf);
    out.push_str("</main>");
    document("lull — people", &out)
}

/// The "spent today" section: each person's tokens and dollars against their budgets,
/// each with a Deny button.
fn spent(out: &mut String, people: &[PersonUsage], limits: &lull_core::limits::Limits, csrf: &str) {
    out.push_str("<section class=\"wide\"><h2>Spent today</h2><table id=\"people\"><tr><th>who</th><th>tokens</th><th>dollars</th><th></th></tr>");
    for p in people {
        let tokens = against(
            p.tokens.to_string(),
            (limits.user_daily_tokens > 0).then(|| limits.user_daily_tokens.to_string()),
        );
        let dollars = against(
            p.cost.to_string(),
            limits
                .user_daily_usd
                .is_set()
                .then(|| limits.user_daily_usd.to_string()),
        );
        // The replies to the console's own answers are charged to the operator, who
        // is no one to deny.
        let operator = p
            .user
            .split_once(':')
            .is_some_and(|(_, id)| id == lull_core::access::CONSOLE_OPERATOR);
        let (who, deny) = if operator {
            ("the operator (console)".to_owned(), String::new())
        } else {
            (esc(&p.user), form(csrf, "deny", Some(&p.user), "Deny"))
        };
        let _ = write!(
            out,
            "<tr data-user=\"{u}\" data-tokens=\"{t}\"><td>{who}</td><td>{tokens}</td><td>{dollars}</td><td>{deny}</td></tr>",
            u = esc(&p.user),
            t = p.tokens,
        );
    }
    out.push_str("</table></section>");
}
