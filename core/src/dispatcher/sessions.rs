//! Platform sessions: electing the one process that holds a platform connection, and
//! handing the adapter one session at a time.
//!
//! Telegram allows one long-poller per bot token (a second gets 409 Conflict) and
//! Discord delivers each event to every connected session, so with several processes
//! on one database exactly one holds the platform's *poller lease* (the same
//! compare-and-swap row with expiry as conversation leases) and the others stand by,
//! retrying the claim, and take over within the lease TTL when the holder dies. This
//! loop exists once, here; adapters only run sessions.
//!
//! A platform split into shards (Discord's gateway) runs one election per shard, each
//! with a lease of its own (`LeaseKey::Poller(platform, shard)`): several processes
//! then hold different shards at once, and a dead process's shards are taken over by
//! the others within the lease TTL. Exclusive per shard: at most one process holds a
//! shard's connection.
//!
//! So that replicas split the shards rather than the first one holding them all, each
//! process also holds a *replica slot* (`LeaseKey::Replica(platform, n)`, the lowest
//! free one). Shard N belongs to the replica in slot N: while that slot is held by
//! another live process, this one does not claim shard N, and hands it over (ends the
//! session and releases the lease at once) if it holds it. A shard whose slot is empty
//! (fewer replicas than shards, or its replica died) is claimed by whoever is first.

use std::sync::Arc;

use lull_port::{AdapterState, Backoff, Health, Inbound, SessionEnd, Shard};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Dispatcher;
use super::lease_keeper::{LeaseKeeper, claim};
use crate::domain::{LeaseKey, Platform};

/// Pauses between failed sessions of one platform.
const SESSION_BACKOFF: Backoff = Backoff::new(
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(30),
);

/// Why a platform's connection stopped for good.
#[derive(Debug, thiserror::Error)]
#[error("the {platform} adapter stopped: {reason}")]
pub struct SessionsEnded {
    pub platform: Platform,
    pub reason: String,
}

/// Hold `inbound`'s platform connection, each of its shards whenever this process
/// wins that shard's poller lease, until `shutdown`: standing by while other processes
/// hold them, handing a shard over at once on shutdown or after a failed session (and
/// trying again after a backoff), and returning an error when a session says trying
/// again cannot help (a rejected token); the other shards are then left too.
pub(super) async fn serve(
    dispatcher: &Arc<Dispatcher>,
    inbound: Arc<dyn Inbound>,
    health: Health,
    shutdown: CancellationToken,
) -> Result<(), SessionsEnded> {
    let platform = inbound.platform();
    health.set(platform, AdapterState::Starting);
    let Some(total) = shard_count(inbound.as_ref(), &health, &shutdown).await? else {
        return Ok(());
    };
    if total == 1 {
        return serve_shard(dispatcher, inbound, Shard::ONLY, None, &health, &shutdown).await;
    }
    tracing::info!(%platform, shards = total, "the platform connection is split into shards; each is elected on its own");
    // A fatal end of one shard stops the others: they share the token it refused.
    let stop = shutdown.child_token();
    let (slot_tx, slot) = watch::channel(None);
    let membership = tokio::spawn(hold_replica_slot(
        dispatcher.clone(),
        platform,
        total,
        slot_tx,
        stop.clone(),
    ));
    // The first slot attempt first: a shard's election must not take this process's
    // own slot for another replica's.
    let mut first = slot.clone();
    tokio::select! {
        _ = first.changed() => {}
        () = stop.cancelled() => {}
    }
    let mut shards = tokio::task::JoinSet::new();
    for shard in Shard::all(total) {
        let (dispatcher, inbound, health, stop, slot) = (
            dispatcher.clone(),
            inbound.clone(),
            health.clone(),
            stop.clone(),
            slot.clone(),
        );
        shards.spawn(async move {
            serve_shard(&dispatcher, inbound, shard, Some(slot), &health, &stop).await
        });
    }
    let mut ended = Ok(());
    while let Some(joined) = shards.join_next().await {
        let result = joined.unwrap_or_else(|e| {
            Err(SessionsEnded {
                platform,
                reason: format!("a shard's task failed: {e}"),
            })
        });
        if let Err(e) = result {
            stop.cancel();
            if ended.is_ok() {
                ended = Err(e);
            }
        }
    }
    stop.cancel();
    let _ = membership.await;
    ended
}

