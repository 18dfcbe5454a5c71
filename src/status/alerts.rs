//! The overview's alerts: the shipped Prometheus rules (`deploy/prometheus/alerts.yml`)
//! whose conditions the overview's own numbers can judge, judged now, so an operator
//! without Prometheus sees what it would say. Prometheus fires a rule once its
//! condition has held for the rule's `for:` (and judges rates over its own window);
//! here a condition true now shows at once, judged on the numbers beside it (the last
//! hour's replies and failures, today's tokens, the month's dollars). Rules about the
//! scrape itself or this process's lease metrics (`LullDown`,
//! `LullLeaseContentionRising`) and about limits by reason (`LullBudgetExhausted`) are
//! left to Prometheus.

use std::fmt::Write as _;

use serde::Serialize;

use super::Snapshot;
use super::escape::esc;

/// One rule's condition, judged now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Condition {
    /// The rule's name in `deploy/prometheus/alerts.yml`.
    pub name: &'static str,
    pub firing: bool,
    /// What the numbers say, in a sentence.
    pub said: String,
}

/// More pending chats than this, and the rule looks at whether they grow.
const PENDING_MANY: u64 = 5;

/// Above this share of a budget the "nearly spent" rules fire.
const NEARLY: f64 = 0.9;

/// The conditions of the rules judged here, in the rules file's order.
pub(crate) fn judge(s: &Snapshot) -> Vec<Condition> {
    let st = &s.store;
    let mut out = Vec::new();
    let mut add = |name, firing, said: String| out.push(Condition { name, firing, said });
    add(
        "LullDatabaseDown",
        s.database != "ok",
        if s.database == "ok" {
            "the database answers".into()
        } else {
            format!("the database did not answer: {}", s.database)
        },
    );
    let unconnected: Vec<String> = s
        .platforms
        .iter()
        .filter(|(platform, state)| *platform != "http" && !connected(s, platform, state))
        .map(|(platform, state)| format!("{platform} ({state})"))
        .collect();
    add(
        "LullNoPlatformConnection",
        !unconnected.is_empty(),
        if unconnected.is_empty() {
            "every platform's connection is held".into()
        } else {
            format!(
                "no process holds the connection of {}",
                unconnected.join(", ")
            )
        },
    );
    add(
        "LullRepliesFailing",
        st.failed.hour > 0,
        format!("{} repl(ies) given up in the last hour", st.failed.hour),
    );
    add(
        "LullPendingGrowing",
        st.pending > PENDING_MANY,
        format!(
            "{} chat(s) waiting for a reply (the rule fires above {PENDING_MANY} while they grow)",
            st.pending
        ),
    );
    let (failures, replies) = (st.model_failures.hour, st.generated.hour);
    add(
        "LullModelFailing",
        failures > 0 && failures >= replies,
        format!("{failures} model failure(s) told and {replies} model repl(ies) in the last hour"),
    );
    budgets(s, &mut add);
    out
}

