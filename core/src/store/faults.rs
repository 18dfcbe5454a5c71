//! Fault injection for tests: a plan the real backend consults, so a test makes the
//! store fail or freeze without a hand-written copy of the store around it.
//!
//! A backend asks the plan before a write reaches the database (its single execution
//! point, told which [`Operation`] the write is) and, for a renewal, whether to pretend
//! it succeeded: a pretended renewal must return the lease it would have renewed, a
//! value only `renew_lease` has, so that one switch is consulted there.

/// What a write does, as far as a fault plan tells writes apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    /// Storing or editing a message (`ingest`, `edit`).
    Intake,
    /// Every other write.
    Other,
    /// A read: never faulted, and proves nothing about writes.
    Read,
}

#[cfg(feature = "test-switches")]
pub use plan::FaultPlan;

#[cfg(feature = "test-switches")]
mod plan {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use super::Operation;
    use crate::store::StoreError;

    /// Switches a test flips while the store runs. All off: the store behaves as in
    /// production. Exists only in builds with the `test-switches` feature.
    #[derive(Debug, Default)]
    pub struct FaultPlan {
        busy_intake: AtomicBool,
        full_intake: AtomicBool,
        frozen_renewals: AtomicBool,
        intake_calls: AtomicUsize,
    }

    impl FaultPlan {
        /// While on, storing or editing a message fails as a database locked by
        /// another writer past the busy timeout does ([`StoreError::Busy`]).
        pub fn busy_intake(&self, on: bool) {
            self.busy_intake.store(on, Ordering::SeqCst);
        }

        /// While on, storing or editing a message fails as a full disk does
        /// ([`StoreError::Full`]; the store's condition records it, as for a real one).
        pub fn full_intake(&self, on: bool) {
            self.full_intake.store(on, Ordering::SeqCst);
        }

        /// While on, a renewal reports success without reaching the database: a
        /// process frozen by the OS that believes it still holds its lease.
        pub fn freeze_renewals(&self, on: bool) {
            self.frozen_renewals.store(on, Ordering::SeqCst);
        }

        /// How many times a message was stored or edited, failed attempts included.
        pub fn intake_calls(&self) -> usize {
            self.intake_calls.load(Ordering::SeqCst)
        }

        /// Consulted before a write reaches the database: the error to fail it with.
        pub(crate) fn before_write(&self, operation: Operation) -> Result<(), StoreError> {
            if operation != Operation::Intake {
                return Ok(());
            }
            self.intake_calls.fetch_add(1, Ordering::SeqCst);
            if self.busy_intake.load(Ordering::SeqCst) {
                return Err(StoreError::Busy);
            }
            if self.full_intake.load(Ordering::SeqCst) {
                return Err(StoreError::Full);
            }
            Ok(())
        }

        /// Whether a renewal is to pretend it succeeded.
        pub(crate) fn renewals_frozen(&self) -> bool {
            self.frozen_renewals.load(Ordering::SeqCst)
        }
    }
}
