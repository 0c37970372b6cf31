//! The KV block pool. Block ids live in `[0, num_blocks)`; a block is free when no
//! `KvBlocks` references it. Blocks are reference-counted so the radix prefix cache can
//! share a cached prefix between requests; `Drop` returns a block once its last holder
//! lets go, so a request frees its KV however it ends.
use std::sync::{Arc, Mutex, MutexGuard};

/// Not enough free blocks for an all-or-nothing request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("KV pool exhausted: {requested} blocks requested, {free} free")]
pub struct OutOfBlocks {
    pub requested: usize,
    pub free: usize,
}

#[derive(Debug)]
struct Pool {
    /// Free block ids; popped from the end.
    free: Vec<u32>,
    /// Holders per block id; 0 means free.
    ref_counts: Vec<u32>,
}

impl Pool {
    fn retain(&mut self, id: u32) {
        let count = &mut self.ref_counts[id as usize];
        assert!(*count > 0, "retaining free KV block {id}");
        *count += 1;
    }

    fn release(&mut self, id: u32) {
        let count = &mut self.ref_counts[id as usize];
        assert!(*count > 0, "double free of KV block {id}");
        *count -= 1;
        if *count == 0 {
            self.free.push(id);
        }
    }
}

/// Handle to the shared pool. Cheap to clone; every clone sees the same blocks.
#[derive(Debug, Clone)]
pub struct BlockAllocator {
    pool: Arc<Mutex<Pool>>,
    total: u32,
}

