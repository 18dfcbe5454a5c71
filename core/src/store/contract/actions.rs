//! The actions area of the contract: the journal of tool calls that act (DESIGN.md,
//! "Actions: act once").
//!
//! A call that is not read-only is **reserved before it runs**, in one transaction
//! under the conversation's lease, fenced by its token, and only while the
//! conversation is still at the round's `v0` (the final check, moved in front of the
//! side effect). Its row is keyed by an [`ActionKey`] (the conversation, the batch it
//! serves, the tool and its canonical arguments): a later round of the same batch
//! (after a stale drop, a lost lease, a crash, on any replica) that asks for the same
//! call reads the row instead of running the call again.
//!
//! States, and the only moves between them:
//! - `reserved` → `done` ([`ActionStore::finish_action`], by the reserving token), or
//!   `unknown` when the call failed after its request was written;
//! - `reserved` → `unknown` (its reservation expired without a result, found by a
//!   later round; a tool declared idempotent is reserved again instead);
//! - `awaiting` → `reserved` (the person's `/approve`, taken with the reservation in one
//!   fenced write: [`NewAction::approved`]) | `refused` ([`ActionStore::decide_action`]:
//!   `/cancel`; `awaiting` past its expiry → `refused` when found);
//! - `approved` (rows of earlier versions, decided apart from their reservation) →
//!   `reserved` while its question is open, `refused` by a `/cancel` or once expired.
//!
//! `done`, `unknown` and `refused` are facts: nothing moves them again, except that a
//! late result of the reserving token turns `unknown` into `done` (the call did run).

use async_trait::async_trait;

use crate::domain::{ConversationId, ConversationRef, Lease, LeaseToken, Timestamp, Version};
use crate::store::{ConversationAt, StoreError};

/// The idempotency key of an action: a hash of the conversation, the batch it
/// serves, the tool and its canonical arguments ([`ActionKey::of`]). Passed to the
/// tool's server in the request's `_meta`, so servers that deduplicate can.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActionKey(pub String);

impl ActionKey {
    /// The key of calling `tool` with `arguments` (canonical JSON: see
    /// [`canonical_json`]) for the batch that starts at message row `batch` of
    /// `conversation`.
    pub fn of(conversation: ConversationId, batch: i64, tool: &str, arguments: &str) -> Self {
        use sha2::Digest as _;
        let mut hash = sha2::Sha256::new();
        for part in [
            conversation.0.to_string().as_str(),
            batch.to_string().as_str(),
            tool,
            arguments,
        ] {
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part.as_bytes());
        }
        ActionKey(format!("act_{}", hex_of(&hash.finalize()[..16])))
    }
}

impl ActionKey {
    /// The key as a tool server sees it (`_meta.idempotencyKey`): this key salted with
    /// the database's own salt ([`ActionStore::idempotency_salt`]), so two deployments
    /// sharing a server, or a restored backup and its original, never send the same key
    /// for different calls. The journal keeps the unsalted key.
    pub fn for_server(&self, salt: &str) -> String {
        use sha2::Digest as _;
        let mut hash = sha2::Sha256::new();
        for part in [salt, self.0.as_str()] {
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part.as_bytes());
        }
        format!("act_{}", hex_of(&hash.finalize()[..16]))
    }
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The canonical text of a JSON value: object keys sorted, no insignificant spaces,
/// so the same arguments always give the same [`ActionKey`].
pub fn canonical_json(value: &serde_json::Value) -> String {
    fn sorted(value: &serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => {
                let mut keys: Vec<_> = map.keys().collect();
                keys.sort();
                let mut out = serde_json::Map::new();
                for key in keys {
                    out.insert(key.clone(), sorted(&map[key]));
                }
                serde_json::Value::Object(out)
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.iter().map(sorted).collect())
            }
            other => other.clone(),
        }
    }
    // serde_json keeps insertion order only with `preserve_order`; without it maps
    // are sorted already. Sorting here makes it independent of that feature.
    sorted(value).to_string()
}

