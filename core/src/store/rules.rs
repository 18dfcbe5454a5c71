//! What both backends decide the same way once their rows are read, written once so
//! the backends differ only in their SQL: the final check's verdict, the outbox rows a
//! commit, a notice and a give-up hand back, the rate hold's and the budget's
//! verdicts, which due conversations are ready and when to look again, how history
//! rows group into exchanges, what an access-decision row means, the order budget
//! rows are locked in, the media and quick-reply codecs, and what reserving an action and deciding an
//! approval write given the journal row they found. The conformance suite pins each
//! through both backends.

use lull_port::{Media, MediaKind, QuickReply};

use super::{
    AccessRule, ActionReservation, ActionRow, ActionState, Charged, CommitOutcome, Decision,
    Exchange, HeldOut, NewAction, OutboxKind, OutboxRow, ScopeCharge, StoreError, Subject, Unit,
};
use crate::access::SubjectKind;
use crate::domain::{
    ConversationId, ConversationRef, HolderId, Lease, LeaseToken, OutboxId, Platform, Said,
    Timestamp, Version,
};
use crate::rhythm::{Cue, Waits};
use crate::timing::TimerPolicy;

/// A message stored (or edited) in `conversation`, whose version the caller bumps and
/// whose timer it arms for `holder`, in the transaction that stores it. The wait is
/// picked the same way on every backend ([`Arming::due_at`]); only the write differs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Arming<'a> {
    pub(crate) conversation: ConversationId,
    pub(crate) platform: Platform,
    pub(crate) policy: TimerPolicy,
    pub(crate) cue: Cue,
    pub(crate) holder: &'a HolderId,
    pub(crate) now: Timestamp,
}

impl Arming<'_> {
    /// When the timer is due: the adaptive wait for the conversation's rhythm
    /// (`waits`) and its `pending` count, capped from the oldest pending message (or
    /// `now`). The database may only push it later (a backoff, a limit's hold).
    pub(crate) fn due_at(
        &self,
        waits: Option<Waits>,
        pending: (u32, Option<Timestamp>),
    ) -> Timestamp {
        let (count, first_pending) = pending;
        let wait = self.policy.debounce_for(waits, self.cue, count);
        self.policy
            .due_after(wait, self.now, first_pending.unwrap_or(self.now), count)
    }
}

/// The conversation a conversation's lease is on. A poller lease is never used for
/// conversation work: that would be a bug, not a condition of the database.
pub(crate) fn conversation_of(lease: &Lease) -> ConversationId {
    lease.key.conversation().unwrap_or_else(|| {
        panic!(
            "a poller lease ({}) was used for conversation work",
            lease.key
        )
    })
}

/// The final check's verdict on the version read under the lease: `None` when the
/// reply is stale, `Some(forced)` when it may be committed (`forced`: newer messages
/// arrived, but the oldest pending message, at `oldest`, has waited the cap).
pub(crate) fn commit_verdict(
    policy: TimerPolicy,
    version: i64,
    v0: Version,
    oldest: Timestamp,
    now: Timestamp,
) -> Option<bool> {
    // Fresh: a reply is committed only if no message arrived since it was
    // collected, unless the cap forces it out.
    let forced = version != v0.0;
    (!forced || policy.cap_reached(now, oldest)).then_some(forced)
}

/// A commit the final check refused: the conversation is at `version` now.
pub(crate) fn stale(version: i64) -> CommitOutcome {
    CommitOutcome::Stale {
        version: Version(version),
    }
}

/// What a committed reply hands back: its outbox row `reply`, covering those of the
/// batch's collected messages (`collected`: row, platform id) that the commit
/// covered (`covered`, by row: a message edited since it was collected is left
/// pending), and the notices stored with it.
pub(crate) fn committed<'a>(
    collected: impl IntoIterator<Item = (i64, &'a str)>,
    covered: &[i64],
    reply: OutboxRow,
    notices: Vec<OutboxRow>,
    forced: bool,
    memories: crate::store::MemoryApplied,
) -> CommitOutcome {
    let outbox = OutboxRow {
        covers: covered_ids(collected, covered),
        ..reply
    };
    CommitOutcome::Committed {
        notices,
        outbox,
        forced,
        memories,
    }
}

