//! Which lease row a holder claims, renews, releases and is fenced by: shared by
//! every backend, so the counter-test's switch means the same on each.

use crate::domain::{HolderId, LeaseKey};

/// Which lease row a holder claims, renews, releases and is fenced by.
///
/// The counter-test needs processes that race as if there were no lease, while the
/// statements stay exactly the production ones: no statement has a parameter that
/// switches a check off. So the switch changes which row is named, not the SQL. With
/// [`LeaseRows::PerHolder`] every holder gets a private row per lease (its resource
/// names the holder; its conversation column stays NULL): a claim never contends (no
/// one else ever holds that row), fencing checks the holder's own row and passes,
/// and `due_work` sees no live lease on the conversation (no row names it), so every
/// process takes every due conversation, exactly as with the lease checks off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseRows {
    /// One row per lease, shared by every holder: what makes a lease exclusive.
    Shared,
    /// The counter-test: one private row per lease and holder.
    #[cfg(feature = "test-switches")]
    PerHolder,
}

/// The row a holder's lease lives in.
pub(crate) struct LeaseRow {
    pub(crate) resource: String,
    /// The conversation the row names, which `due_work` joins on (NULL for pollers).
    pub(crate) conversation: Option<i64>,
}

impl LeaseRows {
    /// The row `holder`'s lease on `key` lives in.
    // Only the counter-test's private rows name the holder.
    #[cfg_attr(not(feature = "test-switches"), allow(unused_variables))]
    pub(crate) fn row(self, key: &LeaseKey, holder: &HolderId) -> LeaseRow {
        match self {
            LeaseRows::Shared => LeaseRow {
                resource: key.resource(),
                conversation: key.conversation().map(|id| id.0),
            },
            #[cfg(feature = "test-switches")]
            LeaseRows::PerHolder => LeaseRow {
                resource: format!("{}@{holder}", key.resource()),
                conversation: None,
            },
        }
    }
}
