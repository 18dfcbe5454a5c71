//! Conformance of the messages area: ingest, media, edits, catch-up reads.

use lull_port::{Media, MediaKind};

use super::{at, claimed, collect, committed, holder, http, message, pending_ids, stored};
use crate::domain::{ConversationRef, Platform, Version};
use crate::store::{
    IngestOutcome, MessageEdit, NewMessage, RecentConversation, RecentQuery, Store, StoredBy,
};

/// No duplicate: a redelivered update is not stored or counted again; the same
/// platform id in another conversation is another message.
pub async fn ingest_is_idempotent(store: &dyn Store) {
    let a = holder("a");
    let (id, version, _) = stored(store, message(http("c1"), "m1"), &a, at(0)).await;
    assert_eq!(version, Version(1));
    let again = store.ingest(message(http("c1"), "m1"), &a, at(10)).await;
    assert_eq!(
        again.unwrap(),
        IngestOutcome::Duplicate { conversation: id },
        "a redelivered message is a duplicate"
    );
    let batch = collect(store, id).await;
    assert_eq!(
        batch.v0,
        Version(1),
        "a redelivery does not bump the version"
    );
    assert_eq!(pending_ids(&batch), ["m1"]);
    let (other, version, _) = stored(store, message(http("c2"), "m1"), &a, at(20)).await;
    assert_ne!(other, id, "another conversation");
    assert_eq!(version, Version(1));
}

/// Media references are stored with their message, in the same transaction, and
/// come back with the pending batch, in order; a message without media has none, and
/// an edit of the caption keeps them.
pub async fn media_are_stored_with_their_message(store: &dyn Store) {
    let a = holder("a");
    let image = |reference: &str, size: Option<u64>, mime: Option<&str>| Media {
        kind: MediaKind::Image,
        reference: reference.into(),
        size,
        mime: mime.map(str::to_owned),
        duration_secs: None,
    };
    let media = vec![
        image("file-1", Some(1234), Some("image/jpeg")),
        image("https://cdn.example/a.png?ex=1&is=2", None, None),
    ];
    let photo = NewMessage {
        text: "[image] [image] what is this?".into(),
        media: media.clone(),
        ..message(http("c1"), "m1")
    };
    let (id, _, _) = stored(store, photo, &a, at(0)).await;
    stored(store, message(http("c1"), "m2"), &a, at(10)).await;
    let edit = MessageEdit {
        conversation: http("c1"),
        message_id: "m1".into(),
        text: "[image] [image] and now?".into(),
    };
    assert!(matches!(
        store
            .edit(
                edit,
                StoredBy {
                    holder: &a,
                    now: at(20)
                }
            )
            .await
            .unwrap(),
        IngestOutcome::Stored { .. }
    ));
    let batch = collect(store, id).await;
    assert_eq!(pending_ids(&batch), ["m1", "m2"]);
    assert_eq!(batch.pending[0].media, media, "stored with the message");
    assert_eq!(batch.pending[0].text, "[image] [image] and now?");
    assert!(batch.pending[1].media.is_empty(), "text has no media");
}

/// Each message bumps the version and re-arms the timer to `now + debounce`, never
/// past `first pending + max_wait`; a full batch is due at once.
pub async fn ingest_bumps_the_version_and_arms_the_capped_timer(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    let (id, version, due_at) = stored(store, message(c1.clone(), "m1"), &a, at(0)).await;
    assert_eq!((version, due_at), (Version(1), at(1000)), "debounced");
    let (_, version, due_at) = stored(store, message(c1.clone(), "m2"), &a, at(500)).await;
    assert_eq!((version, due_at), (Version(2), at(1500)), "re-armed");
    let (_, version, due_at) = stored(store, message(c1.clone(), "m3"), &a, at(3500)).await;
    assert_eq!(
        (version, due_at),
        (Version(3), at(4000)),
        "capped at the first pending message + max_wait"
    );
    let batch = collect(store, id).await;
    assert_eq!(batch.v0, Version(3));
    assert_eq!(
        batch.timer.map(|t| (t.due_at, t.attempts)),
        Some((at(4000), 0))
    );
    assert_eq!(batch.oldest_pending_at(), Some(at(0)));
    let (_, _, due_at) = stored(store, message(c1, "m4"), &a, at(3600)).await;
    assert_eq!(due_at, at(3600), "a full batch is due at once");
}

