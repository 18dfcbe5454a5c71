//! The model's job tools, offered beside the MCP servers' when tools and jobs are on:
//! `lull__schedule {when, text, kind?}` and `lull__cancel_job {id}` act, so a round
//! reserves them in the act-once journal before they run (a later round of the same
//! batch gets the stored result: never a second job), and `lull__jobs {}` only reads.
//! In a group, making and stopping are for admins, like the job commands: a batch with
//! anyone else in it is told so by the call (offered to everyone, so the group's
//! history stays in the prompt); anyone may list.
//!
//! A round composes them with the toolbox for its batch ([`JobTools::for_batch`]):
//! lull's own tools ([`OwnTools`]) that know the chat and who asks, beside the MCP
//! toolbox.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Map, Value, json};

use super::JobSettings;
use super::job_commands::{self, Asked, JobMaker};
use crate::clock::Clock;
use crate::domain::ConversationRef;
use crate::limits::TimeZone;
use crate::store::{JobKind, Store};
use crate::tools::beside::{Beside, OwnTools};
use crate::tools::{CallOutcome, Effect, ToolOutput, ToolSpec, Toolbox, Users};

const SCHEDULE: &str = "lull__schedule";
const JOBS: &str = "lull__jobs";
const CANCEL: &str = "lull__cancel_job";
/// What a group member who is not an admin is told, through the model.
const ADMINS_ONLY: &str = "Not done: in a group only lull's admins may make or stop reminders and scheduled tasks. Tell the person so.";

/// The job tools for one batch, over the MCP toolbox.
pub(super) struct JobTools {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    jobs: JobSettings,
    /// `LULL_TIMEZONE`, for a chat that chose none.
    default_tz: TimeZone,
    conversation: ConversationRef,
    is_group: bool,
    /// Who asks: the author of the batch's newest message.
    creator: String,
    creator_name: String,
    /// A private chat, or a group batch written by admins only: jobs may be made and
    /// stopped (others are told why not).
    may_change: bool,
}

/// Where and for whom a batch's job tools act.
pub(super) struct ForBatch {
    pub(super) conversation: ConversationRef,
    pub(super) is_group: bool,
    /// Everyone who wrote in the batch is an admin.
    pub(super) all_admins: bool,
    pub(super) creator: String,
    pub(super) creator_name: String,
}

impl JobTools {
    /// The toolbox a round of `batch` offers: `inner` and, with jobs on, the job tools.
    pub(super) fn for_batch(
        d: &super::Dispatcher,
        inner: Option<Arc<dyn Toolbox>>,
        batch: ForBatch,
    ) -> Option<Arc<dyn Toolbox>> {
        let Some(jobs) = d.settings.jobs.clone() else {
            return inner;
        };
        let own = JobTools {
            store: d.store.clone(),
            clock: d.clock.clone(),
            jobs,
            default_tz: d.settings.limits.timezone.clone(),
            conversation: batch.conversation,
            is_group: batch.is_group,
            creator: batch.creator,
            creator_name: batch.creator_name,
            may_change: !batch.is_group || batch.all_admins,
        };
        Some(Beside::over(own, inner))
    }

    /// `lull__schedule`: a job made from `when` and `text`; one idempotency key (one
    /// reserved call) makes one job.
    async fn schedule(&self, arguments: &Map<String, Value>, key: Option<&str>) -> ToolOutput {
        let text = |name: &str| arguments.get(name).and_then(Value::as_str).unwrap_or("");
        let kind = match text("kind") {
            "task" => JobKind::Task,
            "" | "reminder" => JobKind::Reminder,
            other => return failed(format!("kind must be reminder or task, got {other:?}")),
        };
        if text("when").trim().is_empty() || text("text").trim().is_empty() {
            return failed("when and text are both needed".into());
        }
        let Some(key) = key else {
            return failed("a job is made only as a reserved action".into());
        };
        let store = self.store.as_ref();
        let tz = job_commands::chat_timezone(store, &self.conversation, &self.default_tz).await;
        let tz = match tz {
            Ok(tz) => tz,
            Err(e) => return failed(e.to_string()),
        };
        let maker = JobMaker {
            store,
            jobs: &self.jobs,
            tz,
        };
        let asked = Asked {
            conversation: &self.conversation,
            is_group: self.is_group,
            creator: &self.creator,
            creator_name: &self.creator_name,
            origin: format!("tool/{key}"),
        };
        let rest = format!("{} {}", text("when").trim(), text("text").trim());
        match maker.make(asked, kind, &rest, self.clock.now()).await {
            Ok((answer, _)) => done(answer),
            Err(e) => unknown(&e),
        }
    }

