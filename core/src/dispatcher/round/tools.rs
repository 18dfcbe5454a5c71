//! The round's tool loop: the model asks for calls, the round answers them and asks
//! again, at most `LULL_TOOL_STEPS` model turns (the last is asked without tools, so
//! it answers).
//!
//! A call that acts is **reserved before it runs** (DESIGN.md, "Actions: act once"):
//! [`ActionStore::reserve_action`](crate::store::ActionStore::reserve_action) checks,
//! under the lease, that the conversation is still at the round's `v0` — the final
//! check moved in front of the side effect — and reads the journal: a call already
//! taken for this batch is answered with its stored result, never run again; one
//! whose earlier attempt was interrupted is reported as of unknown outcome (run again
//! only when the tool declares itself idempotent); a destructive one waits for the
//! person's `/approve`. Read-only calls run freely.
//!
//! Once a call that acts has started, it is not abandoned when the lease is lost (its
//! result is a fact to record); only the hard stop of shutdown leaves it, and then its
//! reservation expires into "outcome unknown".

use std::time::Duration;

use super::{Interrupt, Round, add_note};
use crate::dispatcher::Event;
use crate::dispatcher::notices::Notice;
use crate::dispatcher::wallet::Spent;
use crate::domain::{LeaseToken, Version};
use crate::llm::{FailureKind, Generation, LlmError, Prompt, ToolCall, ToolTurn};
use crate::metrics as names;
use crate::store::{
    ActionKey, ActionReservation, ActionResult, ActionRow, ActionState, Askers, Batch, BatchOf,
    NewAction, OutboxRow, Reserve, canonical_json,
};
use crate::texts;
use crate::tools::{Effect, ToolSpec, Toolbox, Users};

/// How a round's generation ended.
pub(super) enum Generated {
    /// The model's reply; `spent` counts every turn.
    Reply {
        generation: Generation,
        spent: Spent,
    },
    /// The model failed; `spent`: what earlier turns of the loop spent.
    Failed { error: LlmError, spent: Spent },
    /// A newer message arrived before a call that acts: nothing acted; the round
    /// ends without a reply (the next round, covering everything, decides again).
    Stale { version: Version, spent: Spent },
}

impl Generated {
    /// Count `earlier` (turns before this generation was asked again) in its spend.
    pub(super) fn add_spent(&mut self, earlier: Spent) {
        match self {
            Generated::Reply { spent, .. }
            | Generated::Failed { spent, .. }
            | Generated::Stale { spent, .. } => *spent += earlier,
        }
    }
}

/// How one model turn ended.
enum Turn {
    Answered(Result<Generation, LlmError>),
    /// A newer message made the reply stale while it was written (not at the cap):
    /// the request was dropped (the stream closed), at this version.
    Overtaken(Version),
}

/// What the round tells the model a call gave, or that the round must stop.
enum Answer {
    Result(String),
    Stale(Version),
}

/// A reservation of a call that acts expires this long after its call's deadline:
/// a holder still recording its result is not taken for dead.
pub(super) const RESERVATION_MARGIN: Duration = Duration::from_secs(5);

/// Tries of recording a call's result after the hard stop (before it, until it lands).
const RECORD_TRIES_AFTER_STOP: u32 = 3;