/// An edit of a pending message replaces its text and counts as a new message; an
/// edit that changes nothing, of an unknown message or of an answered one is ignored.
pub async fn edits_change_only_pending_messages(store: &dyn Store) {
    let a = holder("a");
    let c1 = http("c1");
    let edit = |id: &str, text: &str| MessageEdit {
        conversation: c1.clone(),
        message_id: id.into(),
        text: text.into(),
    };
    let (id, _, _) = stored(store, message(c1.clone(), "m1"), &a, at(0)).await;
    assert_eq!(
        store
            .edit(
                edit("m1", "edited"),
                StoredBy {
                    holder: &a,
                    now: at(500)
                }
            )
            .await
            .unwrap(),
        IngestOutcome::Stored {
            conversation: id,
            version: Version(2),
            due_at: at(1500),
        },
        "an edit bumps the version and re-arms the timer"
    );
    let batch = collect(store, id).await;
    assert_eq!(batch.v0, Version(2));
    assert_eq!(batch.pending.len(), 1, "an edit is not another message");
    assert_eq!(batch.pending[0].text, "edited");
    for (ignored, why) in [
        (edit("m1", "edited"), "an unchanged text"),
        (edit("m9", "who?"), "an unknown message"),
        (
            MessageEdit {
                conversation: http("nowhere"),
                ..edit("m1", "x")
            },
            "an unknown conversation",
        ),
    ] {
        assert_eq!(
            store
                .edit(
                    ignored,
                    StoredBy {
                        holder: &a,
                        now: at(600)
                    }
                )
                .await
                .unwrap(),
            IngestOutcome::EditIgnored,
            "{why}"
        );
    }
    let lease = claimed(store, id, &a, at(1500)).await;
    committed(store, &lease, &batch, "answer", at(1500)).await;
    assert_eq!(
        store
            .edit(
                edit("m1", "too late"),
                StoredBy {
                    holder: &a,
                    now: at(1600)
                }
            )
            .await
            .unwrap(),
        IngestOutcome::EditIgnored,
        "an answered message"
    );
    let after = collect(store, id).await;
    assert_eq!(after.v0, Version(2));
    assert!(after.pending.is_empty() && after.timer.is_none());
}

/// Conversations of a platform with a message stored since a moment, most recent
/// first, each with the platform id of the message stored last (not the largest id).
pub async fn recent_conversations_resume_after_the_last_stored_message(store: &dyn Store) {
    let a = holder("a");
    stored(store, message(http("c1"), "m9"), &a, at(0)).await;
    stored(store, message(http("c1"), "m10"), &a, at(300)).await;
    let group = NewMessage {
        is_group: true,
        ..message(http("g1"), "x1")
    };
    stored(store, group, &a, at(200)).await;
    stored(
        store,
        message(ConversationRef::new(Platform::Telegram, "t1"), "7"),
        &a,
        at(250),
    )
    .await;
    let recent = |platform, since, limit| {
        store.recent_conversations(RecentQuery {
            platform,
            since,
            limit,
        })
    };
    let entry = |key: &str, is_group, last: &str| RecentConversation {
        conversation: http(key),
        is_group,
        last_message_id: last.into(),
    };
    assert_eq!(
        recent(Platform::Http, at(100), 10).await.unwrap(),
        [entry("c1", false, "m10"), entry("g1", true, "x1")]
    );
    assert_eq!(
        recent(Platform::Http, at(250), 10).await.unwrap(),
        [entry("c1", false, "m10")]
    );
    assert_eq!(
        recent(Platform::Http, at(0), 1).await.unwrap(),
        [entry("c1", false, "m10")]
    );
    assert_eq!(
        recent(Platform::Telegram, at(0), 10).await.unwrap().len(),
        1
    );
    assert!(
        recent(Platform::Discord, at(0), 10)
            .await
            .unwrap()
            .is_empty()
    );
}
