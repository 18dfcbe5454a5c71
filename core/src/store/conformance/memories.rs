//! Conformance of the memories area: memories are written with a committed reply or
//! not at all, each fact once per scope; a scope keeps its newest; the commands change
//! rows of their own scope only; `/forgetme` erases a person's memories and texts and
//! nobody else's; commits remembering in one scope at once keep every fact.

use super::{at, collect, holder, http, message, reply, round, stored};
use crate::domain::{ConversationRef, Platform, Timestamp};
use crate::store::{
    CommitOutcome, MEMORIES_PER_SCOPE, Memory, MemoryApplied, MemoryChange, MemoryWrites,
    OverheardMessage, Overhearing, Remember, ReplyCommit, Scope, Store,
};

fn person(user: &str) -> Scope {
    Scope::person(Platform::Http, user)
}

fn fact(scope: &Scope, text: &str, author: &str) -> MemoryChange {
    MemoryChange::Remember(Remember {
        scope: scope.clone(),
        text: text.into(),
        author: author.into(),
        source: Some("m1".into()),
    })
}

fn writes(changes: Vec<MemoryChange>) -> MemoryWrites {
    MemoryWrites {
        changes,
        // Every message stored so far: no fence made before the commit applies.
        newest_message: i64::MAX,
        seen: Vec::new(),
    }
}

/// A round in `chat` committing a reply that writes `changes`: what it applied, or
/// `None` when the reply was stale.
async fn commit_with(
    store: &dyn Store,
    chat: &ConversationRef,
    ids: &[&str],
    changes: Vec<MemoryChange>,
    newer: Option<&str>,
) -> Option<MemoryApplied> {
    let by = holder("p1");
    let (_, lease, batch) = round(store, chat, &by, ids, at(1_000)).await;
    if let Some(newer) = newer {
        stored(store, message(chat.clone(), newer), &by, at(1_050)).await;
    }
    let outcome = store
        .commit_reply(ReplyCommit {
            lease: &lease,
            batch: &batch,
            reply: crate::store::NewReply {
                memories: MemoryWrites {
                    newest_message: newest(&batch),
                    ..writes(changes)
                },
                ..reply("noted")
            },
            now: at(1_100),
        })
        .await
        .expect("committing");
    match outcome {
        CommitOutcome::Committed { memories, .. } => Some(memories),
        CommitOutcome::Stale { .. } => None,
    }
}

fn newest(batch: &crate::store::Batch) -> i64 {
    batch.pending.iter().map(|m| m.row).max().unwrap_or(0)
}

async fn texts(store: &dyn Store, scope: &Scope) -> Vec<String> {
    store
        .memories(std::slice::from_ref(scope), 1_000)
        .await
        .expect("reading memories")
        .into_iter()
        .map(|m| m.text)
        .collect()
}

/// Written with the reply: a committed reply's facts are stored (each fact once per
/// scope, newest first), a stale reply's are not; a forget names its scope.
pub async fn memories_are_written_with_a_committed_reply_only(store: &dyn Store) {
    let ann = person("u1");
    let applied = commit_with(
        store,
        &http("mem-1"),
        &["m1"],
        vec![
            fact(&ann, "likes tea", "u1"),
            fact(&ann, "lives in Oslo", "u1"),
        ],
        None,
    )
    .await
    .expect("committed");
    assert_eq!(applied.remembered, 2);
    assert_eq!(texts(store, &ann).await, ["lives in Oslo", "likes tea"]);
    // Stale: nothing written.
    let stale = commit_with(
        store,
        &http("mem-2"),
        &["s1"],
        vec![fact(&ann, "has a cat", "u1")],
        Some("s2"),
    )
    .await;
    assert!(stale.is_none());
    assert_eq!(
        texts(store, &ann).await.len(),
        2,
        "a stale reply wrote nothing"
    );
    // The same fact again is kept once; a forget of another scope's id leaves it.
    let tea = store
        .memories(std::slice::from_ref(&ann), 10)
        .await
        .unwrap()[1]
        .clone();
    let applied = commit_with(
        store,
        &http("mem-3"),
        &["t1"],
        vec![
            fact(&ann, "likes tea", "u1"),
            MemoryChange::Forget {
                scope: person("u2"),
                id: tea.id,
            },
        ],
        None,
    )
    .await
    .expect("committed");
    assert_eq!(applied, MemoryApplied::default());
    assert_eq!(texts(store, &ann).await.len(), 2);
    let applied = commit_with(
        store,
        &http("mem-4"),
        &["f1"],
        vec![MemoryChange::Forget {
            scope: ann.clone(),
            id: tea.id,
        }],
        None,
    )
    .await
    .expect("committed");
    assert_eq!(applied.forgotten, 1);
    assert_eq!(texts(store, &ann).await, ["lives in Oslo"]);
}

