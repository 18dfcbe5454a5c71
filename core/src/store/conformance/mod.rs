//! One test body for every [`Store`] backend: the contract checked from the outside,
//! through the trait alone, so SQLite and PostgreSQL answer to the same checks.
//!
//! A backend's tests run every check with [`store_conformance!`](crate::store_conformance),
//! given an async function that opens a fresh, empty store with the timer policy it is
//! handed ([`policy`]):
//!
//! ```ignore
//! async fn open(timers: TimerPolicy) -> Box<dyn Store> { /* a fresh database */ }
//! lull_core::store_conformance!(open);
//! ```
//!
//! Time is an argument of every store call, so the checks use their own timeline
//! ([`at`]) and never sleep. Exists only in builds with the `conformance` feature.
//!
//! The checks are split by the contract's areas, one file each, named as in `contract/`,
//! `sqlite/` and `postgres/`:
//! - `messages`: ingest, media, edits, catch-up reads.
//! - `leases`: compare-and-swap claims, renewal, release, fencing.
//! - `rounds`: the claim, the final check, the cap, give-ups, transcripts, failures.
//! - `outbox`: delivery order, the row's stored time, a notice's quick replies.
//! - `work`: due work between holders, settled conversations, health.
//! - `limits`: the rate hold, the token wallet, access decisions.
//! - `actions`: the journal (reserved before acting, fenced and at `v0`; a finished
//!   action is a fact; approvals asked once and decided once).
//! - `settings`: a conversation's own choices, applied once and fresh, and `/stop`.
//! - `reactions`: an ack reaction claimed once per pending burst.
//! - `rhythm`: a committed reply teaches the rhythm; ingest waits what it allows.
//! - `overheard`: group context kept once per platform message, bounded, never pending.
//! - `threads`: a thread lull opened is remembered once, per platform and key.
//! - `jobs`: a job made once per origin, within its chat's limit; each occurrence fired
//!   once with its output; a cancelled job never fires; a chat's time zone.
//! - `memories`: written with a committed reply or not at all, each fact once per
//!   scope; a scope keeps its newest; the commands touch their scope only;
//!   `/forgetme` erases one person's memories and texts; concurrent commits keep
//!   every fact; a clear or an erase fences the rounds in flight.
//! - `summaries`: a summary is stored under its lease only if it covers more, never
//!   after a `/new` or a `/forgetme`, and read with the exchanges after it; retention removes old
//!   texts of answered messages and delivered replies only.
//! - `status`: the operator's view counts what the rows say, the same on every backend.

mod actions;
mod jobs;
mod leases;
mod limits;
mod memories;
mod messages;
mod outbox;
mod overheard;
mod reactions;
mod rhythm;
mod rounds;
mod settings;
mod status;
mod summaries;
mod threads;
mod work;

pub use actions::*;
pub use jobs::*;
pub use leases::*;
pub use limits::*;
pub use memories::*;
pub use messages::*;
pub use outbox::*;
pub use overheard::*;
pub use reactions::*;
pub use rhythm::*;
pub use rounds::*;
pub use settings::*;
pub use status::*;
pub use summaries::*;
pub use threads::*;
pub use work::*;

use super::{
    Batch, CommitOutcome, DueWork, IngestOutcome, NewMessage, NewReply, Store, StoreError,
    WorkQuery,
};
use crate::domain::{
    ConversationId, ConversationRef, HolderId, Lease, LeaseKey, OutboxId, Platform, Timestamp,
    Version,
};
use crate::store::{ConversationAt, LeaseClaim, LeaseRelease, OutboxRow, PartSent, ReplyCommit};
use crate::timing::TimerPolicy;
use std::time::Duration;