/// Hold the lowest free replica slot of `platform` (of `total`, one per shard) until
/// `stop`, publishing it in `slot` (`None` while this process has none: all taken, or
/// the slot's lease was lost), and trying again every renewal interval.
async fn hold_replica_slot(
    dispatcher: Arc<Dispatcher>,
    platform: Platform,
    total: u32,
    slot: watch::Sender<Option<u32>>,
    stop: CancellationToken,
) {
    loop {
        let mut held = None;
        for n in 0..total {
            match claim(&dispatcher, LeaseKey::Replica(platform, n)).await {
                Ok(Some(keeper)) => {
                    held = Some((n, keeper));
                    break;
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(%platform, error = %e, "could not claim a replica slot");
                    break;
                }
            }
        }
        // Published after every attempt, so the shards' elections can wait for the
        // first one.
        slot.send_replace(held.as_ref().map(|(n, _)| *n));
        if let Some((n, keeper)) = held {
            tracing::info!(%platform, slot = n, "this process is replica {n}: shard {n} is handed to it");
            tokio::select! {
                () = keeper.lost() => {
                    tracing::warn!(%platform, slot = n, "the replica slot was lost");
                    slot.send_replace(None);
                }
                () = stop.cancelled() => {
                    keeper.release().await;
                    return;
                }
            }
        }
        tokio::select! {
            () = tokio::time::sleep(dispatcher.settings.lease.renew_every()) => {}
            () = stop.cancelled() => return,
        }
    }
}

/// Whether `shard` belongs to another live replica: its replica slot is held, and not
/// by this process (whose slot is `mine`). Found by claiming the slot: a slot that
/// can be claimed is free (and is given back at once).
async fn belongs_elsewhere(
    dispatcher: &Dispatcher,
    platform: Platform,
    shard: Shard,
    mine: Option<u32>,
) -> bool {
    if mine == Some(shard.index()) {
        return false;
    }
    match claim(dispatcher, LeaseKey::Replica(platform, shard.index())).await {
        Ok(Some(probe)) => {
            probe.release().await;
            false
        }
        Ok(None) => true,
        Err(_) => false,
    }
}

/// Completes once `shard` belongs to another live replica (checked every renewal
/// interval); never for a platform that is not sharded.
async fn wanted_elsewhere(
    dispatcher: &Dispatcher,
    platform: Platform,
    shard: Shard,
    slot: Option<&watch::Receiver<Option<u32>>>,
) {
    let Some(slot) = slot else {
        return std::future::pending().await;
    };
    loop {
        tokio::time::sleep(dispatcher.settings.lease.renew_every()).await;
        let mine = *slot.borrow();
        if belongs_elsewhere(dispatcher, platform, shard, mine).await {
            return;
        }
    }
}

/// How many shards `inbound` wants, asked until it answers (a backoff between failed
/// attempts). `None` if `shutdown` fired first.
async fn shard_count(
    inbound: &dyn Inbound,
    health: &Health,
    shutdown: &CancellationToken,
) -> Result<Option<u32>, SessionsEnded> {
    let platform = inbound.platform();
    let mut failures = 0;
    loop {
        let asked = tokio::select! {
            asked = inbound.shards() => asked,
            () = shutdown.cancelled() => return Ok(None),
        };
        let reason = match asked {
            Ok(total) => return Ok(Some(total.max(1))),
            Err(SessionEnd::Fatal(reason)) => {
                health.set(platform, AdapterState::Down(reason.clone()));
                return Err(SessionsEnded { platform, reason });
            }
            Err(SessionEnd::Shutdown | SessionEnd::LeaseLost) => return Ok(None),
            Err(SessionEnd::Failed { reason, .. }) => reason,
        };
        failures += 1;
        let wait = SESSION_BACKOFF.delay(failures);
        tracing::warn!(%platform, reason, retry_in_ms = wait.as_millis() as u64, "cannot tell how many shards to run");
        health.set(platform, AdapterState::Down(reason));
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = shutdown.cancelled() => return Ok(None),
        }
    }
}

