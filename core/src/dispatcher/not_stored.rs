//! An update the store could not take: what the adapter hears (it must not
//! acknowledge the update) and what is logged. Its own room: ingest and the rooms
//! ingest hands updates to (overheard messages, threads) all answer this way.

use crate::store::StoreError;
use lull_port::IngestError;

/// The update was not stored: the adapter must not acknowledge it. A database that
/// is busy, full or failing is reported by the store (once per change); anything else
/// is unexpected and logged here.
pub(super) fn not_stored(error: StoreError) -> IngestError {
    if !matches!(
        error,
        StoreError::Busy
            | StoreError::Full
            | StoreError::Pool(_)
            | StoreError::Damaged(_)
            | StoreError::Io(_)
    ) {
        tracing::error!(error = %error, "could not store an update");
    }
    IngestError::from(error)
}
