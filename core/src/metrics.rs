//! Metric names (a contract with users' dashboards: never rename) and their
//! descriptions. The core records through the `metrics` facade; the binary installs
//! the Prometheus exporter.

pub const MESSAGES_INGESTED: &str = "lull_messages_ingested_total";
pub const REPLIES_SENT: &str = "lull_replies_sent_total";
/// Replies given up (dead-lettered): refused by the platform, or still failing when
/// their delivery deadline (`LULL_WEBHOOK_MAX_AGE` for the webhook) passed.
pub const REPLIES_FAILED: &str = "lull_replies_failed_total";
/// Model answers stopped at the token limit (`finish_reason: "length"`: the context or
/// `LULL_MAX_TOKENS` ran out), each given a note saying so; counted when the answer
/// arrives (a stale one dropped later still counts).
pub const REPLIES_CUT: &str = "lull_replies_cut_total";
pub const REPLIES_DROPPED_STALE: &str = "lull_replies_dropped_stale_total";
pub const LEASE_CONTENDED: &str = "lull_lease_contended_total";
/// Labelled `outcome`: `ok`, `error`, `timeout`, `empty`, `rate_limited`, `too_long`
/// (prompt refused as longer than the context), `refused` (other 4xx), `cancelled`
/// (dropped before its answer: an overtaken generation stopped, a lost lease); one per
/// request, retries and smaller prompts included. Divided by `lull_replies_sent_total`
/// it gives the model calls spent per delivered reply.
pub const LLM_REQUESTS: &str = "lull_llm_requests_total";
pub const LLM_SECONDS: &str = "lull_llm_seconds";
/// Labelled `kind`: `prompt`, `completion` (from the API's usage field), per successful
/// request. Kept as an alias for dashboards built before [`TOKENS`]; it counts only
/// what servers report, so prefer `lull_tokens_total`.
pub const LLM_TOKENS: &str = "lull_llm_tokens_total";
/// Labelled `kind`: `prompt`, `completion` (reported by the model), `estimated` (the
/// server reported none: four characters a token). What the token budgets are charged.
pub const TOKENS: &str = "lull_tokens_total";
/// Tokens spent on generations whose reply never went out: dropped as stale at the
/// final check, or stopped when a newer message overtook them (estimated from the
/// prompt: the server reports no usage for a request it did not finish). Already
/// counted in [`TOKENS`] by kind; this says how much of it was spent for nothing.
pub const TOKENS_DROPPED: &str = "lull_tokens_dropped_total";
/// Labelled `reason`: `denied` (a message from someone not admitted), `rate` (a
/// message held by `LULL_RATE_PER_MIN`), `user_budget`, `bot_budget` (a batch held by
/// `LULL_USER_DAILY_TOKENS` or `LULL_DAILY_TOKENS`).
pub const LIMITED: &str = "lull_limited_total";
pub const BATCH_MESSAGES: &str = "lull_batch_messages";
pub const PENDING_CONVERSATIONS: &str = "lull_pending_conversations";
/// 1 while the database answers and no recent operation found it damaged, full or
/// unwritable (what `/healthz` says of it), 0 otherwise; set at every scrape.
pub const DATABASE_UP: &str = "lull_database_up";
/// Labelled `platform`: 1 while this process holds the platform's connection (any
/// shard of it), 0 while it stands by, starts or is down; set at every scrape. Summed
/// over the replicas, 0 means no process is connected.
pub const PLATFORM_CONNECTED: &str = "lull_platform_connected";
/// Generations stopped because a newer message made their reply stale before it
/// was written (not at the cap): the covering round started at once.
pub const GENERATIONS_CANCELLED: &str = "lull_generations_cancelled_total";
/// Tokens charged today (the `LULL_TIMEZONE` day) to the whole bot's budget, read
/// from the store at every scrape: the same number on every replica. Set only while
/// `LULL_DAILY_TOKENS` is set.
pub const DAILY_TOKENS_USED: &str = "lull_daily_tokens_used";
/// `LULL_DAILY_TOKENS`, at every scrape while it is set: with
/// [`DAILY_TOKENS_USED`], how much of the day's budget is spent.
pub const DAILY_TOKENS_LIMIT: &str = "lull_daily_tokens_limit";
/// Labelled `server`, `tool`, `outcome`: `ok`, `error`, `timeout` (the toolbox's
/// [`crate::tools::CallOutcome`]), and the journal's `reused` (a finished action's
/// stored result), `unknown` (its holder died mid-call), `refused` (not approved, or
/// not allowed), `stale` (the conversation moved on before it was reserved); counted
/// by the dispatcher.
pub const TOOL_CALLS: &str = "lull_tool_calls_total";
/// Labelled `server`, `tool`: the time a `tools/call` took (to its answer, error or
/// deadline), recorded by the toolbox.
pub const TOOL_CALL_SECONDS: &str = "lull_tool_call_duration_seconds";

