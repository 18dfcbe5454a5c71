//! Conformance of the actions area: the journal of tool calls that act (reserve before
//! acting, fenced and at `v0`; a finished action is a fact; an abandoned one is
//! unknown unless idempotent; approvals asked once and decided once).

use super::{at, claimed, collect, holder, http, lost, message, ms, round, stored};
use crate::domain::{ConversationId, Lease, LeaseToken, Timestamp, Version};
use crate::store::{
    ActionKey, ActionReservation, ActionResult, ActionRow, ActionState, ApprovalAnswer, BatchOf,
    ConversationAt, Decision, NewAction, Reserve, Store, canonical_json,
};

/// A call of `tool` (arguments `{"n": n}`) for the batch starting at row `batch` of
/// `conversation`, reserved until `expires_at`: neither idempotent nor destructive.
fn call(
    conversation: ConversationId,
    batch: i64,
    tool: &str,
    n: u32,
    expires_at: Timestamp,
) -> NewAction {
    let arguments = canonical_json(&serde_json::json!({ "n": n }));
    NewAction {
        key: ActionKey::of(conversation, batch, tool, &arguments),
        batch,
        tool: tool.into(),
        arguments,
        idempotent: false,
        needs_approval: false,
        requested_by: Some("u1".into()),
        expires_at,
        approved: None,
    }
}

/// The same call, destructive: it waits for the person's yes until `expires_at`.
fn destructive(call: NewAction) -> NewAction {
    NewAction {
        needs_approval: true,
        ..call
    }
}

async fn reserve(
    store: &dyn Store,
    lease: &Lease,
    v0: Version,
    action: &NewAction,
    now: Timestamp,
) -> ActionReservation {
    store
        .reserve_action(Reserve {
            lease,
            v0,
            action: action.clone(),
            now,
        })
        .await
        .expect("reserving an action")
}

/// Reserve `action`, which must be reserved now for `lease`: its row.
async fn reserved(
    store: &dyn Store,
    lease: &Lease,
    v0: Version,
    action: &NewAction,
    now: Timestamp,
) -> ActionRow {
    match reserve(store, lease, v0, action, now).await {
        ActionReservation::Reserved(row) => {
            assert_eq!((row.state, row.token), (ActionState::Reserved, lease.token));
            row
        }
        other => panic!("{} was not reserved: {other:?}", action.tool),
    }
}

/// Reserve the destructive `action`, which must be asked now (awaiting, token 0):
/// its row.
async fn asked(
    store: &dyn Store,
    lease: &Lease,
    v0: Version,
    action: &NewAction,
    now: Timestamp,
) -> ActionRow {
    match reserve(store, lease, v0, action, now).await {
        ActionReservation::Awaiting {
            row,
            asked_now: true,
        } => {
            assert_eq!(
                (row.state, row.token),
                (ActionState::Awaiting, LeaseToken(0))
            );
            row
        }
        other => panic!("{} was not asked: {other:?}", action.tool),
    }
}

async fn of_batch(store: &dyn Store, conversation: ConversationId, batch: i64) -> Vec<ActionRow> {
    store
        .actions_of_batch(BatchOf {
            conversation,
            batch,
        })
        .await
        .expect("reading a batch's actions")
}

async fn finish(store: &dyn Store, key: &ActionKey, token: LeaseToken, result: &str) -> bool {
    finish_as(store, key, token, result, false).await
}

/// Store a result, `unknown` when the call ended without an answer.
async fn finish_as(
    store: &dyn Store,
    key: &ActionKey,
    token: LeaseToken,
    result: &str,
    unknown: bool,
) -> bool {
    store
        .finish_action(ActionResult {
            key,
            token,
            result,
            is_error: unknown,
            unknown,
            now: at(0),
        })
        .await
        .expect("storing an action's result")
}

async fn decide(
    store: &dyn Store,
    conversation: ConversationId,
    id: i64,
    approve: bool,
    now: Timestamp,
) -> Decision {
    store
        .decide_action(ApprovalAnswer {
            conversation,
            id,
            approve,
            now,
        })
        .await
        .expect("deciding an approval")
}

async fn open(store: &dyn Store, conversation: ConversationId, now: Timestamp) -> Vec<i64> {
    store
        .open_approvals(
            ConversationAt { conversation, now },
            std::time::Duration::ZERO,
        )
        .await
        .expect("reading open approvals")
        .iter()
        .map(|row| row.id)
        .collect()
}