/// The two "nearly spent" rules: today's tokens against `LULL_DAILY_TOKENS`, the
/// month's dollars against `LULL_MONTHLY_USD`.
fn budgets(s: &Snapshot, add: &mut impl FnMut(&'static str, bool, String)) {
    let limit = s.running.daily_tokens_limit;
    let today = s.store.tokens_per_day.last().map_or(0, |d| d.tokens);
    add(
        "LullBudgetNearlySpent",
        limit > 0 && today as f64 > limit as f64 * NEARLY,
        if limit > 0 {
            format!("{today} of {limit} tokens today (LULL_DAILY_TOKENS)")
        } else {
            "no daily token budget (LULL_DAILY_TOKENS)".into()
        },
    );
    let (month, budget) = (s.store.month_cost, s.monthly_budget);
    add(
        "LullMonthlyBudgetNearlySpent",
        budget.is_set() && month.0 as f64 > budget.0 as f64 * NEARLY,
        if budget.is_set() {
            format!("{month} of {budget} this month (LULL_MONTHLY_USD)")
        } else {
            "no monthly dollar budget (LULL_MONTHLY_USD)".into()
        },
    );
}

/// Whether `platform`'s connection is held: up here, or its poller lease held by
/// another process (this one standing by).
fn connected(s: &Snapshot, platform: &str, state: &str) -> bool {
    state == "up"
        || s.store
            .connections
            .iter()
            .any(|c| super::polls(&c.resource, platform))
}

/// The overview's alerts section: the firing first, each with what the numbers say.
pub(super) fn section(out: &mut String, s: &Snapshot) {
    let firing = s.alerts.iter().filter(|a| a.firing).count();
    let _ = write!(
        out,
        "<section class=\"wide\"><h2>Alerts — <span id=\"alerts-firing\" data-value=\"{firing}\">{firing}</span> firing</h2>\
         <p class=\"muted\">The shipped Prometheus rules these numbers can judge, judged now (Prometheus waits each rule's <code>for:</code>).</p>\
         <table id=\"alerts\">"
    );
    let mut shown: Vec<&Condition> = s.alerts.iter().collect();
    shown.sort_by_key(|a| !a.firing);
    for a in shown {
        let (class, state) = if a.firing {
            ("bad", "firing")
        } else {
            ("ok", "quiet")
        };
        let _ = write!(
            out,
            "<tr data-alert=\"{n}\" data-firing=\"{f}\"><th>{n}</th><td class=\"{class}\">{state}</td><td>{said}</td></tr>",
            n = a.name,
            f = a.firing,
            said = esc(&a.said)
        );
    }
    out.push_str("</table></section>");
}

#[cfg(test)]
mod tests {
    use super::*;
    use lull_core::money::Usd;
    use lull_core::store::Recent;

    fn snapshot() -> Snapshot {
        Snapshot::idle()
    }

    fn firing(s: &Snapshot) -> Vec<&'static str> {
        judge(s)
            .into_iter()
            .filter(|a| a.firing)
            .map(|a| a.name)
            .collect()
    }

    #[test]
    fn every_rule_judged_here_is_a_shipped_rule() {
        let rules = include_str!("../../deploy/prometheus/alerts.yml");
        for condition in judge(&snapshot()) {
            assert!(
                rules.contains(&format!("- alert: {}\n", condition.name)),
                "{} is not in deploy/prometheus/alerts.yml",
                condition.name
            );
        }
    }

    #[test]
    fn a_quiet_run_fires_nothing() {
        let mut s = snapshot();
        s.store.generated = Recent { hour: 3, day: 3 };
        s.store.model_failures = Recent { hour: 1, day: 1 };
        assert!(firing(&s).is_empty(), "{:?}", judge(&s));
    }

    #[test]
    fn each_condition_fires_on_its_numbers() {
        let mut s = snapshot();
        s.database = "database is locked".into();
        s.platforms.insert("telegram".into(), "down: 401".into());
        s.store.failed = Recent { hour: 1, day: 1 };
        s.store.pending = 6;
        s.store.model_failures = Recent { hour: 2, day: 2 };
        s.running.daily_tokens_limit = 1000;
        s.store.tokens_per_day = vec![lull_core::store::DayTokens {
            day: "2026-12-05".into(),
            tokens: 901,
            cost: Usd(0),
        }];
        s.monthly_budget = Usd(1000);
        s.store.month_cost = Usd(901);
        assert_eq!(
            firing(&s),
            [
                "LullDatabaseDown",
                "LullNoPlatformConnection",
                "LullRepliesFailing",
                "LullPendingGrowing",
                "LullModelFailing",
                "LullBudgetNearlySpent",
                "LullMonthlyBudgetNearlySpent"
            ]
        );
        // Standing by while another process holds the connection: held.
        s.platforms.insert("telegram".into(), "standby".into());
        s.store.connections = vec![lull_core::store::ConnectionLease {
            resource: "poller/telegram".into(),
            holder: "b:1".into(),
            expires_at: 0,
        }];
        assert!(!firing(&s).contains(&"LullNoPlatformConnection"));
    }
}