impl Round<'_> {
    /// Generate the reply to `prompt`, answering the model's tool calls in between.
    /// The notices it queues (an approval's question) join `rows`.
    pub(super) async fn generate_acting(
        &self,
        batch: &Batch,
        prompt: &mut Prompt,
        rows: &mut Vec<OutboxRow>,
    ) -> Result<Generated, Interrupt> {
        let d = self.dispatcher;
        let toolbox = d.toolbox().cloned();
        let model = prompt
            .choices
            .model
            .clone()
            .unwrap_or_else(|| d.settings.controls.default_model.clone());
        let offered = match &toolbox {
            Some(toolbox) if !d.tool_refusals.refused(&model, std::time::Instant::now()) => {
                self.offered(toolbox.as_ref(), batch)
            }
            _ => Vec::new(),
        };
        if let Some(first) = batch.pending.first()
            && toolbox.is_some()
        {
            let taken = d
                .store
                .actions_of_batch(BatchOf {
                    conversation: self.conversation,
                    batch: first.row,
                })
                .await?;
            let lines = action_lines(&taken);
            if !lines.is_empty() {
                add_note(prompt, &texts::actions_taken_note(&lines));
            }
        }
        // Admins-only tools are offered only to a prompt whose every text comes from
        // admins: in a group, others' words (history, group context) are left out of
        // it (docs/tools.md); the batch's authors were checked by `offered`.
        if batch.is_group && offered.iter().any(|t| t.users == Users::Admins) {
            prompt.history.clear();
            prompt.overheard.clear();
        }
        prompt.tools = offered.into();
        let steps = d.settings.tools.steps.max(1);
        let mut spent = Spent::default();
        let mut turn = 0;
        loop {
            turn += 1;
            if turn >= steps {
                // The last turn answers: no more calls.
                prompt.tools = Vec::new().into();
            }
            let generated = match self.generate_once(batch, prompt).await? {
                Turn::Answered(generated) => generated,
                Turn::Overtaken(version) => {
                    spent += self.overtaken_spent(prompt);
                    return Ok(Generated::Stale { version, spent });
                }
            };
            let generation = match generated {
                Ok(generation) => generation,
                Err(error)
                    if error.kind() == FailureKind::Refused
                        && !prompt.tools.is_empty()
                        && !matches!(error, LlmError::OutOfCredit { .. }) =>
                {
                    // A model without tool support refuses `tools` (4xx): ask again
                    // without them; if that is answered, offer none from now on.
                    let tools = std::mem::replace(&mut prompt.tools, Vec::new().into());
                    let again = match self.generate_once(batch, prompt).await? {
                        Turn::Answered(again) => again,
                        Turn::Overtaken(version) => {
                            spent += self.overtaken_spent(prompt);
                            return Ok(Generated::Stale { version, spent });
                        }
                    };
                    match again {
                        Ok(generation) => {
                            // Remembered only when the refusal named tools, for this
                            // model, for a while (`tool_refusals`).
                            if d.tool_refusals
                                .record(&model, &error, std::time::Instant::now())
                            {
                                tracing::warn!(conversation = %self.conversation, %model, error = %error, tools = tools.len(), "the model refused the tools; answering without them for a while (set LULL_TOOLS=off for a model without tool support)");
                            }
                            generation
                        }
                        Err(error) => return Ok(Generated::Failed { error, spent }),
                    }
                }
                Err(error) => return Ok(Generated::Failed { error, spent }),
            };
            spent += Spent::of(&d.settings.limits, prompt, &generation);
            if generation.tool_calls.is_empty() {
                return Ok(Generated::Reply { generation, spent });
            }
            let mut results = Vec::with_capacity(generation.tool_calls.len());
            for call in &generation.tool_calls {
                match self
                    .answer_call(toolbox.as_deref(), &prompt.tools, batch, call, rows)
                    .await?
                {
                    Answer::Result(text) => results.push(text),
                    Answer::Stale(version) => {
                        return Ok(Generated::Stale { version, spent });
                    }
                }
            }
            prompt.turns.push(ToolTurn {
                text: generation.text,
                calls: generation.tool_calls,
                results,
            });
        }
    }

    /// One model turn, abandoned when the lease is lost or lull stops, and stopped
    /// when a newer message overtakes it ([`Round::overtaken`]).
    async fn generate_once(&self, batch: &Batch, prompt: &Prompt) -> Result<Turn, Interrupt> {
        tokio::select! {
            generated = self.generate(batch, prompt) => Ok(Turn::Answered(generated)),
            version = self.overtaken(batch) => Ok(Turn::Overtaken(version)),
            () = self.keeper.lost() => Err(Interrupt::LeaseLost),
            () = self.stop.cancelled() => Err(Interrupt::Stopped),
        }
    }

    /// Completes, with the conversation's newer version, once a message newer than
    /// the batch is stored: on this process at once (the event bus), on another at the
    /// next look (every `LULL_POLL_MS`). Never while the batch's oldest message has
    /// waited the cap (a forced round finishes: its reply goes out whatever arrives),
    /// nor with `cancel_overtaken` off. Only ever a saving: the final check drops a
    /// stale reply anyway.
    async fn overtaken(&self, batch: &Batch) -> Version {
        let d = self.dispatcher;
        let never = || std::future::pending::<Version>();
        let Some(oldest) = batch.oldest_pending_at() else {
            return never().await;
        };
        if !d.settings.cancel_overtaken {
            return never().await;
        }
        let here =
            crate::dispatcher::drafts::newer_message(d.subscribe(), self.conversation, batch.v0);
        let elsewhere = async {
            loop {
                tokio::time::sleep(d.settings.poll_every).await;
                if let Ok(now) = d.store.collect(self.conversation, 0).await
                    && now.v0 > batch.v0
                {
                    return now.v0;
                }
            }
        };
        let version = tokio::select! {
            () = here => Version(batch.v0.0 + 1),
            version = elsewhere => version,
        };
        if d.settings.timers.cap_reached(d.clock.now(), oldest) {
            return never().await;
        }
        metrics::counter!(names::GENERATIONS_CANCELLED).increment(1);
        tracing::info!(conversation = %self.conversation, v0 = batch.v0.0, version = version.0, "a newer message overtook the generation; stopped it (the covering round starts now)");
        d.emit(Event::GenerationCancelled {
            conversation: self.conversation,
            v0: batch.v0,
        });
        version
    }

    /// Whether the batch's oldest message has waited the cap: its reply is committed
    /// (forced) whatever arrives from now on.
    pub(super) fn at_cap(&self, batch: &Batch) -> bool {
        let d = self.dispatcher;
        batch
            .oldest_pending_at()
            .is_some_and(|oldest| d.settings.timers.cap_reached(d.clock.now(), oldest))
    }

    /// What a generation stopped mid-way is charged: its prompt (estimated: the
    /// server never reported the usage of a request it did not finish).
    fn overtaken_spent(&self, prompt: &Prompt) -> Spent {
        let limits = &self.dispatcher.settings.limits;
        Spent::estimated(crate::dispatcher::wallet::prompt_tokens(limits, prompt))
    }

    /// The tools offered for `batch`: all of the toolbox's, but an admins-only
    /// server's only when everyone who wrote in the batch is an admin.
    fn offered(&self, toolbox: &dyn Toolbox, batch: &Batch) -> Vec<ToolSpec> {
        let admins = &self.dispatcher.settings.access.admins;
        let platform = batch.conversation.platform;
        let all_admins = batch
            .pending
            .iter()
            .all(|m| admins.contains(platform, &m.user_id));
        toolbox
            .tools()
            .into_iter()
            .filter(|tool| tool.users == Users::Allowed || all_admins)
            .collect()
    }

    /// Answer one call: run it (read-only), or reserve it and run it once (acting).
    async fn answer_call(
        &self,
        toolbox: Option<&dyn Toolbox>,
        offered: &[ToolSpec],
        batch: &Batch,
        call: &ToolCall,
        rows: &mut Vec<OutboxRow>,
    ) -> Result<Answer, Interrupt> {
        // Only a toolbox's tools are ever offered: without one, every call is unknown.
        let found = offered.iter().find(|t| t.name == call.name);
        let (Some(spec), Some(toolbox)) = (found, toolbox) else {
            count(&call.name, "", "refused");
            tracing::info!(conversation = %self.conversation, tool = %call.name, "the model called a tool that is not offered");
            return Ok(Answer::Result(texts::unknown_tool_result(&call.name)));
        };
        let arguments = match parse_arguments(&call.arguments) {
            Ok(arguments) => arguments,
            Err(error) => {
                count(&spec.server, &spec.tool, "error");
                return Ok(Answer::Result(texts::bad_arguments_result(&error)));
            }
        };
        let (idempotent, destructive) = match spec.effect {
            Effect::ReadOnly => {
                let output = tokio::select! {
                    output = self.calling(batch, toolbox, spec, arguments, None) => output,
                    () = self.keeper.lost() => return Err(Interrupt::LeaseLost),
                    () = self.stop.cancelled() => return Err(Interrupt::Stopped),
                };
                count(&spec.server, &spec.tool, output.outcome.label());
                return Ok(Answer::Result(result_text(&output.text, output.is_error)));
            }
            Effect::Acts { idempotent } => (idempotent, false),
            Effect::Destructive { idempotent } => (idempotent, true),
        };
        if crate::switches::no_journal() {
            // Counter-test build: the journal bypassed, every call simply runs.
            let output = toolbox.call(&spec.name, arguments, None).await;
            count(&spec.server, &spec.tool, output.outcome.label());
            return Ok(Answer::Result(result_text(&output.text, output.is_error)));
        }
        let d = self.dispatcher;
        let Some(first) = batch.pending.first() else {
            return Ok(Answer::Result(texts::unknown_tool_result(&call.name)));
        };
        let canonical = canonical_json(&serde_json::Value::Object(arguments.clone()));
        let key = ActionKey::of(self.conversation, first.row, &spec.name, &canonical);
        // Read before the reservation: once reserved, nothing may fail before the call
        // (a reservation that never ran would be reported as of unknown outcome).
        let salt = d.idempotency_salt().await?;
        let settings = d.settings.tools;
        loop {
            let now = d.clock.now();
            let expires_at = if destructive {
                now.plus(settings.approval_ttl)
            } else {
                now.plus(settings.call_timeout + RESERVATION_MARGIN)
            };
            let action = NewAction {
                key: key.clone(),
                batch: first.row,
                tool: spec.name.clone(),
                arguments: canonical.clone(),
                idempotent,
                needs_approval: destructive,
                requested_by: Askers::of(batch.pending.iter().map(|m| m.user_id.as_str())).stored(),
                expires_at,
                approved: None,
            };
            let lease = self.keeper.lease();
            let reservation = d
                .store
                .reserve_action(Reserve {
                    lease: &lease,
                    v0: batch.v0,
                    action,
                    now,
                })
                .await?;
            match reservation {
                ActionReservation::Reserved(row) => {
                    let result = self
                        .run_reserved(batch, toolbox, spec, arguments, (&row, salt))
                        .await?;
                    return Ok(Answer::Result(result));
                }
                ActionReservation::Done(row) => {
                    count(&spec.server, &spec.tool, "reused");
                    tracing::info!(conversation = %self.conversation, tool = %spec.name, action = row.id, "action already taken for this batch; its result reused");
                    let result = row.result.unwrap_or_default();
                    return Ok(Answer::Result(texts::reused_result(&result_text(
                        &result,
                        row.is_error,
                    ))));
                }
                ActionReservation::InFlight { until } => {
                    // An earlier holder may still be running it: wait for its result
                    // or its reservation's expiry, then ask again.
                    let wait = d.clock.now().until(until).max(Duration::from_millis(50));
                    tracing::info!(conversation = %self.conversation, tool = %spec.name, wait_ms = wait.as_millis() as u64, "action reserved by an earlier round; waiting for its result or expiry");
                    tokio::select! {
                        () = tokio::time::sleep(wait.min(Duration::from_millis(500))) => {}
                        () = self.keeper.lost() => return Err(Interrupt::LeaseLost),
                        () = self.stop.cancelled() => return Err(Interrupt::Stopped),
                    }
                }
                ActionReservation::Unknown(row) => {
                    count(&spec.server, &spec.tool, "unknown");
                    tracing::warn!(conversation = %self.conversation, tool = %spec.name, action = row.id, "an earlier attempt of this action gave no answer; outcome unknown, not run again");
                    // Its recorded reason when it ended without an answer; else it
                    // was interrupted before anything was recorded.
                    let told = row
                        .result
                        .unwrap_or_else(|| texts::OUTCOME_UNKNOWN_RESULT.to_owned());
                    return Ok(Answer::Result(told));
                }
                ActionReservation::Awaiting { row, asked_now } => {
                    if asked_now {
                        let ttl = humantime::format_duration(settings.approval_ttl).to_string();
                        let question =
                            texts::approval_question(row.id, &spec.name, &row.arguments, &ttl);
                        let key = format!("approval/{}/{}", self.conversation, row.id);
                        rows.extend(
                            Notice::to_batch(batch)
                                .queue(d, question, key, d.clock.now())
                                .await?,
                        );
                        d.emit(Event::ApprovalAsked {
                            conversation: self.conversation,
                            action: row.id,
                        });
                    }
                    return Ok(Answer::Result(texts::awaiting_approval_result(row.id)));
                }
                ActionReservation::Refused(_) => {
                    count(&spec.server, &spec.tool, "refused");
                    return Ok(Answer::Result(texts::REFUSED_ACTION_RESULT.to_owned()));
                }
                ActionReservation::Stale { version } => {
                    if self.at_cap(batch) {
                        // The cap forces this round's reply out whatever arrives: the
                        // call is not run on the old picture, and the round goes on to
                        // that reply (no loss: the bound holds with tools as without).
                        count(&spec.server, &spec.tool, "moved");
                        tracing::info!(conversation = %self.conversation, tool = %spec.name, v0 = batch.v0.0, version = version.0, "a newer message arrived before an action at the cap; not run, the forced reply says so");
                        return Ok(Answer::Result(texts::MOVED_ON_RESULT.to_owned()));
                    }
                    count(&spec.server, &spec.tool, "stale");
                    tracing::debug!(conversation = %self.conversation, tool = %spec.name, v0 = batch.v0.0, version = version.0, "a newer message arrived before an action; not acting on the old picture");
                    return Ok(Answer::Stale(version));
                }
            }
        }
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
        let output = tokio::select! {
            output = self.calling(batch, toolbox, spec, arguments, Some(&key)) => output,
            // Only the hard stop leaves a running call: its reservation expires into
            // "outcome unknown".
            () = self.stop.cancelled() => return Err(Interrupt::Stopped),
        };
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
            result_text(&output.text, output.is_error)
        })
    }

    /// Run one call, the draft (where the platform has drafts) saying which tool
    /// runs; never committed, the reply replaces it.
    async fn calling(
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
                    let wait = Duration::from_millis((25u64 << attempt.min(3)).min(200));
                    tracing::warn!(conversation = %self.conversation, action = %key.0, error = %e, "could not record an action's result; retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// The report of the actions of `batch` and of the approvals `decided` in this
    /// round, to end its reply with (empty: none).
    pub(super) async fn actions_report(
        &self,
        batch: &Batch,
        decided: &[ActionRow],
    ) -> Result<String, Interrupt> {
        let Some(first) = batch.pending.first() else {
            return Ok(String::new());
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
/// no tools).
pub(in crate::dispatcher) async fn batch_report(
    d: &crate::dispatcher::Dispatcher,
    of: BatchOf,
    decided: &[ActionRow],
) -> Result<String, crate::store::StoreError> {
    if d.toolbox().is_none() {
        return Ok(String::new());
    }
    let mut taken = d.store.actions_of_batch(of).await?;
    taken.extend(decided.iter().cloned());
    let lines = action_lines(&taken);
    Ok(if lines.is_empty() {
        String::new()
    } else {
        texts::actions_report(&lines)
    })
}

/// One line per action of the journal, as the user and the model are told them.
fn action_lines(rows: &[ActionRow]) -> Vec<String> {
    rows.iter()
        .map(|row| {
            let call = format!("{} {}", row.tool, shortened(&row.arguments));
            match row.state {
                // Rows of versions before unknown outcomes were stored as such.
                ActionState::Done
                    if row.is_error
                        && row
                            .result
                            .as_deref()
                            .is_some_and(|r| r.starts_with(texts::OUTCOME_UNKNOWN_PREFIX)) =>
                {
                    format!("⚠ {call}: outcome unknown (no answer)")
                }
                ActionState::Done if row.is_error => format!("✗ {call} failed"),
                ActionState::Done => format!("✓ {call}"),
                ActionState::Unknown if row.result.is_some() => {
                    format!("⚠ {call}: outcome unknown (no answer)")
                }
                ActionState::Unknown | ActionState::Reserved => {
                    format!("⚠ {call}: outcome unknown")
                }
                ActionState::Awaiting => format!("⏳ {call}: waiting for /approve {}", row.id),
                ActionState::Approved => format!("⏳ {call}: approved, about to run"),
                ActionState::Refused => format!("✗ {call}: not approved, not run"),
            }
        })
        .collect()
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

/// The model's arguments as a JSON object (empty text: no arguments).
fn parse_arguments(text: &str) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    if text.trim().is_empty() {
        return Ok(serde_json::Map::new());
    }
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(other) => Err(format!("got {}", json_kind(&other))),
        Err(e) => Err(e.to_string()),
    }
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// A tool's output as the model reads it: a failure says so.
fn result_text(text: &str, is_error: bool) -> String {
    if is_error {
        format!("Error: {text}")
    } else {
        text.to_owned()
    }
}

/// Count a call in `lull_tool_calls_total`.
fn count(server: &str, tool: &str, outcome: &'static str) {
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

    #[test]
    fn arguments_are_a_json_object_or_nothing() {
        assert!(parse_arguments("").unwrap().is_empty());
        assert_eq!(parse_arguments(r#"{"a":1}"#).unwrap()["a"], 1);
        assert_eq!(parse_arguments("[1]").unwrap_err(), "got an array");
        assert!(parse_arguments("{").is_err());
    }
}
