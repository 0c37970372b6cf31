//! One sequence's event channel, counting the events sent and not yet received. The
//! scheduler never waits on a reader (the channel is unbounded, so a slow client cannot
//! slow the batch), but it sees how far behind each reader is and drops a stream that has
//! fallen `max_stream_backlog` events behind, freeing its batch slot and KV blocks.
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::mpsc::{self, error::TryRecvError};

use super::SequenceEvent;

/// A new channel: the scheduler keeps the sender, the request task the stream.
pub fn channel() -> (EventSender, SequenceStream) {
    let (tx, rx) = mpsc::unbounded_channel();
    let backlog = Arc::new(AtomicUsize::new(0));
    (
        EventSender {
            tx,
            backlog: backlog.clone(),
        },
        SequenceStream { rx, backlog },
    )
}

#[derive(Debug)]
pub struct EventSender {
    tx: mpsc::UnboundedSender<SequenceEvent>,
    backlog: Arc<AtomicUsize>,
}

impl EventSender {
    /// Sends unless the stream is gone (then nobody is told, as before).
    pub fn send(&self, event: SequenceEvent) {
        // Counted before it can be received (the reader runs on another thread), so the
        // reader's decrement never comes first and the count never wraps below zero.
        self.backlog.fetch_add(1, Ordering::Relaxed);
        if self.tx.send(event).is_err() {
            self.backlog.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The stream was dropped: the client left, or a stop sequence ended it.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Events sent that the stream has not received yet.
    pub fn backlog(&self) -> usize {
        self.backlog.load(Ordering::Relaxed)
    }
}

/// Receives a sequence's events. Dropping it cancels the sequence: the scheduler notices
/// before its next step and frees the sequence's KV blocks.
#[derive(Debug)]
pub struct SequenceStream {
    rx: mpsc::UnboundedReceiver<SequenceEvent>,
    backlog: Arc<AtomicUsize>,
}

impl SequenceStream {
    pub async fn recv(&mut self) -> Option<SequenceEvent> {
        let event = self.rx.recv().await;
        self.received(event.is_some());
        event
    }

    pub fn try_recv(&mut self) -> Result<SequenceEvent, TryRecvError> {
        let event = self.rx.try_recv();
        self.received(event.is_ok());
        event
    }

    fn received(&self, got: bool) {
        if got {
            self.backlog.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_backlog_counts_what_was_sent_and_not_received() {
        let (sender, mut stream) = channel();
        for _ in 0..3 {
            sender.send(SequenceEvent::Error("x".into()));
        }
        assert_eq!(sender.backlog(), 3);
        assert!(stream.recv().await.is_some());
        assert!(stream.try_recv().is_ok());
        assert_eq!(sender.backlog(), 1);
        drop(stream);
        assert!(sender.is_closed());
        sender.send(SequenceEvent::Error("nobody".into()));
        assert_eq!(
            sender.backlog(),
            1,
            "a send to a dropped stream is not counted"
        );
    }
}
