//! DDL that both dialects write byte for byte alike, written once here and named by
//! both migration lists (`sqlite/schema.rs`, `postgres/schema.rs`). A migration moves
//! here only with its text unchanged: a released migration is never edited, and the
//! text of one that is shared stays the same in both lists.

/// The status page's range-scan indexes: SQLite's ninth migration, PostgreSQL's
/// seventh.
pub(super) const STATUS_INDEXES: &str = r#"
-- The status page (GET /, GET /api/status) reads the last day and the last thirty days
-- of the outbox, and the timers a limit holds or a failure backs off, by range scans on
-- these instead of walking every row.
CREATE INDEX outbox_sent ON outbox (sent_at) WHERE sent_at IS NOT NULL;
CREATE INDEX outbox_failed ON outbox (failed_at) WHERE failed_at IS NOT NULL;
CREATE INDEX outbox_created ON outbox (created_at);
CREATE INDEX timers_held ON timers (held_until);
CREATE INDEX timers_retrying ON timers (conversation_id) WHERE attempts > 0;
"#;

/// The status page's top conversations of a day: the budget scopes of one day, by
/// tokens (the primary key leads with the scope). SQLite's sixteenth migration,
/// PostgreSQL's seventeenth.
pub(super) const TOKEN_USAGE_BY_DAY: &str = r#"
-- The status page reads one day's conversation totals, most tokens first.
CREATE INDEX token_usage_by_day ON token_usage (day, tokens);
"#;

/// The quick replies a notice offers, stored with it: SQLite's eighteenth migration,
/// PostgreSQL's nineteenth.
pub(super) const OUTBOX_QUICK_REPLIES: &str = r#"
-- The answers a notice offers as buttons (an approval's Approve and Cancel, the pick of
-- a listed model), decided when the notice was built and stored with it as a JSON array
-- of {"label", "text"}; NULL: none (every reply, most notices, rows stored before).
ALTER TABLE outbox ADD COLUMN quick_replies TEXT;
"#;

/// Costs in money beside the tokens: SQLite's twenty-second migration, PostgreSQL's
/// twenty-third.
pub(super) const COSTS: &str = r#"
-- What each scope spent in dollars, as whole nano-dollars (10^-9 $), beside its tokens:
-- per person, chat and bot and day, as tokens are; the bot's month (LULL_MONTHLY_USD)
-- in rows of scope 'month:bot' keyed by the month ('2026-12'). Only ever added to.
ALTER TABLE token_usage ADD COLUMN cost BIGINT NOT NULL DEFAULT 0;
-- A round's reserved dollars, given back with its tokens when it never settles; `day`
-- is the row's key (a month row's reservation names the month).
ALTER TABLE token_reservations ADD COLUMN cost BIGINT NOT NULL DEFAULT 0;
"#;

/// A chat's name as its platform shows it, for the console: SQLite's twenty-third
/// migration, PostgreSQL's twenty-fourth.
pub(super) const CHAT_TITLES: &str = r#"
-- The chat's name as its platform last showed it (a Telegram group's title, the
-- person's name for a private chat); NULL: never told. Not a setting: writing it
-- moves no version.
ALTER TABLE conversations ADD COLUMN title TEXT;
"#;