/// Where an action stands. The only moves: `reserved` → `done`
/// ([`ActionStore::finish_action`]) or `unknown` (abandoned, found by a later round);
/// `awaiting` → `approved` | `refused` ([`ActionStore::decide_action`], or `refused`
/// when found expired); `approved` → `reserved` ([`ActionStore::reserve_action`]);
/// `unknown` → `done` (a late result of the reserving token). Nothing else moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionState {
    /// Reserved by a round's lease; the call may be running.
    Reserved,
    /// Ran; its result is stored.
    Done,
    /// Its reservation expired without a result: it may or may not have happened.
    Unknown,
    /// A destructive call waiting for the person's yes.
    Awaiting,
    /// The person said yes, decided apart from the reservation (earlier versions);
    /// reserved while its question is open, refused after, or by a `/cancel`.
    Approved,
    /// Said no, or the question expired: never run.
    Refused,
}

impl ActionState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            ActionState::Reserved => "reserved",
            ActionState::Done => "done",
            ActionState::Unknown => "unknown",
            ActionState::Awaiting => "awaiting",
            ActionState::Approved => "approved",
            ActionState::Refused => "refused",
        }
    }

    /// The state of a stored name.
    pub fn parse(name: &str) -> Result<Self, StoreError> {
        Ok(match name {
            "reserved" => ActionState::Reserved,
            "done" => ActionState::Done,
            "unknown" => ActionState::Unknown,
            "awaiting" => ActionState::Awaiting,
            "approved" => ActionState::Approved,
            "refused" => ActionState::Refused,
            other => {
                return Err(StoreError::Corrupt(format!(
                    "unknown action state {other:?}"
                )));
            }
        })
    }
}

/// One row of the journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionRow {
    pub id: i64,
    pub key: ActionKey,
    pub conversation_id: ConversationId,
    /// The first pending message row of the batch the call serves (a batch keeps its
    /// first row until a reply covers it, however many messages join it).
    pub batch: i64,
    /// The tool as the model names it (`SERVER__TOOL`).
    pub tool: String,
    /// Canonical JSON ([`canonical_json`]).
    pub arguments: String,
    pub state: ActionState,
    /// The tool's result text, once done.
    pub result: Option<String>,
    /// The result is the tool's report of a failure (MCP `isError`).
    pub is_error: bool,
    /// The lease token of the round that reserved it last (0 before any reservation:
    /// an approval not yet run).
    pub token: LeaseToken,
    /// For a reservation: when, without a result, it counts as abandoned. For an
    /// approval: when the question expires. On the caller's timeline.
    pub expires_at: Timestamp,
    /// The users whose messages led to the call (who may approve it, besides admins),
    /// as [`Askers::stored`] writes them; read them with [`ActionRow::askers`].
    pub requested_by: Option<String>,
    pub created_at: Timestamp,
}

/// An approval still open, with the chat it was asked in: what the console's approvals
/// page lists and answers ([`ActionStore::waiting_approvals`]).
#[derive(Debug, Clone)]
pub struct WaitingApproval {
    pub action: ActionRow,
    pub conversation: ConversationRef,
    pub is_group: bool,
    /// The answer the console stored in the chat for it ([`console_answer_id`]), not
    /// yet decided by a round: `Some(true)` approve, `Some(false)` cancel (which wins,
    /// as in a round, when both were sent).
    pub console_answer: Option<bool>,
}

/// The message id of the console's answer to approval `id` in its chat: one per
/// approval and answer, so the same answer sent again is a redelivery, stored once.
pub fn console_answer_id(id: i64, approve: bool) -> String {
    let word = if approve { "approve" } else { "cancel" };
    format!("console:{word}:{id}")
}

/// The answer a [`console_answer_id`] names (`None`: not one).
pub fn console_answer_of(message_id: &str) -> Option<bool> {
    match message_id.split(':').nth(1)? {
        "approve" => Some(true),
        "cancel" => Some(false),
        _ => None,
    }
}

impl ActionRow {
    /// The users who may answer this action's approval besides admins: every author of
    /// the messages the call answered.
    pub fn askers(&self) -> Askers {
        Askers::parse(self.requested_by.as_deref())
    }
}