/// When an outbox row was stored, as [`OutboxRow`] reports it: `created_at` on the
/// caller's timeline, `stored_at` as stored (on SQLite both are the caller's `now`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoredAt {
    pub(crate) created_at: Timestamp,
    pub(crate) stored_at: Timestamp,
}

/// The row of a reply just committed: nothing delivered, no attempt yet, no quick
/// replies (a reply offers none; its covers are added by [`committed`]).
pub(crate) fn reply_row(
    id: i64,
    conversation: ConversationRef,
    text: String,
    reply_to: Option<String>,
    at: StoredAt,
) -> OutboxRow {
    OutboxRow {
        id: OutboxId(id),
        conversation,
        kind: OutboxKind::Reply,
        text,
        reply_to,
        covers: Vec::new(),
        quick_replies: Vec::new(),
        parts_sent: 0,
        attempts: 0,
        created_at: at.created_at,
        stored_at: at.stored_at,
    }
}

/// The row of a notice just queued (a command's answer, a held-out notice, or a
/// give-up, which covers the messages it ended), with the quick replies it was built
/// with: nothing delivered, no attempt yet.
pub(crate) fn notice_row(
    id: i64,
    conversation: ConversationRef,
    text: String,
    reply_to: Option<String>,
    covers: Vec<String>,
    quick_replies: Vec<QuickReply>,
    at: StoredAt,
) -> OutboxRow {
    OutboxRow {
        kind: OutboxKind::Notice,
        covers,
        quick_replies,
        ..reply_row(id, conversation, text, reply_to, at)
    }
}

/// The notice row of messages a reply left out ([`HeldOut`]), just stored with the
/// reply: it covers `covered` (row, platform id), the held-out messages still unedited.
/// It offers no quick replies.
pub(crate) fn held_out_row(
    id: i64,
    conversation: &ConversationRef,
    held: &HeldOut,
    covered: Vec<(i64, String)>,
    at: StoredAt,
) -> OutboxRow {
    let covers = covered.into_iter().map(|(_, id)| id).collect();
    let (text, reply_to) = (held.text.clone(), held.reply_to.clone());
    notice_row(
        id,
        conversation.clone(),
        text,
        reply_to,
        covers,
        Vec::new(),
        at,
    )
}

/// The platform ids of the collected messages (row, platform id) a reply covers.
pub(crate) fn covered_ids<'a>(
    collected: impl IntoIterator<Item = (i64, &'a str)>,
    covered: &[i64],
) -> Vec<String> {
    collected
        .into_iter()
        .filter(|(row, _)| covered.contains(row))
        .map(|(_, id)| id.to_owned())
        .collect()
}

/// The rate hold's verdict on the conversation's timer, on the timeline the store
/// compares on: `held_until` is the timer's hold (`None`: no timer, the messages were
/// answered), `until` when the window has room again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RateVerdict {
    /// Answered already: nothing left to hold.
    Nothing,
    /// A hold in force (until then) is kept, not extended.
    Kept(Timestamp),
    /// Hold the timer until then: this call begins the hold.
    Begin(Timestamp),
}

pub(crate) fn rate_verdict(
    held_until: Option<i64>,
    until: Timestamp,
    now: Timestamp,
) -> RateVerdict {
    match held_until {
        None => RateVerdict::Nothing,
        Some(held_until) if held_until > now.0 => RateVerdict::Kept(Timestamp(held_until)),
        Some(_) => RateVerdict::Begin(until),
    }
}

/// Whether a scope's part of a charge is checked against a budget: it has a limit
/// and spends in its unit (a give-back never passes a budget).
pub(crate) fn budgeted(scope: &ScopeCharge) -> bool {
    (scope.limit.is_some() && scope.tokens > 0) || (scope.cost_limit.is_some() && scope.cost > 0)
}

/// The budgets' verdict on a scope that used `tokens` and `cost` (nano-dollars) in
/// its period: `Some(Over)` when the charge's positive tokens or dollars on top of
/// them would pass the scope's token or dollar limit (tokens are checked first).
pub(crate) fn over_budget(scope: &ScopeCharge, tokens: i64, cost: i64) -> Option<Charged> {
    let over = |spent: i64, used: i64, limit: Option<u64>, unit: Unit| {
        let limit = limit.filter(|_| spent > 0)?;
        let used = used.max(0) as u64;
        (used.saturating_add(spent as u64) > limit).then(|| Charged::Over {
            scope: scope.scope.clone(),
            used,
            limit,
            unit,
        })
    };
    over(scope.tokens, tokens, scope.limit, Unit::Tokens)
        .or_else(|| over(scope.cost, cost, scope.cost_limit, Unit::Usd))
}

