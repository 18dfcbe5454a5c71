//! What both backends decide the same way once their rows are read: which due
//! conversations are ready and when to look again, how history rows group into
//! exchanges, what an access-decision row means. Written once, so the backends differ only in their SQL.

use lull_port::{Media, MediaKind};

use super::{AccessRule, Exchange, ScopeCharge, StoreError, Subject};
use crate::access::SubjectKind;
use crate::domain::{ConversationId, Said, Timestamp};

/// Sorting `due_work` candidates (one per conversation with work due by `now`) into
/// conversations ready now and the earliest future moment something becomes due.
#[derive(Debug)]
pub(crate) struct DueScan {
    now: i64,
    ready: Vec<(i64, ConversationId)>,
    next_at: Option<i64>,
}

impl DueScan {
    pub(crate) fn new(now: i64) -> Self {
        Self {
            now,
            ready: Vec::new(),
            next_at: None,
        }
    }

    /// A conversation whose work is due here at `at`, under the lease row it joined
    /// (`held`: the row names a holder; `expires_at`: its expiry).
    pub(crate) fn candidate(
        &mut self,
        conversation: ConversationId,
        at: i64,
        held: bool,
        expires_at: Option<i64>,
    ) {
        // Exclusive: a conversation under a live lease is left to its holder until the
        // lease expires (or is released).
        let leased_until = expires_at.filter(|e| held && *e > self.now);
        match leased_until {
            _ if at > self.now => self.sooner(at.max(leased_until.unwrap_or(at))),
            Some(expiry) => self.sooner(expiry),
            None => self.ready.push((at, conversation)),
        }
    }

    /// Something else becomes due at `at`.
    pub(crate) fn sooner(&mut self, at: i64) {
        self.next_at = Some(self.next_at.map_or(at, |n| n.min(at)));
    }

    /// At most `limit` ready conversations, the longest due first, and the next
    /// deadline.
    pub(crate) fn finish(mut self, limit: usize) -> (Vec<ConversationId>, Option<i64>) {
        self.ready.sort();
        let ready = self.ready.into_iter().take(limit).map(|(_, c)| c).collect();
        (ready, self.next_at)
    }
}

/// History rows (reply id, reply text, author, message text), ordered by reply and
/// message, as exchanges: the messages each reply covered, then the reply.
pub(crate) fn exchanges(rows: impl IntoIterator<Item = (i64, String, Said)>) -> Vec<Exchange> {
    let mut history: Vec<(i64, Exchange)> = Vec::new();
    for (id, reply, said) in rows {
        match history.last_mut() {
            Some((last, exchange)) if *last == id => exchange.user.push(said),
            _ => history.push((
                id,
                Exchange {
                    user: vec![said],
                    reply,
                },
            )),
        }
    }
    history.into_iter().map(|(_, exchange)| exchange).collect()
}

/// An access decision from its stored columns (platform, kind, subject, allowed,
/// set by, set at).
pub(crate) fn access_rule(
    platform: &str,
    kind: &str,
    id: String,
    allowed: bool,
    set_by: String,
    set_at: i64,
) -> Result<AccessRule, StoreError> {
    let kind = match kind {
        "user" => SubjectKind::User,
        "chat" => SubjectKind::Chat,
        other => return Err(StoreError::Corrupt(format!("access kind '{other}'"))),
    };
    Ok(AccessRule {
        subject: Subject {
            platform: platform.parse().map_err(StoreError::Corrupt)?,
            kind,
            id,
        },
        allowed,
        set_by,
        set_at: Timestamp(set_at),
    })
}

/// A charge's scopes in the one order every charge takes its budget rows in (by
/// scope name), each scope once (a scope named twice is charged the sum, against the
/// smaller limit): two charges naming the same scopes in different orders queue on
/// the first row they share instead of deadlocking.
pub(crate) fn sorted_scopes(scopes: &[ScopeCharge]) -> Vec<ScopeCharge> {
    let mut sorted: Vec<ScopeCharge> = Vec::with_capacity(scopes.len());
    let mut scopes = scopes.to_vec();
    scopes.sort_by(|a, b| a.scope.cmp(&b.scope));
    for scope in scopes {
        match sorted.last_mut() {
            Some(last) if last.scope == scope.scope => {
                last.tokens += scope.tokens;
                last.limit = match (last.limit, scope.limit) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            _ => sorted.push(scope),
        }
    }
    sorted
}

/// A message's text as prompts and history show it: `[voice message]: <transcript>`
/// once transcribed, else the stored text.
pub fn said_text(text: &str, transcript: Option<&str>) -> String {
    match transcript {
        Some(transcript) => format!("{text}: {transcript}"),
        None => text.to_owned(),
    }
}

/// Media references as every backend stores them: one nullable text column holding a
/// JSON array (`NULL` for a message without media), so the schema change is one column
/// in any backend.
pub fn encode_media(media: &[Media]) -> Option<String> {
    if media.is_empty() {
        return None;
    }
    let items: Vec<serde_json::Value> = media
        .iter()
        .map(|m| {
            serde_json::json!({
                "kind": m.kind.as_str(),
                "ref": m.reference,
                "size": m.size,
                "mime": m.mime,
                "secs": m.duration_secs,
            })
        })
        .collect();
    Some(serde_json::Value::Array(items).to_string())
}

/// The media references [`encode_media`] stored.
pub fn decode_media(stored: Option<&str>) -> Result<Vec<Media>, StoreError> {
    let Some(stored) = stored else {
        return Ok(Vec::new());
    };
    let corrupt = |why: &str| StoreError::Corrupt(format!("media of a message: {why}"));
    let items: Vec<serde_json::Value> =
        serde_json::from_str(stored).map_err(|e| corrupt(&e.to_string()))?;
    items
        .iter()
        .map(|item| {
            let kind = item["kind"]
                .as_str()
                .and_then(MediaKind::parse)
                .ok_or_else(|| corrupt("unknown kind"))?;
            let reference = item["ref"]
                .as_str()
                .ok_or_else(|| corrupt("no reference"))?
                .to_owned();
            Ok(Media {
                kind,
                reference,
                size: item["size"].as_u64(),
                mime: item["mime"].as_str().map(str::to_owned),
                duration_secs: item["secs"].as_u64().map(|s| s as u32),
            })
        })
        .collect()
}