/// Due-work queries this process sent to a PostgreSQL store (each wake-up of its
/// scheduler: an announcement, its own timer, the poll). Divided by the messages
/// ingested, the cost of wake-ups per message; flat in the number of replicas.
pub const DUE_WORK_QUERIES: &str = "lull_due_work_queries_total";

/// Labelled `kind` (`reminder`, `task`): job occurrences fired (each once, by whichever
/// process fired it).
pub const JOBS_FIRED: &str = "lull_jobs_fired_total";
/// How late job occurrences fired, in seconds (0 to a poll interval when lull runs).
pub const JOB_LATENESS: &str = "lull_job_lateness_seconds";
/// Jobs active (reminders and tasks still to fire), read from the store.
pub const JOBS_ACTIVE: &str = "lull_jobs_active";
/// Labelled `op`: memory rows changed — `remember` and `forget` (written with a
/// reply), `drop` (the oldest beyond a scope's limit), `fenced` (a fact kept out by a
/// clear made while its reply was written), `command_forget` and `clear`
/// (`/memory`), `erase` (`/forgetme`).
pub const MEMORIES: &str = "lull_memories_total";
/// Labelled `outcome`: summaries made — `stored`; not stored: `superseded` (the stored
/// one covers as much), `fenced` (the maker lost its summary lease, or `/forgetme`
/// came while it was written), `reset` (`/new` meanwhile); not made: `over_budget`, `refused` (the model refused or answered
/// nothing), `failed` (the model or the database failed). The previous summary stays.
pub const SUMMARIES: &str = "lull_summaries_total";
/// Labelled `kind` (`message`, `reply`, `overheard`): texts removed by retention
/// (`LULL_RETENTION_DAYS`).
pub const RETENTION_REMOVED: &str = "lull_retention_removed_total";

/// Labelled `model`: dollars spent at `LULL_PRICES` (replies, tool turns, summaries,
/// transcriptions, the replies dropped as stale), in dollars. The `metrics` facade
/// counts in whole numbers, so this counter is kept here in nano-dollars
/// ([`record_cost`]) and rendered beside the others ([`render_costs`]).
pub const COST_USD: &str = "lull_cost_usd_total";
/// Dollars the whole bot spent this month (the `LULL_TIMEZONE` month), read from the
/// store at every scrape; set only while `LULL_MONTHLY_USD` is.
pub const MONTH_COST_USD: &str = "lull_month_cost_usd";
/// `LULL_MONTHLY_USD`, at every scrape while it is set: with [`MONTH_COST_USD`], how
/// much of the month's budget is spent (the `LullMonthlyBudgetNearlySpent` alert).
pub const MONTHLY_BUDGET_USD: &str = "lull_monthly_budget_usd";

/// This process's dollars by model, in nano-dollars (exact; [`COST_USD`]).
static COSTS: std::sync::Mutex<std::collections::BTreeMap<String, u64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Count `cost` spent with `model` in [`COST_USD`] (nothing for a free call).
pub fn record_cost(model: &str, cost: crate::money::Usd) {
    if cost.0 == 0 {
        return;
    }
    let mut costs = COSTS.lock().unwrap_or_else(|e| e.into_inner());
    let total = costs.entry(model.to_owned()).or_default();
    *total = total.saturating_add(cost.0);
}

/// [`COST_USD`] in Prometheus's text format: its help, its type, and one sample per
/// model that spent anything in this process (dollars, as a float).
pub fn render_costs() -> String {
    let costs = COSTS.lock().unwrap_or_else(|e| e.into_inner());
    let mut text = format!(
        "# HELP {COST_USD} Dollars spent at LULL_PRICES, by model (replies, summaries, transcriptions).\n# TYPE {COST_USD} counter\n"
    );
    for (model, nanos) in costs.iter() {
        let label = model
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        text.push_str(&format!(
            "{COST_USD}{{model=\"{label}\"}} {}\n",
            crate::money::Usd(*nanos).dollars()
        ));
    }
    text
}

