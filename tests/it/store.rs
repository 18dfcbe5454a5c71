//! The store contract, checked against the SQLite backend: the same test body
//! (`lull_core::store::conformance`) every backend runs, one test per check.

use std::ops::Deref;

use lull_core::store::SqliteStore;
use lull_core::timing::TimerPolicy;

/// A store on a fresh database file, with the folder that holds it.
struct Fresh {
    store: SqliteStore,
    _dir: tempfile::TempDir,
}

impl Deref for Fresh {
    type Target = SqliteStore;

    fn deref(&self) -> &SqliteStore {
        &self.store
    }
}

async fn open(timers: TimerPolicy) -> Fresh {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("lull.db"), timers).expect("open the store");
    Fresh { store, _dir: dir }
}

lull_core::store_conformance!(open);

/// The same checks against the PostgreSQL backend, on a fresh database of the test
/// cluster each, with the caller's clock (the checks drive time themselves).
mod postgres {
    use lull_core::store::{PostgresStore, TimeSource};
    use lull_core::timing::TimerPolicy;

    async fn open(timers: TimerPolicy) -> Option<Box<PostgresStore>> {
        let url = crate::support::postgres::fresh_database()?;
        let store = PostgresStore::open(&url, timers, TimeSource::Caller)
            .await
            .expect("open the PostgreSQL store");
        Some(Box::new(store))
    }

    lull_core::store_conformance!(optional open);
}