/// Whether a reservation refused by `scope` (which used `tokens` and `cost`) would
/// fit without `others`, the tokens and nano-dollars other rounds reserved on the same
/// row and have not settled: then it is [`Charged::Busy`], not over.
pub(crate) fn busy_only(scope: &ScopeCharge, tokens: i64, cost: i64, others: (i64, i64)) -> bool {
    over_budget(scope, tokens - others.0, cost - others.1).is_none()
}

/// What a refused charge answers and how long it holds the conversation (with the
/// charge's `hold_until`): `over` as the budget said, held until the budget resets; or,
/// `busy` (refused only by other rounds' open reservations), [`Charged::Busy`], held
/// for [`BUSY_RETRY`](super::BUSY_RETRY) from `now`.
pub(crate) fn refusal(
    over: Charged,
    busy: bool,
    hold_until: Option<Timestamp>,
    now: Timestamp,
) -> (Charged, Option<Timestamp>) {
    match over {
        Charged::Over { scope, .. } if busy => (
            Charged::Busy { scope },
            hold_until.map(|_| now.plus(super::BUSY_RETRY)),
        ),
        over => (over, hold_until),
    }
}

/// What a scope used, from its stored totals (a negative total, never stored but read
/// defensively, counts as nothing).
pub(crate) fn used(tokens: i64, cost: i64) -> super::Used {
    super::Used {
        tokens: tokens.max(0) as u64,
        cost: crate::money::Usd(cost.max(0) as u64),
    }
}

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

/// A charge's scopes in the one order every charge (and every give-back of an
/// abandoned reservation) takes its budget rows in: by scope name, then period key;
/// each row once (a scope named twice is charged the sum, against the smaller
/// limit): two charges naming the same scopes in different orders queue on the
/// first row they share instead of deadlocking.
pub(crate) fn sorted_scopes(scopes: &[ScopeCharge]) -> Vec<ScopeCharge> {
    let mut sorted: Vec<ScopeCharge> = Vec::with_capacity(scopes.len());
    let mut scopes = scopes.to_vec();
    scopes.sort_by(|a, b| (&a.scope, a.period).cmp(&(&b.scope, b.period)));
    let smaller = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    for scope in scopes {
        match sorted.last_mut() {
            Some(last) if last.scope == scope.scope && last.period == scope.period => {
                last.tokens += scope.tokens;
                last.cost += scope.cost;
                last.limit = smaller(last.limit, scope.limit);
                last.cost_limit = smaller(last.cost_limit, scope.cost_limit);
            }
            _ => sorted.push(scope),
        }
    }
    sorted
}

/// What a journal row is set to (a new row, or a move of one found): its state, the
/// token of the reservation it records (0 for an approval not yet run), its expiry, on
/// the caller's timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ActionWrite {
    pub(crate) state: ActionState,
    pub(crate) token: LeaseToken,
    pub(crate) expires_at: Timestamp,
}

/// What a journal call does once it has read the row it decides on, written once for
/// both backends ([`reserve_step`], [`decide_step`]): answer from the row as it stands,
/// or write a row and answer from the row written (`answer` turns it into the reply).
/// A backend only runs the one statement the step names, in the same transaction.
#[derive(Debug)]
pub(crate) enum ActionStep<A> {
    /// Nothing to write.
    Answer(A),
    /// Store `action` as a new row of the lease's conversation, set to `write`.
    Insert {
        action: NewAction,
        write: ActionWrite,
        answer: fn(ActionRow) -> A,
    },
    /// Move the row `id` to `write` (a move the module docs of `contract::actions`
    /// allow: nothing else is ever written to a journal row).
    Update {
        id: i64,
        write: ActionWrite,
        answer: fn(ActionRow) -> A,
    },
}