/// A new call is stored `reserved` by the lease's token until its expiry; the same
/// round asking again finds the same reservation; once finished it is done, with its
/// result, and is never reserved again (a second result changes nothing).
pub async fn a_reservation_is_stored_once_and_finished_once(store: &dyn Store) {
    let a = holder("a");
    let (id, lease, batch) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let start = batch.pending[0].row;
    let action = call(id, start, "files__write", 1, at(6000));
    let row = reserved(store, &lease, batch.v0, &action, at(1100)).await;
    assert_eq!(
        (
            &row.key,
            row.conversation_id,
            row.batch,
            row.tool.as_str(),
            row.arguments.as_str()
        ),
        (&action.key, id, start, "files__write", r#"{"n":1}"#)
    );
    assert_eq!((row.expires_at, row.created_at), (at(6000), at(1100)));
    assert_eq!((row.result.clone(), row.is_error), (None, false));
    assert_eq!(row.requested_by.as_deref(), Some("u1"));
    let again = reserved(store, &lease, batch.v0, &action, at(1200)).await;
    assert_eq!(
        again, row,
        "the same round asking again: the same reservation"
    );
    assert!(finish(store, &action.key, lease.token, "written").await);
    let ActionReservation::Done(done) = reserve(store, &lease, batch.v0, &action, at(1300)).await
    else {
        panic!("a finished action is done");
    };
    assert_eq!(
        (done.id, done.state, done.result.as_deref()),
        (row.id, ActionState::Done, Some("written"))
    );
    assert!(
        !finish(store, &action.key, lease.token, "again").await,
        "a fact is not rewritten"
    );
    assert_eq!(of_batch(store, id, start).await, vec![done]);
}

/// A call that ended without an answer after its request was written is stored
/// `unknown`, with the reason as its result: a later round of the batch is told so and
/// never runs it again (it is not idempotent), and a late real result of the same
/// token still makes it `done`.
pub async fn a_call_without_an_answer_is_stored_unknown(store: &dyn Store) {
    let a = holder("a");
    let (id, lease, batch) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let start = batch.pending[0].row;
    let action = call(id, start, "files__write", 1, at(6000));
    reserved(store, &lease, batch.v0, &action, at(1100)).await;
    assert!(
        finish_as(
            store,
            &action.key,
            lease.token,
            "Outcome unknown: closed",
            true
        )
        .await
    );
    let ActionReservation::Unknown(row) = reserve(store, &lease, batch.v0, &action, at(1200)).await
    else {
        panic!("an unanswered call is unknown");
    };
    assert_eq!(
        (row.state, row.result.as_deref()),
        (ActionState::Unknown, Some("Outcome unknown: closed"))
    );
    assert!(finish(store, &action.key, lease.token, "written").await);
    let rows = of_batch(store, id, start).await;
    assert_eq!(rows[0].state, ActionState::Done, "a late answer is a fact");
}

/// The database's idempotency salt: made once, the same at every read.
pub async fn the_idempotency_salt_is_made_once(store: &dyn Store) {
    let salt = store.idempotency_salt().await.expect("reading the salt");
    assert_eq!(salt.len(), 32, "{salt}");
    assert!(salt.bytes().all(|b| b.is_ascii_hexdigit()), "{salt}");
    assert_eq!(store.idempotency_salt().await.unwrap(), salt);
}

/// A reservation is the final check moved in front of the side effect: at a version
/// past `v0` it is stale, and a lease that expired, or was taken over, is refused;
/// neither stores anything.
pub async fn a_stale_or_unfenced_reservation_stores_nothing(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let (id, lease, batch) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let start = batch.pending[0].row;
    let action = call(id, start, "mail__send", 1, at(60_000));
    stored(store, message(http("c1"), "m2"), &a, at(1100)).await;
    let fresh = collect(store, id).await.v0;
    assert!(fresh > batch.v0);
    assert_eq!(
        reserve(store, &lease, batch.v0, &action, at(1200)).await,
        ActionReservation::Stale { version: fresh }
    );
    // The lease expired: refused, even at the current version.
    let expired = lease.expires_at;
    lost(
        store
            .reserve_action(Reserve {
                lease: &lease,
                v0: fresh,
                action: action.clone(),
                now: expired,
            })
            .await,
        "an expired lease",
    );
    // Taken over by b: a's lease is refused although a never saw it go.
    let taken = claimed(store, id, &b, expired).await;
    lost(
        store
            .reserve_action(Reserve {
                lease: &lease,
                v0: fresh,
                action: action.clone(),
                now: expired.plus(ms(10)),
            })
            .await,
        "a replaced holder",
    );
    assert!(
        of_batch(store, id, start).await.is_empty(),
        "nothing stored"
    );
    // The live holder at the current version reserves it.
    reserved(store, &taken, fresh, &action, expired.plus(ms(20))).await;
}

/// A later round (a new claim after the first lease expired) finds the earlier
/// round's reservation in flight until it expires; after that, with no result, it is
/// a fact that the outcome is unknown (stored so, never run again), though a late
/// result of the reserving token still turns it into done, and a wrong token's does
/// not.
pub async fn an_abandoned_reservation_is_in_flight_then_unknown(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let (id, first, batch) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let start = batch.pending[0].row;
    let until = first.expires_at.plus(ms(5000));
    let action = call(id, start, "mail__send", 1, until);
    let row = reserved(store, &first, batch.v0, &action, at(1100)).await;
    let later = claimed(store, id, &b, first.expires_at).await;
    assert_ne!(later.token, first.token);
    assert_eq!(
        reserve(store, &later, batch.v0, &action, first.expires_at).await,
        ActionReservation::InFlight { until }
    );
    let ActionReservation::Unknown(unknown) =
        reserve(store, &later, batch.v0, &action, until).await
    else {
        panic!("an expired reservation without a result is unknown");
    };
    assert_eq!((unknown.id, unknown.state), (row.id, ActionState::Unknown));
    assert_eq!(unknown.token, first.token, "still the reserving token");
    assert!(matches!(
        reserve(store, &later, batch.v0, &action, until.plus(ms(10))).await,
        ActionReservation::Unknown(_)
    ));
    assert_eq!(of_batch(store, id, start).await, vec![unknown]);
    assert!(
        !finish(store, &action.key, later.token, "not mine").await,
        "only the reserving token records a result"
    );
    assert!(finish(store, &action.key, first.token, "sent after all").await);
    let rows = of_batch(store, id, start).await;
    assert_eq!(
        (rows[0].state, rows[0].result.as_deref()),
        (ActionState::Done, Some("sent after all"))
    );
}

/// An idempotent call whose reservation was abandoned is reserved again for the later
/// round (its token and expiry); the earlier token's result no longer counts.
pub async fn an_abandoned_idempotent_reservation_is_reserved_again(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let (id, first, batch) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let start = batch.pending[0].row;
    let action = NewAction {
        idempotent: true,
        ..call(id, start, "kv__put", 1, at(5000))
    };
    let row = reserved(store, &first, batch.v0, &action, at(1100)).await;
    let later = claimed(store, id, &b, first.expires_at).await;
    let renewed = NewAction {
        expires_at: first.expires_at.plus(ms(5000)),
        ..action.clone()
    };
    let again = reserved(store, &later, batch.v0, &renewed, first.expires_at).await;
    assert_eq!(again.id, row.id, "the same row");
    assert_eq!(
        (again.token, again.expires_at),
        (later.token, renewed.expires_at)
    );
    assert!(!finish(store, &action.key, first.token, "late").await);
    assert!(finish(store, &action.key, later.token, "put").await);
    assert_eq!(of_batch(store, id, start).await[0].state, ActionState::Done);
}

/// A destructive call is stored awaiting the person's yes (token 0), asked once;
/// decided once (a second answer is told it was decided); once approved, the next
/// reservation runs it under its lease; refused, it never runs; an id of another
/// conversation is not found.
pub async fn an_approval_is_asked_once_and_decided_once(store: &dyn Store) {
    let a = holder("a");
    let (id, lease, batch) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let start = batch.pending[0].row;
    let question = at(9000);
    let drop_table = destructive(call(id, start, "db__drop", 1, question));
    let row = asked(store, &lease, batch.v0, &drop_table, at(1100)).await;
    assert_eq!(row.expires_at, question);
    assert_eq!(
        reserve(store, &lease, batch.v0, &drop_table, at(1200)).await,
        ActionReservation::Awaiting {
            row: row.clone(),
            asked_now: false
        },
        "asked once"
    );
    assert_eq!(open(store, id, at(1300)).await, vec![row.id]);
    let Decision::Decided(approved) = decide(store, id, row.id, true, at(1400)).await else {
        panic!("an open question is decided");
    };
    assert_eq!(approved.state, ActionState::Approved);
    assert_eq!(
        decide(store, id, row.id, true, at(1500)).await,
        Decision::AlreadyDecided(approved.clone()),
        "a double tap decides once"
    );
    assert_eq!(
        open(store, id, at(1600)).await,
        vec![row.id],
        "approved, not run"
    );
    let run = NewAction {
        expires_at: at(7000),
        ..drop_table.clone()
    };
    let running = reserved(store, &lease, batch.v0, &run, at(1700)).await;
    assert_eq!((running.id, running.expires_at), (row.id, at(7000)));
    assert!(open(store, id, at(1800)).await.is_empty());
    let Decision::AlreadyDecided(late) = decide(store, id, row.id, false, at(1850)).await else {
        panic!("a /cancel after the reservation is too late");
    };
    assert_eq!(late.state, ActionState::Reserved);
    assert!(finish(store, &drop_table.key, lease.token, "dropped").await);
    // Approved, then cancelled before it ran: refused, never run.
    let purge = destructive(call(id, start, "db__purge", 1, question));
    let pending = asked(store, &lease, batch.v0, &purge, at(1860)).await;
    decide(store, id, pending.id, true, at(1870)).await;
    let Decision::Decided(cancelled) = decide(store, id, pending.id, false, at(1880)).await else {
        panic!("an approved call not yet run is still cancelled");
    };
    assert_eq!(cancelled.state, ActionState::Refused);
    assert!(matches!(
        reserve(store, &lease, batch.v0, &purge, at(1890)).await,
        ActionReservation::Refused(_)
    ));
    // Refused: never run.
    let wipe = destructive(call(id, start, "db__wipe", 1, question));
    let pending = asked(store, &lease, batch.v0, &wipe, at(1900)).await;
    let Decision::Decided(refused) = decide(store, id, pending.id, false, at(2000)).await else {
        panic!("an open question is decided");
    };
    assert_eq!(refused.state, ActionState::Refused);
    assert_eq!(
        reserve(store, &lease, batch.v0, &wipe, at(2100)).await,
        ActionReservation::Refused(refused)
    );
    // Not this conversation's, or no such row.
    let (other, _, _) = stored(store, message(http("c2"), "m1"), &a, at(2200)).await;
    assert_eq!(
        decide(store, other, pending.id, true, at(2300)).await,
        Decision::NotFound
    );
    assert_eq!(
        decide(store, id, pending.id + 1000, true, at(2300)).await,
        Decision::NotFound
    );
}

/// A question that expired is refused: an answer after it is told so (and stores the
/// refusal), as is the round that finds it; neither is listed open any more.
pub async fn an_expired_approval_is_refused(store: &dyn Store) {
    let a = holder("a");
    let (id, lease, batch) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let start = batch.pending[0].row;
    let late = destructive(call(id, start, "db__drop", 1, at(3000)));
    let row = asked(store, &lease, batch.v0, &late, at(1100)).await;
    assert_eq!(open(store, id, at(2999)).await, vec![row.id]);
    assert!(open(store, id, at(3000)).await.is_empty(), "expired");
    let Decision::Expired(expired) = decide(store, id, row.id, true, at(3000)).await else {
        panic!("an answer after the expiry is too late");
    };
    assert_eq!((expired.id, expired.state), (row.id, ActionState::Refused));
    assert_eq!(
        decide(store, id, row.id, true, at(3100)).await,
        Decision::AlreadyDecided(expired.clone())
    );
    // Found expired by the round: stored refused.
    let found = destructive(call(id, start, "db__wipe", 1, at(4000)));
    let pending = asked(store, &lease, batch.v0, &found, at(1200)).await;
    let ActionReservation::Refused(refused) =
        reserve(store, &lease, batch.v0, &found, at(4000)).await
    else {
        panic!("an expired question is refused when found");
    };
    assert_eq!(
        (refused.id, refused.state),
        (pending.id, ActionState::Refused)
    );
    assert_eq!(
        decide(store, id, pending.id, true, at(4100)).await,
        Decision::AlreadyDecided(refused)
    );
}

/// A batch's actions are its own (not another batch's, not another conversation's),
/// in the order stored; open approvals are the open questions (not expired) and the
/// approved calls not yet run, oldest first, of that conversation alone; every chat's
/// (the console's) are the same rows, with their chats.
pub async fn a_batch_lists_its_actions_and_open_approvals_only_open_ones(store: &dyn Store) {
    let a = holder("a");
    let (id, lease, batch) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let (other, other_lease, other_batch) = round(store, &http("c2"), &a, &["m1"], at(1000)).await;
    let (start, v0) = (batch.pending[0].row, batch.v0);
    let next = start + 1000;
    let first = reserved(
        store,
        &lease,
        v0,
        &call(id, start, "t__a", 1, at(9000)),
        at(1100),
    )
    .await;
    let elsewhere = call(id, next, "t__a", 1, at(9000));
    reserved(store, &lease, v0, &elsewhere, at(1150)).await;
    let ask = |tool, expires_at| destructive(call(id, start, tool, 1, expires_at));
    let lasting = asked(store, &lease, v0, &ask("t__ask", at(9000)), at(1200)).await;
    let brief = asked(store, &lease, v0, &ask("t__brief", at(2000)), at(1300)).await;
    let yes = asked(store, &lease, v0, &ask("t__yes", at(9000)), at(1400)).await;
    let no = asked(store, &lease, v0, &ask("t__no", at(9000)), at(1500)).await;
    assert!(matches!(
        decide(store, id, yes.id, true, at(1600)).await,
        Decision::Decided(_)
    ));
    assert!(matches!(
        decide(store, id, no.id, false, at(1600)).await,
        Decision::Decided(_)
    ));
    let done = call(id, start, "t__done", 1, at(9000));
    reserved(store, &lease, v0, &done, at(1700)).await;
    assert!(finish(store, &done.key, lease.token, "ok").await);
    // Another conversation's, at the same batch row.
    let theirs = destructive(call(other, start, "t__ask", 1, at(9000)));
    let theirs = asked(store, &other_lease, other_batch.v0, &theirs, at(1800)).await;

    let ids: Vec<i64> = of_batch(store, id, start)
        .await
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids.len(), 6, "{ids:?}");
    assert_eq!(ids[..5], [first.id, lasting.id, brief.id, yes.id, no.id]);
    assert!(ids.is_sorted(), "in the order stored: {ids:?}");
    assert_eq!(of_batch(store, id, next).await.len(), 1);
    assert_eq!(
        open(store, id, at(1900)).await,
        vec![lasting.id, brief.id, yes.id]
    );
    assert_eq!(
        open(store, id, at(2000)).await,
        vec![lasting.id, yes.id],
        "an expired question is not open"
    );
    assert_eq!(open(store, other, at(1900)).await.len(), 1);

    // Every chat's, for the console: the same rows, oldest first, with their chats.
    let waiting = |now, limit| async move {
        store
            .waiting_approvals(now, limit)
            .await
            .expect("reading every chat's open approvals")
            .into_iter()
            .map(|w| (w.action.id, w.conversation.key, w.console_answer))
            .collect::<Vec<_>>()
    };
    let c = |row: &ActionRow, key: &str| (row.id, key.to_owned(), None);
    assert_eq!(
        waiting(at(1900), 10).await,
        [
            c(&lasting, "c1"),
            c(&brief, "c1"),
            c(&yes, "c1"),
            c(&theirs, "c2")
        ]
    );
    assert_eq!(
        waiting(at(2000), 10).await,
        [c(&lasting, "c1"), c(&yes, "c1"), c(&theirs, "c2")],
        "an expired question is not waiting"
    );
    assert_eq!(waiting(at(2000), 2).await.len(), 2, "at most the limit");
    // The console's answers stored in the chat, not yet decided: shown with their
    // approval (a cancel wins over an approve), and only in their own chat.
    for (row, chat, answers) in [
        (&lasting, http("c1"), &[true][..]),
        (&yes, http("c1"), &[true, false][..]),
        (&theirs, http("c1"), &[false][..]),
    ] {
        for &approve in answers {
            let id = crate::store::console_answer_id(row.id, approve);
            stored(store, message(chat.clone(), &id), &a, at(1950)).await;
        }
    }
    assert_eq!(
        waiting(at(2000), 10).await,
        [
            (lasting.id, "c1".to_owned(), Some(true)),
            (yes.id, "c1".to_owned(), Some(false)),
            c(&theirs, "c2")
        ],
        "the console's answers, each in the chat that asked"
    );
}

