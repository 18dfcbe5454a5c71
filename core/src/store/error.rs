//! The backend-neutral error every store method reports.

use crate::domain::{ConversationId, LeaseKey};

/// Why a store operation failed. `Busy` and `Full` are conditions of the database
/// the caller may wait out; `LeaseLost` means the caller no longer owns what it was
/// acting on and must abandon its work.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// Locked by another writer past the busy timeout: wait and try again.
    #[error("the database is busy (locked by another writer longer than the busy timeout)")]
    Busy,
    /// No room for the write: nothing was stored; wait for space.
    #[error("the database or its disk is full")]
    Full,
    /// Pages of the file do not parse: only restoring a backup helps.
    #[error("the database file is damaged ({0}); restore it from a backup")]
    Damaged(String),
    /// The file cannot be read or written (permissions, a failing disk).
    #[error("the database file cannot be read or written: {0}")]
    Io(String),
    /// Exclusive: the caller's lease expired or was taken over, so its write was
    /// refused (fencing) and the work it protected must be abandoned.
    #[error("the lease on {0} was lost (expired or taken over)")]
    LeaseLost(LeaseKey),
    #[error("conversation {0} does not exist")]
    NoConversation(ConversationId),
    /// The database cannot be opened or brought up to date at start.
    #[error("cannot open the database at {path}: {reason}")]
    Open { path: String, reason: String },
    /// Any other failure of the backend, in its own words: the error names no
    /// backend's types, so every backend reports through the same enum.
    #[error("database error while {context}: {message}")]
    Backend {
        context: &'static str,
        message: String,
    },
    /// A value in the database this build cannot read (an unknown platform name).
    #[error("unexpected data in the database: {0}")]
    Corrupt(String),
    /// No connection came free in time, or the task running the query failed.
    #[error("database connection pool: {0}")]
    Pool(String),
}

impl StoreError {
    /// Whether waiting and trying again may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StoreError::Busy | StoreError::Full | StoreError::Pool(_)
        )
    }
}
