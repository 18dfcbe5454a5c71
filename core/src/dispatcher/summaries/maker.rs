//! Making a conversation's next summary, beside the rounds, after a reply was
//! delivered: under the conversation's summary lease, charged to the people whose
//! reply asked for it, stored only if it covers more. Every end is counted in
//! `lull_summaries_total{outcome}`; none stalls the conversation, whose rounds go on
//! meanwhile (a message that arrives is simply after the summary).

use std::sync::Arc;

use super::{SUMMARY_MAX_CHARS, SUMMARY_MAX_TOKENS, cover, texts};
use crate::dispatcher::Dispatcher;
use crate::dispatcher::lease_keeper::{self, LeaseKeeper};
use crate::dispatcher::wallet::{self, Amount};
use crate::domain::{ConversationId, ConversationRef, Exchange, LeaseKey, Said};
use crate::llm::{Choices, FailureKind, Generation, Partial, Prompt, exchange_chars};
use crate::metrics as names;
use crate::money::Usd;
use crate::store::{CoverableExchange, NewSummary, StoreError, SummaryPicture};

/// The most exchanges one summary's picture reads (a summary that lagged behind many
/// replies covers what fits its input, and the next covers the rest).
const PICTURE_EXCHANGES: usize = 200;

/// What a round that found a summary due hands to its maker.
#[derive(Debug, Clone)]
pub(in crate::dispatcher) struct SummaryAsked {
    pub conversation: ConversationId,
    pub chat: ConversationRef,
    pub is_group: bool,
    /// Who pays: the people whose messages the round answered.
    pub payers: Vec<String>,
    /// The chat's model (`/model`), used when `LULL_SUMMARY_MODEL` is unset.
    pub chat_model: Option<String>,
}

/// Make the next summary of `asked.conversation` beside the rounds (shutdown cancels
/// it: a summary is derived, and its lease expires). Another process or task already
/// making one: nothing.
pub(in crate::dispatcher) fn make_later(d: &Arc<Dispatcher>, asked: SummaryAsked) {
    let dispatcher = d.clone();
    d.background.show(async move {
        let conversation = asked.conversation;
        let outcome = match make(&dispatcher, &asked).await {
            Ok(Some(outcome)) => outcome,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(%conversation, %error, "could not make a summary; the previous one stays");
                "failed"
            }
        };
        tracing::info!(%conversation, outcome, "summary");
        metrics::counter!(names::SUMMARIES, "outcome" => outcome).increment(1);
    });
}

/// Claim the summary lease, make the summary under it, release it. `None`: nothing
/// to do (another maker holds the lease, or the window is no longer full).
async fn make(d: &Dispatcher, asked: &SummaryAsked) -> Result<Option<&'static str>, StoreError> {
    let Some(keeper) = lease_keeper::claim(d, LeaseKey::Summary(asked.conversation)).await? else {
        tracing::debug!(conversation = %asked.conversation, "another maker is writing this summary");
        return Ok(None);
    };
    let made = match under_lease(d, asked, &keeper).await {
        // A charge under a lease lost meanwhile: the summary is not stored.
        Err(StoreError::LeaseLost(_)) => Ok(Some("fenced")),
        other => other,
    };
    keeper.release().await;
    made
}

async fn under_lease(
    d: &Dispatcher,
    asked: &SummaryAsked,
    keeper: &LeaseKeeper,
) -> Result<Option<&'static str>, StoreError> {
    let Some(settings) = &d.settings.summary else {
        return Ok(None);
    };
    let Some(plan) = plan(d, settings, asked).await? else {
        return Ok(None);
    };
    let lease = keeper.lease();
    let model = plan
        .model
        .clone()
        .unwrap_or_else(|| d.settings.controls.default_model.clone());
    let price = d.settings.limits.prices.tokens_of(&model);
    let input = wallet::prompt_tokens(&d.settings.limits, &plan.prompt);
    let worst = Amount::new(
        input + SUMMARY_MAX_TOKENS,
        price.worst(input, SUMMARY_MAX_TOKENS),
    );
    let day = d.settings.limits.timezone.day(d.clock.now());
    let charge = |amount: Amount, check: bool| {
        wallet::charge_summary(d, &lease, asked, amount, check, day.clone())
    };
    // Never for a chat over budget: the worst case is charged before it is asked.
    if !charge(worst, true).await? {
        return Ok(Some("over_budget"));
    }
    let generation = match ask(d, &plan.prompt, keeper, asked).await {
        Ok(generation) => generation,
        Err(outcome) => {
            // Given back under the lease; a lost lease leaves the worst case charged
            // (the give-back fails as `LeaseLost`: counted as `fenced`).
            charge(worst.negated(), false).await?;
            return Ok(Some(outcome));
        }
    };
    let spent = generation.usage.map_or(worst, |u| {
        Amount::new(u.prompt + u.completion, price.cost(&u))
    });
    charge(spent.minus(worst), false).await?;
    metrics::counter!(names::TOKENS, "kind" => "summary").increment(spent.tokens as u64);
    names::record_cost(&model, Usd(spent.cost as u64));
    let summary = new_summary(d, asked, &plan, &generation);
    let stored = d
        .store
        .store_summary(&lease, &summary, d.clock.now())
        .await?;
    Ok(Some(stored.outcome()))
}