    async fn cancel(&self, arguments: &Map<String, Value>) -> ToolOutput {
        let Some(id) = arguments.get("id").and_then(Value::as_i64) else {
            return failed("id (a number from lull__jobs) is needed".into());
        };
        let now = self.clock.now();
        match job_commands::cancel(self.store.as_ref(), &self.conversation, id, now).await {
            Ok(answer) => done(answer),
            Err(e) => unknown(&e),
        }
    }
}

#[async_trait]
impl OwnTools for JobTools {
    fn specs(&self) -> Vec<ToolSpec> {
        job_specs()
    }

    fn owns(&self, name: &str) -> bool {
        [SCHEDULE, JOBS, CANCEL].contains(&name)
    }

    async fn call_own(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        key: Option<&str>,
    ) -> ToolOutput {
        match name {
            SCHEDULE | CANCEL if !self.may_change => failed(ADMINS_ONLY.to_owned()),
            SCHEDULE => self.schedule(&arguments, key).await,
            CANCEL => self.cancel(&arguments).await,
            JOBS => {
                let now = self.clock.now();
                match job_commands::list(self.store.as_ref(), &self.conversation, now).await {
                    Ok(list) => done(list),
                    Err(e) => failed(e.to_string()),
                }
            }
            _ => failed(crate::texts::unknown_tool_result(name)),
        }
    }
}

/// The job tools, as every round offers them (the same in every chat).
pub(super) fn job_specs() -> Vec<ToolSpec> {
    let mut tools = Vec::new();
    tools.push(spec(
        SCHEDULE,
        "Make a reminder (its text sent as is when due) or a task (its text answered by you when due) in this chat. when: in 20m, at 18:00, tomorrow 9:00, 2026-12-24 18:00, every day 8:00, every weekday 8:30, every monday 9:00, every 2h, cron \"0 8 * * 1-5\".",
        json!({
            "type": "object",
            "properties": {
                "when": {"type": "string", "description": "When, in the forms listed"},
                "text": {"type": "string", "description": "The reminder's text, or the task's prompt"},
                "kind": {"type": "string", "enum": ["reminder", "task"]}
            },
            "required": ["when", "text"]
        }),
        Effect::Acts { idempotent: true },
    ));
    tools.push(spec(
        JOBS,
        "List this chat's reminders and scheduled tasks: id, kind, when, next time, text.",
        json!({"type": "object", "properties": {}}),
        Effect::ReadOnly,
    ));
    tools.push(spec(
        CANCEL,
        "Stop one of this chat's reminders or scheduled tasks, by its id from lull__jobs.",
        json!({
            "type": "object",
            "properties": {"id": {"type": "integer"}},
            "required": ["id"]
        }),
        Effect::Acts { idempotent: true },
    ));
    tools
}

fn spec(name: &str, description: &str, parameters: Value, effect: Effect) -> ToolSpec {
    // Offered to everyone: who may change this chat's jobs is checked by the call
    // (an admins-only tool would take the group's history out of the prompt).
    ToolSpec::own(name, description, parameters, effect, Users::Allowed)
}

fn done(text: String) -> ToolOutput {
    ToolOutput::ok(text)
}

/// A call that did not act (its arguments, or the database): told to the model.
fn failed(text: String) -> ToolOutput {
    ToolOutput::error(text, CallOutcome::Error)
}

/// The database failed while the job was made or stopped: the write may have committed
/// before the answer was lost, so the outcome is unknown, never "failed". Both tools
/// are idempotent (one origin, one job; cancelling twice is cancelling once), so the
/// journal may run them again safely.
fn unknown(error: &crate::store::StoreError) -> ToolOutput {
    ToolOutput::error(
        format!("the database did not answer: {error}"),
        CallOutcome::Lost,
    )
}