/// A scope keeps its newest [`MEMORIES_PER_SCOPE`]: remembering beyond drops the
/// oldest, and says how many.
pub async fn a_scope_keeps_its_newest_memories(store: &dyn Store) {
    let ann = person("u1");
    let many: Vec<MemoryChange> = (0..MEMORIES_PER_SCOPE + 5)
        .map(|n| fact(&ann, &format!("fact {n:03}"), "u1"))
        .collect();
    let applied = commit_with(store, &http("cap-1"), &["m1"], many, None)
        .await
        .expect("committed");
    assert_eq!(applied.remembered as usize, MEMORIES_PER_SCOPE + 5);
    assert_eq!(applied.dropped, 5);
    let kept = texts(store, &ann).await;
    assert_eq!(kept.len(), MEMORIES_PER_SCOPE);
    assert_eq!(kept[0], format!("fact {:03}", MEMORIES_PER_SCOPE + 4));
    assert!(!kept.contains(&"fact 004".to_owned()), "the oldest dropped");
    assert!(kept.contains(&"fact 005".to_owned()));
}

/// `/memory forget N` and `/memory clear` change rows of their scope only; the counts
/// are by scope kind.
pub async fn the_commands_change_their_scope_only(store: &dyn Store) {
    let ann = person("u1");
    let bob = person("u2");
    let group = Scope::chat(&http("g-1"));
    let changes = vec![
        fact(&ann, "a1", "u1"),
        fact(&ann, "a2", "u1"),
        fact(&bob, "b1", "u2"),
        fact(&group, "g1", "u1"),
    ];
    commit_with(store, &http("cmd-1"), &["m1"], changes, None)
        .await
        .expect("committed");
    let counts = store.memory_counts().await.unwrap();
    assert_eq!((counts.person, counts.chat), (3, 1));
    let bobs: Vec<Memory> = store
        .memories(std::slice::from_ref(&bob), 10)
        .await
        .unwrap();
    assert!(
        !store.forget_memory(&ann, bobs[0].id).await.unwrap(),
        "another scope's id is never touched"
    );
    assert!(store.forget_memory(&bob, bobs[0].id).await.unwrap());
    assert!(
        !store.forget_memory(&bob, bobs[0].id).await.unwrap(),
        "once"
    );
    assert_eq!(store.clear_memories(&ann).await.unwrap(), 2);
    assert_eq!(texts(store, &group).await, ["g1"]);
    let both = store.memories(&[ann, group.clone()], 10).await.unwrap();
    assert_eq!(both.len(), 1);
}

/// `/forgetme`: the person's memories (their own, and the chat memories they asked
/// for) deleted, their message texts tombstoned and their overheard messages deleted;
/// another person's untouched; the messages stay rows (still pending, versions kept).
pub async fn forgetting_a_person_erases_their_memories_and_texts(store: &dyn Store) {
    let by = holder("p1");
    let chat = http("forget-1");
    let ann_said = message(chat.clone(), "a1");
    let mut bob_said = message(chat.clone(), "b1");
    bob_said.user_id = "u2".into();
    bob_said.text = "bob's words".into();
    stored(store, ann_said, &by, at(0)).await;
    let (conversation, version, _) = stored(store, bob_said, &by, at(10)).await;
    let mut in_group = message(http("forget-group"), "g0");
    in_group.user_id = "u2".into();
    let (group_id, _, _) = stored(store, in_group, &by, at(15)).await;
    store
        .overhear(Overhearing {
            message: OverheardMessage {
                conversation: http("forget-group"),
                message_id: "o1".into(),
                user_id: "u1".into(),
                author: "Ann".into(),
                text: "ann overheard".into(),
            },
            keep: 10,
            now: at(20),
        })
        .await
        .unwrap();
    let group = Scope::chat(&http("forget-group"));
    let changes = vec![
        fact(&person("u1"), "ann's fact", "u1"),
        fact(&group, "asked by ann", "u1"),
        fact(&group, "asked by bob", "u2"),
        fact(&person("u2"), "bob's fact", "u2"),
    ];
    commit_with(store, &http("forget-2"), &["m1"], changes, None)
        .await
        .expect("committed");
    let erased = store
        .erase_person(Platform::Http, "u1", Timestamp(5_000))
        .await
        .unwrap();
    assert_eq!(erased.memories, 2, "{erased:?}");
    // Ann's messages here and in the round's chat ("m1").
    assert_eq!(erased.messages, 2, "{erased:?}");
    assert_eq!(erased.overheard, 1, "{erased:?}");
    let batch = collect(store, conversation).await;
    assert_eq!(batch.v0, version, "versions are kept");
    let said: Vec<(&str, &str)> = batch
        .pending
        .iter()
        .map(|m| (m.message_id.as_str(), m.text.as_str()))
        .collect();
    assert_eq!(said, [("a1", ""), ("b1", "bob's words")]);
    assert_eq!(texts(store, &group).await, ["asked by bob"]);
    assert_eq!(texts(store, &person("u2")).await, ["bob's fact"]);
    assert!(texts(store, &person("u1")).await.is_empty());
    let heard = store
        .overheard(crate::store::OverheardQuery {
            conversation: group_id,
            limit: 10,
        })
        .await
        .unwrap();
    assert!(heard.is_empty());
}

