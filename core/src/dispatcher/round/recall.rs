//! The **recall** stage: what the model remembers in this chat, read after the claim
//! and shown in the system prompt, and the staging the memory tools write into. The
//! person's memories are shown only in their private chat, the chat's only in it.

use std::sync::Arc;

use super::{Answering, Flow, Interrupt, Round};
use crate::dispatcher::memory::{self, Recalled, Staging};
use crate::store::MEMORIES_PER_SCOPE;

impl Round<'_> {
    /// The `recall` stage. Context only: a failure to read the memories is logged and
    /// the batch answered without them (and without the memory tools, which could not
    /// tell which memories exist).
    pub(super) async fn recall(&self, a: &mut Answering) -> Result<Flow, Interrupt> {
        let d = self.dispatcher;
        let Some(settings) = &d.settings.memory else {
            return Ok(Flow::Go);
        };
        let Some(shown) = memory::shown_scope(&a.batch) else {
            return Ok(Flow::Go);
        };
        let seen = match d
            .store
            .memories(std::slice::from_ref(&shown), MEMORIES_PER_SCOPE)
            .await
        {
            Ok(seen) => seen,
            Err(error) => {
                tracing::warn!(conversation = %self.conversation, %error, "could not read the memories; answering without them");
                return Ok(Flow::Go);
            }
        };
        let tools = d.settings.builtin_tools;
        a.prompt.memories = memory::block(&seen, settings.chars, tools);
        let rights = memory::rights(d, &a.batch);
        a.memory = Recalled {
            staging: Some(Arc::new(Staging::new(shown, seen, rights))),
        };
        Ok(Flow::Go)
    }
}
