//! KV-cache memory accounting in the router: the block pool and the radix prefix cache.
//! The shards hold the KV tensors; the router decides which blocks hold what.
pub mod allocator;
pub mod radix;
pub mod radix_bench;

#[cfg(test)]
mod radix_tests;

pub use allocator::{BlockAllocator, KvBlocks, OutOfBlocks};
pub use radix::{PrefixMatch, RadixCache};
