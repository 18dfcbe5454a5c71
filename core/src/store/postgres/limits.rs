//! The limits area on PostgreSQL: the rate hold, the token wallet, access decisions.

use async_trait::async_trait;
use tokio_postgres::Row;

use super::PostgresStore;
use super::leases::ensure_lease;
use super::messages::lock_conversation;
use super::sql::{Tx, execute, query, query_one, query_opt};
use crate::domain::{ConversationId, Timestamp};
use crate::store::faults::Operation;
use crate::store::rules::{self, RateVerdict, conversation_of};
use crate::store::{AccessRule, Charged, LimitStore, RateHold, Reservation, StoreError, Used};
use crate::store::{LeaseCharge, RateCheck, ScopeCharge};

#[async_trait]
impl LimitStore for PostgresStore {
    async fn hold_over_rate(&self, check: RateCheck<'_>) -> Result<Option<RateHold>, StoreError> {
        let window = crate::domain::millis(check.rate.window);
        transaction!(self, Operation::Other, "applying the rate limit", |tx| {
            async {
                let now = self.now(&tx, check.now).await?;
                // The conversation's writers queue here (the lock order: conversation,
                // then timer), so a hold is decided on the timer as it is.
                lock_conversation(&tx, check.conversation).await?;
                let past_limit = query_opt(
                    &tx,
                    "SELECT at FROM (
                         SELECT m.received_at AS at FROM messages m JOIN conversations c ON c.id = m.conversation_id
                         WHERE m.user_id = $1 AND m.received_at > $3
                           AND c.platform = (SELECT platform FROM conversations WHERE id = $2)
                         UNION ALL
                         SELECT e.edited_at FROM edits e
                         WHERE e.user_id = $1 AND e.edited_at > $3
                           AND e.platform = (SELECT platform FROM conversations WHERE id = $2)) recent
                     ORDER BY at DESC LIMIT 1 OFFSET $4",
                    &[&check.user_id, &check.conversation.0, &(now.db.0 - window), &i64::from(check.rate.max)],
                    "counting a user's recent messages",
                )
                .await?;
                let Some(past_limit) = past_limit.map(|r| r.get::<_, i64>(0)) else {
                    return Ok(None);
                };
                let until = Timestamp(past_limit).plus(check.rate.window);
                let held = query_opt(
                    &tx,
                    "SELECT held_until FROM timers WHERE conversation_id = $1 FOR UPDATE",
                    &[&check.conversation.0],
                    "reading the timer",
                )
                .await?;
                match rules::rate_verdict(held.map(|r| r.get::<_, i64>(0)), until, now.db) {
                    RateVerdict::Nothing => Ok(None),
                    RateVerdict::Kept(held_until) => Ok(Some(RateHold {
                        until: now.to_caller(held_until),
                        began: false,
                    })),
                    RateVerdict::Begin(until) => {
                        hold_timer(&tx, check.conversation, until).await?;
                        Ok(Some(RateHold {
                            until: now.to_caller(until),
                            began: true,
                        }))
                    }
                }
            }
            .await
        })
    }

    async fn charge_tokens(&self, charging: LeaseCharge<'_>) -> Result<Charged, StoreError> {
        let row = self.row(&charging.lease.key, &charging.lease.holder);
        // Budget rows are locked in one order, sorted once here (by scope, then
        // period key, each row once), every row of the charge before any is written:
        // concurrent charges queue on the first row they share and never deadlock.
        let scopes = crate::store::rules::sorted_scopes(&charging.charge.scopes);
        transaction!(self, Operation::Other, "charging tokens", |tx| {
            async {
                let now = self.now(&tx, charging.now).await?;
                ensure_lease(&tx, charging.lease, &row, now).await?;
                if let Some((refused, hold)) = refusal(&tx, &charging, &scopes).await? {
                    // Only a hold or a reservation names the conversation (a summary's
                    // charge is under its summary lease, and neither holds nor
                    // reserves).
                    if let Some(until) = hold {
                        let conversation = conversation_of(charging.lease);
                        hold_timer(&tx, conversation, now.to_db(until)).await?;
                    }
                    return Ok(refused);
                }
                for scope in &scopes {
                    // Totals are only ever added to, never written back from a read.
                    execute(
                        &tx,
                        "UPDATE token_usage SET tokens = GREATEST(tokens + $3::int8, 0), cost = GREATEST(cost + $4::int8, 0)
                         WHERE scope = $1 AND day = $2",
                        &[&scope.scope, &scope.row_day(&charging.charge.day), &scope.tokens, &scope.cost],
                        "charging tokens",
                    )
                    .await?;
                }
                keep_reservation(&tx, &charging, &scopes).await
            }
            .await
        })
    }

    async fn usage_between(
        &self,
        first: &str,
        last: &str,
        scopes: &[String],
    ) -> Result<Vec<Used>, StoreError> {
        transaction!(self, Operation::Read, "reading token usage", |tx| async {
            let rows = query(
                &tx,
                "SELECT s.scope, COALESCE(SUM(u.tokens), 0)::int8, COALESCE(SUM(u.cost), 0)::int8
                 FROM unnest($3::text[]) AS s (scope)
                 LEFT JOIN token_usage u ON u.scope = s.scope AND u.day >= $1 AND u.day <= $2
                 GROUP BY s.scope",
                &[&first, &last, &scopes],
                "reading token usage",
            )
            .await?;
            let used: std::collections::HashMap<String, Used> = rows
                .into_iter()
                .map(|r| (r.get(0), rules::used(r.get(1), r.get(2))))
                .collect();
            Ok(scopes
                .iter()
                .map(|scope| used.get(scope).copied().unwrap_or_default())
                .collect())
        }
        .await)
    }

    async fn set_access(&self, rule: &AccessRule) -> Result<(), StoreError> {
        transaction!(
            self,
            Operation::Other,
            "recording an access decision",
            |tx| {
                async {
                    execute(
                        &tx,
                        "INSERT INTO access_rules (platform, kind, subject, allowed, set_by, set_at)
                         VALUES ($1, $2, $3, $4, $5, $6)
                         ON CONFLICT (platform, kind, subject) DO UPDATE SET
                             allowed = excluded.allowed, set_by = excluded.set_by, set_at = excluded.set_at",
                        &[
                            &rule.subject.platform.as_str(),
                            &rule.subject.kind.as_str(),
                            &rule.subject.id,
                            &rule.allowed,
                            &rule.set_by,
                            &rule.set_at.0,
                        ],
                        "recording an access decision",
                    )
                    .await?;
                    Ok(())
                }
                .await
            }
        )
    }

    async fn access_rules(&self) -> Result<Vec<AccessRule>, StoreError> {
        transaction!(self, Operation::Read, "reading access decisions", |tx| {
            async {
                access_rules_of(query(&tx, ACCESS_RULES, &[], "reading access decisions").await?)
            }
            .await
        })
    }
}

