//! The console's memories page: `GET /memories` shows how many memories are kept by
//! kind and looks a scope up; `GET /memories?scope=person:telegram:42` (or
//! `chat:telegram:-100…`) shows that scope's texts, on request only; `POST /memories`
//! (`scope`, `action` `forget` with `id`, or `clear`, and the form's `csrf`) does what
//! `/memory forget N` and `/memory clear` do there (a clear fences the rounds in
//! flight), answered by a redirect back saying what was done.

use std::fmt::Write as _;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::response::Response;
use lull_core::domain::Platform;
use lull_core::store::{Memory, Scope, ScopeKind};

use super::forms::with_token;
use super::page::{document, esc, nav};
use super::{StatusPage, forms};

/// What `GET /memories` is asked.
#[derive(serde::Deserialize)]
pub(super) struct Asked {
    scope: Option<String>,
    done: Option<String>,
}

/// A scope as the page names it: `person:PLATFORM:ID` or `chat:PLATFORM:KEY`.
pub(super) fn scope_of(text: &str) -> Option<Scope> {
    let mut parts = text.trim().splitn(3, ':');
    let kind = ScopeKind::parse(parts.next()?)?;
    let platform: Platform = parts.next()?.parse().ok()?;
    let owner = parts.next().filter(|o| !o.is_empty())?;
    Some(Scope {
        kind,
        platform,
        owner: owner.to_owned(),
    })
}

/// The page's name of `scope`.
pub(super) fn scope_name(scope: &Scope) -> String {
    format!("{}:{}:{}", scope.kind.as_str(), scope.platform, scope.owner)
}

/// `GET /memories`.
pub(super) async fn page(
    State(status): State<StatusPage>,
    Query(asked): Query<Asked>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = status.refusal(&headers, false) {
        return refused;
    }
    let counts = status.inner.store.memory_counts().await.unwrap_or_default();
    let scope = asked.scope.as_deref().and_then(scope_of);
    let texts = match (&scope, &status.inner.console) {
        (Some(scope), Some(console)) => match console.console_memories(scope).await {
            Ok(memories) => Some(memories),
            Err(e) => {
                return forms::unavailable("lull — memories", &e);
            }
        },
        _ => None,
    };
    with_token(&headers, |csrf| {
        let mut out = format!(
            "<header><h1>lull memories</h1><p>about people (private chats): <span id=\"memories-person\">{}</span> · \
             of group chats: <span id=\"memories-chat\">{}</span></p>{}</header><main><section class=\"wide\">",
            counts.person,
            counts.chat,
            nav("/memories")
        );
        if let Some(done) = &asked.done {
            let _ = write!(out, "<p class=\"done\" id=\"done\">{}</p>", esc(done));
        }
        out.push_str(
            "<form method=\"get\" action=\"/memories\" id=\"look-up\"><input name=\"scope\" \
             placeholder=\"person:telegram:42 or chat:telegram:-100123\" aria-label=\"scope\" required>\
             <button type=\"submit\">Show their memories</button></form>",
        );
        if let (Some(scope), Some(memories)) = (&scope, &texts) {
            scope_texts(&mut out, scope, memories, csrf);
        }
        out.push_str("</section></main>");
        document("lull — memories", &out)
    })
}

/// A scope's memories, each with its forget button, and the clear button.
fn scope_texts(out: &mut String, scope: &Scope, memories: &[Memory], csrf: &str) {
    let name = esc(&scope_name(scope));
    let _ = write!(
        out,
        "<h2>{name}: {} memor{}</h2><table id=\"memories\"><tr><th>#</th><th>text</th><th>asked by</th><th></th></tr>",
        memories.len(),
        if memories.len() == 1 { "y" } else { "ies" }
    );
    let form = |action: &str, id: Option<i64>, label: &str| {
        format!(
            "<form method=\"post\" action=\"/memories\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
             <input type=\"hidden\" name=\"scope\" value=\"{name}\"><input type=\"hidden\" name=\"action\" value=\"{action}\">{}\
             <button type=\"submit\">{label}</button></form>",
            id.map_or_else(String::new, |id| format!(
                "<input type=\"hidden\" name=\"id\" value=\"{id}\">"
            ))
        )
    };
    for m in memories {
        let _ = write!(
            out,
            "<tr data-memory=\"{id}\"><td>#{id}</td><td>{text}</td><td>{by}</td><td>{forget}</td></tr>",
            id = m.id,
            text = esc(&m.text),
            by = esc(&m.author),
            forget = form("forget", Some(m.id), "Forget")
        );
    }
    out.push_str("</table>");
    if !memories.is_empty() {
        out.push_str(&form("clear", None, "Forget them all"));
    }
}

/// `POST /memories`: forget one memory, or clear a scope.
pub(super) async fn change(
    State(status): State<StatusPage>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (posted, console) = match forms::console_change(&status, &headers, body) {
        Ok(checked) => checked,
        Err(refused) => return *refused,
    };
    let scope_text = posted.field("scope").unwrap_or_default();
    let Some(scope) = scope_of(&scope_text) else {
        return forms::back_to("/memories", "not changed: no such scope");
    };
    let action = posted.field("action").unwrap_or_default();
    let said = match action.as_str() {
        "forget" => match posted.field("id").and_then(|id| id.parse::<i64>().ok()) {
            Some(id) => console.console_forget_memory(&scope, id).await,
            None => Ok("not changed: no memory named".to_owned()),
        },
        "clear" => console.console_clear_memories(&scope).await,
        other => Ok(format!("not changed: unknown action {other:?}")),
    }
    .unwrap_or_else(|e| format!("not changed: {e}"));
    tracing::info!(scope = %scope_text, %action, outcome = %said, "a console change of memories");
    let page = format!(
        "/memories?scope={}",
        url::form_urlencoded::byte_serialize(scope_name(&scope).as_bytes()).collect::<String>()
    );
    forms::back_to(&page, &said)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_read_as_the_page_names_them() {
        let scope = scope_of("chat:telegram:-100:7").unwrap();
        assert_eq!(
            (scope.kind, scope.owner.as_str()),
            (ScopeKind::Chat, "-100:7")
        );
        assert_eq!(scope_name(&scope), "chat:telegram:-100:7");
        assert!(scope_of("person:telegram:").is_none());
        assert!(scope_of("nobody:telegram:1").is_none());
        assert!(scope_of("person:mars:1").is_none());
    }
}
