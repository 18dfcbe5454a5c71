//! Why a step under a conversation's lease ended the round early: shared by the
//! round and its delivery (its own module, so neither imports the other for it).

use crate::store::StoreError;

/// Why a step ended the round early.
pub(super) enum Interrupt {
    LeaseLost,
    Stopped,
    Deferred,
    Store(StoreError),
}

impl From<StoreError> for Interrupt {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::LeaseLost(_) => Interrupt::LeaseLost,
            other => Interrupt::Store(other),
        }
    }
}