/// Register descriptions with the installed recorder (call once, after installing it).
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        MESSAGES_INGESTED,
        "Messages stored (redeliveries not counted)."
    );
    describe_counter!(REPLIES_SENT, "Replies fully delivered to the platform.");
    describe_counter!(
        SUMMARIES,
        "Summaries of long conversations, by outcome (stored, superseded, fenced, reset, over_budget, refused, failed)."
    );
    describe_counter!(
        RETENTION_REMOVED,
        "Texts removed by retention, by kind (message, reply, overheard)."
    );
    describe_counter!(
        JOBS_FIRED,
        "Job occurrences fired, by kind (reminder, task)."
    );
    describe_histogram!(
        JOB_LATENESS,
        metrics::Unit::Seconds,
        "How late job occurrences fired."
    );
    describe_gauge!(JOBS_ACTIVE, "Jobs still to fire.");
    describe_counter!(
        MEMORIES,
        "Memory rows changed, by op (remember, forget, drop, fenced, command_forget, clear, erase)."
    );
    describe_counter!(
        REPLIES_FAILED,
        "Replies given up: refused by the platform, or still failing at their delivery deadline."
    );
    describe_counter!(
        REPLIES_CUT,
        "Model answers stopped at the token limit (finish_reason length), each ending with a note saying so."
    );
    describe_counter!(
        REPLIES_DROPPED_STALE,
        "Replies dropped at the final check because a newer message arrived during generation."
    );
    describe_counter!(
        LEASE_CONTENDED,
        "Times this process found a due conversation already leased by another process."
    );
    describe_counter!(LLM_REQUESTS, "Model calls, by outcome.");
    describe_histogram!(
        LLM_SECONDS,
        metrics::Unit::Seconds,
        "Time the model took per call."
    );
    describe_counter!(
        TOKENS,
        "Tokens charged to the budgets, by kind (prompt, completion, or estimated when the server reports none)."
    );
    describe_counter!(
        TOKENS_DROPPED,
        "Tokens spent on generations whose reply never went out (dropped as stale or stopped when overtaken); also in lull_tokens_total."
    );
    describe_counter!(
        LIMITED,
        "Messages or batches held back by access or spending limits, by reason."
    );
    describe_histogram!(BATCH_MESSAGES, "Messages covered by each committed reply.");
    describe_gauge!(
        PENDING_CONVERSATIONS,
        "Conversations with messages waiting for a reply."
    );
    describe_gauge!(
        DATABASE_UP,
        "1 while the database answers and is writable, 0 otherwise."
    );
    describe_gauge!(
        PLATFORM_CONNECTED,
        "1 while this process holds the platform's connection, 0 while it stands by or is down."
    );
    describe_counter!(
        GENERATIONS_CANCELLED,
        "Generations stopped because a newer message made their reply stale (not at the cap)."
    );
    describe_counter!(
        DUE_WORK_QUERIES,
        "Due-work queries sent to a PostgreSQL store: wake-ups of this process's scheduler."
    );
    describe_gauge!(
        DAILY_TOKENS_USED,
        "Tokens charged today to the whole bot's daily budget (set while LULL_DAILY_TOKENS is)."
    );
    describe_gauge!(
        DAILY_TOKENS_LIMIT,
        "LULL_DAILY_TOKENS: the whole bot's daily token budget (set while it is)."
    );
    describe_gauge!(
        MONTH_COST_USD,
        "Dollars the whole bot spent this month (set while LULL_MONTHLY_USD is)."
    );
    describe_gauge!(
        MONTHLY_BUDGET_USD,
        "LULL_MONTHLY_USD: the whole bot's monthly dollar budget (set while it is)."
    );
    describe_counter!(
        TOOL_CALLS,
        "Tool calls the model asked for, by server, tool and outcome (ok, error, timeout, reused, unknown, refused, stale)."
    );
    describe_histogram!(
        TOOL_CALL_SECONDS,
        metrics::Unit::Seconds,
        "Time a tool call took on its MCP server (to its answer, error or deadline)."
    );
}