/// What reserving `action` for the lease with `token` does, in the transaction that
/// fenced the lease and read the conversation's `version` and the row with the
/// action's key (`found`), at `now` (the timeline `found`'s times are on):
/// - the conversation moved past `v0`: stale, nothing written;
/// - no row: a new one, `reserved` by `token` until `action.expires_at`, or `awaiting`
///   (token 0, until the question expires) when it needs approval;
/// - `done`: its result; `unknown`, `refused`: so told; `reserved` by `token`: the same
///   round asking again, reserved still;
/// - `reserved` by another token: in flight until its expiry; after it, abandoned:
///   reserved again for `token` when the tool is idempotent, else stored `unknown`;
/// - `awaiting`: still awaiting until it expires, then stored `refused`; with the
///   person's yes ([`NewAction::approved`]) reserved for `token` if the question was
///   open when the yes arrived, else stored `refused`;
/// - `approved`: reserved for `token` while its question is open (the approved call
///   runs once, in this round), else stored `refused`.
pub(crate) fn reserve_step(
    version: i64,
    v0: Version,
    found: Option<ActionRow>,
    action: NewAction,
    token: LeaseToken,
    now: Timestamp,
) -> ActionStep<ActionReservation> {
    use ActionReservation as R;
    // Never act on an old picture: the final check, in front of the side effect.
    if version != v0.0 {
        return ActionStep::Answer(R::Stale {
            version: Version(version),
        });
    }
    let reserve = ActionWrite {
        state: ActionState::Reserved,
        token,
        expires_at: action.expires_at,
    };
    let Some(row) = found else {
        if action.needs_approval {
            let write = ActionWrite {
                state: ActionState::Awaiting,
                token: LeaseToken(0),
                ..reserve
            };
            return ActionStep::Insert {
                action,
                write,
                answer: |row| R::Awaiting {
                    row,
                    asked_now: true,
                },
            };
        }
        return ActionStep::Insert {
            action,
            write: reserve,
            answer: R::Reserved,
        };
    };
    let (id, live) = (row.id, row.expires_at > now);
    let mark = |state| ActionWrite {
        state,
        token: row.token,
        expires_at: row.expires_at,
    };
    let update = |write, answer| ActionStep::Update { id, write, answer };
    match row.state {
        ActionState::Done => ActionStep::Answer(R::Done(row)),
        ActionState::Reserved if row.token == token => ActionStep::Answer(R::Reserved(row)),
        ActionState::Reserved if live => ActionStep::Answer(R::InFlight {
            until: row.expires_at,
        }),
        // Abandoned: its holder died mid-call (or lost its lease). Unknown is told, not
        // guessed, unless running it twice does what running it once does.
        ActionState::Reserved if action.idempotent => update(reserve, R::Reserved),
        ActionState::Reserved => update(mark(ActionState::Unknown), R::Unknown),
        ActionState::Unknown => ActionStep::Answer(R::Unknown(row)),
        // The person's yes, taken with the reservation: judged open at the answer's
        // arrival, not now.
        ActionState::Awaiting | ActionState::Approved if action.approved.is_some() => {
            let answered_at = now.minus(action.approved.unwrap_or_default());
            if row.expires_at > answered_at {
                update(reserve, R::Reserved)
            } else {
                update(mark(ActionState::Refused), R::Refused)
            }
        }
        ActionState::Awaiting if live => ActionStep::Answer(R::Awaiting {
            row,
            asked_now: false,
        }),
        ActionState::Awaiting => update(mark(ActionState::Refused), R::Refused),
        // Approved by an earlier version, apart from its reservation: approved rows
        // expire with their question.
        ActionState::Approved if live => update(reserve, R::Reserved),
        ActionState::Approved => update(mark(ActionState::Refused), R::Refused),
        ActionState::Refused => ActionStep::Answer(R::Refused(row)),
    }
}

