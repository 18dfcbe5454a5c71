//! The actions area on sqlite: the journal of tool calls that act (a placeholder
//! until the journal's tables land; every call fails plainly).

use async_trait::async_trait;

use super::SqliteStore;
use crate::domain::{ConversationId, Lease, LeaseToken, Timestamp, Version};
use crate::store::{
    ActionKey, ActionReservation, ActionRow, ActionStore, Decision, NewAction, StoreError,
};

fn not_built() -> StoreError {
    StoreError::Backend {
        context: "using the action journal",
        message: "not built yet".into(),
    }
}

#[async_trait]
impl ActionStore for SqliteStore {
    async fn reserve_action(
        &self,
        _lease: &Lease,
        _v0: Version,
        _action: NewAction,
        _now: Timestamp,
    ) -> Result<ActionReservation, StoreError> {
        Err(not_built())
    }

    async fn finish_action(
        &self,
        _key: &ActionKey,
        _token: LeaseToken,
        _result: &str,
        _is_error: bool,
        _now: Timestamp,
    ) -> Result<bool, StoreError> {
        Err(not_built())
    }

    async fn actions_of_batch(
        &self,
        _conversation: ConversationId,
        _batch: i64,
    ) -> Result<Vec<ActionRow>, StoreError> {
        Err(not_built())
    }

    async fn open_approvals(
        &self,
        _conversation: ConversationId,
        _now: Timestamp,
    ) -> Result<Vec<ActionRow>, StoreError> {
        Err(not_built())
    }

    async fn decide_action(
        &self,
        _conversation: ConversationId,
        _id: i64,
        _approve: bool,
        _now: Timestamp,
    ) -> Result<Decision, StoreError> {
        Err(not_built())
    }
}