/// Every run-time access decision, oldest first.
pub(super) const ACCESS_RULES: &str =
    "SELECT platform, kind, subject, allowed, set_by, set_at FROM access_rules ORDER BY set_at, id";

/// Access decisions from the rows of [`ACCESS_RULES`].
pub(super) fn access_rules_of(rows: Vec<Row>) -> Result<Vec<AccessRule>, StoreError> {
    rows.into_iter()
        .map(|r| {
            crate::store::rules::access_rule(
                r.get(0),
                r.get(1),
                r.get(2),
                r.get(3),
                r.get(4),
                r.get(5),
            )
        })
        .collect()
}

/// Lock every budget row of the charge (`scopes`, in order; a missing row made
/// first), and answer the first budget the charge would pass, with the hold it puts
/// on the caller's timeline ([`rules::refusal`]); `None`: every budget has room.
async fn refusal(
    tx: &Tx<'_>,
    charging: &LeaseCharge<'_>,
    scopes: &[ScopeCharge],
) -> Result<Option<(Charged, Option<Timestamp>)>, StoreError> {
    let charge = charging.charge;
    for scope in scopes {
        let row_day = scope.row_day(&charge.day);
        execute(
            tx,
            "INSERT INTO token_usage (scope, day, tokens) VALUES ($1, $2, 0)
             ON CONFLICT (scope, day) DO NOTHING",
            &[&scope.scope, &row_day],
            "reading a budget",
        )
        .await?;
        // Budgets: what a scope used is read under its row lock, so two charges never
        // both fit the same remainder.
        let used = query_one(
            tx,
            "SELECT tokens, cost FROM token_usage WHERE scope = $1 AND day = $2 FOR UPDATE",
            &[&scope.scope, &row_day],
            "reading a budget",
        )
        .await?;
        let (tokens, cost): (i64, i64) = (used.get(0), used.get(1));
        if let Some(over) = rules::over_budget(scope, tokens, cost) {
            // Refused only by other rounds' open reservations (committed with the
            // charges this row lock waited for), a reservation tries again once they
            // settle.
            let busy = charge.reservation == Reservation::Reserve
                && rules::busy_only(
                    scope,
                    tokens,
                    cost,
                    reserved_by_others(tx, scope, &row_day, charging.lease).await?,
                );
            return Ok(Some(rules::refusal(
                over,
                busy,
                charge.hold_until,
                charging.now,
            )));
        }
    }
    Ok(None)
}

