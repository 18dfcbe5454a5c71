//! The dispatcher's work beside its rounds: ack reactions set and taken off, draft
//! placeholders paced. Tracked, never detached: shutdown stops it in one known place,
//! after the rounds (whose deliveries take reactions off) and before the store's last
//! checkpoint, so nothing of it writes after the process said it stopped.
//!
//! Two kinds, by what stopping early costs: work that **finishes** (a reaction being
//! set or taken off, a write that records it) is waited for, within a bound; work
//! that only **shows** (a draft placeholder, cosmetic) is cancelled at once.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How long shutdown waits for work that finishes before it is cancelled too.
pub(crate) const FINISH_WITHIN: Duration = Duration::from_secs(1);

/// The dispatcher's tracked background work (cheap to clone: one set of tasks).
#[derive(Clone, Default)]
pub(crate) struct Background {
    tasks: TaskTracker,
    /// Cancels the work that only shows at once, and what still runs at the bound.
    shown: CancellationToken,
    finishing: CancellationToken,
}

impl Background {
    /// Run `work` beside the rounds; shutdown waits for it (at most
    /// [`FINISH_WITHIN`], then it is dropped where it waits).
    pub(crate) fn finish(&self, work: impl Future<Output = ()> + Send + 'static) {
        let stop = self.finishing.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                () = work => {}
                () = stop.cancelled() => {}
            }
        });
    }

    /// Run `work` beside the rounds; shutdown cancels it at once (it only shows).
    pub(crate) fn show(&self, work: impl Future<Output = ()> + Send + 'static) {
        let stop = self.shown.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                () = work => {}
                () = stop.cancelled() => {}
            }
        });
    }

    /// Stop: what only shows at once, what finishes within [`FINISH_WITHIN`]; returns
    /// when every task has ended. Work started afterwards is cancelled as it starts.
    pub(crate) async fn stop(&self) {
        self.tasks.close();
        self.shown.cancel();
        let running = self.tasks.len();
        if tokio::time::timeout(FINISH_WITHIN, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                running,
                "background work (ack reactions) not done in time; dropped"
            );
        }
        self.finishing.cancel();
        self.tasks.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn shown_work_stops_at_once_and_finishing_work_is_waited_for() {
        let background = Background::default();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        background.show(std::future::pending());
        background.finish(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let _ = done_tx.send(());
        });
        let started = tokio::time::Instant::now();
        background.stop().await;
        assert_eq!(started.elapsed(), Duration::from_millis(300));
        done_rx.await.expect("the finishing work finished");
    }

    #[tokio::test(start_paused = true)]
    async fn finishing_work_is_dropped_at_the_bound() {
        let background = Background::default();
        background.finish(std::future::pending());
        let started = tokio::time::Instant::now();
        background.stop().await;
        assert_eq!(started.elapsed(), FINISH_WITHIN);
        // Work started after the stop is cancelled as it starts.
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        background.show(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            let _ = tx.send(());
        });
        assert!(rx.await.is_err());
    }
}
