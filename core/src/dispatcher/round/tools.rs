//! The round's tool loop: the model asks for calls, the round answers them and asks
//! again, at most `LULL_TOOL_STEPS` model turns (the last is asked without tools, so
//! it answers).
//!
//! A read-only call runs freely, abandoned with the round when the lease is lost; a
//! call that acts is reserved before it runs and run once (`actions`).

use super::actions::{Acting, Answer, action_lines, count};
use super::{Interrupt, Round, add_note};
use crate::dispatcher::Event;
use std::sync::Arc;

use crate::dispatcher::job_tools::{ForBatch, JobTools};
use crate::dispatcher::memory::{MemoryTools, Recalled};
use crate::dispatcher::wallet::{self, Spent};
use crate::domain::Version;
use crate::llm::{FailureKind, Generation, LlmError, Prompt, ToolCall, ToolTurn};
use crate::metrics as names;
use crate::store::{Batch, BatchOf, OutboxRow};
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

/// lull's own tools a round offers in a private chat, as [`Round::toolbox_for`] layers
/// them (the console's tools page): with `LULL_TOOLS=auto` or MCP servers, the job
/// tools when jobs are on; the web tools that are on; with `LULL_TOOLS=auto`, the
/// memory tools when memory is on.
pub(in crate::dispatcher) fn own_tools(d: &crate::dispatcher::Dispatcher) -> Vec<ToolSpec> {
    let mut tools = Vec::new();
    if d.settings.jobs.is_some() && (d.settings.builtin_tools || d.toolbox().is_some()) {
        tools.extend(crate::dispatcher::job_tools::job_specs());
    }
    if let Some(web) = d.web() {
        tools.extend(web.specs());
    }
    if d.settings.memory.is_some() && d.settings.builtin_tools {
        tools.extend(crate::dispatcher::memory::memory_specs());
    }
    tools
}
impl Round<'_> {
    /// Generate the reply to `prompt`, answering the model's tool calls in between.
    /// The notices it queues (an approval's question) join `rows`; `toolbox`: the
    /// round's (`reserve` built it).
    pub(super) async fn generate_acting(
        &self,
        batch: &Batch,
        prompt: &mut Prompt,
        rows: &mut Vec<OutboxRow>,
        toolbox: Option<&Arc<dyn Toolbox>>,
    ) -> Result<Generated, Interrupt> {
        let d = self.dispatcher;
        let toolbox = toolbox.map(Arc::as_ref);
        let model = self.offer_tools(toolbox, batch, prompt).await?;
        let steps = d.settings.tools.steps.max(1);
        let mut spent = Spent::default();
        let mut turn = 0;
        loop {
            turn += 1;
            if turn >= steps {
                // The last turn answers: no more calls.
                prompt.tools = Vec::new().into();
            }
            let generation = match self.ask(batch, prompt, &model).await? {
                Turn::Answered(Ok(generation)) => generation,
                Turn::Answered(Err(error)) => return Ok(Generated::Failed { error, spent }),
                Turn::Overtaken(version) => {
                    spent += self.overtaken_spent(prompt);
                    return Ok(Generated::Stale { version, spent });
                }
            };
            spent += Spent::of(
                &d.settings.limits,
                &wallet::price_of(d, prompt),
                prompt,
                &generation,
            );
            if generation.tool_calls.is_empty() {
                return Ok(Generated::Reply { generation, spent });
            }
            let mut results = Vec::with_capacity(generation.tool_calls.len());
            for call in &generation.tool_calls {
                let offered = &prompt.tools;
                match self
                    .answer_call(toolbox, offered, batch, call, rows)
                    .await?
                {
                    Answer::Result(text) => results.push(text),
                    Answer::Stale(version) => return Ok(Generated::Stale { version, spent }),
                }
            }
            prompt.turns.push(ToolTurn {
                text: generation.text,
                calls: generation.tool_calls,
                results,
            });
        }
    }

    /// The toolbox of this batch's round: the MCP servers' tools, then lull's own
    /// with `LULL_TOOLS=auto` (with or without MCP servers): with jobs on, the job
    /// tools acting in this chat for the batch's newest author; the web tools; with
    /// memory on, the memory tools.
    pub(super) fn toolbox_for(&self, batch: &Batch, memory: &Recalled) -> Option<Arc<dyn Toolbox>> {
        let d = self.dispatcher;
        let mut servers = d.toolbox().cloned();
        if let Some(asker) = batch.pending.last()
            && (d.settings.builtin_tools || servers.is_some())
        {
            let asked = ForBatch {
                conversation: batch.conversation.clone(),
                is_group: batch.is_group,
                all_admins: d.written_by_admins(batch),
                creator: asker.user_id.clone(),
                creator_name: asker.author.clone(),
            };
            servers = JobTools::for_batch(d, servers, asked);
        }
        let servers = match d.web() {
            Some(web) => Some(web.over(servers)),
            None => servers,
        };
        match &memory.staging {
            Some(staging) if d.settings.builtin_tools => {
                Some(MemoryTools::over(servers, staging.clone()))
            }
            _ => servers,
        }
    }

    /// Offer the tools of `toolbox` the batch may use in `prompt` (none to a model
    /// that refused tools lately), with a note of the actions the batch already took;
    /// returns the model asked.
    async fn offer_tools(
        &self,
        toolbox: Option<&dyn Toolbox>,
        batch: &Batch,
        prompt: &mut Prompt,
    ) -> Result<String, Interrupt> {
        let d = self.dispatcher;
        let model = wallet::model_of(d, prompt);
        let Some(toolbox) = toolbox else {
            return Ok(model);
        };
        let offered = if d.tool_refusals.refused(&model, std::time::Instant::now()) {
            Vec::new()
        } else {
            self.offered(toolbox, batch)
        };
        if let Some(first) = batch.pending.first() {
            let of = BatchOf {
                conversation: self.conversation,
                batch: first.row,
            };
            let lines = action_lines(&d.store.actions_of_batch(of).await?);
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
        Ok(model)
    }

    /// Ask the model one turn. A model without tool support refuses `tools` (a 4xx
    /// that may be about them: `tool_refusals::may_be_the_tools`): it is asked again
    /// without them, and if that is answered and the refusal named tools, offered
    /// none for a while (`tool_refusals`). A refusal of the key, the model or the
    /// images ends the turn as it is.
    async fn ask(
        &self,
        batch: &Batch,
        prompt: &mut Prompt,
        model: &str,
    ) -> Result<Turn, Interrupt> {
        let error = match self.generate_once(batch, prompt).await? {
            Turn::Answered(Err(error))
                if error.kind() == FailureKind::Refused
                    && !prompt.tools.is_empty()
                    && crate::dispatcher::tool_refusals::may_be_the_tools(&error) =>
            {
                error
            }
            turn => return Ok(turn),
        };
        let tools = std::mem::replace(&mut prompt.tools, Vec::new().into());
        let again = self.generate_once(batch, prompt).await?;
        let d = self.dispatcher;
        if matches!(again, Turn::Answered(Ok(_)))
            && d.tool_refusals
                .record(model, &error, std::time::Instant::now())
        {
            tracing::warn!(conversation = %self.conversation, %model, error = %error, tools = tools.len(), "the model refused the tools; answering without them for a while (set LULL_TOOLS=off for a model without tool support)");
        }
        Ok(again)
    }
    /// One model turn, abandoned when the lease is lost or lull stops, and stopped
    /// when a newer message overtakes it ([`Round::overtaken`]).
    async fn generate_once(&self, batch: &Batch, prompt: &Prompt) -> Result<Turn, Interrupt> {
        self.guarded(async {
            Ok(tokio::select! {
                generated = self.generate(batch, prompt) => Turn::Answered(generated),
                version = self.overtaken(batch) => Turn::Overtaken(version),
            })
        })
        .await
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
        let d = self.dispatcher;
        Spent::estimated(
            wallet::prompt_tokens(&d.settings.limits, prompt),
            &wallet::price_of(d, prompt),
        )
    }

    /// The tools offered for `batch`: all of the toolbox's, but an admins-only
    /// server's only when everyone who wrote in the batch is an admin.
    pub(super) fn offered(&self, toolbox: &dyn Toolbox, batch: &Batch) -> Vec<ToolSpec> {
        let all_admins = self.dispatcher.written_by_admins(batch);
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
            Effect::ReadOnly | Effect::WithReply => {
                let calling = self.calling(batch, toolbox, spec, arguments, None);
                let output = self.guarded(async { Ok(calling.await) }).await?;
                count(&spec.server, &spec.tool, output.outcome.label());
                return Ok(Answer::Result(texts::tool_output_result(
                    &output.text,
                    output.is_error,
                )));
            }
            Effect::Acts { idempotent } => (idempotent, false),
            Effect::Destructive { idempotent } => (idempotent, true),
        };
        if crate::switches::no_journal() {
            // Counter-test build: the journal bypassed, every call simply runs.
            let output = toolbox.call(&spec.name, arguments, None).await;
            count(&spec.server, &spec.tool, output.outcome.label());
            return Ok(Answer::Result(texts::tool_output_result(
                &output.text,
                output.is_error,
            )));
        }
        let acting = Acting {
            toolbox,
            spec,
            arguments,
            idempotent,
            destructive,
        };
        self.act(acting, batch, rows).await
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_a_json_object_or_nothing() {
        assert!(parse_arguments("").unwrap().is_empty());
        assert_eq!(parse_arguments(r#"{"a":1}"#).unwrap()["a"], 1);
        assert_eq!(parse_arguments("[1]").unwrap_err(), "got an array");
        assert!(parse_arguments("{").is_err());
    }
}
