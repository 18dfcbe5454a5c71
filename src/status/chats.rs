//! The console's chats: `GET /chats` (every chat with its choices and state),
//! `GET /chats/{id}` (one, with its forms), and `POST /chats/{id}` (a change: `action`
//! `model`, `persona` or `prompt` with `value` (empty: back to the default), `new`,
//! `stop`, `allow` or `deny`, and the form's `csrf`), answered by a redirect back to
//! the chat's page saying what was done. Changes go through the chat commands' own
//! store operations ([`Dispatcher::console_setting`] and its siblings): the same
//! fences, seen by every process.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use lull_core::dispatcher::{ConsoleChange, Dispatcher};
use lull_core::domain::{ConversationId, ConversationRef, Platform};
use lull_core::store::{ChatRow, Setting};

use super::forms::{Done, with_token};
use super::page::{document, esc, nav};
use super::{StatusPage, forms, html};

/// The most chats `/chats` lists.
const LIMIT: usize = 500;

/// `GET /chats`.
pub(super) async fn list(State(status): State<StatusPage>, headers: HeaderMap) -> Response {
    let now = status.inner.clock.now();
    let read = status.inner.store.chats(None, LIMIT, now);
    forms::page(&status, &headers, "lull — chats", read, |chats, _| {
        render_list(&chats, &status.inner.timezone, now)
    })
    .await
}

/// `GET /chats/{id}`.
pub(super) async fn detail(
    State(status): State<StatusPage>,
    Path(id): Path<i64>,
    Query(done): Query<Done>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = status.refusal(&headers, false) {
        return refused;
    }
    let chat = match one(&status, id).await {
        Ok(chat) => chat,
        Err(answer) => return answer,
    };
    let offered = Offered::of(status.inner.console.as_deref()).await;
    let now = status.inner.clock.now();
    let done = done.done.as_deref();
    with_token(&headers, |csrf| {
        render_detail(&chat, &offered, csrf, done, &status.inner.timezone, now)
    })
}

/// `POST /chats/{id}`: a change, refused without the session (off loopback) or with
/// a form token that is not the browser's (403); redirected back to the chat's page.
pub(super) async fn change(
    State(status): State<StatusPage>,
    Path(id): Path<i64>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (posted, console) = match forms::console_change(&status, &headers, body) {
        Ok(checked) => checked,
        Err(refused) => return *refused,
    };
    let field = |name: &str| posted.field(name);
    let chat = match one(&status, id).await {
        Ok(chat) => chat,
        Err(answer) => return answer,
    };
    let action = field("action").unwrap_or_default();
    let value = field("value").unwrap_or_default();
    let said = match apply(&console, &chat, &action, value.trim()).await {
        Ok(said) => said,
        Err(e) => format!("not saved: {e}"),
    };
    tracing::info!(chat = id, %action, outcome = %said, "a console change");
    forms::back_to(&format!("/chats/{id}"), &said)
}

/// Do `action` on `chat`; what the page then says.
async fn apply(
    console: &Arc<Dispatcher>,
    chat: &ChatRow,
    action: &str,
    value: &str,
) -> Result<String, lull_core::store::StoreError> {
    let Ok(platform) = chat.platform.parse::<Platform>() else {
        return Ok(format!("not saved: unknown platform {}", chat.platform));
    };
    let conversation = ConversationRef::new(platform, chat.key.clone());
    let value_or_default = (!value.is_empty()).then_some(value);
    // What was done, and what the page says when it was already so.
    let (done, what, same) = match action {
        "model" | "persona" | "prompt" => {
            apply_setting(console, chat, &conversation, action, value_or_default).await?
        }
        "new" => (
            console.console_new(&conversation, chat.is_group).await?,
            "the conversation starts afresh".to_owned(),
            String::new(),
        ),
        "stop" => return console.console_stop(&conversation, chat.is_group).await,
        "allow" | "deny" => {
            let allowed = action == "allow";
            (
                console.console_access(&conversation, allowed).await?,
                format!(
                    "everyone in this chat is {}",
                    if allowed { "allowed" } else { "denied" }
                ),
                String::new(),
            )
        }
        other => return Ok(format!("not saved: unknown action {other:?}")),
    };
    Ok(match done {
        ConsoleChange::Done { changed: true } => format!("saved: {what}"),
        ConsoleChange::Done { changed: false } => format!("nothing to change: {same}"),
        ConsoleChange::Refused(why) => format!("not saved: {why}"),
    })
}

