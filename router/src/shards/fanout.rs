//! One call made on every rank at once, failing fast.
//!
//! Under tensor parallelism a rank that dies leaves the others blocked in a collective, so
//! waiting for every answer would hang. The first error ends the call (the other ranks'
//! calls are dropped, which cancels them), and an optional deadline bounds a hang.
use std::future::Future;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};

/// Why a fan-out call did not get an answer from every rank.
#[derive(Debug)]
pub enum FanOutError<E> {
    /// `rank` answered with an error.
    Failed { rank: usize, error: E },
    /// The deadline passed; `pending` lists the ranks (ascending) that had not answered.
    TimedOut {
        pending: Vec<usize>,
        waited: Duration,
    },
}

/// Runs `calls` (one per rank, in rank order) concurrently; returns their answers in rank
/// order, or the first failure.
pub async fn on_every_rank<T, E, Fut>(
    calls: Vec<Fut>,
    timeout: Option<Duration>,
) -> Result<Vec<T>, FanOutError<E>>
where
    Fut: Future<Output = Result<T, E>>,
{
    let count = calls.len();
    let mut running: FuturesUnordered<_> = calls
        .into_iter()
        .enumerate()
        .map(|(rank, call)| async move { (rank, call.await) })
        .collect();
    let mut answers: Vec<Option<T>> = (0..count).map(|_| None).collect();
    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
    for _ in 0..count {
        let next = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, running.next()).await {
                Ok(next) => next,
                Err(_) => {
                    let pending = (0..count).filter(|&r| answers[r].is_none()).collect();
                    return Err(FanOutError::TimedOut {
                        pending,
                        waited: timeout.unwrap_or_default(),
                    });
                }
            },
            None => running.next().await,
        };
        let Some((rank, answer)) = next else { break };
        match answer {
            Ok(value) => answers[rank] = Some(value),
            Err(error) => return Err(FanOutError::Failed { rank, error }),
        }
    }
    Ok(answers.into_iter().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    type Call = std::pin::Pin<Box<dyn Future<Output = Result<usize, String>> + Send>>;

    fn answer_after(ms: u64, value: Result<usize, String>) -> Call {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            value
        })
    }

    fn never() -> Call {
        Box::pin(std::future::pending())
    }

    #[tokio::test]
    async fn answers_come_back_in_rank_order_whatever_order_they_finish_in() {
        let calls = vec![
            answer_after(30, Ok(0)),
            answer_after(1, Ok(1)),
            answer_after(10, Ok(2)),
        ];
        let answers = on_every_rank(calls, Some(Duration::from_secs(5)))
            .await
            .unwrap();
        assert_eq!(answers, vec![0, 1, 2]);
    }

    #[tokio::test]
    async fn a_failing_rank_ends_the_call_while_the_others_still_wait() {
        // Rank 0 is blocked (as in a collective whose peer died); rank 1 fails.
        let calls = vec![never(), answer_after(5, Err("connection reset".into()))];
        match on_every_rank(calls, None).await {
            Err(FanOutError::Failed { rank, error }) => {
                assert_eq!(rank, 1);
                assert_eq!(error, "connection reset");
            }
            other => panic!("expected rank 1's failure, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_hung_rank_times_out_naming_the_ranks_still_pending() {
        let calls = vec![answer_after(1, Ok(0)), never(), never()];
        match on_every_rank(calls, Some(Duration::from_millis(200))).await {
            Err(FanOutError::TimedOut { pending, waited }) => {
                assert_eq!(pending, vec![1, 2]);
                assert_eq!(waited, Duration::from_millis(200));
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn the_other_calls_are_dropped_after_a_failure() {
        let finished = Arc::new(AtomicBool::new(false));
        let flag = finished.clone();
        let slow: Call = Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            flag.store(true, Ordering::SeqCst);
            Ok(0)
        });
        let calls = vec![slow, answer_after(1, Err("dead".into()))];
        assert!(on_every_rank(calls, None).await.is_err());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !finished.load(Ordering::SeqCst),
            "the slow call kept running"
        );
    }
}
