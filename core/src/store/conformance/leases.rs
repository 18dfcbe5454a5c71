//! Conformance of the leases area: compare-and-swap claims, renewal, release, fencing.

use super::{
    TTL, at, claim, claimed, collect, committed, holder, http, lost, message, ms, owed,
    pending_ids, release, reply, round, stored,
};
use crate::domain::{Lease, LeaseKey, Platform, Timestamp};
use crate::store::{
    Batch, CommitOutcome, GiveUp, IdleDisarm, LeaseClaim, LeaseRelease, LeaseRenewal, PartSent,
    ReplyCommit, RoundFailure, Store, StoreError,
};

/// What the store answers a commit of the reply "late" under `lease`.
async fn commit_late(
    store: &dyn Store,
    lease: &Lease,
    batch: &Batch,
    now: Timestamp,
) -> Result<CommitOutcome, StoreError> {
    let commit = ReplyCommit {
        lease,
        batch,
        reply: reply("late"),
        now,
    };
    store.commit_reply(commit).await
}

/// Exclusive: a lease is claimed only while free or expired, and every claim bumps
/// the fencing token.
pub async fn a_lease_is_claimed_by_compare_and_swap(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let (id, _, _) = stored(store, message(http("c1"), "m1"), &a, at(0)).await;
    let key = LeaseKey::Conversation(id);
    let first = claim(store, &key, &a, at(0)).await.expect("a free lease");
    assert_eq!((&first.key, &first.holder), (&key, &a));
    assert_eq!(first.expires_at, at(0).plus(TTL));
    assert!(
        claim(store, &key, &b, at(1)).await.is_none(),
        "a live lease is not claimable"
    );
    assert!(
        claim(store, &key, &a, at(1)).await.is_none(),
        "not even by its holder"
    );
    let second = claim(store, &key, &b, first.expires_at)
        .await
        .expect("an expired lease is claimable");
    assert!(second.token > first.token, "fencing tokens only grow");
    let poller = LeaseKey::Poller(Platform::Telegram, 0);
    let polling = claim(store, &poller, &a, at(2)).await;
    assert!(
        polling.is_some(),
        "leases of other resources are independent"
    );
    assert!(claim(store, &poller, &b, at(3)).await.is_none());
    let shard = LeaseKey::Poller(Platform::Telegram, 1);
    assert!(
        claim(store, &shard, &b, at(3)).await.is_some(),
        "each shard of a platform has a lease of its own"
    );
    assert!(claim(store, &shard, &a, at(4)).await.is_none());
    let slot = LeaseKey::Replica(Platform::Telegram, 1);
    assert!(
        claim(store, &slot, &a, at(4)).await.is_some(),
        "a replica slot is no shard's lease"
    );
    assert!(claim(store, &slot, &b, at(5)).await.is_none());
}

/// A renewal extends only the live holder's lease; a release frees it at once, and
/// never frees a lease taken over since.
pub async fn a_lease_is_renewed_and_released(store: &dyn Store) {
    let (a, b, c) = (holder("a"), holder("b"), holder("c"));
    let (id, _, _) = stored(store, message(http("c1"), "m1"), &a, at(0)).await;
    let key = LeaseKey::Conversation(id);
    let lease = claimed(store, id, &a, at(0)).await;
    let renewed = store
        .renew_lease(LeaseRenewal {
            lease: &lease,
            ttl: TTL,
            now: at(5000),
        })
        .await
        .unwrap();
    assert_eq!(renewed.expires_at, at(5000).plus(TTL));
    assert_eq!(renewed.token, lease.token, "a renewal is no new claim");
    assert!(
        claim(store, &key, &b, lease.expires_at).await.is_none(),
        "a renewed lease outlives its first expiry"
    );
    release(store, &renewed, renewed.expires_at).await;
    let taken = claim(store, &key, &b, at(5001))
        .await
        .expect("a released lease is claimable at once");
    assert!(taken.token > renewed.token);
    lost(
        store
            .renew_lease(LeaseRenewal {
                lease: &renewed,
                ttl: TTL,
                now: at(5002),
            })
            .await,
        "renewing a lease taken over",
    );
    release(store, &renewed, renewed.expires_at).await;
    assert!(
        claim(store, &key, &c, at(5003)).await.is_none(),
        "releasing a lost lease leaves the new holder's alone"
    );
    store
        .renew_lease(LeaseRenewal {
            lease: &taken,
            ttl: TTL,
            now: at(5004),
        })
        .await
        .unwrap();
    lost(
        store
            .renew_lease(LeaseRenewal {
                lease: &taken,
                ttl: TTL,
                now: at(60_000),
            })
            .await,
        "renewing an expired lease",
    );
}

