//! Act once (DESIGN.md, "Actions: act once"): a call that acts is **reserved before it
//! runs**. [`ActionStore::reserve_action`](crate::store::ActionStore::reserve_action)
//! checks, under the lease, that the conversation is still at the round's `v0` — the
//! final check moved in front of the side effect — and reads the journal: a call
//! already taken for this batch is answered with its stored result, never run again;
//! one whose earlier attempt was interrupted is reported as of unknown outcome (run
//! again only when the tool declares itself idempotent); a destructive one waits for
//! the person's `/approve` (`approvals`). A finished call's result is recorded, retried
//! until it lands; the actions of a batch are reported with its reply.
//!
//! Once a call that acts has started, it is not abandoned when the lease is lost (its
//! result is a fact to record); only the hard stop of shutdown leaves it, and then its
//! reservation expires into "outcome unknown".

use std::time::Duration;

use super::{Interrupt, Round};
use crate::dispatcher::Event;
use crate::dispatcher::notices::Notice;
use crate::domain::{LeaseToken, Version};
use crate::metrics as names;
use crate::store::{
    ActionKey, ActionReservation, ActionResult, ActionRow, ActionState, Askers, Batch, BatchOf,
    NewAction, OutboxRow, Reserve, canonical_json,
};
use crate::texts::{self, ActionOutcome, NoticeText};
use crate::tools::{ToolSpec, Toolbox};

/// What the round tells the model a call gave, or that the round must stop.
pub(super) enum Answer {
    Result(String),
    Stale(Version),
}

/// A reservation of a call that acts expires this long after its call's deadline:
/// a holder still recording its result is not taken for dead.
pub(super) const RESERVATION_MARGIN: Duration = Duration::from_secs(5);

/// Between tries of recording a call's result: 25 ms doubling to 200 ms.
const RECORD_BACKOFF: lull_port::retry::Backoff =
    lull_port::retry::Backoff::new(Duration::from_millis(25), Duration::from_millis(200));

/// Tries of recording a call's result after the hard stop (before it, until it lands).
const RECORD_TRIES_AFTER_STOP: u32 = 3;

/// A call that acts, as the model asked for it.
pub(super) struct Acting<'t> {
    pub(super) toolbox: &'t dyn Toolbox,
    pub(super) spec: &'t ToolSpec,
    pub(super) arguments: serde_json::Map<String, serde_json::Value>,
    /// The tool declares that running it twice does what running it once does.
    pub(super) idempotent: bool,
    /// It waits for the person's `/approve` before it runs.
    pub(super) destructive: bool,
}

