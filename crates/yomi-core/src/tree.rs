//! The batch topology of one forward pass (DESIGN §3).
//!
//! A pass takes T rows in a topological order (every parent before its children; drafters emit
//! depth-first preorder, references may use breadth-first). Row i has a `parent` (−1 = child of
//! the last committed token) and a `depth` (0 for the root). A prefill chunk or a decode step is
//! a chain (parent = i − 1), where j is an ancestor-or-self of i iff j ≤ i; other trees keep one
//! ancestor bit-row per row, so the mask test is one load in either case. The position of row i
//! is `committed + depth[i]`.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeBatch {
    parent: Vec<i32>,
    depth: Vec<u32>,
    /// Non-chains only: row i's ancestors-or-self as bits, `words` u64 per row.
    anc: Vec<u64>,
    words: usize,
    is_chain: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TreeError {
    Empty,
    ParentNotBefore { row: usize, parent: i32 },
    MultipleRoots { row: usize },
    BadAcceptedPath(String),
}

impl fmt::Display for TreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TreeError::Empty => write!(f, "a tree batch needs at least one row"),
            TreeError::ParentNotBefore { row, parent } => {
                write!(
                    f,
                    "tree row {row} has parent {parent}, which does not come before it"
                )
            }
            TreeError::MultipleRoots { row } => {
                write!(
                    f,
                    "tree row {row} is a second root; a draft tree has one root"
                )
            }
            TreeError::BadAcceptedPath(s) => write!(f, "invalid accepted path: {s}"),
        }
    }
}

impl std::error::Error for TreeError {}

impl TreeBatch {
    /// A chain of `t` rows: row i's parent is i − 1 (prefill chunks and plain decode).
    pub fn chain(t: usize) -> Self {
        let mut tb = TreeBatch {
            parent: Vec::with_capacity(t),
            depth: Vec::with_capacity(t),
            anc: Vec::new(),
            words: 0,
            is_chain: true,
        };
        tb.set_chain(t);
        tb
    }

    /// Reuses this batch's buffers for a chain of `t` rows (no allocation once grown).
    pub fn set_chain(&mut self, t: usize) {
        self.parent.clear();
        self.depth.clear();
        self.anc.clear();
        self.words = 0;
        for i in 0..t {
            self.parent.push(i as i32 - 1);
            self.depth.push(i as u32);
        }
        self.is_chain = true;
    }

    /// Makes this batch a copy of `other`, reusing its buffers (no allocation once grown).
    pub fn copy_from(&mut self, other: &TreeBatch) {
        self.parent.clear();
        self.parent.extend_from_slice(&other.parent);
        self.depth.clear();
        self.depth.extend_from_slice(&other.depth);
        self.anc.clear();
        self.anc.extend_from_slice(&other.anc);
        self.words = other.words;
        self.is_chain = other.is_chain;
    }

    /// Builds a tree from parent indices in a topological order: exactly one root (row 0), and
    /// every parent before its child.
    pub fn from_parents(parents: &[i32]) -> Result<Self, TreeError> {
        let mut tb = TreeBatch::chain(0);
        tb.set_parents(parents)?;
        Ok(tb)
    }

