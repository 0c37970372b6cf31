//! KV-cache memory accounting in the router: the block pool and (later) the radix
//! prefix cache. The shards hold the KV tensors; the router decides which blocks hold what.
pub mod allocator;

pub use allocator::{BlockAllocator, KvBlocks, OutOfBlocks};
