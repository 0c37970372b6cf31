//! The radix prefix cache: a tree of token ids whose nodes hold the KV blocks computed
//! for them, so a request that repeats a known prefix (a system prompt, few-shot
//! examples, the history of a chat including earlier answers) computes only its suffix.
//!
//! Everything is block-aligned: a node covers whole blocks, and a child is found by its
//! first block of tokens. A node holds one reference per block (a [`KvBlocks`]); a
//! request that matched a prefix holds references of its own. "In use" is read from the
//! pool's reference counts, so a request that ends for any reason (finish, disconnect,
//! error) releases its hold through `Drop`, and nothing here needs to be told.
//! Eviction removes least recently used leaves whose blocks nobody else holds, and only
//! when the scheduler asks (the free pool ran short).
use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use super::allocator::{BlockAllocator, KvBlocks};

type NodeId = usize;
const ROOT: NodeId = 0;

/// Children keyed by their first block of token ids.
type Children = HashMap<Box<[u32]>, NodeId, BuildHasherDefault<TokenHasher>>;

#[derive(Debug)]
struct Node {
    parent: NodeId,
    /// Token ids this node adds to its parent's prefix; a multiple of the block size.
    tokens: Vec<u32>,
    /// One block per `block_size` tokens of `tokens`.
    blocks: KvBlocks,
    /// Offset in `tokens` from which the tokens were generated (not prompt) when first
    /// cached; `tokens.len()` when all were prompt. Feeds the generated-hits metric.
    generated_from: usize,
    children: Children,
    /// Logical clock of the last match or insert through this node.
    last_access: u64,
}

/// A cached prefix handed to a request: it holds its own references to the blocks.
#[derive(Debug)]
pub struct PrefixMatch {
    pub blocks: KvBlocks,
    /// Tokens covered: `blocks.len() * block_size`.
    pub tokens: usize,
    /// Of those, how many were generated tokens (an earlier answer) when cached.
    pub generated_tokens: usize,
}

/// The radix tree. Not thread-safe by itself; the scheduler owns it.
#[derive(Debug)]
pub struct RadixCache {
    allocator: BlockAllocator,
    block_size: usize,
    /// Slab of nodes; `None` slots are free and listed in `vacant`.
    nodes: Vec<Option<Node>>,
    vacant: Vec<NodeId>,
    /// Leaves (nodes without children, root excluded) by (last access, id): eviction
    /// order.
    leaves: BTreeSet<(u64, NodeId)>,
    clock: u64,
    cached_blocks: usize,
}

