//! What the database's condition is, learned from the outcome of real operations.
//!
//! A health check that only runs `SELECT 1` says "ok" about a damaged file while every
//! message is refused. So every store operation reports its outcome here, and the
//! health check reads the result: a damaged file stays unhealthy until the process is
//! restarted (a damaged file does not heal itself); a full disk or an I/O failure is
//! unhealthy until a write succeeds again. Each change of condition is logged once,
//! not once per refused message.

use std::sync::Mutex;

use super::StoreError;

/// A condition of the database that makes lull unable to do its work.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Trouble {
    /// Pages that do not parse: only a restore from a backup helps.
    Damaged(String),
    /// The disk (or the database's size limit) is full.
    Full,
    /// The file cannot be read or written (permissions, a failing disk).
    Io(String),
}

impl Trouble {
    fn of(error: &StoreError) -> Option<Trouble> {
        match error {
            StoreError::Damaged(reason) => Some(Trouble::Damaged(reason.clone())),
            StoreError::Full => Some(Trouble::Full),
            StoreError::Io(reason) => Some(Trouble::Io(reason.clone())),
            _ => None,
        }
    }

    fn error(&self) -> StoreError {
        match self {
            Trouble::Damaged(reason) => StoreError::Damaged(reason.clone()),
            Trouble::Full => StoreError::Full,
            Trouble::Io(reason) => StoreError::Io(reason.clone()),
        }
    }
}

/// The database's condition as the last operations found it. Shared by every
/// connection of one store.
#[derive(Debug, Default)]
pub(crate) struct Condition {
    /// A std mutex: held to compare and replace a value, never across an await.
    trouble: Mutex<Option<Trouble>>,
}

impl Condition {
    /// Record the outcome of an operation. `wrote`: it was a committed write, which
    /// proves the disk takes data again.
    pub(crate) fn observe<T>(&self, result: &Result<T, StoreError>, wrote: bool) {
        let mut trouble = self.trouble.lock().expect("condition poisoned");
        match result {
            Err(error) => {
                let Some(found) = Trouble::of(error) else {
                    return;
                };
                // Damage is the worst news and stays: a full disk reported later does
                // not hide it.
                if matches!(*trouble, Some(Trouble::Damaged(_))) || trouble.as_ref() == Some(&found)
                {
                    return;
                }
                tracing::error!(error = %error, "the database is failing; messages are refused until it recovers");
                *trouble = Some(found);
            }
            Ok(_) if wrote => {
                if matches!(*trouble, Some(Trouble::Full | Trouble::Io(_))) {
                    tracing::info!("the database takes writes again");
                    *trouble = None;
                }
            }
            Ok(_) => {}
        }
    }

    /// `Err` while the database is known to be failing.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        match &*self.trouble.lock().expect("condition poisoned") {
            Some(trouble) => Err(trouble.error()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damage_stays_and_a_full_disk_clears_with_a_write() {
        let condition = Condition::default();
        condition.observe::<()>(&Err(StoreError::Full), true);
        assert!(matches!(condition.check(), Err(StoreError::Full)));
        condition.observe(&Ok(()), false);
        assert!(
            condition.check().is_err(),
            "a read proves nothing about writes"
        );
        condition.observe(&Ok(()), true);
        assert!(condition.check().is_ok());

        condition.observe::<()>(&Err(StoreError::Damaged("malformed".into())), false);
        condition.observe::<()>(&Err(StoreError::Full), true);
        condition.observe(&Ok(()), true);
        assert!(matches!(condition.check(), Err(StoreError::Damaged(_))));
    }

    #[test]
    fn passing_conditions_are_not_trouble() {
        let condition = Condition::default();
        condition.observe::<()>(&Err(StoreError::Busy), true);
        assert!(condition.check().is_ok());
    }
}
