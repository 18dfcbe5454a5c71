//! The model's memory tools: `lull__remember {text, scope?}` and `lull__forget {id}`.
//! Neither writes: each stages its change in the round ([`Staging`]), and the commit
//! stage writes what was staged in the reply's final-check transaction
//! ([`Effect::WithReply`]). So they run freely, like reads, and a round that does not
//! commit — stale, stopped, overtaken, its lease lost — leaves no trace; the round that
//! finally answers asks again and decides again.
//!
//! Who may write where: in a private chat, the person's own scope; in a group, the
//! chat's scope only when everyone who wrote in the batch is an admin (others are told
//! why), and a person's scope only when one person wrote the batch.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::{Map, Value, json};

use super::texts;
use crate::store::{
    MEMORIES_PER_SCOPE, MEMORY_MAX_CHARS, Memory, MemoryChange, MemoryWrites, Remember, Scope,
    ScopeKind,
};
use crate::tools::beside::{Beside, OwnTools};
use crate::tools::{CallOutcome, Effect, ToolOutput, ToolSpec, Toolbox, Users};

const REMEMBER: &str = "lull__remember";
const FORGET: &str = "lull__forget";
/// The most facts one reply may remember: a model calling remember in a loop fills
/// no scope.
pub(crate) const REMEMBER_PER_REPLY: usize = 20;

/// What a round's memory tools know of its batch, and what they staged.
pub(crate) struct Staging {
    /// The scope the prompt showed (the person's in a private chat, the chat's in a
    /// group), and its memories as read: what `lull__forget` may name.
    shown: Scope,
    seen: Vec<Memory>,
    /// Where the batch may write, and who asks.
    rights: Rights,
    changes: Mutex<Vec<MemoryChange>>,
}

/// Where a batch's memory tools may write ([`Staging::new`]).
pub(crate) struct Rights {
    pub(crate) is_group: bool,
    /// Everyone who wrote in the batch is an admin.
    pub(crate) all_admins: bool,
    /// The one person who wrote the batch, if one did.
    pub(crate) only_person: Option<Scope>,
    pub(crate) chat: Scope,
    /// Who asks (the batch's newest author) and the message it came from (its
    /// platform id, and its row: what a later clear fences out).
    pub(crate) author: String,
    pub(crate) source: Option<String>,
    pub(crate) newest_message: i64,
}

impl Staging {
    /// Staging for a round that showed `seen` of `shown`.
    pub(crate) fn new(shown: Scope, seen: Vec<Memory>, rights: Rights) -> Staging {
        Staging {
            shown,
            seen,
            rights,
            changes: Mutex::new(Vec::new()),
        }
    }

    /// What the commit writes (the memories read go with it only for the
    /// counter-test's switch, which writes them back).
    pub(crate) fn writes(&self) -> MemoryWrites {
        let changes = self.lock().clone();
        let seen = if crate::switches::memory_write_back() && !changes.is_empty() {
            self.seen.clone()
        } else {
            Vec::new()
        };
        MemoryWrites {
            changes,
            newest_message: self.rights.newest_message,
            seen,
        }
    }