/// Exclusive: the fencing token, not the holder's name, decides. A process whose
/// lease expired and that claimed the conversation again (a stalled round and a new
/// one in the same process) holds a new token; writes under the old one are refused.
pub async fn fencing_refuses_an_earlier_claim_of_the_same_holder(store: &dyn Store) {
    let a = holder("a");
    let (id, old, batch) = round(store, &http("c1"), &a, &["m1"], at(0)).await;
    let new = claimed(store, id, &a, old.expires_at).await;
    assert!(new.token > old.token, "every claim bumps the token");
    let now = old.expires_at.plus(ms(1));
    lost(
        store
            .renew_lease(LeaseRenewal {
                lease: &old,
                ttl: TTL,
                now,
            })
            .await,
        "a renewal under the earlier token",
    );
    lost(
        commit_late(store, &old, &batch, now).await,
        "a commit under the earlier token",
    );
    lost(
        store
            .record_failure(RoundFailure {
                lease: &old,
                retry_at: at(60_000),
                now,
            })
            .await,
        "a failure recorded under the earlier token",
    );
    committed(store, &new, &batch, "fresh", now).await;
}

/// Fencing: a holder whose lease expired and was taken over writes nothing; the new
/// holder's commit goes through. An expired lease nobody took is no lease either.
pub async fn fencing_refuses_a_replaced_holder(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let c1 = http("c1");
    let (id, old, batch) = round(store, &c1, &a, &["m1"], at(0)).await;
    let new = claimed(store, id, &b, old.expires_at).await;
    let now = old.expires_at.plus(ms(1));
    lost(
        commit_late(store, &old, &batch, now).await,
        "a commit of the replaced holder",
    );
    lost(
        store
            .give_up(GiveUp {
                lease: &old,
                batch: &batch,
                notice: "late",
                quick_replies: &[],
                now,
            })
            .await,
        "a give-up of the replaced holder",
    );
    lost(
        store
            .record_failure(RoundFailure {
                lease: &old,
                retry_at: at(60_000),
                now,
            })
            .await,
        "a failure recorded by the replaced holder",
    );
    lost(
        store
            .disarm_idle_timer(IdleDisarm {
                lease: &old,
                v0: batch.v0,
                now,
            })
            .await,
        "a timer disarmed by the replaced holder",
    );
    let untouched = collect(store, id).await;
    assert_eq!(pending_ids(&untouched), ["m1"]);
    assert_eq!(untouched.timer.map(|t| t.attempts), Some(0));
    assert!(owed(store, id, now).await.is_empty());
    let (outbox, forced) = committed(store, &new, &untouched, "fresh", now).await;
    assert!(!forced);
    assert_eq!(owed(store, id, now).await[0].id, outbox);

    stored(store, message(c1, "m2"), &a, now).await;
    let batch = collect(store, id).await;
    lost(
        store
            .commit_reply(ReplyCommit {
                lease: &new,
                batch: &batch,
                reply: reply("expired"),
                now: new.expires_at,
            })
            .await,
        "a commit under an expired lease",
    );
}

/// The last part a round delivered is recorded with the release of its lease; it is
/// recorded even when the lease was lost meanwhile (a delivered part is a fact), and a
/// lost lease stays with its new holder.
pub async fn the_last_part_is_recorded_with_the_release(store: &dyn Store) {
    let (a, b) = (holder("a"), holder("b"));
    let (id, lease, batch) = round(store, &http("c1"), &a, &["m1"], at(1000)).await;
    let (reply, _) = committed(store, &lease, &batch, "answer", at(1000)).await;
    let sent = |parts_sent, done| PartSent {
        outbox: reply,
        parts_sent,
        done,
    };
    store
        .release_lease(LeaseRelease {
            lease: &lease,
            last_sent: Some(sent(1, false)),
            now: at(1100),
        })
        .await
        .unwrap();
    assert_eq!(owed(store, id, at(1100)).await[0].parts_sent, 1);
    let again = claimed(store, id, &a, at(1200)).await;
    // The lease expires and another holder takes it before the release.
    let taker = claimed(store, id, &b, again.expires_at).await;
    store
        .release_lease(LeaseRelease {
            lease: &again,
            last_sent: Some(sent(2, true)),
            now: again.expires_at,
        })
        .await
        .unwrap();
    assert!(
        owed(store, id, again.expires_at).await.is_empty(),
        "the last part was recorded though the lease was lost"
    );
    lost(
        store
            .claim_lease(LeaseClaim {
                key: &LeaseKey::Conversation(id),
                holder: &a,
                ttl: ms(3000),
                now: again.expires_at,
            })
            .await
            .map(|l| l.ok_or(StoreError::LeaseLost(LeaseKey::Conversation(id))))
            .and_then(|r| r),
        "the taker still holds it",
    );
    let _ = taker;
}
