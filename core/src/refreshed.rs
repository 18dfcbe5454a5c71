//! A value read from elsewhere and kept for a while: the admins' access decisions
//! (from the store, checked for every inbound message), the model server's list (for
//! `/model`) and the status page's snapshot. However many callers ask meanwhile, it
//! is read at most once per its age:
//! - **one read at a time**: callers that find the copy stale together wait for one
//!   read instead of each sending its own (a burst of callers would otherwise each
//!   take a pooled connection, opening connections the process then keeps, or each
//!   ask the model server), and share its answer, a failure too (a source that hangs
//!   fails them after one read's deadline, not one deadline per caller in turn);
//! - **a forgotten copy stays forgotten**: [`Refreshed::forget`] (a decision this
//!   process just recorded) makes the copy stale at once, and a read that started
//!   before it (and may have missed the decision) does not put its answer back as
//!   fresh.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The copy, and the one read that refreshes it. `E` is the read's error, shared by
/// the callers that waited for it.
pub struct Refreshed<T, E> {
    kept: Mutex<Kept<T, E>>,
    /// Held by the caller reading; the others wait on it, then find the copy fresh
    /// (or the read failed).
    reading: tokio::sync::Mutex<()>,
}

struct Kept<T, E> {
    /// The value and when the read that found it started.
    read: Option<(Instant, Arc<T>)>,
    /// Bumped by [`Refreshed::forget`]: a read answers only for the generation it
    /// started in.
    generation: u64,
    /// Reads finished, and the last one's failure: a caller that waited while a
    /// read failed answers with that failure.
    reads: u64,
    failed: Option<E>,
}

impl<T, E> Default for Refreshed<T, E> {
    fn default() -> Self {
        Refreshed {
            kept: Mutex::new(Kept {
                read: None,
                generation: 0,
                reads: 0,
                failed: None,
            }),
            reading: tokio::sync::Mutex::new(()),
        }
    }
}

impl<T, E: Clone> Refreshed<T, E> {
    /// The value, read again (by `read`) when the copy is older than `max_age` or
    /// forgotten.
    pub async fn get<R>(&self, max_age: Duration, read: impl FnOnce() -> R) -> Result<Arc<T>, E>
    where
        R: Future<Output = Result<T, E>>,
    {
        let reads = {
            let kept = self.kept();
            if let Some(value) = kept.fresh(max_age) {
                return Ok(value);
            }
            kept.reads
        };
        let _reading = self.reading.lock().await;
        let generation = {
            let kept = self.kept();
            // Someone else's read finished while this caller waited: its answer.
            if let Some(value) = kept.fresh(max_age) {
                return Ok(value);
            }
            if kept.reads != reads
                && let Some(failed) = &kept.failed
            {
                return Err(failed.clone());
            }
            kept.generation
        };
        let started = Instant::now();
        let read = read().await;
        let mut kept = self.kept();
        kept.reads += 1;
        match read {
            Ok(value) => {
                let value = Arc::new(value);
                kept.failed = None;
                if kept.generation == generation {
                    kept.read = Some((started, value.clone()));
                }
                Ok(value)
            }
            Err(failed) => {
                kept.failed = Some(failed.clone());
                Err(failed)
            }
        }
    }

    /// Make the copy stale (this process just changed what it holds).
    pub fn forget(&self) {
        let mut kept = self.kept();
        kept.read = None;
        kept.generation += 1;
    }

    fn kept(&self) -> MutexGuard<'_, Kept<T, E>> {
        self.kept.lock().expect("refreshed copy")
    }
}