impl Round<'_> {
    /// Reserve a call that acts and run it once; a call the journal already holds is
    /// answered from it (its result, its unknown outcome, its approval question).
    pub(super) async fn act(
        &self,
        acting: Acting<'_>,
        batch: &Batch,
        rows: &mut Vec<OutboxRow>,
    ) -> Result<Answer, Interrupt> {
        let Some(first) = batch.pending.first() else {
            return Ok(Answer::Result(texts::unknown_tool_result(
                &acting.spec.name,
            )));
        };
        let canonical = canonical_json(&serde_json::Value::Object(acting.arguments.clone()));
        let key = ActionKey::of(self.conversation, first.row, &acting.spec.name, &canonical);
        // Read before the reservation: once reserved, nothing may fail before the call
        // (a reservation that never ran would be reported as of unknown outcome).
        let salt = self.dispatcher.idempotency_salt().await?;
        loop {
            let action = NewAction {
                key: key.clone(),
                batch: first.row,
                tool: acting.spec.name.clone(),
                arguments: canonical.clone(),
                idempotent: acting.idempotent,
                needs_approval: acting.destructive,
                requested_by: Askers::of(batch.pending.iter().map(|m| m.user_id.as_str())).stored(),
                expires_at: self.reservation_expiry(acting.destructive),
                approved: None,
            };
            let lease = self.keeper.lease();
            let reserve = Reserve {
                lease: &lease,
                v0: batch.v0,
                action,
                now: self.dispatcher.clock.now(),
            };
            let reservation = self.dispatcher.store.reserve_action(reserve).await?;
            if let Some(answer) = self
                .reserved(reservation, &acting, batch, salt, rows)
                .await?
            {
                return Ok(answer);
            }
        }
    }

    /// When a reservation made now expires: a destructive call's question after
    /// `LULL_APPROVAL_TTL`, a call after its deadline and a margin.
    fn reservation_expiry(&self, destructive: bool) -> crate::domain::Timestamp {
        let d = self.dispatcher;
        let now = d.clock.now();
        if destructive {
            now.plus(d.settings.tools.approval_ttl)
        } else {
            now.plus(d.settings.tools.call_timeout + RESERVATION_MARGIN)
        }
    }

    /// What the journal's answer to a reservation makes of the call: run it (reserved
    /// now), its stored outcome, a question for the person, or the round's end (a
    /// newer message). `None`: an earlier holder may still be running it; ask again
    /// after a wait.
    async fn reserved(
        &self,
        reservation: ActionReservation,
        acting: &Acting<'_>,
        batch: &Batch,
        salt: &str,
        rows: &mut Vec<OutboxRow>,
    ) -> Result<Option<Answer>, Interrupt> {
        let spec = acting.spec;
        let conversation = self.conversation;
        let told = match reservation {
            ActionReservation::Reserved(row) => {
                let arguments = acting.arguments.clone();
                self.run_reserved(batch, acting.toolbox, spec, arguments, (&row, salt))
                    .await?
            }
            ActionReservation::Done(row) => {
                count(&spec.server, &spec.tool, "reused");
                tracing::info!(%conversation, tool = %spec.name, action = row.id, "action already taken for this batch; its result reused");
                let result = row.result.unwrap_or_default();
                texts::reused_result(&texts::tool_output_result(&result, row.is_error))
            }
            ActionReservation::InFlight { until } => {
                self.wait_in_flight(spec, until).await?;
                return Ok(None);
            }
            ActionReservation::Unknown(row) => {
                count(&spec.server, &spec.tool, "unknown");
                tracing::warn!(%conversation, tool = %spec.name, action = row.id, "an earlier attempt of this action gave no answer; outcome unknown, not run again");
                // Its recorded reason when it ended without an answer; else it was
                // interrupted before anything was recorded.
                row.result
                    .unwrap_or_else(|| texts::OUTCOME_UNKNOWN_RESULT.to_owned())
            }
            ActionReservation::Awaiting { row, asked_now } => {
                if asked_now {
                    rows.extend(self.ask_approval(batch, spec, &row).await?);
                }
                texts::awaiting_approval_result(row.id)
            }
            ActionReservation::Refused(_) => {
                count(&spec.server, &spec.tool, "refused");
                texts::REFUSED_ACTION_RESULT.to_owned()
            }
            ActionReservation::Stale { version } => {
                return Ok(Some(self.stale_call(spec, batch, version)));
            }
        };
        Ok(Some(Answer::Result(told)))
    }

    /// An earlier holder may still be running the call: wait for its result or its
    /// reservation's expiry (at most half a second at a time), under the lease.
    async fn wait_in_flight(
        &self,
        spec: &ToolSpec,
        until: crate::domain::Timestamp,
    ) -> Result<(), Interrupt> {
        let wait = self
            .dispatcher
            .clock
            .now()
            .until(until)
            .max(Duration::from_millis(50));
        tracing::info!(conversation = %self.conversation, tool = %spec.name, wait_ms = wait.as_millis() as u64, "action reserved by an earlier round; waiting for its result or expiry");
        let pause = tokio::time::sleep(wait.min(Duration::from_millis(500)));
        self.guarded(async {
            pause.await;
            Ok(())
        })
        .await
    }

    /// Queue the question a destructive call asks (once: when it was reserved now).
    async fn ask_approval(
        &self,
        batch: &Batch,
        spec: &ToolSpec,
        row: &ActionRow,
    ) -> Result<Option<OutboxRow>, Interrupt> {
        let d = self.dispatcher;
        let ttl = humantime::format_duration(d.settings.tools.approval_ttl).to_string();
        let question = texts::approval_question(row.id, &spec.name, &row.arguments, &ttl);
        let key = format!("approval/{}/{}", self.conversation, row.id);
        let asked = Notice::to_batch(batch)
            .queue(d, question, key, d.clock.now())
            .await?;
        d.emit(Event::ApprovalAsked {
            conversation: self.conversation,
            action: row.id,
        });
        Ok(asked)
    }

    /// A newer message arrived before the call could be reserved: not run on the old
    /// picture. At the cap the round's reply goes out whatever arrives, so the call is
    /// told "not run" and the round goes on to that reply (no loss: the bound holds
    /// with tools as without); else the round ends, and the next one covers both.
    fn stale_call(&self, spec: &ToolSpec, batch: &Batch, version: Version) -> Answer {
        let conversation = self.conversation;
        if self.at_cap(batch) {
            count(&spec.server, &spec.tool, "moved");
            tracing::info!(%conversation, tool = %spec.name, v0 = batch.v0.0, version = version.0, "a newer message arrived before an action at the cap; not run, the forced reply says so");
            return Answer::Result(texts::MOVED_ON_RESULT.to_owned());
        }
        count(&spec.server, &spec.tool, "stale");
        tracing::debug!(%conversation, tool = %spec.name, v0 = batch.v0.0, version = version.0, "a newer message arrived before an action; not acting on the old picture");
        Answer::Stale(version)
    }

    /// Run a call reserved for this round, and record its result (a fact, recorded
    /// even if the lease was lost meanwhile). `salt`: the database's idempotency salt,
    /// read before the reservation ([`ActionKey::for_server`]): between the reservation
    /// and the call nothing may fail.
    pub(super) async fn run_reserved(
        &self,
        batch: &Batch,
        toolbox: &dyn Toolbox,
        spec: &ToolSpec,
        arguments: serde_json::Map<String, serde_json::Value>,
        (row, salt): (&ActionRow, &str),
    ) -> Result<String, Interrupt> {
        let d = self.dispatcher;
        tracing::info!(conversation = %self.conversation, tool = %spec.name, action = row.id, "running an action (reserved)");
        d.emit(Event::ActionStarted {
            conversation: self.conversation,
            action: row.id,
        });
        // The key the server sees is salted by this database (a second deployment or a
        // restored backup never sends the same key for another call).
        let key = row.key.for_server(salt);
        // Only the hard stop leaves a running call: its reservation expires into
        // "outcome unknown".
        let output = self
            .until_stop(self.calling(batch, toolbox, spec, arguments, Some(&key)))
            .await?;
        count(&spec.server, &spec.tool, output.outcome.label());
        // An action without an answer (in time, or at all: the server died, the
        // connection broke after the request) may or may not have acted: recorded,
        // and told, as of unknown outcome (never as a plain failure).
        let unknown = output.outcome.is_unknown();
        let text = if unknown {
            tracing::warn!(conversation = %self.conversation, tool = %spec.name, outcome = output.outcome.label(), "an action gave no answer; its outcome is unknown");
            texts::unknown_action_result(&output.text)
        } else {
            output.text.clone()
        };
        self.record(&row.key, row.token, &text, output.is_error, unknown)
            .await;
        // The result is recorded; the round goes on only under its lease.
        if self.keeper.is_lost() {
            return Err(Interrupt::LeaseLost);
        }
        Ok(if unknown {
            text
        } else {
            texts::tool_output_result(&output.text, output.is_error)
        })
    }

    /// Run one call, the draft (where the platform has drafts) saying which tool
    /// runs; never committed, the reply replaces it.
    pub(super) async fn calling(
        &self,
        batch: &Batch,
        toolbox: &dyn Toolbox,
        spec: &ToolSpec,
        arguments: serde_json::Map<String, serde_json::Value>,
        key: Option<&str>,
    ) -> crate::tools::ToolOutput {
        self.showing(batch, |partial| async move {
            partial.push(&texts::tool_running_draft(&spec.name));
            toolbox.call(&spec.name, arguments, key).await
        })
        .await
    }

    /// Record a call's result, retried until it lands (a finished action is a fact;
    /// after the hard stop, a few more tries, then one error line).
    async fn record(
        &self,
        key: &ActionKey,
        token: LeaseToken,
        text: &str,
        is_error: bool,
        unknown: bool,
    ) {
        let d = self.dispatcher;
        let mut tries_after_stop = 0;
        let mut attempt = 0u32;
        loop {
            match d
                .store
                .finish_action(ActionResult {
                    key,
                    token,
                    result: text,
                    is_error,
                    unknown,
                    now: d.clock.now(),
                })
                .await
            {
                Ok(true) => return,
                Ok(false) => {
                    tracing::warn!(conversation = %self.conversation, action = %key.0, "an action's result found its reservation taken over; not recorded");
                    return;
                }
                Err(e) => {
                    if self.stop.is_cancelled() {
                        tries_after_stop += 1;
                        if tries_after_stop > RECORD_TRIES_AFTER_STOP {
                            tracing::error!(conversation = %self.conversation, action = %key.0, error = %e, "could not record an action's result before stopping; a later round will report its outcome as unknown");
                            return;
                        }
                    }
                    attempt += 1;
                    let wait = RECORD_BACKOFF.delay(attempt);
                    tracing::warn!(conversation = %self.conversation, action = %key.0, error = %e, "could not record an action's result; retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// The report of the actions of `batch` and of the approvals `decided` in this
    /// round, to end its reply with (empty: none), and the answers it offers when a
    /// notice ends with it.
    pub(super) async fn actions_report(
        &self,
        batch: &Batch,
        decided: &[ActionRow],
    ) -> Result<NoticeText, Interrupt> {
        let Some(first) = batch.pending.first() else {
            return Ok(NoticeText::default());
        };
        let of = BatchOf {
            conversation: self.conversation,
            batch: first.row,
        };
        Ok(batch_report(self.dispatcher, of, decided).await?)
    }
}

/// The report of the actions of the batch `of`, and of `decided` (approvals decided
/// for it), as a reply or a notice that ends the batch ends with it (empty: none, or
/// no tools). A notice ending with it offers "Approve" for each action still waiting
/// for its approval; a reply offers nothing (it uses the text alone).
pub(in crate::dispatcher) async fn batch_report(
    d: &crate::dispatcher::Dispatcher,
    of: BatchOf,
    decided: &[ActionRow],
) -> Result<NoticeText, crate::store::StoreError> {
    // No tools at all (`LULL_TOOLS=off`): nothing can have acted.
    if d.toolbox().is_none() && !d.settings.builtin_tools {
        return Ok(NoticeText::default());
    }
    let mut taken = d.store.actions_of_batch(of).await?;
    taken.extend(decided.iter().cloned());
    let lines = action_lines(&taken);
    if lines.is_empty() {
        return Ok(NoticeText::default());
    }
    let awaiting: Vec<i64> = taken
        .iter()
        .filter_map(|row| match outcome(row) {
            ActionOutcome::Awaiting(id) => Some(id),
            _ => None,
        })
        .collect();
    Ok(NoticeText {
        text: texts::actions_report(&lines),
        quick_replies: texts::awaiting_replies(&awaiting),
    })
}

/// One line per action of the journal, as the user and the model are told them (the
/// words are [`texts::action_line`]'s).
pub(super) fn action_lines(rows: &[ActionRow]) -> Vec<String> {
    rows.iter()
        .map(|row| texts::action_line(&row.tool, &shortened(&row.arguments), outcome(row)))
        .collect()
}

/// What came of an action, as its journal row says: a reserved row whose round never
/// recorded a result may or may not have acted.
fn outcome(row: &ActionRow) -> ActionOutcome {
    let no_answer = || {
        row.result
            .as_deref()
            .is_some_and(|r| r.starts_with(texts::OUTCOME_UNKNOWN_PREFIX))
    };
    match row.state {
        // Rows of versions before unknown outcomes were stored as such.
        ActionState::Done if row.is_error && no_answer() => ActionOutcome::NoAnswer,
        ActionState::Done if row.is_error => ActionOutcome::Failed,
        ActionState::Done => ActionOutcome::Done,
        ActionState::Unknown if row.result.is_some() => ActionOutcome::NoAnswer,
        ActionState::Unknown | ActionState::Reserved => ActionOutcome::Unknown,
        ActionState::Awaiting => ActionOutcome::Awaiting(row.id),
        ActionState::Approved => ActionOutcome::Approved,
        ActionState::Refused => ActionOutcome::Refused,
    }
}

/// The longest arguments a report shows, in characters.
const REPORTED_ARGUMENTS_CHARS: usize = 200;

/// `arguments` as a report shows them: cut with `…` past
/// [`REPORTED_ARGUMENTS_CHARS`].
fn shortened(arguments: &str) -> String {
    if arguments.chars().count() <= REPORTED_ARGUMENTS_CHARS {
        return arguments.to_owned();
    }
    let cut: String = arguments.chars().take(REPORTED_ARGUMENTS_CHARS).collect();
    format!("{cut}…")
}

/// Count a call in `lull_tool_calls_total`.
pub(super) fn count(server: &str, tool: &str, outcome: &'static str) {
    metrics::counter!(names::TOOL_CALLS, "server" => server.to_owned(), "tool" => tool.to_owned(), "outcome" => outcome)
        .increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_shows_long_arguments_cut() {
        assert_eq!(shortened(r#"{"a":1}"#), r#"{"a":1}"#);
        let long = format!(r#"{{"text":"{}"}}"#, "x".repeat(500));
        let shown = shortened(&long);
        assert_eq!(shown.chars().count(), REPORTED_ARGUMENTS_CHARS + 1);
        assert!(shown.ends_with('…'));
    }
}