impl BlockAllocator {
    pub fn new(num_blocks: u32) -> Self {
        // Reversed so that blocks are handed out in ascending order (easier to read in logs).
        let free = (0..num_blocks).rev().collect();
        let pool = Pool {
            free,
            ref_counts: vec![0; num_blocks as usize],
        };
        Self {
            pool: Arc::new(Mutex::new(pool)),
            total: num_blocks,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Pool> {
        // A panic elsewhere cannot leave the pool half-updated (each method mutates
        // it in one step), so a poisoned lock is still safe to use.
        self.pool
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn total(&self) -> u32 {
        self.total
    }

    pub fn free(&self) -> u32 {
        self.lock().free.len() as u32
    }

    pub fn used(&self) -> u32 {
        self.total - self.free()
    }

    /// An empty table tied to this pool; grow it with [`KvBlocks::grow`].
    pub fn empty(&self) -> KvBlocks {
        KvBlocks {
            allocator: self.clone(),
            ids: Vec::new(),
        }
    }

    /// `count` fresh blocks, or none at all if fewer are free.
    pub fn allocate(&self, count: usize) -> Result<KvBlocks, OutOfBlocks> {
        let mut blocks = self.empty();
        blocks.grow(count)?;
        Ok(blocks)
    }

    /// How many holders a block has (0 = free). For tests and the radix cache.
    pub fn ref_count(&self, id: u32) -> u32 {
        self.lock().ref_counts[id as usize]
    }

    /// Whether any of `ids` has a holder besides the one asking (ref count above 1).
    pub fn any_shared(&self, ids: &[u32]) -> bool {
        let pool = self.lock();
        ids.iter().any(|&id| pool.ref_counts[id as usize] > 1)
    }

    /// How many of `ids` have exactly one holder, in one lock (the radix cache asks which
    /// of its blocks nobody else holds).
    pub fn count_sole_held<'a>(&self, ids: impl IntoIterator<Item = &'a u32>) -> usize {
        let pool = self.lock();
        ids.into_iter()
            .filter(|&&id| pool.ref_counts[id as usize] == 1)
            .count()
    }

    /// A new holder of blocks someone already holds (a cached prefix gathered from
    /// several radix nodes), in one lock. Panics on a free block: sharing one would
    /// hand out memory the pool may give to someone else.
    pub fn share(&self, ids: Vec<u32>) -> KvBlocks {
        let mut pool = self.lock();
        for &id in &ids {
            pool.retain(id);
        }
        KvBlocks {
            allocator: self.clone(),
            ids,
        }
    }
}

/// An ordered list of blocks held by one owner (a sequence's block table, or a radix
/// cache node). Each listed block counts one reference; dropping releases them all.
#[derive(Debug)]
pub struct KvBlocks {
    allocator: BlockAllocator,
    ids: Vec<u32>,
}

impl KvBlocks {
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Appends `count` fresh blocks, all or nothing.
    pub fn grow(&mut self, count: usize) -> Result<(), OutOfBlocks> {
        let mut pool = self.allocator.lock();
        let free = pool.free.len();
        if count > free {
            return Err(OutOfBlocks {
                requested: count,
                free,
            });
        }
        for _ in 0..count {
            let id = pool.free.pop().expect("free list length checked above");
            pool.ref_counts[id as usize] = 1;
            self.ids.push(id);
        }
        Ok(())
    }

    /// A new holder of the first `count` blocks (a cached prefix), sharing them.
    pub fn share_prefix(&self, count: usize) -> KvBlocks {
        self.share_range(0, count)
    }

    /// A new holder of blocks `start..end` (clamped to the table), sharing them.
    pub fn share_range(&self, start: usize, end: usize) -> KvBlocks {
        let end = end.min(self.ids.len());
        let start = start.min(end);
        self.allocator.share(self.ids[start..end].to_vec())
    }

    /// Moves the blocks from `at` on into a new holder; references move, none are added.
    pub fn split_off(&mut self, at: usize) -> KvBlocks {
        let at = at.min(self.ids.len());
        KvBlocks {
            allocator: self.allocator.clone(),
            ids: self.ids.split_off(at),
        }
    }

    /// Appends `other`'s blocks to this table, taking over its references.
    pub fn append(&mut self, mut other: KvBlocks) {
        assert!(
            Arc::ptr_eq(&self.allocator.pool, &other.allocator.pool),
            "KV blocks from different pools"
        );
        self.ids.append(&mut other.ids);
    }

    /// Releases the blocks past the first `len`.
    pub fn truncate(&mut self, len: usize) {
        if len >= self.ids.len() {
            return;
        }
        let mut pool = self.allocator.lock();
        for id in self.ids.drain(len..) {
            pool.release(id);
        }
    }
}

impl Clone for KvBlocks {
    fn clone(&self) -> Self {
        self.share_prefix(self.ids.len())
    }
}

impl Drop for KvBlocks {
    fn drop(&mut self) {
        self.truncate(0);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn blocks_return_to_the_pool_on_drop() {
        let pool = BlockAllocator::new(4);
        let blocks = pool.allocate(3).unwrap();
        assert_eq!(blocks.ids(), &[0, 1, 2]);
        assert_eq!((pool.used(), pool.free()), (3, 1));
        assert_eq!(
            pool.allocate(2).unwrap_err(),
            OutOfBlocks {
                requested: 2,
                free: 1
            }
        );
        drop(blocks);
        assert_eq!((pool.used(), pool.free()), (0, 4));
    }

    #[test]
    fn shared_blocks_stay_used_until_the_last_holder_drops() {
        let pool = BlockAllocator::new(4);
        let mut request = pool.allocate(3).unwrap();
        let cached = request.share_prefix(2);
        assert_eq!(pool.ref_count(0), 2);
        assert_eq!(pool.ref_count(2), 1);
        request.truncate(1);
        assert_eq!(pool.used(), 2, "block 1 is still cached, block 2 is free");
        drop(request);
        assert_eq!(pool.used(), 2);
        drop(cached);
        assert_eq!(pool.used(), 0);
    }

    #[test]
    fn grow_is_all_or_nothing() {
        let pool = BlockAllocator::new(3);
        let mut blocks = pool.allocate(2).unwrap();
        assert!(blocks.grow(2).is_err());
        assert_eq!(blocks.len(), 2);
        blocks.grow(1).unwrap();
        assert_eq!(pool.free(), 0);
    }

    #[test]
    fn append_moves_references_without_counting_twice() {
        let pool = BlockAllocator::new(4);
        let mut table = pool.allocate(1).unwrap();
        table.append(pool.allocate(2).unwrap());
        assert_eq!(table.ids().len(), 3);
        assert!(table.ids().iter().all(|&id| pool.ref_count(id) == 1));
        drop(table);
        assert_eq!(pool.free(), 4);
    }

    #[test]
    fn split_off_moves_references_and_share_range_adds_them() {
        let pool = BlockAllocator::new(6);
        let mut head = pool.allocate(5).unwrap();
        let tail = head.split_off(3);
        assert_eq!((head.ids(), tail.ids()), (&[0, 1, 2][..], &[3, 4][..]));
        assert!((0..5).all(|id| pool.ref_count(id) == 1));
        let middle = head.share_range(1, 9);
        assert_eq!(middle.ids(), &[1, 2]);
        assert!(pool.any_shared(&[0, 1]) && !pool.any_shared(&[0, 3]));
        drop(head);
        assert_eq!(pool.used(), 4, "blocks 1 and 2 live on in `middle`");
        drop((middle, tail));
        assert_eq!(pool.free(), 6);
    }

    #[test]
    #[should_panic(expected = "retaining free KV block")]
    fn sharing_a_free_block_is_refused() {
        let pool = BlockAllocator::new(2);
        let _ = pool.share(vec![1]);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Allocate(usize),
        Grow(usize, usize),
        Share(usize, usize),
        Clone(usize),
        Truncate(usize, usize),
        Drop(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..6usize).prop_map(Op::Allocate),
            (0..8usize, 0..4usize).prop_map(|(h, n)| Op::Grow(h, n)),
            (0..8usize, 0..6usize).prop_map(|(h, n)| Op::Share(h, n)),
            (0..8usize).prop_map(Op::Clone),
            (0..8usize, 0..6usize).prop_map(|(h, n)| Op::Truncate(h, n)),
            (0..8usize).prop_map(Op::Drop),
        ]
    }

    /// Every block's reference count equals how many holders list it, and the pool's
    /// used count equals the distinct blocks held.
    fn check(pool: &BlockAllocator, holders: &[KvBlocks]) {
        let mut counts: HashMap<u32, u32> = HashMap::new();
        for holder in holders {
            for &id in holder.ids() {
                *counts.entry(id).or_default() += 1;
            }
        }
        for id in 0..pool.total() {
            assert_eq!(
                pool.ref_count(id),
                counts.get(&id).copied().unwrap_or(0),
                "block {id}"
            );
        }
        assert_eq!(pool.used() as usize, counts.len());
        assert_eq!(pool.used() + pool.free(), pool.total());
    }

    proptest! {
        #[test]
        fn random_interleavings_never_leak_or_double_free(
            total in 1u32..24,
            ops in proptest::collection::vec(op(), 1..80),
        ) {
            let pool = BlockAllocator::new(total);
            let mut holders: Vec<KvBlocks> = Vec::new();
            for op in ops {
                let pick = |h: usize, holders: &Vec<KvBlocks>| (!holders.is_empty()).then(|| h % holders.len());
                match op {
                    Op::Allocate(n) => {
                        let free = pool.free() as usize;
                        match pool.allocate(n) {
                            Ok(blocks) => {
                                prop_assert!(n <= free);
                                // Fresh blocks are held by nobody else.
                                for &id in blocks.ids() {
                                    prop_assert!(holders.iter().all(|h| !h.ids().contains(&id)));
                                }
                                holders.push(blocks);
                            }
                            Err(error) => prop_assert!(n > free && error.free == free),
                        }
                    }
                    Op::Grow(h, n) => if let Some(i) = pick(h, &holders) {
                        let before = holders[i].len();
                        let grown = holders[i].grow(n).is_ok();
                        prop_assert_eq!(holders[i].len(), if grown { before + n } else { before });
                    },
                    Op::Share(h, n) => if let Some(i) = pick(h, &holders) {
                        let shared = holders[i].share_prefix(n);
                        holders.push(shared);
                    },
                    Op::Clone(h) => if let Some(i) = pick(h, &holders) {
                        let copy = holders[i].clone();
                        holders.push(copy);
                    },
                    Op::Truncate(h, n) => if let Some(i) = pick(h, &holders) {
                        holders[i].truncate(n);
                    },
                    Op::Drop(h) => if let Some(i) = pick(h, &holders) {
                        holders.swap_remove(i);
                    },
                }
                check(&pool, &holders);
            }
            holders.clear();
            prop_assert_eq!(pool.free(), total);
        }
    }
}
