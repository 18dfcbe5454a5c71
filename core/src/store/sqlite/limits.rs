//! The limits area on SQLite: the rate hold, the token wallet, access decisions.

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::SqliteStore;
use super::leases::ensure_lease;
use super::sql::Context;
use crate::domain::{ConversationId, Lease, Timestamp};
use crate::store::rules::{self, RateVerdict, conversation_of};
use crate::store::{AccessRule, Charged, LimitStore, RateHold, Reservation, StoreError, Used};
use crate::store::{LeaseCharge, RateCheck, ScopeCharge, TokenCharge};

#[async_trait]
impl LimitStore for SqliteStore {
    async fn hold_over_rate(&self, check: RateCheck<'_>) -> Result<Option<RateHold>, StoreError> {
        let user_id = check.user_id.to_owned();
        self.write("applying the rate limit", move |tx| {
            // Rate limit: the newest message or edit past the limit within the
            // window, if any; the window has room again once it has left.
            let past_limit: Option<i64> = tx
                .prepare_cached(
                    "SELECT at FROM (
                         SELECT m.received_at AS at FROM messages m JOIN conversations c ON c.id = m.conversation_id
                         WHERE m.user_id = ?1 AND m.received_at > ?3
                           AND c.platform = (SELECT platform FROM conversations WHERE id = ?2)
                         UNION ALL
                         SELECT e.edited_at FROM edits e
                         WHERE e.user_id = ?1 AND e.edited_at > ?3
                           AND e.platform = (SELECT platform FROM conversations WHERE id = ?2))
                     ORDER BY at DESC LIMIT 1 OFFSET ?4",
                )
                .ctx("preparing a statement")?
                .query_row(
                    params![
                        user_id,
                        check.conversation.0,
                        check.now.0 - crate::domain::millis(check.rate.window),
                        check.rate.max,
                    ],
                    |r| r.get(0),
                )
                .optional()
                .ctx("counting a user's recent messages")?;
            let Some(past_limit) = past_limit else {
                return Ok(None);
            };
            let until = Timestamp(past_limit).plus(check.rate.window);
            let held: Option<i64> = tx
                .prepare_cached("SELECT held_until FROM timers WHERE conversation_id = ?1")
                .ctx("preparing a statement")?
                .query_row([check.conversation.0], |r| r.get(0))
                .optional()
                .ctx("reading the timer")?;
            match rules::rate_verdict(held, until, check.now) {
                RateVerdict::Nothing => Ok(None),
                RateVerdict::Kept(until) => Ok(Some(RateHold { until, began: false })),
                RateVerdict::Begin(until) => {
                    hold_timer(tx, check.conversation, until)?;
                    Ok(Some(RateHold { until, began: true }))
                }
            }
        })
        .await
    }

    async fn charge_tokens(&self, charging: LeaseCharge<'_>) -> Result<Charged, StoreError> {
        let lease = charging.lease.clone();
        let charge = charging.charge.clone();
        let row = self.lease_rows.row(&lease.key, &lease.holder);
        self.write("charging tokens", move |tx| {
            // Budgets: charged under the lease, fenced like the final check.
            ensure_lease(tx, &lease, &row.resource, charging.now)?;
            // One order for every charge (SQLite has one writer; PostgreSQL locks
            // the rows in this order).
            let scopes = crate::store::rules::sorted_scopes(&charge.scopes);
            if let Some((refused, hold)) = refusal(tx, &charge, &scopes, &lease, charging.now)? {
                // Only a hold or a reservation names the conversation (a summary's
                // charge is under its summary lease, and neither holds nor reserves).
                if let Some(until) = hold {
                    hold_timer(tx, conversation_of(&lease), until)?;
                }
                return Ok(refused);
            }
            for scope in &scopes {
                // Budgets: totals are only added to (never written back from a read),
                // so concurrent charges all count; a give-back never goes below zero.
                tx.prepare_cached(
                    "INSERT INTO token_usage (scope, day, tokens, cost)
                     VALUES (?1, ?2, MAX(?3, 0), MAX(?4, 0))
                     ON CONFLICT (scope, day) DO UPDATE SET
                         tokens = MAX(token_usage.tokens + ?3, 0), cost = MAX(token_usage.cost + ?4, 0)",
                )
                .ctx("preparing a statement")?
                .execute(params![scope.scope, scope.row_day(&charge.day), scope.tokens, scope.cost])
                .ctx("charging tokens")?;
            }
            keep_reservation(tx, &charge, &scopes, &lease)
        })
        .await
    }

    async fn usage_between(
        &self,
        first: &str,
        last: &str,
        scopes: &[String],
    ) -> Result<Vec<Used>, StoreError> {
        let (first, last) = (first.to_owned(), last.to_owned());
        let scopes = scopes.to_vec();
        self.with_conn(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT COALESCE(SUM(tokens), 0), COALESCE(SUM(cost), 0) FROM token_usage
                     WHERE scope = ?1 AND day >= ?2 AND day <= ?3",
                )
                .ctx("reading token usage")?;
            scopes
                .iter()
                .map(|scope| {
                    stmt.query_row(params![scope, first, last], |r| {
                        Ok(rules::used(r.get(0)?, r.get(1)?))
                    })
                    .ctx("reading token usage")
                })
                .collect()
        })
        .await
    }

    async fn set_access(&self, rule: &AccessRule) -> Result<(), StoreError> {
        let rule = rule.clone();
        self.write("recording an access decision", move |tx| {
            // One decision per subject: the latest replaces the earlier one.
            tx.prepare_cached(
                "INSERT INTO access_rules (platform, kind, subject, allowed, set_by, set_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (platform, kind, subject) DO UPDATE SET
                     allowed = excluded.allowed, set_by = excluded.set_by, set_at = excluded.set_at",
            )
            .ctx("preparing a statement")?
            .execute(
                params![
                    rule.subject.platform.as_str(),
                    rule.subject.kind.as_str(),
                    rule.subject.id,
                    rule.allowed,
                    rule.set_by,
                    rule.set_at.0,
                ],
            )
            .ctx("recording an access decision")?;
            Ok(())
        })
        .await
    }

    async fn access_rules(&self) -> Result<Vec<AccessRule>, StoreError> {
        self.with_conn(|conn| read_access_rules(conn)).await
    }
}