/// What the next summary is made of: the picture read under the lease, how many of
/// its exchanges it covers, the model that writes it and the request.
struct Plan {
    picture: SummaryPicture,
    covered: usize,
    model: Option<String>,
    prompt: Prompt,
}

/// Read the picture under the lease and decide what the summary covers; `None`:
/// nothing to do (a summary stored meanwhile made room in the window).
async fn plan(
    d: &Dispatcher,
    settings: &super::SummarySettings,
    asked: &SummaryAsked,
) -> Result<Option<Plan>, StoreError> {
    let picture = d
        .store
        .summary_picture(asked.conversation, PICTURE_EXCHANGES)
        .await?;
    let sizes: Vec<usize> = picture
        .exchanges
        .iter()
        .map(|e| exchange_chars(&e.exchange, asked.is_group))
        .collect();
    if !cover::window_full(&sizes, settings.history) {
        return Ok(None);
    }
    let input_chars = settings.history.chars.saturating_mul(2);
    let covered = cover::covered(&sizes, settings.history, input_chars);
    if covered == 0 {
        return Ok(None);
    }
    let model = settings.model.clone().or_else(|| asked.chat_model.clone());
    let prompt = request(asked, &picture, covered, model.clone());
    Ok(Some(Plan {
        picture,
        covered,
        model,
        prompt,
    }))
}

/// Ask the summary model, unless the summary lease is lost first: its answer, or the
/// outcome that ends the summary (`fenced`, `refused`, `failed`).
async fn ask(
    d: &Dispatcher,
    prompt: &Prompt,
    keeper: &LeaseKeeper,
    asked: &SummaryAsked,
) -> Result<Generation, &'static str> {
    let partial = Partial::ignored();
    // A maker that lost its lease stops asking; the counter-test's makers write back
    // whatever happened, as the peers' do.
    let lease_lost = async {
        if crate::switches::summary_write_back() {
            std::future::pending::<()>().await;
        }
        keeper.lost().await;
    };
    let answered = tokio::select! {
        answered = d.responder.respond(prompt, &partial) => answered,
        () = lease_lost => return Err("fenced"),
    };
    match answered {
        Ok(generation) if !generation.text.trim().is_empty() => Ok(generation),
        Ok(_) => Err("refused"),
        Err(error) => {
            tracing::info!(conversation = %asked.conversation, %error, "the summary model failed; the previous summary stays");
            Err(match error.kind() {
                FailureKind::Refused | FailureKind::TooLong => "refused",
                FailureKind::Transient => "failed",
            })
        }
    }
}

/// The summary request: the summary model's instructions, the previous summary and
/// the `n` oldest exchanges of the picture.
fn request(
    asked: &SummaryAsked,
    picture: &SummaryPicture,
    n: usize,
    model: Option<String>,
) -> Prompt {
    let covered: Vec<&Exchange> = picture.exchanges[..n].iter().map(|e| &e.exchange).collect();
    Prompt {
        conversation: asked.chat.clone(),
        is_group: false,
        history: Vec::new(),
        overheard: Vec::new(),
        memories: None,
        summary: None,
        batch: vec![Said::new(
            "",
            texts::request(picture.previous.as_ref(), &covered),
        )],
        note: None,
        images: Vec::new(),
        max_tokens: Some(SUMMARY_MAX_TOKENS),
        tools: Vec::new().into(),
        turns: Vec::new(),
        choices: Choices {
            model,
            system_prompt: Some(texts::INSTRUCTIONS.to_owned()),
            temperature: Some(0.2),
        },
    }
}

/// The row to store: covering the picture's previous summary and its covered
/// exchanges, with the model's text cut to [`SUMMARY_MAX_CHARS`] at a sentence; the
/// model named is the one asked (the deployment's default when the chat chose none).
fn new_summary(
    d: &Dispatcher,
    asked: &SummaryAsked,
    plan: &Plan,
    generation: &Generation,
) -> NewSummary {
    let picture = &plan.picture;
    let covered: &[CoverableExchange] = &picture.exchanges[..plan.covered];
    let last = &covered[covered.len() - 1];
    let before = picture.previous.as_ref().map_or(0, |p| p.messages);
    let messages = before
        + covered
            .iter()
            .map(|e| e.exchange.user.len() as u64)
            .sum::<u64>();
    let text = generation.text.trim();
    let text = if lull_port::split::char_len(text) > SUMMARY_MAX_CHARS {
        let window = &text[..lull_port::split::byte_index(text, SUMMARY_MAX_CHARS)];
        window[..lull_port::split::best_cut(window)]
            .trim_end()
            .to_owned()
    } else {
        text.to_owned()
    };
    NewSummary {
        conversation: asked.conversation,
        context_version: picture.context_version,
        through_reply: last.reply,
        through_message: last.newest_message,
        through_at: last.newest_at,
        messages,
        text,
        model: plan
            .model
            .clone()
            .unwrap_or_else(|| d.settings.controls.default_model.clone()),
        usage: generation.usage,
        picture_newest_message: picture
            .exchanges
            .iter()
            .map(|e| e.newest_message)
            .max()
            .unwrap_or(last.newest_message),
    }
}
