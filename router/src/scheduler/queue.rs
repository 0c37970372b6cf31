//! The waiting queue: FIFO for new requests; preempted sequences go back to the front
//! so that they resume before anything that arrived after them.
use std::collections::VecDeque;

#[derive(Debug)]
pub struct WaitingQueue<T> {
    items: VecDeque<T>,
}

impl<T> Default for WaitingQueue<T> {
    fn default() -> Self {
        Self {
            items: VecDeque::new(),
        }
    }
}

impl<T> WaitingQueue<T> {
    /// A newly submitted sequence.
    pub fn push_back(&mut self, item: T) {
        self.items.push_back(item);
    }

    /// A preempted sequence, which keeps its place ahead of later arrivals.
    pub fn push_front(&mut self, item: T) {
        self.items.push_front(item);
    }

    pub fn front(&self) -> Option<&T> {
        self.items.front()
    }

    pub fn pop_front(&mut self) -> Option<T> {
        self.items.pop_front()
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.items.iter()
    }

    /// Removes and returns the first item matching `predicate`.
    pub fn remove_first(&mut self, predicate: impl FnMut(&T) -> bool) -> Option<T> {
        let position = self.items.iter().position(predicate)?;
        self.items.remove(position)
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Removes and returns every item matching `predicate`, keeping the others' order.
    pub fn extract_if(&mut self, mut predicate: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut kept = VecDeque::with_capacity(self.items.len());
        let mut removed = Vec::new();
        for item in self.items.drain(..) {
            if predicate(&item) {
                removed.push(item);
            } else {
                kept.push_back(item);
            }
        }
        self.items = kept;
        removed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_with_preempted_at_the_front() {
        let mut queue = WaitingQueue::default();
        queue.push_back(1);
        queue.push_back(2);
        queue.push_front(0);
        assert_eq!(queue.len(), 3);
        assert_eq!(queue.pop_front(), Some(0));
        assert_eq!(queue.pop_front(), Some(1));
        assert_eq!(queue.front(), Some(&2));
    }

    #[test]
    fn extract_if_keeps_order_of_the_rest() {
        let mut queue = WaitingQueue::default();
        for i in 0..6 {
            queue.push_back(i);
        }
        assert_eq!(queue.extract_if(|i| i % 2 == 1), vec![1, 3, 5]);
        assert_eq!(queue.pop_front(), Some(0));
        assert_eq!(queue.pop_front(), Some(2));
        assert_eq!(queue.pop_front(), Some(4));
        assert!(queue.is_empty());
    }

    #[test]
    fn remove_first_takes_one_match_from_the_middle() {
        let mut queue = WaitingQueue::default();
        for i in [5, 6, 7, 6] {
            queue.push_back(i);
        }
        assert_eq!(queue.remove_first(|&i| i == 6), Some(6));
        assert_eq!(queue.remove_first(|&i| i == 9), None);
        assert_eq!(queue.iter().copied().collect::<Vec<_>>(), vec![5, 7, 6]);
    }
}