/// The first budget of `scopes` the charge would pass, as the charge answers it with
/// the hold it puts ([`rules::refusal`]); `None`: every budget has room.
fn refusal(
    tx: &Connection,
    charge: &TokenCharge,
    scopes: &[ScopeCharge],
    lease: &Lease,
    now: Timestamp,
) -> Result<Option<(Charged, Option<Timestamp>)>, StoreError> {
    for scope in scopes.iter().filter(|s| rules::budgeted(s)) {
        let (tokens, cost): (i64, i64) = tx
            .prepare_cached(
                "SELECT COALESCE(MAX(tokens), 0), COALESCE(MAX(cost), 0) FROM token_usage WHERE scope = ?1 AND day = ?2",
            )
            .ctx("preparing a statement")?
            .query_row(params![scope.scope, scope.row_day(&charge.day)], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .ctx("reading a budget")?;
        if let Some(over) = rules::over_budget(scope, tokens, cost) {
            // Budgets: refused only by other rounds' open reservations, a reservation
            // tries again once they settle.
            let busy = charge.reservation == Reservation::Reserve
                && rules::busy_only(
                    scope,
                    tokens,
                    cost,
                    reserved_by_others(tx, scope, &charge.day, lease)?,
                );
            return Ok(Some(rules::refusal(over, busy, charge.hold_until, now)));
        }
    }
    Ok(None)
}

/// What a charged charge does to the lease's reservation: a `Reserve` is recorded
/// under the lease's token on each row it charged (given back at the next claim
/// unless settled), a `Settle` forgets the lease's record.
fn keep_reservation(
    tx: &Connection,
    charge: &TokenCharge,
    scopes: &[ScopeCharge],
    lease: &Lease,
) -> Result<Charged, StoreError> {
    match charge.reservation {
        Reservation::None => {}
        Reservation::Reserve => {
            // Budgets: every reservation expires: recorded under the lease's token, it
            // is given back at the next claim unless settled.
            let mut record = tx
                .prepare_cached(
                    "INSERT INTO token_reservations (conversation_id, lease_token, day, scope, tokens, cost)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                     ON CONFLICT (conversation_id, lease_token, day, scope)
                     DO UPDATE SET tokens = token_reservations.tokens + excluded.tokens,
                                   cost = token_reservations.cost + excluded.cost",
                )
                .ctx("recording a reservation")?;
            for scope in scopes {
                record
                    .execute(params![
                        conversation_of(lease).0,
                        lease.token.0,
                        scope.row_day(&charge.day),
                        scope.scope,
                        scope.tokens,
                        scope.cost
                    ])
                    .ctx("recording a reservation")?;
            }
        }
        Reservation::Settle => {
            tx.prepare_cached(
                "DELETE FROM token_reservations WHERE conversation_id = ?1 AND lease_token = ?2",
            )
            .ctx("preparing a statement")?
            .execute(params![conversation_of(lease).0, lease.token.0])
            .ctx("settling a reservation")?;
        }
    }
    Ok(Charged::Charged)
}

/// The tokens and nano-dollars other rounds (any lease but `lease`) reserved on
/// `scope`'s row of a charge on `day` and have not settled.
fn reserved_by_others(
    tx: &Connection,
    scope: &ScopeCharge,
    day: &str,
    lease: &Lease,
) -> Result<(i64, i64), StoreError> {
    tx.prepare_cached(
        "SELECT COALESCE(SUM(tokens), 0), COALESCE(SUM(cost), 0) FROM token_reservations
         WHERE scope = ?1 AND day = ?2 AND NOT (conversation_id = ?3 AND lease_token = ?4)",
    )
    .ctx("preparing a statement")?
    .query_row(
        params![
            scope.scope,
            scope.row_day(day),
            conversation_of(lease).0,
            lease.token.0
        ],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .ctx("reading open reservations")
}

fn hold_timer(
    tx: &Connection,
    conversation: ConversationId,
    until: Timestamp,
) -> Result<(), StoreError> {
    // Limits: a held conversation's messages wait (stored, pending) until `until`;
    // later messages, /reset and a forced commit re-arm the timer no sooner.
    tx.prepare_cached(
        "UPDATE timers SET held_until = CASE WHEN held_until < ?2 THEN ?2 ELSE held_until END,
                           due_at = CASE WHEN due_at < ?2 THEN ?2 ELSE due_at END
         WHERE conversation_id = ?1",
    )
    .ctx("preparing a statement")?
    .execute(params![conversation.0, until.0])
    .ctx("holding a timer")?;
    Ok(())
}

/// Every run-time access decision, oldest first, read on `conn`.
pub(super) fn read_access_rules(conn: &Connection) -> Result<Vec<AccessRule>, StoreError> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT platform, kind, subject, allowed, set_by, set_at FROM access_rules ORDER BY set_at, rowid",
        )
        .ctx("reading access decisions")?;
    let rows: Vec<(String, String, String, bool, String, i64)> = stmt
        .query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get(3)?,
                r.get(4)?,
                r.get(5)?,
            ))
        })
        .ctx("reading access decisions")?
        .collect::<Result<_, _>>()
        .ctx("reading access decisions")?;
    rows.into_iter()
        .map(|(platform, kind, id, allowed, set_by, set_at)| {
            crate::store::rules::access_rule(&platform, &kind, id, allowed, set_by, set_at)
        })
        .collect()
}