    /// Forget what earlier attempts staged: a generation asked again (without images)
    /// decides again.
    pub(crate) fn reset(&self) {
        self.lock().clear();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<MemoryChange>> {
        self.changes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `lull__remember`: the answer the model reads.
    fn remember(&self, arguments: &Map<String, Value>) -> ToolOutput {
        let text = arguments
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or("")
            .trim();
        if text.is_empty() {
            return refused(texts::EMPTY);
        }
        let chars = lull_port::split::char_len(text);
        if chars > MEMORY_MAX_CHARS {
            return refused(&texts::too_long(chars));
        }
        let scope = match self.scope(arguments.get("scope").and_then(Value::as_str)) {
            Ok(scope) => scope,
            Err(why) => return refused(why),
        };
        if let Some(known) = self
            .seen
            .iter()
            .find(|m| m.scope == scope && m.text == text)
        {
            return done(texts::already_remembered(known));
        }
        let mut changes = self.lock();
        let staged: Vec<&Remember> = changes
            .iter()
            .filter_map(|c| match c {
                MemoryChange::Remember(fact) => Some(fact),
                MemoryChange::Forget { .. } => None,
            })
            .collect();
        if staged.iter().any(|f| f.scope == scope && f.text == text) {
            return done(texts::ALREADY_STAGED.to_owned());
        }
        if staged.len() >= REMEMBER_PER_REPLY {
            return refused(&texts::too_many(REMEMBER_PER_REPLY));
        }
        let held = self.seen.iter().filter(|m| m.scope == scope).count()
            + staged.iter().filter(|f| f.scope == scope).count();
        changes.push(MemoryChange::Remember(Remember {
            scope: scope.clone(),
            text: text.to_owned(),
            author: self.rights.author.clone(),
            source: self.rights.source.clone(),
        }));
        done(texts::will_remember(
            scope.kind,
            text,
            held >= MEMORIES_PER_SCOPE,
        ))
    }

    /// Where `asked` ("person", "chat" or nothing) stores, or why it may not.
    fn scope(&self, asked: Option<&str>) -> Result<Scope, &'static str> {
        let kind = match asked.map(str::trim) {
            None | Some("") => None,
            Some(asked) => Some(ScopeKind::parse(asked).ok_or(texts::BAD_SCOPE)?),
        };
        if !self.rights.is_group {
            // A private chat's only scope is its person's.
            return Ok(self.shown.clone());
        }
        match kind.unwrap_or(ScopeKind::Chat) {
            ScopeKind::Chat if self.rights.all_admins => Ok(self.rights.chat.clone()),
            ScopeKind::Chat => Err(texts::CHAT_ADMINS_ONLY),
            ScopeKind::Person => self.rights.only_person.clone().ok_or(texts::PERSON_UNCLEAR),
        }
    }

    /// `lull__forget`: only a memory the prompt showed, and in a group only where the
    /// batch may write.
    fn forget(&self, arguments: &Map<String, Value>) -> ToolOutput {
        let Some(id) = arguments.get("id").and_then(id_of) else {
            return refused(texts::NEED_ID);
        };
        let Some(memory) = self.seen.iter().find(|m| m.id == id) else {
            return refused(&texts::no_such_memory(id));
        };
        if self.rights.is_group && !self.rights.all_admins {
            return refused(texts::CHAT_ADMINS_ONLY);
        }
        let mut changes = self.lock();
        let forget = MemoryChange::Forget {
            scope: memory.scope.clone(),
            id,
        };
        if !changes.contains(&forget) {
            changes.push(forget);
        }
        done(texts::will_forget(memory))
    }
}

/// An id as the model writes it: a number, or a string such as "12" or "#12".
fn id_of(value: &Value) -> Option<i64> {
    value.as_i64().or_else(|| {
        value
            .as_str()
            .and_then(|s| s.trim().trim_start_matches('#').parse().ok())
    })
}

/// The memory tools of one round, as lull's own.
pub(crate) struct MemoryTools {
    staging: Arc<Staging>,
}

impl MemoryTools {
    /// `inner` (the MCP servers', the job and web tools, if any) with the memory tools
    /// of the round that staged into `staging`.
    pub(crate) fn over(inner: Option<Arc<dyn Toolbox>>, staging: Arc<Staging>) -> Arc<dyn Toolbox> {
        Beside::over(MemoryTools { staging }, inner)
    }

    fn spec(name: &str, description: &str, parameters: Value) -> ToolSpec {
        // Everyone may ask; where it is stored is checked by the call.
        ToolSpec::own(
            name,
            description,
            parameters,
            Effect::WithReply,
            Users::Allowed,
        )
    }
}

#[async_trait]
impl OwnTools for MemoryTools {
    fn specs(&self) -> Vec<ToolSpec> {
        memory_specs()
    }

    fn owns(&self, name: &str) -> bool {
        name == REMEMBER || name == FORGET
    }