/// What answering the approval `found` (the row of that id in the conversation, read
/// in the deciding transaction and locked or written there alone) does at `now`: only
/// an `awaiting` row moves, once: to `approved` (or `refused`) while its question is
/// open, to `refused` (told [`Decision::Expired`]) once it has expired; an `approved`
/// row not yet run moves to `refused` on a `/cancel`.
pub(crate) fn decide_step(
    found: Option<ActionRow>,
    approve: bool,
    now: Timestamp,
) -> ActionStep<Decision> {
    let Some(row) = found else {
        return ActionStep::Answer(Decision::NotFound);
    };
    // Open: awaiting, or approved and not yet run (a `/cancel` still refuses it).
    let open =
        row.state == ActionState::Awaiting || (row.state == ActionState::Approved && !approve);
    if !open {
        return ActionStep::Answer(Decision::AlreadyDecided(row));
    }
    let (state, answer): (_, fn(ActionRow) -> Decision) = if row.expires_at <= now {
        (ActionState::Refused, Decision::Expired)
    } else if approve {
        (ActionState::Approved, Decision::Decided)
    } else {
        (ActionState::Refused, Decision::Decided)
    };
    ActionStep::Update {
        id: row.id,
        write: ActionWrite {
            state,
            token: row.token,
            expires_at: row.expires_at,
        },
        answer,
    }
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

/// The key of one occurrence of job `job`: a reminder's dedupe key, a task's platform
/// message id, so even its output is stored once per occurrence. The counter-test's
/// switch makes it one per firing process, so nothing dedupes.
pub(crate) fn occurrence_key(job: i64, scheduled_at: Timestamp, holder: &HolderId) -> String {
    if crate::switches::no_occurrence_key() {
        return format!("job/{job}/{}/{}", scheduled_at.0, holder.as_str());
    }
    format!("job/{job}/{}", scheduled_at.0)
}

/// The notice a reminder's occurrence leaves (its dedupe key: the occurrence's).
pub(crate) fn occurrence_notice(
    job: &crate::store::JobRow,
    text: String,
    key: String,
) -> crate::store::NewNotice {
    crate::store::NewNotice {
        conversation: job.conversation.clone(),
        is_group: job.is_group,
        text,
        reply_to: None,
        quick_replies: Vec::new(),
        dedupe_key: key,
    }
}

/// The message a task's occurrence leaves, from the job's creator (its platform id:
/// the occurrence's key, so it is stored once).
pub(crate) fn occurrence_message(
    job: &crate::store::JobRow,
    text: String,
    key: String,
) -> crate::store::NewMessage {
    crate::store::NewMessage {
        conversation: job.conversation.clone(),
        is_group: job.is_group,
        message_id: key,
        user_id: job.creator.clone(),
        author: job.creator_name.clone(),
        text,
        media: Vec::new(),
    }
}

/// A job's columns as a backend reads them, before [`job_row`] checks them.
pub(crate) struct RawJob {
    pub(crate) id: i64,
    pub(crate) platform: String,
    pub(crate) key: String,
    pub(crate) conversation_id: i64,
    pub(crate) is_group: bool,
    pub(crate) creator: String,
    pub(crate) creator_name: String,
    pub(crate) kind: String,
    pub(crate) schedule: String,
    pub(crate) timezone: String,
    pub(crate) text: String,
    pub(crate) next_at: Option<i64>,
    pub(crate) state: String,
    pub(crate) created_at: i64,
}

/// A job row of its raw columns; a platform or kind this build cannot read is
/// [`StoreError::Corrupt`] (never guessed: a job fired into the wrong chat, or as the
/// wrong kind, would be worse than one not fired).
pub(crate) fn job_row(raw: RawJob) -> Result<crate::store::JobRow, StoreError> {
    let platform = raw.platform.parse().map_err(StoreError::Corrupt)?;
    let kind = crate::store::JobKind::parse(&raw.kind)
        .ok_or_else(|| StoreError::Corrupt(format!("job kind '{}'", raw.kind)))?;
    Ok(crate::store::JobRow {
        id: raw.id,
        conversation: ConversationRef::new(platform, raw.key),
        conversation_id: ConversationId(raw.conversation_id),
        is_group: raw.is_group,
        creator: raw.creator,
        creator_name: raw.creator_name,
        kind,
        schedule: raw.schedule,
        timezone: raw.timezone,
        text: raw.text,
        next_at: raw.next_at.map(Timestamp),
        state: crate::store::JobState::parse(&raw.state),
        created_at: Timestamp(raw.created_at),
    })
}

/// A notice's quick replies as every backend stores them: one nullable text column
/// holding a JSON array of `{"label", "text"}` (`NULL` for none: every reply, most
/// notices, and rows stored before the column existed).
pub(super) fn encode_quick_replies(replies: &[QuickReply]) -> Option<String> {
    if replies.is_empty() {
        return None;
    }
    let items: Vec<serde_json::Value> = replies
        .iter()
        .map(|r| serde_json::json!({"label": r.label, "text": r.text}))
        .collect();
    Some(serde_json::Value::Array(items).to_string())
}

/// The quick replies [`encode_quick_replies`] stored.
pub(super) fn decode_quick_replies(stored: Option<&str>) -> Result<Vec<QuickReply>, StoreError> {
    let Some(stored) = stored else {
        return Ok(Vec::new());
    };
    let corrupt = |why: &str| StoreError::Corrupt(format!("quick replies of a notice: {why}"));
    let items: Vec<serde_json::Value> =
        serde_json::from_str(stored).map_err(|e| corrupt(&e.to_string()))?;
    items
        .iter()
        .map(|item| {
            let field = |name: &str| {
                item[name]
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| corrupt(&format!("no {name}")))
            };
            Ok(QuickReply {
                label: field("label")?,
                text: field("text")?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_newer_version_is_stale_until_the_cap_forces_it() {
        let policy =
            TimerPolicy::new(Duration::from_millis(100), Duration::from_millis(1000), 20).unwrap();
        let (v0, oldest) = (Version(3), Timestamp(10_000));
        assert_eq!(
            commit_verdict(policy, 3, v0, oldest, Timestamp(10_500)),
            Some(false)
        );
        assert_eq!(
            commit_verdict(policy, 4, v0, oldest, Timestamp(10_999)),
            None
        );
        assert_eq!(
            commit_verdict(policy, 4, v0, oldest, Timestamp(11_000)),
            Some(true)
        );
    }

    #[test]
    fn a_rate_hold_in_force_is_kept_not_extended() {
        let (until, now) = (Timestamp(5_000), Timestamp(1_000));
        assert_eq!(rate_verdict(None, until, now), RateVerdict::Nothing);
        assert_eq!(
            rate_verdict(Some(2_000), until, now),
            RateVerdict::Kept(Timestamp(2_000))
        );
        assert_eq!(
            rate_verdict(Some(1_000), until, now),
            RateVerdict::Begin(until)
        );
        assert_eq!(rate_verdict(Some(0), until, now), RateVerdict::Begin(until));
    }

    #[test]
    fn only_spending_past_a_limit_is_over_budget() {
        let scope = |tokens, limit| ScopeCharge::tokens("bot", tokens, limit);
        assert!(over_budget(&scope(10, Some(100)), 90, 0).is_none());
        assert_eq!(
            over_budget(&scope(11, Some(100)), 90, 0),
            Some(Charged::Over {
                scope: "bot".into(),
                used: 90,
                limit: 100,
                unit: Unit::Tokens,
            })
        );
        // A give-back, or a scope with no limit, never passes a budget.
        assert!(over_budget(&scope(-50, Some(100)), 500, 0).is_none());
        assert!(over_budget(&scope(50, None), 500, 0).is_none());
        assert!(!budgeted(&scope(-50, Some(100))) && !budgeted(&scope(50, None)));
        assert!(budgeted(&scope(1, Some(100))));
        // A negative total (never stored, but read defensively) counts as nothing used.
        assert!(over_budget(&scope(100, Some(100)), -5, 0).is_none());
    }

    #[test]
    fn dollars_are_checked_against_their_own_budget() {
        let scope = ScopeCharge {
            cost: 300,
            cost_limit: Some(1_000),
            ..ScopeCharge::tokens("bot", 10, Some(100))
        };
        assert!(budgeted(&scope));
        assert!(
            over_budget(&scope, 0, 700).is_none(),
            "exactly the budget fits"
        );
        assert_eq!(
            over_budget(&scope, 0, 701),
            Some(Charged::Over {
                scope: "bot".into(),
                used: 701,
                limit: 1_000,
                unit: Unit::Usd,
            })
        );
        let free = ScopeCharge {
            cost: 0,
            ..scope.clone()
        };
        assert!(
            over_budget(&free, 0, 5_000).is_none(),
            "nothing spent passes nothing"
        );
    }

    #[test]
    fn a_month_row_sorts_apart_from_the_day_row_of_its_scope() {
        let day = ScopeCharge::tokens("bot", 1, None);
        let month = ScopeCharge {
            period: crate::store::Period::Month,
            ..ScopeCharge::tokens("bot", 2, None)
        };
        let sorted = sorted_scopes(&[month.clone(), day.clone(), day.clone()]);
        assert_eq!(sorted.len(), 2);
        assert_eq!((sorted[0].tokens, sorted[1].tokens), (2, 2));
        assert_eq!(sorted[1].period, crate::store::Period::Month);
        assert_eq!(month.row_day("2026-12-05"), "2026-12");
    }

    fn journal_row(state: ActionState, token: i64, expires_at: i64) -> ActionRow {
        ActionRow {
            id: 5,
            key: crate::store::ActionKey("act_k".into()),
            conversation_id: ConversationId(1),
            batch: 1,
            tool: "t__x".into(),
            arguments: "{}".into(),
            state,
            result: None,
            is_error: false,
            token: LeaseToken(token),
            expires_at: Timestamp(expires_at),
            requested_by: None,
            created_at: Timestamp(0),
        }
    }

    fn asked_for(idempotent: bool, needs_approval: bool) -> NewAction {
        NewAction {
            key: crate::store::ActionKey("act_k".into()),
            batch: 1,
            tool: "t__x".into(),
            arguments: "{}".into(),
            idempotent,
            needs_approval,
            requested_by: None,
            expires_at: Timestamp(9_000),
            approved: None,
        }
    }

    /// The write a step names and the answer it gives from `row` written so.
    fn written<A>(step: ActionStep<A>) -> (ActionWrite, A) {
        match step {
            ActionStep::Insert { write, answer, .. } | ActionStep::Update { write, answer, .. } => {
                let row = journal_row(write.state, write.token.0, write.expires_at.0);
                (write, answer(row))
            }
            ActionStep::Answer(_) => panic!("nothing written"),
        }
    }

    #[test]
    fn a_reservation_writes_only_the_moves_the_journal_allows() {
        use ActionReservation as R;
        use ActionState as S;
        let (ours, now) = (LeaseToken(3), Timestamp(1_000));
        let step = |found, idempotent, approval| {
            reserve_step(
                7,
                Version(7),
                found,
                asked_for(idempotent, approval),
                ours,
                now,
            )
        };
        assert!(matches!(
            reserve_step(8, Version(7), None, asked_for(false, false), ours, now),
            ActionStep::Answer(R::Stale {
                version: Version(8)
            })
        ));
        let (write, answer) = written(step(None, false, false));
        assert_eq!(
            (write.state, write.token, write.expires_at),
            (S::Reserved, ours, Timestamp(9_000))
        );
        assert!(matches!(answer, R::Reserved(_)));
        let (write, answer) = written(step(None, false, true));
        assert_eq!((write.state, write.token), (S::Awaiting, LeaseToken(0)));
        assert!(matches!(
            answer,
            R::Awaiting {
                asked_now: true,
                ..
            }
        ));
        // Another round's live reservation, then its expiry (at `now`: expired).
        assert!(matches!(
            step(Some(journal_row(S::Reserved, 2, 1_001)), false, false),
            ActionStep::Answer(R::InFlight {
                until: Timestamp(1_001)
            })
        ));
        let (write, answer) = written(step(Some(journal_row(S::Reserved, 2, 1_000)), false, false));
        assert_eq!(
            (write.state, write.token, write.expires_at),
            (S::Unknown, LeaseToken(2), Timestamp(1_000))
        );
        assert!(matches!(answer, R::Unknown(_)));
        let (write, answer) = written(step(Some(journal_row(S::Reserved, 2, 1_000)), true, false));
        assert_eq!(
            (write.state, write.token, write.expires_at),
            (S::Reserved, ours, Timestamp(9_000))
        );
        assert!(matches!(answer, R::Reserved(_)));
        assert!(matches!(
            step(Some(journal_row(S::Reserved, 3, 0)), false, false),
            ActionStep::Answer(R::Reserved(_))
        ));
        // Questions: open, expired, approved.
        assert!(matches!(
            step(Some(journal_row(S::Awaiting, 0, 1_001)), false, true),
            ActionStep::Answer(R::Awaiting {
                asked_now: false,
                ..
            })
        ));
        let (write, answer) = written(step(Some(journal_row(S::Awaiting, 0, 1_000)), false, true));
        assert_eq!(write.state, S::Refused);
        assert!(matches!(answer, R::Refused(_)));
        let (write, answer) = written(step(Some(journal_row(S::Approved, 0, 5_000)), false, true));
        assert_eq!((write.state, write.token), (S::Reserved, ours));
        assert!(matches!(answer, R::Reserved(_)));
        // Approved rows expire with their question.
        let (write, _) = written(step(Some(journal_row(S::Approved, 0, 1_000)), false, true));
        assert_eq!(write.state, S::Refused);
        // A yes taken with the reservation: open when it arrived (500 ms ago, the
        // question expiring 200 ms ago) runs; a yes that arrived after the expiry does not.
        let approved = |ago_ms: u64, expires_at: i64| {
            let action = NewAction {
                approved: Some(std::time::Duration::from_millis(ago_ms)),
                ..asked_for(false, true)
            };
            let found = Some(journal_row(S::Awaiting, 0, expires_at));
            reserve_step(7, Version(7), found, action, ours, now)
        };
        let (write, answer) = written(approved(500, 800));
        assert_eq!((write.state, write.token), (S::Reserved, ours));
        assert!(matches!(answer, R::Reserved(_)));
        let (write, answer) = written(approved(100, 800));
        assert_eq!(write.state, S::Refused);
        assert!(matches!(answer, R::Refused(_)));
        // Still fenced: a yes in a batch that moved on reserves nothing.
        let moved = NewAction {
            approved: Some(std::time::Duration::ZERO),
            ..asked_for(false, true)
        };
        let found = Some(journal_row(S::Awaiting, 0, 9_000));
        assert!(matches!(
            reserve_step(8, Version(7), found, moved, ours, now),
            ActionStep::Answer(R::Stale { .. })
        ));
        // Facts stay, told as they are.
        for state in [S::Done, S::Unknown, S::Refused] {
            let row = journal_row(state, 2, 0);
            let ActionStep::Answer(answer) = step(Some(row.clone()), true, false) else {
                panic!("{state:?} is a fact: nothing written");
            };
            let told = match state {
                S::Done => R::Done(row),
                S::Unknown => R::Unknown(row),
                _ => R::Refused(row),
            };
            assert_eq!(answer, told);
        }
    }

    #[test]
    fn an_approval_is_decided_only_while_its_question_is_open() {
        let now = Timestamp(1_000);
        assert!(matches!(
            decide_step(None, true, now),
            ActionStep::Answer(Decision::NotFound)
        ));
        let open = || Some(journal_row(ActionState::Awaiting, 0, 1_001));
        let (write, answer) = written(decide_step(open(), true, now));
        assert_eq!(write.state, ActionState::Approved);
        assert!(matches!(answer, Decision::Decided(_)));
        let (write, answer) = written(decide_step(open(), false, now));
        assert_eq!(write.state, ActionState::Refused);
        assert!(matches!(answer, Decision::Decided(_)));
        let expired = Some(journal_row(ActionState::Awaiting, 0, 1_000));
        let (write, answer) = written(decide_step(expired, true, now));
        assert_eq!(write.state, ActionState::Refused);
        assert!(matches!(answer, Decision::Expired(_)));
        // An approved call not yet run is still refused by a `/cancel`.
        let (write, answer) = written(decide_step(
            Some(journal_row(ActionState::Approved, 0, 1_001)),
            false,
            now,
        ));
        assert_eq!(write.state, ActionState::Refused);
        assert!(matches!(answer, Decision::Decided(_)));
        assert!(matches!(
            decide_step(
                Some(journal_row(ActionState::Approved, 0, 1_001)),
                true,
                now
            ),
            ActionStep::Answer(Decision::AlreadyDecided(_))
        ));
        for fact in [
            ActionState::Reserved,
            ActionState::Done,
            ActionState::Refused,
        ] {
            assert!(matches!(
                decide_step(Some(journal_row(fact, 2, 1_001)), false, now),
                ActionStep::Answer(Decision::AlreadyDecided(_))
            ));
        }
    }
}
