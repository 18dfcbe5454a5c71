//! Conformance of the threads area: a thread lull opened is remembered, once, per
//! platform and key.

use crate::domain::{ConversationRef, Platform};
use crate::store::Store;

/// Remembered (twice is once), and only that conversation.
pub async fn a_thread_is_remembered(store: &dyn Store) {
    let thread = ConversationRef::new(Platform::Discord, "501");
    assert!(!store.is_thread(&thread).await.unwrap());
    store.remember_thread(&thread, super::at(10)).await.unwrap();
    store.remember_thread(&thread, super::at(20)).await.unwrap();
    assert!(store.is_thread(&thread).await.unwrap());
    let channel = ConversationRef::new(Platform::Discord, "500");
    assert!(!store.is_thread(&channel).await.unwrap());
    let elsewhere = ConversationRef::new(Platform::Telegram, "501");
    assert!(!store.is_thread(&elsewhere).await.unwrap());
}