/// Hold one shard of `inbound`'s connection whenever this process wins its poller
/// lease, one session at a time, until `shutdown` (see [`serve`]).
/// `slot`: this process's replica slot, for a sharded platform.
async fn serve_shard(
    dispatcher: &Arc<Dispatcher>,
    inbound: Arc<dyn Inbound>,
    shard: Shard,
    slot: Option<watch::Receiver<Option<u32>>>,
    health: &Health,
    shutdown: &CancellationToken,
) -> Result<(), SessionsEnded> {
    let platform = inbound.platform();
    let mut failures = 0;
    loop {
        let Some(keeper) =
            elect(dispatcher, platform, shard, slot.as_ref(), health, shutdown).await
        else {
            return Ok(());
        };
        let (session, handover) = keeper.session(platform, shard, shutdown, health);
        // Once the shard belongs to another replica, the session is ended as for a
        // lost lease (the adapter disconnects), and the lease is then released.
        let hand_over = async {
            wanted_elsewhere(dispatcher, platform, shard, slot.as_ref()).await;
            handover.cancel();
            std::future::pending::<()>().await
        };
        let end = tokio::select! {
            end = inbound.session(dispatcher.as_ref(), &session) => end,
            () = hand_over => unreachable!("never completes"),
        };
        if handover.is_cancelled() && !keeper.is_lost() {
            keeper.release().await;
            tracing::info!(%platform, %shard, "handed the shard to the replica it belongs to");
            health.set_shard(platform, shard.index(), AdapterState::Standby);
            continue;
        }
        match end {
            SessionEnd::Shutdown => {
                keeper.release().await;
                tracing::info!(%platform, %shard, "left the platform connection");
                return Ok(());
            }
            SessionEnd::LeaseLost => {
                tracing::warn!(%platform, %shard, "the platform lease was lost; disconnected, standing by");
                health.set_shard(platform, shard.index(), AdapterState::Standby);
            }
            SessionEnd::Fatal(reason) => {
                keeper.release().await;
                health.set_shard(platform, shard.index(), AdapterState::Down(reason.clone()));
                return Err(SessionsEnded { platform, reason });
            }
            SessionEnd::Failed { reason, connected } => {
                // Hand the connection to another process while this one waits.
                keeper.release().await;
                if connected {
                    failures = 0;
                }
                failures += 1;
                let wait = SESSION_BACKOFF.delay(failures);
                tracing::warn!(%platform, %shard, reason, retry_in_ms = wait.as_millis() as u64, "platform session failed");
                health.set_shard(platform, shard.index(), AdapterState::Down(reason));
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = shutdown.cancelled() => return Ok(()),
                }
            }
        }
    }
}

/// Wait until this process holds the poller lease of `platform`'s `shard`, retrying
/// every renewal interval; while another process holds it (or, for a sharded platform,
/// it belongs to another live replica: see `slot`), `health` shows this one standing
/// by. `None` if `shutdown` fired first.
async fn elect(
    dispatcher: &Dispatcher,
    platform: Platform,
    shard: Shard,
    slot: Option<&watch::Receiver<Option<u32>>>,
    health: &Health,
    shutdown: &CancellationToken,
) -> Option<LeaseKeeper> {
    let key = LeaseKey::Poller(platform, shard.index());
    let mut announced = false;
    loop {
        let mine = slot.map(|slot| *slot.borrow());
        let claimed = match mine {
            Some(mine) if belongs_elsewhere(dispatcher, platform, shard, mine).await => Ok(None),
            _ => claim(dispatcher, key.clone()).await,
        };
        match claimed {
            Ok(Some(keeper)) => {
                tracing::info!(%platform, %shard, token = keeper.lease().token.0, "this process now holds the platform connection");
                return Some(keeper);
            }
            Ok(None) => {
                health.set_shard(platform, shard.index(), AdapterState::Standby);
                if !announced {
                    tracing::info!(%platform, %shard, "another process holds the platform connection; standing by");
                    announced = true;
                }
            }
            Err(e) => {
                tracing::warn!(%platform, %shard, error = %e, "could not claim the poller lease")
            }
        }
        tokio::select! {
            () = tokio::time::sleep(dispatcher.settings.lease.renew_every()) => {}
            () = shutdown.cancelled() => return None,
        }
    }
}