/// A yes taken with the reservation (the round's way): judged open at the answer's
/// arrival, so an answer that came before the question expired runs although the round
/// reads it after; one that came after does not; and a batch that moved on takes
/// nothing (the question stays open for the round that covers the newer messages).
pub async fn a_yes_is_taken_with_its_reservation_judged_at_its_arrival(store: &dyn Store) {
    use std::time::Duration;
    let a = holder("a");
    let (id, lease, batch) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let start = batch.pending[0].row;
    let ask = destructive(call(id, start, "db__drop", 1, at(3000)));
    let row = asked(store, &lease, batch.v0, &ask, at(1100)).await;
    // Read at 3.5 s, the answers having arrived at 2.5 s: still open then.
    let listed = store
        .open_approvals(
            ConversationAt {
                conversation: id,
                now: at(3500),
            },
            Duration::from_millis(1000),
        )
        .await
        .unwrap();
    assert_eq!(listed.iter().map(|r| r.id).collect::<Vec<_>>(), [row.id]);
    let yes = |ago: u64| NewAction {
        approved: Some(Duration::from_millis(ago)),
        expires_at: at(9000),
        ..ask.clone()
    };
    stored(store, message(http("c1"), "m2"), &a, at(3400)).await;
    assert!(
        matches!(
            reserve(store, &lease, batch.v0, &yes(1000), at(3500)).await,
            ActionReservation::Stale { .. }
        ),
        "a batch that moved on takes nothing"
    );
    let fresh = collect(store, id).await;
    let running = reserved(store, &lease, fresh.v0, &yes(1000), at(3500)).await;
    assert_eq!((running.id, running.state), (row.id, ActionState::Reserved));

    let late = destructive(call(id, start, "db__wipe", 1, at(3000)));
    asked(store, &lease, fresh.v0, &late, at(1100)).await;
    let after = NewAction {
        approved: Some(Duration::from_millis(100)),
        ..late.clone()
    };
    assert!(matches!(
        reserve(store, &lease, fresh.v0, &after, at(3500)).await,
        ActionReservation::Refused(_)
    ));
}