/// Runs every conformance check as its own `#[tokio::test]`, each on a fresh store
/// opened by `$open`: a path to an `async fn(TimerPolicy) -> S` where `S`
/// dereferences to a [`Store`] (a `Box`, an `Arc`, or a guard that also keeps a
/// temporary folder alive). The calling crate depends on tokio.
#[macro_export]
macro_rules! store_conformance {
    ($open:path) => {
        $crate::store_conformance!(@checks $open, each);
    };
    // `$open` returns an `Option`: `None` skips the check (a backend whose server is
    // not installed here).
    (optional $open:path) => {
        $crate::store_conformance!(@checks $open, each_optional);
    };
    (@checks $open:path, $each:ident) => {
        $crate::store_conformance!(@$each $open;
            ingest_is_idempotent,
            media_are_stored_with_their_message,
            a_transcript_is_stored_once_under_the_lease,
            ingest_bumps_the_version_and_arms_the_capped_timer,
            edits_change_only_pending_messages,
            a_lease_is_claimed_by_compare_and_swap,
            a_lease_is_renewed_and_released,
            fencing_refuses_a_replaced_holder,
            fencing_refuses_an_earlier_claim_of_the_same_holder,
            a_commit_answers_the_batch,
            a_newer_message_makes_the_reply_stale,
            the_cap_forces_a_stale_reply_out,
            a_forced_reply_leaves_an_edited_message_pending,
            giving_up_covers_each_message_once,
            a_timer_with_pending_messages_is_never_disarmed,
            the_outbox_is_delivered_in_order,
            failures_back_off_and_reset_starts_afresh,
            due_work_hands_timers_off_between_holders,
            due_work_leaves_leased_conversations_alone,
            due_work_includes_undelivered_outbox_rows,
            recent_conversations_resume_after_the_last_stored_message,
            settled_and_pending_conversations,
            ping_answers_on_a_sound_store,
            a_round_is_claimed_with_what_it_works_on,
            an_outbox_row_is_stored_at_one_time_in_every_read,
            a_notice_keeps_its_quick_replies,
            the_last_part_is_recorded_with_the_release,
            a_rate_limit_holds_the_conversation_until_the_window_has_room,
            edits_count_in_the_rate_window,
            a_token_charge_is_all_or_nothing_and_fenced,
            concurrent_token_charges_never_pass_a_budget,
            dollars_are_charged_checked_and_given_back_like_tokens,
            a_reservation_crowded_out_by_open_reservations_waits_a_moment,
            charges_naming_their_scopes_in_any_order_never_deadlock,
            a_refused_charge_without_a_hold_holds_nothing,
            an_abandoned_reservation_is_given_back_at_the_next_claim_on_its_day,
            a_settled_reservation_is_not_given_back,
            held_out_messages_are_covered_by_their_notice_with_the_reply,
            a_stale_reply_stores_no_held_out_notice,
            an_access_decision_replaces_the_earlier_one,
            a_reservation_is_stored_once_and_finished_once,
            a_call_without_an_answer_is_stored_unknown,
            the_idempotency_salt_is_made_once,
            a_stale_or_unfenced_reservation_stores_nothing,
            an_abandoned_reservation_is_in_flight_then_unknown,
            an_abandoned_idempotent_reservation_is_reserved_again,
            an_approval_is_asked_once_and_decided_once,
            an_expired_approval_is_refused,
            a_batch_lists_its_actions_and_open_approvals_only_open_ones,
            concurrent_decisions_decide_once,
            a_yes_is_taken_with_its_reservation_judged_at_its_arrival,
            concurrent_reservations_of_one_key_store_one_row,
            the_status_counts_what_the_rows_say,
            the_console_lists_chats_with_their_choices_and_state,
            the_console_lists_a_days_people_by_their_use,
            a_setting_is_applied_once_and_per_conversation,
            a_setting_changed_mid_generation_makes_the_reply_stale,
            stop_closes_the_pending_messages_and_the_generation,
            a_control_fences_even_a_forced_reply,
            an_idle_conversation_starts_afresh,
            retry_answers_the_last_batch_again,
            concurrent_picks_apply_once_and_never_slip_under_a_commit,
            a_command_is_claimed_once,
            an_ack_is_claimed_once_per_burst_and_taken_once,
            an_answered_message_claims_no_ack,
            concurrent_claims_of_one_burst_claim_once,
            overheard_messages_are_kept_once_and_bounded,
            overheard_messages_arm_no_timer,
            a_reset_forgets_overheard_messages,
            a_thread_is_remembered,
            a_job_is_made_once_per_origin_within_the_limit,
            a_reminder_fires_once,
            a_recurring_job_arms_its_next_occurrence,
            a_task_fires_as_a_message_from_its_creator,
            a_cancelled_job_never_fires,
            every_chats_active_jobs_are_listed_next_first,
            a_chat_keeps_its_time_zone,
            memories_are_written_with_a_committed_reply_only,
            a_scope_keeps_its_newest_memories,
            the_commands_change_their_scope_only,
            forgetting_a_person_erases_their_memories_and_texts,
            concurrent_commits_keep_every_fact,
            a_clear_fences_the_rounds_in_flight,
            a_summary_is_stored_under_its_lease_only_if_it_covers_more,
            retention_removes_old_answered_and_delivered_texts_only,
            a_summary_made_before_forgetme_is_not_stored,
            a_commit_teaches_the_rhythm_of_its_burst,
            a_typing_author_holds_the_timer_never_past_the_cap,
        );
        // Checks of adaptive waiting, on a store opened with `adaptive_policy()`.
        $crate::store_conformance!(@$each $open, adaptive_policy;
            ingest_arms_the_wait_the_rhythm_allows,
            ingest_picks_the_burst_window_inside_a_burst,
        );
    };
    (@each $open:path; $($check:ident),* $(,)?) => {
        $crate::store_conformance!(@each $open, policy; $($check),*);
    };
    (@each_optional $open:path; $($check:ident),* $(,)?) => {
        $crate::store_conformance!(@each_optional $open, policy; $($check),*);
    };
    (@each $open:path, $policy:ident; $($check:ident),* $(,)?) => {
        $(
            #[::tokio::test]
            async fn $check() {
                let store = $open($crate::store::conformance::$policy()).await;
                $crate::store::conformance::$check(&*store).await;
            }
        )*
    };
    (@each_optional $open:path, $policy:ident; $($check:ident),* $(,)?) => {
        $(
            #[::tokio::test]
            async fn $check() {
                let Some(store) = $open($crate::store::conformance::$policy()).await else {
                    return;
                };
                $crate::store::conformance::$check(&*store).await;
            }
        )*
    };
}