    async fn call_own(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        _key: Option<&str>,
    ) -> ToolOutput {
        if name == REMEMBER {
            self.staging.remember(&arguments)
        } else {
            self.staging.forget(&arguments)
        }
    }
}

/// The memory tools, as every round with memory on offers them.
pub(crate) fn memory_specs() -> Vec<ToolSpec> {
    vec![
        MemoryTools::spec(
            REMEMBER,
            texts::REMEMBER_DESCRIPTION,
            json!({
                "type": "object",
                "properties": {
                    "text": {"type": "string", "description": "The fact, in a short sentence (at most 500 characters)"},
                    "scope": {"type": "string", "enum": ["person", "chat"]}
                },
                "required": ["text"]
            }),
        ),
        MemoryTools::spec(
            FORGET,
            texts::FORGET_DESCRIPTION,
            json!({
                "type": "object",
                "properties": {"id": {"type": "integer"}},
                "required": ["id"]
            }),
        ),
    ]
}

fn done(text: String) -> ToolOutput {
    ToolOutput::ok(text)
}

/// Nothing staged: the model is told why.
fn refused(text: &str) -> ToolOutput {
    ToolOutput::error(text.to_owned(), CallOutcome::Error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ConversationRef, Platform, Timestamp};

    fn staging(is_group: bool, all_admins: bool, seen: Vec<Memory>) -> Staging {
        let chat = Scope::chat(&ConversationRef::new(Platform::Telegram, "-5"));
        let person = Scope::person(Platform::Telegram, "42");
        let shown = if is_group {
            chat.clone()
        } else {
            person.clone()
        };
        Staging::new(
            shown,
            seen,
            Rights {
                is_group,
                all_admins,
                only_person: Some(person),
                chat,
                author: "42".into(),
                source: Some("m1".into()),
                newest_message: 1,
            },
        )
    }

    fn args(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    #[test]
    fn bad_input_is_refused_and_stages_nothing() {
        let s = staging(false, false, Vec::new());
        assert!(s.remember(&args(json!({"text": "  "}))).is_error);
        assert!(
            s.remember(&args(json!({"text": "x".repeat(100_000)})))
                .is_error
        );
        assert!(
            s.remember(&args(json!({"text": "a", "scope": "world"})))
                .is_error
        );
        assert!(s.forget(&args(json!({"id": 9}))).is_error, "not a shown id");
        assert!(s.writes().changes.is_empty());
    }

    #[test]
    fn one_reply_remembers_at_most_its_share_and_each_fact_once() {
        let s = staging(false, false, Vec::new());
        for n in 0..50 {
            let out = s.remember(&args(json!({"text": format!("fact {n}")})));
            assert_eq!(out.is_error, n >= REMEMBER_PER_REPLY, "{n}: {}", out.text);
        }
        assert!(!s.remember(&args(json!({"text": "fact 0"}))).is_error);
        assert_eq!(s.writes().changes.len(), REMEMBER_PER_REPLY);
        s.reset();
        assert!(s.writes().changes.is_empty());
    }

    #[test]
    fn in_a_group_only_admins_write_the_chat() {
        let member = staging(true, false, Vec::new());
        let out = member.remember(&args(json!({"text": "standup at 9"})));
        assert!(out.is_error && out.text.contains("admins"), "{}", out.text);
        let own = member.remember(&args(json!({"text": "I am vegan", "scope": "person"})));
        assert!(!own.is_error, "{}", own.text);
        let admin = staging(true, true, Vec::new());
        assert!(
            !admin
                .remember(&args(json!({"text": "standup at 9"})))
                .is_error
        );
        let MemoryChange::Remember(fact) = &admin.writes().changes[0] else {
            panic!()
        };
        assert_eq!(fact.scope.kind, ScopeKind::Chat);
    }

    #[test]
    fn forgetting_names_a_shown_memory_of_its_scope() {
        let seen = vec![Memory {
            id: 7,
            scope: Scope::person(Platform::Telegram, "42"),
            text: "likes tea".into(),
            author: "42".into(),
            source: None,
            created_at: Timestamp(0),
            version: 1,
        }];
        let s = staging(false, false, seen);
        assert!(!s.forget(&args(json!({"id": "#7"}))).is_error);
        assert!(!s.forget(&args(json!({"id": 7}))).is_error);
        assert_eq!(s.writes().changes.len(), 1, "staged once");
        assert!(
            s.remember(&args(json!({"text": "likes tea"})))
                .text
                .contains("#7")
        );
    }
}