impl<T, E> Kept<T, E> {
    fn fresh(&self, max_age: Duration) -> Option<Arc<T>> {
        match &self.read {
            Some((read_at, value)) if read_at.elapsed() < max_age => Some(value.clone()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::access::{AccessRule, Subject, SubjectKind};
    use crate::domain::{Platform, Timestamp};
    use crate::store::StoreError;

    type AccessRules = Refreshed<Vec<AccessRule>, StoreError>;

    const AGE: Duration = Duration::from_secs(60);

    fn rule(name: &str) -> AccessRule {
        AccessRule {
            subject: Subject {
                platform: Platform::Telegram,
                kind: SubjectKind::User,
                id: name.into(),
            },
            allowed: true,
            set_by: "telegram:1".into(),
            set_at: Timestamp(0),
        }
    }

    type Answer = Result<Arc<Vec<AccessRule>>, StoreError>;

    /// Sixteen callers at once on a stale copy, each read answering `answer` after
    /// 50 ms: their answers, and how many reads were sent.
    async fn crowd(answer: Result<Vec<AccessRule>, StoreError>) -> (Vec<Answer>, usize) {
        let rules = Arc::new(AccessRules::default());
        let reads = Arc::new(AtomicUsize::new(0));
        let mut callers = tokio::task::JoinSet::new();
        for _ in 0..16 {
            let (rules, reads, answer) = (rules.clone(), reads.clone(), answer.clone());
            callers.spawn(async move {
                rules
                    .get(AGE, || async {
                        reads.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        answer
                    })
                    .await
            });
        }
        let mut answers = Vec::new();
        while let Some(got) = callers.join_next().await {
            answers.push(got.unwrap());
        }
        (answers, reads.load(Ordering::SeqCst))
    }

    /// Sixteen callers that find the copy stale together cause one read.
    #[tokio::test]
    async fn callers_that_find_the_copy_stale_together_share_one_read() {
        let (answers, reads) = crowd(Ok(vec![rule("a")])).await;
        for answer in answers {
            assert_eq!(*answer.unwrap(), vec![rule("a")]);
        }
        assert_eq!(reads, 1);
    }

    /// A copy older than the age, or forgotten, is read again.
    #[tokio::test]
    async fn a_stale_or_forgotten_copy_is_read_again() {
        let rules = AccessRules::default();
        let reads = AtomicUsize::new(0);
        let read = || async {
            reads.fetch_add(1, Ordering::SeqCst);
            Ok(vec![])
        };
        rules.get(AGE, read).await.unwrap();
        rules.get(AGE, read).await.unwrap();
        assert_eq!(reads.load(Ordering::SeqCst), 1, "fresh: not read again");
        rules.get(Duration::ZERO, read).await.unwrap();
        assert_eq!(reads.load(Ordering::SeqCst), 2, "stale: read again");
        rules.forget();
        rules.get(AGE, read).await.unwrap();
        assert_eq!(reads.load(Ordering::SeqCst), 3, "forgotten: read again");
    }

    /// A read that started before a decision was recorded answers its caller, but
    /// is not kept: the next caller reads again and sees the decision.
    #[tokio::test]
    async fn a_read_overtaken_by_a_forget_is_not_kept() {
        let rules = AccessRules::default();
        let early = rules.get(AGE, || async {
            // The decision is recorded while this read is on its way.
            rules.forget();
            Ok(vec![])
        });
        assert!(early.await.unwrap().is_empty());
        let later = rules.get(AGE, || async { Ok(vec![rule("b")]) });
        assert_eq!(*later.await.unwrap(), vec![rule("b")]);
    }

    /// Callers that waited while a read failed share its failure: one read, not one
    /// each in turn (a hanging database would keep the last caller waiting one
    /// deadline per caller before it).
    #[tokio::test]
    async fn callers_waiting_on_a_failed_read_share_its_failure() {
        let (answers, reads) = crowd(Err(StoreError::Pool("no answer".into()))).await;
        for answer in answers {
            assert!(matches!(answer, Err(StoreError::Pool(_))), "{answer:?}");
        }
        assert_eq!(reads, 1);
    }

    /// A failed read fails its caller and leaves the copy stale.
    #[tokio::test]
    async fn a_failed_read_is_not_kept() {
        let rules = AccessRules::default();
        let failed = rules
            .get(AGE, || async { Err(StoreError::Pool("down".into())) })
            .await;
        assert!(failed.is_err());
        let next = rules.get(AGE, || async { Ok(vec![rule("c")]) });
        assert_eq!(*next.await.unwrap(), vec![rule("c")]);
    }
}