/// The timer policy every check assumes: a 1 s debounce, a 4 s cap, a batch of 4.
pub fn policy() -> TimerPolicy {
    TimerPolicy::new(ms(1000), ms(4000), 4).expect("the conformance policy is valid")
}

/// [`policy`] with adaptive waiting, the shortest wait 200 ms.
pub fn adaptive_policy() -> TimerPolicy {
    policy()
        .adaptive(ms(200))
        .expect("the adaptive conformance policy is valid")
}

/// The lease lifetime the checks claim with.
const TTL: Duration = Duration::from_secs(10);

/// The checks' timeline: `n` milliseconds after their epoch.
pub fn at(n: u64) -> Timestamp {
    Timestamp(1_700_000_000_000).plus(ms(n))
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn holder(name: &str) -> HolderId {
    HolderId::new(name)
}

fn http(key: &str) -> ConversationRef {
    ConversationRef::new(Platform::Http, key)
}

fn message(conversation: ConversationRef, id: &str) -> NewMessage {
    NewMessage {
        conversation,
        is_group: false,
        message_id: id.into(),
        user_id: "u1".into(),
        author: "Ann".into(),
        // A complete sentence: adaptive waiting gives a fragment the full window.
        text: format!("text of {id}."),
        media: Vec::new(),
    }
}

fn reply(text: &str) -> NewReply {
    NewReply {
        text: text.into(),
        usage: None,
        llm_ms: 1,
        held_out: Vec::new(),
        memories: Default::default(),
    }
}

/// Ingest a message that must be stored: its conversation, version and timer deadline.
async fn stored(
    store: &dyn Store,
    message: NewMessage,
    by: &HolderId,
    now: Timestamp,
) -> (ConversationId, Version, Timestamp) {
    let id = message.message_id.clone();
    match store.ingest(message, by, now).await {
        Ok(IngestOutcome::Stored {
            conversation,
            version,
            due_at,
        }) => (conversation, version, due_at),
        other => panic!("message {id} was not stored: {other:?}"),
    }
}

async fn claim(store: &dyn Store, key: &LeaseKey, by: &HolderId, now: Timestamp) -> Option<Lease> {
    store
        .claim_lease(LeaseClaim {
            key,
            holder: by,
            ttl: TTL,
            now,
        })
        .await
        .expect("claiming a lease")
}

async fn claimed(
    store: &dyn Store,
    conversation: ConversationId,
    by: &HolderId,
    now: Timestamp,
) -> Lease {
    claim(store, &LeaseKey::Conversation(conversation), by, now)
        .await
        .unwrap_or_else(|| panic!("the lease on {conversation} is free at {now:?}"))
}

/// Give `lease` back at `now`, with nothing delivered to record.
async fn release(store: &dyn Store, lease: &Lease, now: Timestamp) {
    let release = LeaseRelease {
        lease,
        last_sent: None,
        now,
    };
    store
        .release_lease(release)
        .await
        .expect("releasing a lease");
}

/// Record that the first `parts_sent` parts of `outbox` were delivered (`done`: all).
async fn mark(store: &dyn Store, outbox: OutboxId, parts_sent: u32, done: bool, now: Timestamp) {
    let sent = PartSent {
        outbox,
        parts_sent,
        done,
    };
    store
        .mark_sent(sent, now)
        .await
        .expect("marking parts sent");
}

/// The outbox rows of `conversation` due at `now`.
async fn owed(store: &dyn Store, conversation: ConversationId, now: Timestamp) -> Vec<OutboxRow> {
    let at = ConversationAt { conversation, now };
    store.due_outbox(at).await.expect("reading the outbox")
}

async fn collect(store: &dyn Store, conversation: ConversationId) -> Batch {
    store
        .collect(conversation, 10)
        .await
        .expect("collecting a batch")
}

/// A round about to generate: the messages `ids` stored in `conversation` by `by`,
/// 100 ms apart from 0, then the lease claimed by `by` at `claim_at` and the batch
/// collected.
async fn round(
    store: &dyn Store,
    conversation: &ConversationRef,
    by: &HolderId,
    ids: &[&str],
    claim_at: Timestamp,
) -> (ConversationId, Lease, Batch) {
    let mut id = None;
    for (n, message_id) in (0..).zip(ids) {
        let message = message(conversation.clone(), message_id);
        id = Some(stored(store, message, by, at(100 * n)).await.0);
    }
    let id = id.expect("a round has messages");
    let lease = claimed(store, id, by, claim_at).await;
    (id, lease, collect(store, id).await)
}

fn pending_ids(batch: &Batch) -> Vec<&str> {
    batch
        .pending
        .iter()
        .map(|m| m.message_id.as_str())
        .collect()
}

async fn committed(
    store: &dyn Store,
    lease: &Lease,
    batch: &Batch,
    text: &str,
    now: Timestamp,
) -> (OutboxId, bool) {
    match store
        .commit_reply(ReplyCommit {
            lease,
            batch,
            reply: reply(text),
            now,
        })
        .await
    {
        Ok(CommitOutcome::Committed { outbox, forced, .. }) => (outbox.id, forced),
        other => panic!("the reply {text:?} was not committed: {other:?}"),
    }
}

/// Commit a reply that must be refused as stale: the version the conversation is at.
async fn stale(store: &dyn Store, lease: &Lease, batch: &Batch, now: Timestamp) -> Version {
    match store
        .commit_reply(ReplyCommit {
            lease,
            batch,
            reply: reply("stale"),
            now,
        })
        .await
    {
        Ok(CommitOutcome::Stale { version }) => version,
        other => panic!("the reply was not stale: {other:?}"),
    }
}

fn lost<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) {
    assert!(
        matches!(result, Err(StoreError::LeaseLost(_))),
        "{what}: expected LeaseLost, got {result:?}"
    );
}

