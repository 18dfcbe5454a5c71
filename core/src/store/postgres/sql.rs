//! Statement helpers: errors with the context of the statement that failed, and
//! `query`/`execute` with that context; the `transaction!` every method runs in.

use std::time::Duration;

use deadpool_postgres::GenericClient;
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

pub(super) async fn query<C: GenericClient>(
    tx: &C,
    sql: &str,
    params: Params<'_>,
    context: &'static str,
) -> Result<Vec<Row>, StoreError> {
    let statement = tx.prepare_cached(sql).await.ctx(context)?;
    tx.query(&statement, params).await.ctx(context)
}

pub(super) async fn query_opt<C: GenericClient>(
    tx: &C,
    sql: &str,
    params: Params<'_>,
    context: &'static str,
) -> Result<Option<Row>, StoreError> {
    let statement = tx.prepare_cached(sql).await.ctx(context)?;
    tx.query_opt(&statement, params).await.ctx(context)
}

pub(super) async fn query_one<C: GenericClient>(
    tx: &C,
    sql: &str,
    params: Params<'_>,
    context: &'static str,
) -> Result<Row, StoreError> {
    let statement = tx.prepare_cached(sql).await.ctx(context)?;
    tx.query_one(&statement, params).await.ctx(context)
}

pub(super) async fn execute<C: GenericClient>(
    tx: &C,
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

/// Run `$once` (an expression of type `Result<T, StoreError>` using `$client`, the
/// pooled connection as `&mut deadpool_postgres::Object`) until it is not
/// [`StoreError::Busy`], a few times: the one place a store call reaches the database,
/// where a test's fault plan is consulted, every try is bounded by the call deadline,
/// and the store's condition learns the outcome. A macro, not a function taking a
/// closure: the body borrows the connection across awaits.
macro_rules! attempts {
    ($store:expr, $operation:expr, $context:expr, |$client:ident| $once:expr) => {{
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
                    let $client = &mut client;
                    $once
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

/// Run `$body` (an expression of type `Result<T, StoreError>` using `$tx`) in one
/// READ COMMITTED transaction, committed when it is `Ok`, rolled back when it is
/// `Err`; retried from the start after a serialization failure or deadlock
/// (`attempts!`). Each statement of the body is a round trip (BEGIN and COMMIT
/// too): the hot paths use `statement!` instead.
macro_rules! transaction {
    ($store:expr, $operation:expr, $context:expr, |$tx:ident| $body:expr) => {{
        use $crate::store::postgres::sql::Context as _;
        attempts!($store, $operation, $context, |client| {
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
    }};
}

/// Run `$body` (an expression of type `Result<T, StoreError>` using `$client`) on a
/// pooled connection outside an explicit transaction: the body sends one statement
/// (a data-modifying CTE, or a call of one of the schema's functions), which is its
/// own transaction, atomic and committed as it returns: one round trip, where BEGIN,
/// the statements and COMMIT of `transaction!` are one each. Retried like it.
macro_rules! statement {
    ($store:expr, $operation:expr, $context:expr, |$client:ident| $body:expr) => {{
        #[allow(unused_imports)]
        use $crate::store::postgres::sql::Context as _;
        attempts!($store, $operation, $context, |connection| {
            let $client: &deadpool_postgres::Object = connection;
            $body
        })
    }};
}
