//! One rank's step pipe: a `StepStream` call that stays open for the life of the router.
//!
//! Steps go out in the order [`StepPipe::send`] is called, and the shard answers them in
//! that order, so each answer goes to the oldest waiter. Sending never waits for an
//! earlier answer: that is what lets the scheduler keep step N+1 queued on the shard while
//! step N runs. When the stream ends, every waiter (and every later send) gets its status.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Channel;
use tonic::{Status, Streaming};

use crate::pb;
use crate::pb::text_generation_shard_client::TextGenerationShardClient;

pub type StepAnswer = Result<pb::StepResponse, Status>;

#[derive(Debug, Default)]
struct Waiters {
    queue: VecDeque<oneshot::Sender<StepAnswer>>,
    /// Why the stream ended; set once, then every send fails with it.
    closed: Option<Status>,
}

impl Waiters {
    fn close(&mut self, status: Status) {
        for waiter in self.queue.drain(..) {
            let _ = waiter.send(Err(status.clone()));
        }
        self.closed = Some(status);
    }
}

#[derive(Debug)]
pub struct StepPipe {
    requests: mpsc::UnboundedSender<pb::StepRequest>,
    waiters: Arc<Mutex<Waiters>>,
}

impl StepPipe {
    /// Opens the stream on the current tokio runtime. The call completes its handshake with
    /// the first step, so nothing here waits.
    pub fn open(client: TextGenerationShardClient<Channel>) -> Self {
        let (requests, outgoing) = mpsc::unbounded_channel();
        let waiters = Arc::new(Mutex::new(Waiters::default()));
        tokio::spawn(run(client, outgoing, waiters.clone()));
        Self { requests, waiters }
    }

    /// Sends `request` now; the receiver gets its answer (or the status that ended the stream).
    pub fn send(&self, request: pb::StepRequest) -> oneshot::Receiver<StepAnswer> {
        let (waiter, answer) = oneshot::channel();
        let mut waiters = self.waiters.lock().expect("step pipe lock");
        if let Some(status) = &waiters.closed {
            let _ = waiter.send(Err(status.clone()));
        } else if self.requests.send(request).is_ok() {
            waiters.queue.push_back(waiter);
        } else {
            let _ = waiter.send(Err(Status::unavailable("the step stream is closed")));
        }
        answer
    }
}

async fn run(
    mut client: TextGenerationShardClient<Channel>,
    outgoing: mpsc::UnboundedReceiver<pb::StepRequest>,
    waiters: Arc<Mutex<Waiters>>,
) {
    let ended = match client
        .step_stream(UnboundedReceiverStream::new(outgoing))
        .await
    {
        Ok(response) => deliver(response.into_inner(), &waiters).await,
        Err(status) => status,
    };
    waiters.lock().expect("step pipe lock").close(ended);
}

/// Hands each answer to the oldest waiter until the stream ends; returns why it ended.
async fn deliver(mut answers: Streaming<pb::StepResponse>, waiters: &Mutex<Waiters>) -> Status {
    loop {
        match answers.message().await {
            Ok(Some(answer)) => {
                let waiter = waiters.lock().expect("step pipe lock").queue.pop_front();
                match waiter {
                    Some(waiter) => {
                        let _ = waiter.send(Ok(answer));
                    }
                    None => {
                        return Status::internal(format!(
                            "the shard answered step {} that nobody sent",
                            answer.step_id
                        ))
                    }
                }
            }
            Ok(None) => return Status::unavailable("the shard closed the step stream"),
            Err(status) => return status,
        }
    }
}
