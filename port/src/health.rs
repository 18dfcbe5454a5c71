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
    /// A std mutex: held to read or set one entry, never across an await.
    adapters: Arc<Mutex<BTreeMap<Platform, AdapterState>>>,
}

impl Health {
    pub fn set(&self, platform: Platform, state: AdapterState) {
        self.adapters
            .lock()
            .expect("health poisoned")
            .insert(platform, state);
    }

    pub fn snapshot(&self) -> BTreeMap<Platform, AdapterState> {
        self.adapters.lock().expect("health poisoned").clone()
    }
}