/// Commits remembering in one person's scope at once, from many conversations: every
/// fact is kept (rows are inserted, never a list written back).
pub async fn concurrent_commits_keep_every_fact(store: &dyn Store) {
    let ann = person("u1");
    let rounds = (0..8).map(|n| {
        let chat = http(&format!("race-{n}"));
        let ann = ann.clone();
        async move {
            let by = holder(&format!("p{n}"));
            let (_, lease, batch) = round(store, &chat, &by, &["m1"], at(1_000)).await;
            store
                .commit_reply(ReplyCommit {
                    lease: &lease,
                    batch: &batch,
                    reply: crate::store::NewReply {
                        memories: writes(vec![fact(&ann, &format!("fact {n}"), "u1")]),
                        ..reply("noted")
                    },
                    now: at(1_100),
                })
                .await
                .expect("committing")
        }
    });
    futures_util::future::join_all(rounds).await;
    let mut kept = texts(store, &ann).await;
    kept.sort();
    let expected: Vec<String> = (0..8).map(|n| format!("fact {n}")).collect();
    assert_eq!(kept, expected);
}

/// A clear (or an erase) fences the rounds in flight: a round whose batch was read
/// before `/memory clear` or `/forgetme` commits its reply, but not its facts; a round
/// of a message stored after it remembers again.
pub async fn a_clear_fences_the_rounds_in_flight(store: &dyn Store) {
    let by = holder("p1");
    let ann = person("u1");
    let chat = http("fence-1");
    let (_, lease, batch) = round(store, &chat, &by, &["m1"], at(1_000)).await;
    assert_eq!(store.clear_memories(&ann).await.unwrap(), 0);
    let commit = |lease, batch, changes| async move {
        let outcome = store
            .commit_reply(ReplyCommit {
                lease,
                batch,
                reply: crate::store::NewReply {
                    memories: MemoryWrites {
                        newest_message: newest(batch),
                        ..writes(changes)
                    },
                    ..reply("noted")
                },
                now: at(1_100),
            })
            .await
            .expect("committing");
        match outcome {
            CommitOutcome::Committed { memories, .. } => memories,
            CommitOutcome::Stale { .. } => panic!("stale"),
        }
    };
    let group = Scope::chat(&http("fence-group"));
    let applied = commit(&lease, &batch, vec![fact(&ann, "old picture", "u1")]).await;
    assert_eq!((applied.remembered, applied.fenced), (0, 1));
    assert!(
        texts(store, &ann).await.is_empty(),
        "a cleared scope stays clear"
    );
    // A message after the clear (here in another chat of hers): its round remembers.
    let (_, lease, batch) = round(store, &http("fence-3"), &by, &["m1"], at(2_000)).await;
    let applied = commit(&lease, &batch, vec![fact(&ann, "new picture", "u1")]).await;
    assert_eq!(applied.remembered, 1);
    // An erase fences every fact the person asked for, in any scope.
    let (_, lease, batch) = round(store, &http("fence-2"), &by, &["m1"], at(3_000)).await;
    store
        .erase_person(Platform::Http, "u1", at(3_050))
        .await
        .unwrap();
    let applied = commit(&lease, &batch, vec![fact(&group, "asked by ann", "u1")]).await;
    assert_eq!(applied.fenced, 1);
    assert!(texts(store, &group).await.is_empty());
}