/// The authors of the messages a call answers: in a group, everyone whose message was
/// in the batch asked for it, not only the last one to write (who may be someone
/// chatting 0.2 s after the request).
///
/// Stored in one text column: a single id as itself (as rows before several askers
/// were kept), several (or one that starts with `[`) as a JSON array, so no single id
/// can read as a list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Askers(pub Vec<String>);

impl Askers {
    /// The distinct ids of `authors`, in order of first appearance.
    pub fn of<'a>(authors: impl IntoIterator<Item = &'a str>) -> Askers {
        let mut ids: Vec<String> = Vec::new();
        for id in authors {
            if !ids.iter().any(|known| known == id) {
                ids.push(id.to_owned());
            }
        }
        Askers(ids)
    }

    /// The column's text (`None`: nobody).
    pub fn stored(&self) -> Option<String> {
        match self.0.as_slice() {
            [] => None,
            [one] if !one.starts_with('[') => Some(one.clone()),
            many => Some(serde_json::Value::from(many.to_vec()).to_string()),
        }
    }

    /// The askers a stored column names.
    pub fn parse(stored: Option<&str>) -> Askers {
        let Some(text) = stored else {
            return Askers::default();
        };
        if text.starts_with('[')
            && let Ok(ids) = serde_json::from_str::<Vec<String>>(text)
        {
            return Askers(ids);
        }
        Askers(vec![text.to_owned()])
    }

    /// Whether `user` is one of them.
    pub fn contains(&self, user: &str) -> bool {
        self.0.iter().any(|id| id == user)
    }
}

/// A call to reserve ([`ActionStore::reserve_action`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewAction {
    pub key: ActionKey,
    pub batch: i64,
    pub tool: String,
    pub arguments: String,
    /// The tool declares that running it twice does what running it once does
    /// (`idempotentHint`): an abandoned reservation is reserved again, not `unknown`.
    pub idempotent: bool,
    /// A destructive call: stored `awaiting` the person's yes instead of reserved.
    pub needs_approval: bool,
    /// [`Askers::stored`] of the batch's authors.
    pub requested_by: Option<String>,
    /// The reservation's expiry (or the question's, for an approval).
    pub expires_at: Timestamp,
    /// A person's `/approve` of this (awaiting) call, read in the round's batch: it
    /// arrived this long before the reservation's `now`. The decision and the
    /// reservation are one write, fenced like any reservation (lease, `v0`): an
    /// `awaiting` row whose question was still open when the answer arrived moves
    /// straight to `reserved`; one that had expired by then is `refused`. `None` for a
    /// call the model asks for.
    pub approved: Option<std::time::Duration>,
}

/// What a reservation found ([`ActionStore::reserve_action`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionReservation {
    /// Reserved now for the caller's lease (new, approved before, or an idempotent
    /// call whose earlier reservation was abandoned): run the call, then
    /// [`ActionStore::finish_action`].
    Reserved(ActionRow),
    /// Ran already: use the stored result, never run it again.
    Done(ActionRow),
    /// Reserved by an earlier lease, no result yet, not expired: its holder may still
    /// be running it. Ask again after `until`.
    InFlight { until: Timestamp },
    /// An earlier reservation expired without a result (now stored `unknown`, a fact)
    /// or was found so: never run again automatically.
    Unknown(ActionRow),
    /// Waiting for the person's yes; `asked_now` when stored by this call (the round
    /// asks the question once).
    Awaiting { row: ActionRow, asked_now: bool },
    /// Refused by the person, or the question expired (stored so when found): not run.
    Refused(ActionRow),
    /// The conversation moved past `v0`: nothing was reserved or stored.
    Stale { version: Version },
}

/// What deciding an approval did ([`ActionStore::decide_action`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Decided now (the row after the decision).
    Decided(ActionRow),
    /// Decided before (a double tap, another replica), or not an approval at all:
    /// nothing changed (the row as it stands).
    AlreadyDecided(ActionRow),
    /// The question expired before the answer (stored `refused` now: the row after).
    Expired(ActionRow),
    /// No action of that id in this conversation.
    NotFound,
}

/// A reservation asked for ([`ActionStore::reserve_action`]): `action`, fenced by
/// `lease` (holder, token, expiry) and by the conversation still being at `v0`.
#[derive(Debug, Clone)]
pub struct Reserve<'a> {
    pub lease: &'a Lease,
    pub v0: Version,
    pub action: NewAction,
    pub now: Timestamp,
}