/// Set the chat's `action` (`model`, `persona`, `prompt`) to `value` (`None`: the
/// default): what was done, and what the page says when it was already so.
async fn apply_setting(
    console: &Dispatcher,
    chat: &ChatRow,
    conversation: &ConversationRef,
    action: &str,
    value: Option<&str>,
) -> Result<(ConsoleChange, String, String), lull_core::store::StoreError> {
    let setting = match action {
        "model" => Setting::Model,
        "persona" => Setting::Persona,
        _ => Setting::Prompt,
    };
    let done = console
        .console_setting(conversation, chat.is_group, setting, value)
        .await?;
    let (what, same) = match value {
        Some(_) if action == "prompt" => (
            "the chat has its own prompt".to_owned(),
            "the chat had that prompt already".to_owned(),
        ),
        Some(v) => (
            format!("{action} is now {v}"),
            format!("{action} was {v} already"),
        ),
        None => (
            format!("{action} is back to the default"),
            format!("{action} was the default already"),
        ),
    };
    Ok((done, what, same))
}

/// The chat `id`; `Err`: the page saying there is none (404), or that the database
/// did not answer (503).
async fn one(status: &StatusPage, id: i64) -> Result<ChatRow, Response> {
    let now = status.inner.clock.now();
    match status
        .inner
        .store
        .chats(Some(ConversationId(id)), 1, now)
        .await
    {
        Ok(mut rows) => rows.pop().ok_or_else(|| not_found(id)),
        Err(e) => Err(forms::unavailable("lull — chat", &e)),
    }
}

fn not_found(id: i64) -> Response {
    html(
        StatusCode::NOT_FOUND,
        document(
            "lull — no such chat",
            &format!("<main><p>No chat #{id}. <a href=\"/chats\">All chats</a></p></main>"),
        ),
    )
}

/// What the chat's forms offer: the models (or why there are none), the default, the
/// personas; nothing without a dispatcher (no changes here).
struct Offered {
    models: Result<Vec<String>, String>,
    default_model: String,
    personas: Vec<String>,
    changes: bool,
}

impl Offered {
    async fn of(console: Option<&Dispatcher>) -> Offered {
        match console {
            Some(d) => Offered {
                models: d.console_models().await,
                default_model: d.console_default_model().to_owned(),
                personas: d.console_personas(),
                changes: true,
            },
            None => Offered {
                models: Ok(Vec::new()),
                default_model: String::new(),
                personas: Vec::new(),
                changes: false,
            },
        }
    }
}

/// A chat's state in words.
fn state(chat: &ChatRow) -> &'static str {
    match (chat.answering, chat.waiting) {
        (true, _) => "answering",
        (false, true) => "waiting",
        (false, false) => "settled",
    }
}

fn shown_at(
    at: Option<i64>,
    tz: &lull_core::limits::TimeZone,
    now: lull_core::domain::Timestamp,
) -> String {
    at.map_or_else(
        || "—".to_owned(),
        |at| tz.show(lull_core::domain::Timestamp(at), now),
    )
}

fn render_list(
    chats: &[ChatRow],
    tz: &lull_core::limits::TimeZone,
    now: lull_core::domain::Timestamp,
) -> String {
    let mut out = format!(
        "<header><h1>lull chats</h1><p>{} chat(s), the most recent first</p>{}</header><main><section class=\"wide\">\
         <table id=\"chats\"><tr><th>chat</th><th>name</th><th>platform</th><th>id</th><th>kind</th><th>model</th><th>persona</th>\
         <th>prompt</th><th>last message</th><th>state</th></tr>",
        chats.len(),
        nav("/chats")
    );
    for c in chats {
        let _ = write!(
            out,
            "<tr data-chat=\"{id}\" data-state=\"{st}\" data-model=\"{m}\"><td><a href=\"/chats/{id}\">#{id}</a></td><td class=\"title\">{t}</td><td>{p}</td>\
             <td><code>{k}</code></td><td>{kind}</td><td>{m_shown}</td><td>{pe}</td><td>{pr}</td><td>{at}</td><td>{st}</td></tr>",
            id = c.id,
            t = esc(c.title.as_deref().unwrap_or("—")),
            st = state(c),
            m = esc(c.model.as_deref().unwrap_or("")),
            p = esc(&c.platform),
            k = esc(&c.key),
            kind = if c.is_group { "group" } else { "private" },
            m_shown = esc(c.model.as_deref().unwrap_or("default")),
            pe = esc(c.persona.as_deref().unwrap_or("default")),
            pr = if c.prompt.is_some() { "own" } else { "default" },
            at = esc(&shown_at(c.last_message_at, tz, now)),
        );
    }
    out.push_str("</table></section></main>");
    document("lull — chats", &out)
}