/// What a charged charge does to the lease's reservation: a `Reserve` is recorded
/// under the lease's token on each row it charged (given back at the next claim
/// unless settled), a `Settle` forgets the lease's record.
async fn keep_reservation(
    tx: &Tx<'_>,
    charging: &LeaseCharge<'_>,
    scopes: &[ScopeCharge],
) -> Result<Charged, StoreError> {
    let (lease, charge) = (charging.lease, charging.charge);
    match charge.reservation {
        Reservation::None => {}
        Reservation::Reserve => {
            // Every reservation expires: recorded under the lease's token, it is
            // given back at the next claim unless settled.
            for scope in scopes {
                execute(
                    tx,
                    "INSERT INTO token_reservations (conversation_id, lease_token, day, scope, tokens, cost)
                     VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (conversation_id, lease_token, day, scope)
                     DO UPDATE SET tokens = token_reservations.tokens + EXCLUDED.tokens,
                                   cost = token_reservations.cost + EXCLUDED.cost",
                    &[&conversation_of(lease).0, &lease.token.0, &scope.row_day(&charge.day), &scope.scope, &scope.tokens, &scope.cost],
                    "recording a reservation",
                )
                .await?;
            }
        }
        Reservation::Settle => {
            execute(
                tx,
                "DELETE FROM token_reservations WHERE conversation_id = $1 AND lease_token = $2",
                &[&conversation_of(lease).0, &lease.token.0],
                "settling a reservation",
            )
            .await?;
        }
    }
    Ok(Charged::Charged)
}

/// The tokens and nano-dollars other rounds (any lease but `lease`) reserved on the
/// budget row (`scope`, `row_day`) and have not settled.
async fn reserved_by_others(
    tx: &Tx<'_>,
    scope: &ScopeCharge,
    row_day: &str,
    lease: &crate::domain::Lease,
) -> Result<(i64, i64), StoreError> {
    let row = query_one(
        tx,
        "SELECT COALESCE(SUM(tokens), 0)::int8, COALESCE(SUM(cost), 0)::int8 FROM token_reservations
         WHERE scope = $1 AND day = $2 AND NOT (conversation_id = $3 AND lease_token = $4)",
        &[&scope.scope, &row_day, &conversation_of(lease).0, &lease.token.0],
        "reading open reservations",
    )
    .await?;
    Ok((row.get(0), row.get(1)))
}

/// Hold a conversation's timer: not due before `until` (a later deadline is kept).
async fn hold_timer(
    tx: &Tx<'_>,
    conversation: ConversationId,
    until: Timestamp,
) -> Result<(), StoreError> {
    // Limits: a held conversation's messages wait (stored, pending) until `until`;
    // later messages, /reset and a forced commit re-arm the timer no sooner.
    execute(
        tx,
        "UPDATE timers SET held_until = GREATEST(held_until, $2), due_at = GREATEST(due_at, $2)
         WHERE conversation_id = $1",
        &[&conversation.0, &until.0],
        "holding a timer",
    )
    .await?;
    Ok(())
}