impl RadixCache {
    pub fn new(allocator: BlockAllocator, block_size: u32) -> Self {
        assert!(block_size > 0, "block size must be positive");
        let root = Node {
            parent: ROOT,
            tokens: Vec::new(),
            blocks: allocator.empty(),
            generated_from: 0,
            children: Children::default(),
            last_access: 0,
        };
        Self {
            allocator,
            block_size: block_size as usize,
            nodes: vec![Some(root)],
            vacant: Vec::new(),
            leaves: BTreeSet::new(),
            clock: 0,
            cached_blocks: 0,
        }
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks the tree holds a reference to.
    pub fn cached_blocks(&self) -> usize {
        self.cached_blocks
    }

    /// Blocks only the tree holds (no sequence uses them): evictable at once.
    /// Walks every cached block, so call it once per step, not per sequence.
    pub fn sole_held_blocks(&self) -> usize {
        let ids = self
            .nodes
            .iter()
            .flatten()
            .flat_map(|node| node.blocks.ids());
        self.allocator.count_sole_held(ids)
    }

    fn node(&self, id: NodeId) -> &Node {
        self.nodes[id].as_ref().expect("live node id")
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes[id].as_mut().expect("live node id")
    }

    /// How many whole blocks `a` and `b` share from their start.
    fn common_blocks(&self, a: &[u32], b: &[u32]) -> usize {
        let len = a.len().min(b.len()) / self.block_size * self.block_size;
        // The common case (the whole node matches) is one memcmp.
        if a[..len] == b[..len] {
            return len / self.block_size;
        }
        let first_difference = a[..len]
            .iter()
            .zip(&b[..len])
            .position(|(x, y)| x != y)
            .expect("the slices differ");
        first_difference / self.block_size
    }

    /// Length in tokens of the longest cached prefix of `tokens`, without touching the
    /// tree (no splits, no recency update). For ranking waiting requests.
    pub fn match_len(&self, tokens: &[u32]) -> usize {
        let bs = self.block_size;
        let (mut node, mut pos) = (ROOT, 0);
        while tokens.len() - pos >= bs {
            let Some(&child) = self.node(node).children.get(&tokens[pos..pos + bs]) else {
                break;
            };
            let child_tokens = &self.node(child).tokens;
            let common = self.common_blocks(child_tokens, &tokens[pos..]);
            pos += common * bs;
            if common * bs < child_tokens.len() {
                break;
            }
            node = child;
        }
        pos
    }

    /// The longest cached prefix of `tokens` (whole blocks only), with references the
    /// caller now holds. A partial match splits the node so the match ends on a node
    /// boundary; every node on the path becomes most recently used.
    pub fn match_prefix(&mut self, tokens: &[u32]) -> PrefixMatch {
        let bs = self.block_size;
        self.clock += 1;
        let (mut node, mut pos, mut generated) = (ROOT, 0, 0);
        let mut ids = Vec::with_capacity(tokens.len() / bs);
        while tokens.len() - pos >= bs {
            let Some((child, partial)) = self.descend(node, &tokens[pos..]) else {
                break;
            };
            let matched = self.node(child);
            ids.extend_from_slice(matched.blocks.ids());
            generated += matched.tokens.len() - matched.generated_from;
            pos += matched.tokens.len();
            node = child;
            if partial {
                break;
            }
        }
        PrefixMatch {
            blocks: self.allocator.share(ids),
            tokens: pos,
            generated_tokens: generated,
        }
    }

    /// Caches the whole blocks of `tokens` held in `table` (block k of `table` holds the
    /// KV of tokens `k*bs..(k+1)*bs`). Prefixes already cached keep their blocks; the
    /// rest is shared from `table`. Tokens from `prompt_len` on count as generated.
    /// Returns how many blocks the tree gained.
    pub fn insert(&mut self, tokens: &[u32], table: &KvBlocks, prompt_len: usize) -> usize {
        let bs = self.block_size;
        let num_blocks = (tokens.len() / bs).min(table.len());
        let tokens = &tokens[..num_blocks * bs];
        self.clock += 1;
        let (mut node, mut pos) = (ROOT, 0);
        while pos < tokens.len() {
            let Some((child, _)) = self.descend(node, &tokens[pos..]) else {
                let blocks = table.share_range(pos / bs, num_blocks);
                let generated_from = prompt_len.saturating_sub(pos).min(tokens.len() - pos);
                self.add_child(node, tokens[pos..].to_vec(), blocks, generated_from);
                return num_blocks - pos / bs;
            };
            pos += self.node(child).tokens.len();
            node = child;
        }
        0
    }

    /// One step down from `node` along `rest` (at least one whole block): the child that
    /// shares `rest`'s first block, split so that it holds only the shared whole blocks,
    /// and marked most recently used; with whether it was split (the match ends there).
    /// `None` when no child starts with that block.
    fn descend(&mut self, node: NodeId, rest: &[u32]) -> Option<(NodeId, bool)> {
        let bs = self.block_size;
        let &child = self.node(node).children.get(&rest[..bs])?;
        let node_len = self.node(child).tokens.len();
        let common = self.common_blocks(&self.node(child).tokens, rest);
        let partial = common * bs < node_len;
        let child = if partial {
            self.split(child, common)
        } else {
            child
        };
        self.touch(child);
        Some((child, partial))
    }

    /// Frees at least `wanted` blocks if it can, dropping least recently used leaves
    /// whose blocks only the tree holds (a parent left childless becomes a candidate in
    /// turn). Returns the blocks actually returned to the pool.
    pub fn evict(&mut self, wanted: usize) -> usize {
        let mut freed = 0;
        let mut skipped = Vec::new();
        while freed < wanted {
            let Some(&(stamp, leaf)) = self.leaves.first() else {
                break;
            };
            self.leaves.remove(&(stamp, leaf));
            if self.allocator.any_shared(self.node(leaf).blocks.ids()) {
                skipped.push((stamp, leaf)); // a request holds it; not evictable
                continue;
            }
            freed += self.remove_leaf(leaf);
        }
        self.leaves.extend(skipped);
        freed
    }

    /// Drops every node (the shards' KV can no longer be trusted). Requests keep the
    /// blocks they hold.
    pub fn clear(&mut self) {
        let allocator = self.allocator.clone();
        let block_size = self.block_size as u32;
        *self = Self::new(allocator, block_size);
    }

    fn remove_leaf(&mut self, leaf: NodeId) -> usize {
        let node = self.nodes[leaf].take().expect("live leaf");
        self.vacant.push(leaf);
        let key = &node.tokens[..self.block_size];
        let parent = self.node_mut(node.parent);
        parent.children.remove(key);
        let parent_became_leaf = parent.children.is_empty() && node.parent != ROOT;
        let parent_stamp = parent.last_access;
        if parent_became_leaf {
            self.leaves.insert((parent_stamp, node.parent));
        }
        self.cached_blocks -= node.blocks.len();
        node.blocks.len() // dropping `node` releases the tree's references
    }

    fn allocate_node(&mut self, node: Node) -> NodeId {
        match self.vacant.pop() {
            Some(id) => {
                self.nodes[id] = Some(node);
                id
            }
            None => {
                self.nodes.push(Some(node));
                self.nodes.len() - 1
            }
        }
    }

    fn add_child(
        &mut self,
        parent: NodeId,
        tokens: Vec<u32>,
        blocks: KvBlocks,
        generated_from: usize,
    ) {
        let key: Box<[u32]> = tokens[..self.block_size].into();
        self.cached_blocks += blocks.len();
        let stamp = self.clock;
        let id = self.allocate_node(Node {
            parent,
            tokens,
            blocks,
            generated_from,
            children: Children::default(),
            last_access: stamp,
        });
        let parent_node = self.node_mut(parent);
        let parent_was_leaf = parent_node.children.is_empty() && parent != ROOT;
        let parent_stamp = parent_node.last_access;
        parent_node.children.insert(key, id);
        if parent_was_leaf {
            self.leaves.remove(&(parent_stamp, parent));
        }
        self.leaves.insert((stamp, id));
    }

    /// Splits `id` after its first `at` blocks (0 < at < its blocks): a new upper node
    /// takes those, `id` keeps the rest as its only child. Returns the upper node.
    fn split(&mut self, id: NodeId, at: usize) -> NodeId {
        let bs = self.block_size;
        let node = self.node_mut(id);
        debug_assert!(at > 0 && at * bs < node.tokens.len());
        let lower_tokens = node.tokens.split_off(at * bs);
        let upper_tokens = std::mem::replace(&mut node.tokens, lower_tokens);
        let lower_blocks = node.blocks.split_off(at);
        let upper_blocks = std::mem::replace(&mut node.blocks, lower_blocks);
        let upper_generated = node.generated_from.min(at * bs);
        node.generated_from = node.generated_from.saturating_sub(at * bs);
        let (parent, stamp) = (node.parent, node.last_access);
        let lower_key: Box<[u32]> = node.tokens[..bs].into();
        let mut children = Children::default();
        children.insert(lower_key, id);
        let upper_key: Box<[u32]> = upper_tokens[..bs].into();
        let upper = self.allocate_node(Node {
            parent,
            tokens: upper_tokens,
            blocks: upper_blocks,
            generated_from: upper_generated,
            children,
            last_access: stamp,
        });
        self.node_mut(id).parent = upper;
        self.node_mut(parent).children.insert(upper_key, upper);
        upper
    }

    /// Marks `id` most recently used, keeping the leaf order in step.
    fn touch(&mut self, id: NodeId) {
        let stamp = self.clock;
        let node = self.node_mut(id);
        let (old, is_leaf) = (node.last_access, node.children.is_empty());
        node.last_access = stamp;
        if is_leaf && self.leaves.remove(&(old, id)) {
            self.leaves.insert((stamp, id));
        }
    }

    /// Every cached block with the token prefix it completes (tests compare this with a
    /// reference model).
    pub fn entries(&self) -> Vec<(Vec<u32>, u32)> {
        let mut out = Vec::new();
        let mut stack = vec![(ROOT, Vec::new())];
        while let Some((id, prefix)) = stack.pop() {
            let node = self.node(id);
            let mut path = prefix;
            for (chunk, &block) in node.tokens.chunks(self.block_size).zip(node.blocks.ids()) {
                path.extend_from_slice(chunk);
                out.push((path.clone(), block));
            }
            for &child in node.children.values() {
                stack.push((child, path.clone()));
            }
        }
        out
    }

    /// Checks the tree's internal bookkeeping; panics with what is wrong.
    pub fn check_invariants(&self) {
        let bs = self.block_size;
        let mut blocks = 0;
        let mut leaves = BTreeSet::new();
        for (id, node) in self.nodes.iter().enumerate() {
            let Some(node) = node else { continue };
            if id == ROOT {
                assert!(node.tokens.is_empty() && node.blocks.is_empty());
            } else {
                assert!(
                    !node.tokens.is_empty() && node.tokens.len() % bs == 0,
                    "node {id} not block-aligned"
                );
                assert_eq!(
                    node.blocks.len() * bs,
                    node.tokens.len(),
                    "node {id} blocks"
                );
                assert!(node.generated_from <= node.tokens.len());
                let parent = self.node(node.parent);
                assert_eq!(
                    parent.children.get(&node.tokens[..bs]),
                    Some(&id),
                    "node {id} parent link"
                );
                assert!(parent.last_access >= node.last_access || node.parent == ROOT);
                if node.children.is_empty() {
                    leaves.insert((node.last_access, id));
                }
            }
            for (key, &child) in &node.children {
                assert_eq!(self.node(child).parent, id);
                assert_eq!(&key[..], &self.node(child).tokens[..bs]);
            }
            blocks += node.blocks.len();
            assert!(node
                .blocks
                .ids()
                .iter()
                .all(|&b| self.allocator.ref_count(b) > 0));
        }
        assert_eq!(blocks, self.cached_blocks, "cached block count");
        assert_eq!(leaves, self.leaves, "leaf index");
    }
}

/// FxHash-style multiply-rotate hasher over token ids: child lookups hash one block
/// per node on the hot path, where SipHash's DoS resistance buys nothing (keys are
/// token ids the router produced, and a collision costs a comparison, not safety).
#[derive(Default)]
struct TokenHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl TokenHasher {
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for TokenHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            self.add(u64::from_le_bytes(chunk.try_into().expect("8 bytes")));
        }
        for &byte in chunks.remainder() {
            self.add(u64::from(byte));
        }
    }

    fn write_u32(&mut self, value: u32) {
        self.add(u64::from(value));
    }

    fn write_usize(&mut self, value: usize) {
        self.add(value as u64);
    }

    fn finish(&self) -> u64 {
        self.hash
    }
}