/// A form posting `action` (and the form token) to the chat's page, with `fields`
/// and a button `label`.
fn form(id: i64, csrf: &str, action: &str, fields: &str, label: &str) -> String {
    format!(
        "<form method=\"post\" action=\"/chats/{id}\" id=\"form-{action}\">\
         <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
         <input type=\"hidden\" name=\"action\" value=\"{action}\">{fields}\
         <button type=\"submit\">{label}</button></form>"
    )
}

/// The forms of a chat's model and persona, each with what is in force now.
fn choice_forms(out: &mut String, c: &ChatRow, offered: &Offered, csrf: &str) {
    let _ = write!(
        out,
        "<h2>Model</h2><p>Now: <span id=\"model\">{}</span></p>",
        esc(c.model.as_deref().unwrap_or("default"))
    );
    match &offered.models {
        Ok(models) => {
            let mut options = vec![(
                String::new(),
                format!("default ({})", offered.default_model),
            )];
            options.extend(models.iter().map(|m| (m.clone(), m.clone())));
            out.push_str(&form(
                c.id,
                csrf,
                "model",
                &select(&options, c.model.as_deref().unwrap_or("")),
                "Set the model",
            ));
        }
        Err(why) => {
            let _ = write!(out, "<p class=\"bad\">No model list: {}</p>", esc(why));
        }
    }
    let _ = write!(
        out,
        "<h2>Persona</h2><p>Now: <span id=\"persona\">{}</span></p>",
        esc(c.persona.as_deref().unwrap_or("default"))
    );
    let mut personas = vec![(String::new(), "default".to_owned())];
    personas.extend(offered.personas.iter().map(|p| (p.clone(), p.clone())));
    out.push_str(&form(
        c.id,
        csrf,
        "persona",
        &select(&personas, c.persona.as_deref().unwrap_or("")),
        "Set the persona",
    ));
}

/// A select named `value` of `options` (value, label), `chosen` selected.
fn select(options: &[(String, String)], chosen: &str) -> String {
    let mut out = String::from("<select name=\"value\">");
    for (value, label) in options {
        let selected = if value == chosen { " selected" } else { "" };
        let _ = write!(
            out,
            "<option value=\"{}\"{selected}>{}</option>",
            esc(value),
            esc(label)
        );
    }
    out.push_str("</select>");
    out
}

fn render_detail(
    c: &ChatRow,
    offered: &Offered,
    csrf: &str,
    done: Option<&str>,
    tz: &lull_core::limits::TimeZone,
    now: lull_core::domain::Timestamp,
) -> String {
    let done = done
        .map(|d| format!("<p class=\"done\" id=\"done\">{}</p>", esc(d)))
        .unwrap_or_default();
    let mut out = format!(
        "<header><h1>chat #{id}{t}</h1><p>{p} <code>{k}</code> · {kind} · last message {at} · \
         <span id=\"state\">{st}</span> · <a href=\"/memories?scope={mem}\">its memories</a></p>{nav}</header><main><section class=\"wide\">{done}",
        id = c.id,
        t = c
            .title
            .as_deref()
            .map(|t| format!(": <span id=\"title\">{}</span>", esc(t)))
            .unwrap_or_default(),
        p = esc(&c.platform),
        k = esc(&c.key),
        kind = if c.is_group { "group" } else { "private chat" },
        at = esc(&shown_at(c.last_message_at, tz, now)),
        st = state(c),
        nav = nav("/chats"),
        mem = url::form_urlencoded::byte_serialize(
            format!("chat:{}:{}", c.platform, c.key).as_bytes()
        )
        .collect::<String>(),
    );
    if !offered.changes {
        out.push_str(
            "<p class=\"muted\">Changes are not available in this process.</p></section></main>",
        );
        return document(&format!("lull — chat #{}", c.id), &out);
    }
    choice_forms(&mut out, c, offered, csrf);
    out.push_str("<h2>Prompt</h2><p>This chat's own system prompt; empty: the default.</p>");
    let prompt = format!(
        "<textarea name=\"value\" aria-label=\"prompt\">{}</textarea>",
        esc(c.prompt.as_deref().unwrap_or(""))
    );
    out.push_str(&form(c.id, csrf, "prompt", &prompt, "Set the prompt"));
    out.push_str("<h2>Conversation</h2><div class=\"tiles\">");
    out.push_str(&form(c.id, csrf, "new", "", "Start afresh (/new)"));
    out.push_str(&form(c.id, csrf, "stop", "", "Stop (/stop)"));
    out.push_str("</div><h2>Access</h2><div class=\"tiles\">");
    out.push_str(&form(c.id, csrf, "allow", "", "Allow everyone here"));
    out.push_str(&form(c.id, csrf, "deny", "", "Deny everyone here"));
    out.push_str("</div></section></main>");
    document(&format!("lull — chat #{}", c.id), &out)
}
