//! What `/healthz` reports: whether the database answers and whether every
//! configured adapter is up (a standby poller counts as healthy: it is ready to take
//! over).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::domain::Platform;

/// The state an adapter reports about its platform connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdapterState {
    /// Configured, not connected yet.
    Starting,
    /// Connected (or, for the http adapter, listening).
    Up,
    /// Another process holds the platform's poller lease; this one is ready to take over.
    Standby,
    /// Disconnected; the reason is shown.
    Down(String),
}

impl AdapterState {
    pub fn is_healthy(&self) -> bool {
        matches!(self, AdapterState::Up | AdapterState::Standby)
    }

    pub fn describe(&self) -> String {
        match self {
            AdapterState::Starting => "starting".into(),
            AdapterState::Up => "up".into(),
            AdapterState::Standby => "standby".into(),
            AdapterState::Down(reason) => format!("down: {reason}"),
        }
    }
}

/// Shared by the adapters (which report) and the HTTP server (which answers).
#[derive(Debug, Clone, Default)]
pub struct Health {
    /// Per platform, the state of each shard of its connection (one entry, shard 0,
    /// for a platform that is not sharded). A std mutex: held to read or set one
    /// entry, never across an await.
    adapters: Arc<Mutex<BTreeMap<Platform, BTreeMap<u32, AdapterState>>>>,
}

impl Health {
    /// The state of the whole platform connection: replaces every shard's.
    pub fn set(&self, platform: Platform, state: AdapterState) {
        self.adapters
            .lock()
            .expect("health poisoned")
            .insert(platform, BTreeMap::from([(0, state)]));
    }

    /// The state of one shard of the platform's connection (the others keep theirs).
    pub fn set_shard(&self, platform: Platform, shard: u32, state: AdapterState) {
        self.adapters
            .lock()
            .expect("health poisoned")
            .entry(platform)
            .or_default()
            .insert(shard, state);
    }

    /// Each platform's state. A sharded connection is down if any shard is (a shard
    /// this process holds, or failed to), starting if any shard is, up if this process
    /// holds any shard, and standing by otherwise.
    pub fn snapshot(&self) -> BTreeMap<Platform, AdapterState> {
        self.adapters
            .lock()
            .expect("health poisoned")
            .iter()
            .filter_map(|(platform, shards)| {
                let worst = shards.values().max_by_key(|state| match state {
                    AdapterState::Standby => 0,
                    AdapterState::Up => 1,
                    AdapterState::Starting => 2,
                    AdapterState::Down(_) => 3,
                })?;
                Some((*platform, worst.clone()))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sharded_connection_reports_its_worst_shard_and_up_beats_standby() {
        let health = Health::default();
        let discord = Platform::Discord;
        health.set_shard(discord, 0, AdapterState::Up);
        health.set_shard(discord, 1, AdapterState::Standby);
        assert_eq!(health.snapshot()[&discord], AdapterState::Up);
        health.set_shard(discord, 0, AdapterState::Standby);
        assert_eq!(health.snapshot()[&discord], AdapterState::Standby);
        health.set_shard(discord, 1, AdapterState::Down("refused".into()));
        assert_eq!(
            health.snapshot()[&discord],
            AdapterState::Down("refused".into())
        );
        health.set(discord, AdapterState::Starting);
        assert_eq!(health.snapshot()[&discord], AdapterState::Starting);
    }
}