/// The result of a call that ran ([`ActionStore::finish_action`]): stored only on
/// the row `key` reserved by `token`, whatever became of that token's lease.
#[derive(Debug, Clone, Copy)]
pub struct ActionResult<'a> {
    pub key: &'a ActionKey,
    pub token: LeaseToken,
    pub result: &'a str,
    /// The tool reported a failure (the call ran all the same: still a fact).
    pub is_error: bool,
    /// The call failed after its request was written (no answer in time, the server
    /// died or the connection broke): it may or may not have acted. Stored `unknown`
    /// (with `result` saying why), never `done`: unknown is told, not guessed.
    pub unknown: bool,
    pub now: Timestamp,
}

/// A batch as its actions are keyed: its conversation and its first pending message
/// row (the `batch` of [`NewAction`] and [`ActionKey::of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchOf {
    pub conversation: ConversationId,
    pub batch: i64,
}

/// A person's answer to the approval `id` of `conversation`
/// ([`ActionStore::decide_action`]); who may answer is checked before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApprovalAnswer {
    pub conversation: ConversationId,
    pub id: i64,
    /// `true`: approved; `false`: refused.
    pub approve: bool,
    pub now: Timestamp,
}

/// The journal of actions (tool calls that act).
#[async_trait]
pub trait ActionStore: Send + Sync + 'static {
    /// Reserve the request's action for its lease, in one transaction: the lease must
    /// still be the caller's (else [`StoreError::LeaseLost`]) and the conversation
    /// still at `v0` (else [`ActionReservation::Stale`], nothing written); then the row
    /// with the same key decides ([`ActionReservation`]); without one, a new row is
    /// stored `reserved` (or `awaiting` when it needs approval) with the lease's token.
    async fn reserve_action(&self, request: Reserve<'_>) -> Result<ActionReservation, StoreError>;

    /// Store the result of a call reserved by `token`: `reserved` (or `unknown`: the
    /// call did run after all) → `done`, or → `unknown` when the result is that the
    /// outcome is unknown ([`ActionResult::unknown`]). Not fenced by the lease: an action that ran
    /// is a fact even when the lease was lost meanwhile. `false`: no row of that key
    /// reserved by that token (nothing changed).
    async fn finish_action(&self, result: ActionResult<'_>) -> Result<bool, StoreError>;

    /// This database's salt for the idempotency keys tool servers see
    /// ([`ActionKey::for_server`]): made once, at the migration that added it, and new
    /// in every copy `lull backup` writes.
    async fn idempotency_salt(&self) -> Result<String, StoreError>;

    /// Every action of the batch starting at row `batch`, in the order stored. Given no
    /// `now`, its rows' times are as stored: the caller's timeline on SQLite and when
    /// the caller drives time, the database's on PostgreSQL in production (the rows
    /// are read for their states and results; deadlines come from
    /// [`ActionStore::reserve_action`] and [`ActionStore::open_approvals`]).
    async fn actions_of_batch(&self, batch: BatchOf) -> Result<Vec<ActionRow>, StoreError>;

    /// The conversation's approvals: rows `awaiting` whose question was still open
    /// `answered` before `now` (when the answers being read arrived: expiry is judged
    /// at an answer's arrival, not when a round reads it) and `approved` (not yet run),
    /// oldest first.
    async fn open_approvals(
        &self,
        at: ConversationAt,
        answered: std::time::Duration,
    ) -> Result<Vec<ActionRow>, StoreError>;

    /// Every chat's open approvals at `now` (as [`ActionStore::open_approvals`] reads
    /// one chat's, expiry judged at `now`), oldest first, at most `limit`: the
    /// console's approvals page. Read only: an answer goes to the chat, where a round
    /// decides it under the conversation's lease.
    async fn waiting_approvals(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<WaitingApproval>, StoreError>;

    /// Answer the approval `id` of `conversation`: `awaiting` → `approved` (or
    /// `refused`), or `approved` → `refused` (a `/cancel` of a call approved but not
    /// yet run), once, by compare-and-swap (a double tap or two replicas: one decides,
    /// the other is told [`Decision::AlreadyDecided`]). Who may answer is the caller's
    /// check ([`ActionRow::askers`], or an admin). A round takes a yes with the
    /// reservation instead ([`NewAction::approved`]).
    async fn decide_action(&self, answer: ApprovalAnswer) -> Result<Decision, StoreError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_servers_key_is_salted_by_the_database() {
        let key = ActionKey::of(ConversationId(1), 2, "t", "{}");
        let here = key.for_server("salt-a");
        assert_eq!(here, key.for_server("salt-a"), "stable for one database");
        assert_ne!(here, key.for_server("salt-b"), "another database's differs");
        assert_ne!(here, key.0);
        assert!(here.starts_with("act_") && here.len() == 36, "{here}");
    }

    #[test]
    fn askers_are_stored_so_no_single_id_reads_as_a_list() {
        let one = Askers::of(["ann", "ann"]);
        assert_eq!(one.stored().as_deref(), Some("ann"));
        let two = Askers::of(["ann", "bob", "ann"]);
        assert_eq!(two.stored().as_deref(), Some(r#"["ann","bob"]"#));
        for askers in [one, two, Askers::of([r#"["ann"]"#])] {
            assert_eq!(Askers::parse(askers.stored().as_deref()), askers);
        }
        let tricky = Askers::of([r#"["ann"]"#]);
        assert!(!Askers::parse(tricky.stored().as_deref()).contains("ann"));
        assert_eq!(Askers::parse(None), Askers::default());
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_depth_and_drops_spaces() {
        let one: serde_json::Value = serde_json::from_str(
            r#"{ "b": 1, "a": { "y": [ 2, { "d": 0, "c": 1 } ], "x": null } }"#,
        )
        .unwrap();
        let other: serde_json::Value =
            serde_json::from_str(r#"{"a":{"x":null,"y":[2,{"c":1,"d":0}]},"b":1}"#).unwrap();
        assert_eq!(
            canonical_json(&one),
            r#"{"a":{"x":null,"y":[2,{"c":1,"d":0}]},"b":1}"#
        );
        assert_eq!(canonical_json(&one), canonical_json(&other));
        // Arrays keep their order: it means something.
        assert_ne!(
            canonical_json(&serde_json::json!([1, 2])),
            canonical_json(&serde_json::json!([2, 1]))
        );
    }

    #[test]
    fn an_action_key_is_stable_and_names_every_part() {
        let args = canonical_json(&serde_json::json!({ "to": "ann", "body": "hi" }));
        let key = ActionKey::of(ConversationId(7), 42, "mail__send", &args);
        assert_eq!(
            key,
            ActionKey::of(ConversationId(7), 42, "mail__send", &args)
        );
        assert!(
            key.0.starts_with("act_") && key.0.len() == 4 + 32,
            "{key:?}"
        );
        assert!(key.0[4..].bytes().all(|b| b.is_ascii_hexdigit()));
        // The same value written in another key order is the same call.
        let reordered =
            canonical_json(&serde_json::from_str(r#"{"body":"hi","to":"ann"}"#).unwrap());
        assert_eq!(
            key,
            ActionKey::of(ConversationId(7), 42, "mail__send", &reordered)
        );
        for other in [
            ActionKey::of(ConversationId(8), 42, "mail__send", &args),
            ActionKey::of(ConversationId(7), 43, "mail__send", &args),
            ActionKey::of(ConversationId(7), 42, "mail__draft", &args),
            ActionKey::of(ConversationId(7), 42, "mail__send", "{}"),
            // Parts are length-prefixed: moving a boundary changes the key.
            ActionKey::of(ConversationId(7), 42, "mail__sen", &format!("d{args}")),
        ] {
            assert_ne!(key, other);
        }
        // Pinned: servers deduplicate on the key, so it never changes between
        // versions (the SHA-256 of the length-prefixed parts, its first 16 bytes).
        assert_eq!(
            ActionKey::of(ConversationId(1), 2, "t", "{}").0,
            "act_9ddbce96a77940b959d05f2b398c784b"
        );
    }
}