    /// Rebuilds this batch from parent indices (same rules as [`TreeBatch::from_parents`]),
    /// reusing its buffers: no allocation once they have grown. On error the batch is left
    /// as an empty chain.
    pub fn set_parents(&mut self, parents: &[i32]) -> Result<(), TreeError> {
        self.set_chain(0);
        if parents.is_empty() {
            return Err(TreeError::Empty);
        }
        let t = parents.len();
        for (i, &p) in parents.iter().enumerate() {
            if p >= i as i32 || p < -1 {
                self.set_chain(0);
                return Err(TreeError::ParentNotBefore { row: i, parent: p });
            }
            let d = if p == -1 {
                if i != 0 {
                    self.set_chain(0);
                    return Err(TreeError::MultipleRoots { row: i });
                }
                0
            } else {
                self.depth[p as usize] + 1
            };
            self.depth.push(d);
            self.parent.push(p);
        }
        self.is_chain = parents.iter().enumerate().all(|(i, &p)| p == i as i32 - 1);
        if !self.is_chain {
            let words = t.div_ceil(64);
            self.words = words;
            self.anc.resize(t * words, 0);
            for (i, &p) in parents.iter().enumerate() {
                if p >= 0 {
                    let p = p as usize;
                    let (before, after) = self.anc.split_at_mut(i * words);
                    after[..words].copy_from_slice(&before[p * words..(p + 1) * words]);
                }
                self.anc[i * words + i / 64] |= 1u64 << (i % 64);
            }
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.parent.len()
    }

    pub fn is_empty(&self) -> bool {
        self.parent.is_empty()
    }

    /// True when every row's parent is the row before it.
    pub fn is_chain(&self) -> bool {
        self.is_chain
    }

    pub fn parent(&self, i: usize) -> i32 {
        self.parent[i]
    }

    pub fn parents(&self) -> &[i32] {
        &self.parent
    }

    pub fn depth(&self, i: usize) -> u32 {
        self.depth[i]
    }

    /// Row j is an ancestor of row i, or i itself.
    #[inline]
    pub fn is_ancestor_or_self(&self, j: usize, i: usize) -> bool {
        if self.is_chain {
            j <= i
        } else {
            j <= i && (self.anc[i * self.words + j / 64] >> (j % 64)) & 1 == 1
        }
    }

    /// The rows from the root down to `i`, inclusive.
    pub fn path_to(&self, i: usize) -> Vec<usize> {
        let mut path = Vec::with_capacity(self.depth[i] as usize + 1);
        let mut j = i as i32;
        while j >= 0 {
            path.push(j as usize);
            j = self.parent[j as usize];
        }
        path.reverse();
        path
    }

    /// Checks that `accepted` is a root-anchored parent chain of this tree (what `commit`
    /// takes): it starts at a root, and each row's parent is the row before it.
    pub fn check_accepted(&self, accepted: &[usize]) -> Result<(), TreeError> {
        let mut prev: i32 = -1;
        for (k, &a) in accepted.iter().enumerate() {
            if a >= self.len() {
                return Err(TreeError::BadAcceptedPath(format!(
                    "row {a} is outside the tree of {} rows",
                    self.len()
                )));
            }
            if self.parent[a] != prev {
                return Err(TreeError::BadAcceptedPath(format!(
                    "step {k}: row {a} has parent {}, expected {prev}",
                    self.parent[a]
                )));
            }
            prev = a as i32;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_is_its_own_ancestry() {
        let t = TreeBatch::chain(5);
        assert!(t.is_chain());
        for i in 0..5 {
            for j in 0..5 {
                assert_eq!(t.is_ancestor_or_self(j, i), j <= i);
            }
            assert_eq!(t.depth(i), i as u32);
        }
        assert!(t.check_accepted(&[0, 1, 2]).is_ok());
        assert!(t.check_accepted(&[0, 2]).is_err());
        assert!(t.check_accepted(&[1]).is_err());
    }

    #[test]
    fn tree_from_parents_matches_walks() {
        // The qwen35-tiny fixture's tree.
        let parents = [-1, 0, 0, 1, 1, 2, 3, 3, 4, 5, 6, 7, 9, 12, 12, 11];
        let t = TreeBatch::from_parents(&parents).unwrap();
        assert!(!t.is_chain());
        for i in 0..parents.len() {
            let path = t.path_to(i);
            for j in 0..parents.len() {
                assert_eq!(
                    t.is_ancestor_or_self(j, i),
                    path.contains(&j),
                    "j={j} i={i}"
                );
            }
            assert_eq!(t.depth(i) as usize + 1, path.len());
            assert!(t.check_accepted(&path).is_ok());
        }
    }

    #[test]
    fn rejects_bad_trees() {
        assert_eq!(TreeBatch::from_parents(&[]), Err(TreeError::Empty));
        assert!(matches!(
            TreeBatch::from_parents(&[-1, 1]),
            Err(TreeError::ParentNotBefore { .. })
        ));
        assert!(matches!(
            TreeBatch::from_parents(&[-1, -1]),
            Err(TreeError::MultipleRoots { .. })
        ));
        // Breadth-first order is a valid topological order.
        assert!(TreeBatch::from_parents(&[-1, 0, 0, 1]).is_ok());
    }
}
