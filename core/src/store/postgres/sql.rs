//! Statement helpers: errors with the context of the statement that failed, and
//! `query`/`execute` with that context; the `transaction!` every method runs in.

use std::time::Duration;

use lull_port::retry::Backoff;
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

use crate::store::StoreError;

/// Attaches what we were doing to a PostgreSQL error and sorts out the conditions a
/// caller can wait out from real failures.
pub(super) trait Context<T> {
    fn ctx(self, context: &'static str) -> Result<T, StoreError>;
}

impl<T> Context<T> for Result<T, tokio_postgres::Error> {
    fn ctx(self, context: &'static str) -> Result<T, StoreError> {
        self.map_err(|source| classify(context, &source))
    }
}

/// A backend-neutral [`StoreError`] for a PostgreSQL error.
pub(super) fn classify(context: &'static str, source: &tokio_postgres::Error) -> StoreError {
    let Some(code) = source.code() else {
        // No SQLSTATE: the connection broke (refused, reset, closed) or timed out.
        return StoreError::Pool(format!(
            "lost the database connection while {context}: {source}"
        ));
    };
    let detail = || match source.as_db_error() {
        Some(db) => format!("{}, while {context}", db.message()),
        None => format!("{source}, while {context}"),
    };
    match *code {
        SqlState::T_R_SERIALIZATION_FAILURE
        | SqlState::T_R_DEADLOCK_DETECTED
        | SqlState::LOCK_NOT_AVAILABLE
        | SqlState::QUERY_CANCELED => StoreError::Busy,
        SqlState::DISK_FULL | SqlState::PROGRAM_LIMIT_EXCEEDED => StoreError::Full,
        SqlState::ADMIN_SHUTDOWN
        | SqlState::CRASH_SHUTDOWN
        | SqlState::CANNOT_CONNECT_NOW
        | SqlState::TOO_MANY_CONNECTIONS
        | SqlState::OUT_OF_MEMORY
        | SqlState::CONNECTION_FAILURE
        | SqlState::CONNECTION_EXCEPTION => StoreError::Pool(detail()),
        SqlState::DATA_CORRUPTED | SqlState::INDEX_CORRUPTED => StoreError::Damaged(detail()),
        SqlState::IO_ERROR
        | SqlState::READ_ONLY_SQL_TRANSACTION
        | SqlState::INSUFFICIENT_PRIVILEGE => StoreError::Io(detail()),
        _ => StoreError::Backend {
            context,
            message: detail(),
        },
    }
}

pub(super) type Tx<'a> = deadpool_postgres::Transaction<'a>;
type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

pub(super) async fn query(
    tx: &Tx<'_>,
    sql: &str,
    params: Params<'_>,
    context: &'static str,
) -> Result<Vec<Row>, StoreError> {
    let statement = tx.prepare_cached(sql).await.ctx(context)?;
    tx.query(&statement, params).await.ctx(context)
}

pub(super) async fn query_opt(
    tx: &Tx<'_>,
    sql: &str,
    params: Params<'_>,
    context: &'static str,
) -> Result<Option<Row>, StoreError> {
    let statement = tx.prepare_cached(sql).await.ctx(context)?;
    tx.query_opt(&statement, params).await.ctx(context)
}

pub(super) async fn query_one(
    tx: &Tx<'_>,
    sql: &str,
    params: Params<'_>,
    context: &'static str,
) -> Result<Row, StoreError> {
    let statement = tx.prepare_cached(sql).await.ctx(context)?;
    tx.query_one(&statement, params).await.ctx(context)
}

pub(super) async fn execute(
    tx: &Tx<'_>,
    sql: &str,
    params: Params<'_>,
    context: &'static str,
) -> Result<u64, StoreError> {
    let statement = tx.prepare_cached(sql).await.ctx(context)?;
    tx.execute(&statement, params).await.ctx(context)
}

pub(super) fn pool_reason(error: &deadpool_postgres::PoolError) -> String {
    match error {
        deadpool_postgres::PoolError::Backend(e) => describe(e),
        other => other.to_string(),
    }
}

/// A PostgreSQL error in words: the server's message when it sent one.
pub(super) fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => db.message().to_owned(),
        None => match std::error::Error::source(error) {
            Some(source) => format!("{error}: {source}"),
            None => error.to_string(),
        },
    }
}

/// Between tries of a transaction that met a serialization failure or deadlock.
pub(super) const SERIALIZATION_RETRY: Backoff =
    Backoff::new(Duration::from_millis(10), Duration::from_millis(80));

/// Run `$body` (an expression of type `Result<T, StoreError>` using `$tx`) in one
/// READ COMMITTED transaction, committed when it is `Ok`, rolled back when it is
/// `Err`; retried from the start after a serialization failure or deadlock. The one
/// place a transaction reaches the database, where a test's fault plan is consulted
/// and the store's condition learns the outcome. A macro, not a function taking a
/// closure: the body borrows the transaction across awaits.
macro_rules! transaction {
    ($store:expr, $operation:expr, $context:expr, |$tx:ident| $body:expr) => {{
        use $crate::store::postgres::sql::Context as _;
        let store: &$crate::store::postgres::PostgresStore = $store;
        let mut attempt = 0;
        let started = std::time::Instant::now();
        let result = loop {
            // No call hangs: the pooled connection, the statements and the commit
            // answer by the deadline, or the call fails (a transient error).
            let deadline = tokio::time::Instant::now() + $crate::store::postgres::CALL_DEADLINE;
            let late = || {
                $crate::store::StoreError::Pool(format!(
                    "no answer from the database within {} ms while {}",
                    $crate::store::postgres::CALL_DEADLINE.as_millis(),
                    $context
                ))
            };
            let result = async {
                store.before_write($operation)?;
                let mut client = tokio::time::timeout_at(deadline, store.client())
                    .await
                    .map_err(|_| late())??;
                let tried = tokio::time::timeout_at(deadline, async {
                    let $tx = client
                        .build_transaction()
                        .isolation_level(tokio_postgres::IsolationLevel::ReadCommitted)
                        .start()
                        .await
                        .ctx($context)?;
                    let value = $body?;
                    $tx.commit().await.ctx($context)?;
                    Ok(value)
                })
                .await;
                match tried {
                    Ok(done) => done,
                    Err(_) => {
                        // Its socket may be dead: not back into the pool. The caller
                        // hears a transient error, as when the server drops the
                        // connection mid-call (a write may then have committed).
                        drop(deadpool_postgres::Object::take(client));
                        Err(late())
                    }
                }
            }
            .await;
            match result {
                // A serialization failure or deadlock comes at once and is worth
                // another try; a lock wait that ran into the statement timeout has
                // waited long enough, and the caller is told.
                Err($crate::store::StoreError::Busy)
                    if attempt < $crate::store::postgres::RETRIES
                        && started.elapsed()
                            < std::time::Duration::from_millis(
                                $crate::store::postgres::STATEMENT_TIMEOUT_MS,
                            ) =>
                {
                    attempt += 1;
                    tokio::time::sleep(
                        $crate::store::postgres::sql::SERIALIZATION_RETRY.delay(attempt),
                    )
                    .await;
                }
                other => break other,
            }
        };
        store.condition.observe(
            &result,
            $operation != $crate::store::faults::Operation::Read,
        );
        result
    }};
}