fn query(by: &HolderId, limit: usize) -> WorkQuery {
    WorkQuery {
        platforms: vec![Platform::Http],
        holder: by.clone(),
        handoff: ms(500),
        limit,
    }
}

async fn due(store: &dyn Store, query: &WorkQuery, now: Timestamp) -> DueWork {
    store.due_work(query, now).await.expect("finding due work")
}

#[cfg(test)]
mod tests {
    /// Every check is run: each `pub async fn` of the area files is named in
    /// `store_conformance!`, the only place that runs them.
    #[test]
    fn the_macro_runs_every_check() {
        let (macro_body, _) = include_str!("mod.rs")
            .split_once("/// The timer policy every check assumes")
            .expect("the macro comes first");
        let checks = concat!(
            include_str!("messages.rs"),
            include_str!("leases.rs"),
            include_str!("rounds.rs"),
            include_str!("outbox.rs"),
            include_str!("work.rs"),
            include_str!("limits.rs"),
            include_str!("actions.rs"),
            include_str!("status.rs"),
            include_str!("settings.rs"),
            include_str!("reactions.rs"),
            include_str!("rhythm.rs"),
            include_str!("overheard.rs"),
            include_str!("threads.rs"),
            include_str!("jobs.rs"),
        );
        let missing: Vec<&str> = checks
            .split("\npub async fn ")
            .skip(1)
            .filter_map(|rest| rest.split_once('(').map(|(name, _)| name))
            .filter(|name| !macro_body.contains(&format!("{name},")))
            .collect();
        assert!(missing.is_empty(), "checks never run: {missing:?}");
    }
}