/// Two answers at once (a double tap, two replicas): two yeses decide once; a yes and
/// a no end refused in either order (the no decides, after the yes or instead of it).
pub async fn concurrent_decisions_decide_once(store: &dyn Store) {
    let a = holder("a");
    let (id, lease, batch) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let start = batch.pending[0].row;
    for n in 0..4 {
        let ask = destructive(call(id, start, "db__drop", n, at(9000)));
        let pending = asked(store, &lease, batch.v0, &ask, at(1100)).await;
        let (yes, no) = tokio::join!(
            store.decide_action(ApprovalAnswer {
                conversation: id,
                id: pending.id,
                approve: true,
                now: at(1200)
            }),
            store.decide_action(ApprovalAnswer {
                conversation: id,
                id: pending.id,
                approve: false,
                now: at(1200)
            }),
        );
        let answers = [yes.unwrap(), no.unwrap()];
        assert!(
            matches!(&answers[1], Decision::Decided(row) if row.state == ActionState::Refused),
            "{answers:?}"
        );
        let rows = of_batch(store, id, start).await;
        let row = rows.iter().find(|r| r.id == pending.id).unwrap();
        assert_eq!(row.state, ActionState::Refused, "{answers:?}");
        let ask = destructive(call(id, start, "db__keep", n, at(9000)));
        let pending = asked(store, &lease, batch.v0, &ask, at(1100)).await;
        let tap = || {
            store.decide_action(ApprovalAnswer {
                conversation: id,
                id: pending.id,
                approve: true,
                now: at(1200),
            })
        };
        let (one, two) = tokio::join!(tap(), tap());
        let answers = [one.unwrap(), two.unwrap()];
        let decided = answers
            .iter()
            .filter(|d| matches!(d, Decision::Decided(_)))
            .count();
        assert_eq!(decided, 1, "{answers:?}");
    }
}

/// The same call reserved twice at once by the same round: one row, reserved once.
pub async fn concurrent_reservations_of_one_key_store_one_row(store: &dyn Store) {
    let a = holder("a");
    let (id, lease, batch) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let start = batch.pending[0].row;
    let action = call(id, start, "mail__send", 1, at(9000));
    let (one, two) = tokio::join!(
        store.reserve_action(Reserve {
            lease: &lease,
            v0: batch.v0,
            action: action.clone(),
            now: at(1100)
        }),
        store.reserve_action(Reserve {
            lease: &lease,
            v0: batch.v0,
            action: action.clone(),
            now: at(1100)
        }),
    );
    let (ActionReservation::Reserved(one), ActionReservation::Reserved(two)) =
        (one.unwrap(), two.unwrap())
    else {
        panic!("both asks find the reservation");
    };
    assert_eq!(one.id, two.id);
    assert_eq!(of_batch(store, id, start).await.len(), 1);
}
