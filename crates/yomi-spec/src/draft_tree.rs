//! The drafter's output: tokens with parent pointers, row 0 the root, depth-first preorder.

use yomi_core::TreeBatch;
use yomi_core::tree::TreeError;

/// A draft tree: row 0 is the root (the pending token), every other row a draft token whose
/// parent comes before it. Drafters write rows in depth-first preorder with unique tokens among
/// siblings ([`check`](Self::check) tests both). Buffers are reused from round to round.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DraftTree {
    tokens: Vec<u32>,
    parents: Vec<i32>,
    depths: Vec<u32>,
    /// Scratch of [`trim`](Self::trim): old row → new row (−1 = dropped).
    remap: Vec<i32>,
}

impl DraftTree {
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty tree with room for `rows` rows.
    pub fn with_capacity(rows: usize) -> Self {
        DraftTree {
            tokens: Vec::with_capacity(rows),
            parents: Vec::with_capacity(rows),
            depths: Vec::with_capacity(rows),
            remap: Vec::with_capacity(rows),
        }
    }

    /// Makes this the root-only tree of `root`.
    pub fn reset(&mut self, root: u32) {
        self.tokens.clear();
        self.parents.clear();
        self.depths.clear();
        self.tokens.push(root);
        self.parents.push(-1);
        self.depths.push(0);
    }

    /// Appends a draft token as a child of row `parent` and returns its row. Keeping depth-first
    /// preorder and unique siblings is the caller's job.
    pub fn push(&mut self, parent: usize, token: u32) -> usize {
        assert!(
            parent < self.tokens.len(),
            "draft row parent {parent} does not exist yet"
        );
        let row = self.tokens.len();
        self.tokens.push(token);
        self.parents.push(parent as i32);
        self.depths.push(self.depths[parent] + 1);
        row
    }

    /// Rows, the root included.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Draft rows (the root excluded).
    pub fn num_drafts(&self) -> usize {
        self.tokens.len().saturating_sub(1)
    }

    pub fn root(&self) -> Option<u32> {
        self.tokens.first().copied()
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Parent rows; −1 for the root.
    pub fn parents(&self) -> &[i32] {
        &self.parents
    }

    pub fn depth(&self, row: usize) -> u32 {
        self.depths[row]
    }

    /// The depth of the deepest row (0 for a root-only tree).
    pub fn max_depth(&self) -> u32 {
        self.depths.iter().copied().max().unwrap_or(0)
    }

    /// True when every row's parent is the row before it.
    pub fn is_chain(&self) -> bool {
        self.parents
            .iter()
            .enumerate()
            .all(|(i, &p)| p == i as i32 - 1)
    }

    /// Keeps the rows of depth ≤ `max_depth`, then the first `max_drafts` draft rows of what is
    /// left (a prefix of a preorder is still a tree in preorder). Parents are renumbered.
    pub fn trim(&mut self, max_drafts: usize, max_depth: u32) {
        if self.tokens.is_empty() {
            return;
        }
        if self.num_drafts() <= max_drafts && self.max_depth() <= max_depth {
            return;
        }
        self.remap.clear();
        let mut kept = 0usize;
        for i in 0..self.tokens.len() {
            let p = self.parents[i];
            let keep = i == 0
                || (kept <= max_drafts
                    && self.depths[i] <= max_depth
                    && self.remap[p as usize] >= 0);
            if keep {
                self.tokens[kept] = self.tokens[i];
                self.parents[kept] = if p < 0 { -1 } else { self.remap[p as usize] };
                self.depths[kept] = self.depths[i];
                self.remap.push(kept as i32);
                kept += 1;
            } else {
                self.remap.push(-1);
            }
        }
        self.tokens.truncate(kept);
        self.parents.truncate(kept);
        self.depths.truncate(kept);
    }

    /// Checks the drafter contract: one root at row 0, parents before children, depth-first
    /// preorder (each row's parent is on the path to the row before it), unique sibling tokens.
    pub fn check(&self) -> Result<(), String> {
        if self.tokens.is_empty() {
            return Err("a draft tree needs a root".into());
        }
        if self.parents[0] != -1 {
            return Err(format!("row 0 has parent {}, not −1", self.parents[0]));
        }
        // `path` is the root-to-previous-row path: a preorder row hangs off one of its rows.
        let mut path: Vec<usize> = vec![0];
        for i in 1..self.tokens.len() {
            let p = self.parents[i];
            if p < 0 || p as usize >= i {
                return Err(format!(
                    "row {i} has parent {p}, which does not come before it"
                ));
            }
            let p = p as usize;
            while path.last().is_some_and(|&top| top != p) {
                path.pop();
            }
            if path.is_empty() {
                return Err(format!("row {i} (parent {p}) breaks depth-first preorder"));
            }
            if self.depths[i] != self.depths[p] + 1 {
                return Err(format!("row {i} has a wrong depth"));
            }
            if (1..i).any(|j| self.parents[j] == p as i32 && self.tokens[j] == self.tokens[i]) {
                return Err(format!(
                    "row {i}: token {} repeats a sibling's",
                    self.tokens[i]
                ));
            }
            path.push(i);
        }
        Ok(())
    }

    /// Writes this tree's topology into `tb`. Chains (the common case) reuse `tb`'s buffers;
    /// a branching tree is rebuilt.
    pub fn to_batch(&self, tb: &mut TreeBatch) -> Result<(), TreeError> {
        if self.is_chain() {
            tb.set_chain(self.tokens.len());
        } else {
            tb.set_parents(&self.parents)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> DraftTree {
        // Rows (tokens): 0 (100) → 1 (1) → 2 (2) → 3 (3); 1 → 4 (4); 0 → 5 (5) → 6 (6).
        let mut t = DraftTree::new();
        t.reset(100);
        let a = t.push(0, 1);
        let b = t.push(a, 2);
        t.push(b, 3);
        t.push(a, 4);
        let c = t.push(0, 5);
        t.push(c, 6);
        t
    }

    #[test]
    fn builds_and_checks() {
        let t = sample();
        assert_eq!(t.len(), 7);
        assert_eq!(t.num_drafts(), 6);
        assert_eq!(t.parents(), &[-1, 0, 1, 2, 1, 0, 5]);
        assert_eq!(t.max_depth(), 3);
        assert!(!t.is_chain());
        t.check().unwrap();
        let mut tb = TreeBatch::chain(0);
        t.to_batch(&mut tb).unwrap();
        assert_eq!(tb.parents(), t.parents());
        assert_eq!(tb.depth(3), 3);
    }

    #[test]
    fn check_rejects_bad_trees() {
        let mut t = DraftTree::new();
        t.reset(1);
        t.push(0, 5);
        t.push(0, 5);
        assert!(t.check().unwrap_err().contains("sibling"));
        // Not preorder: row 3 hangs off row 1 after row 2 started another branch of the root.
        let mut t = DraftTree::new();
        t.reset(1);
        t.push(0, 2);
        t.push(0, 3);
        t.push(1, 4);
        assert!(t.check().unwrap_err().contains("preorder"));
    }

    #[test]
    fn trim_by_depth_and_count() {
        let mut t = sample();
        t.trim(10, 1);
        assert_eq!(t.tokens(), &[100, 1, 5]);
        assert_eq!(t.parents(), &[-1, 0, 0]);
        t.check().unwrap();

        let mut t = sample();
        t.trim(4, 10);
        assert_eq!(t.tokens(), &[100, 1, 2, 3, 4]);
        assert_eq!(t.parents(), &[-1, 0, 1, 2, 1]);
        t.check().unwrap();

        let mut t = sample();
        t.trim(3, 2);
        assert_eq!(t.tokens(), &[100, 1, 2, 4]);
        assert_eq!(t.parents(), &[-1, 0, 1, 1]);
        t.check().unwrap();

        let mut t = sample();
        t.trim(0, 5);
        assert_eq!(t.tokens(), &[100]);
        let mut chain = DraftTree::new();
        chain.reset(1);
        for i in 0..5 {
            chain.push(i, 10 + i as u32);
        }
        assert!(chain.is_chain());
        chain.trim(16, 2);
        assert_eq!(chain.tokens(), &[1, 10, 11]);
        let mut tb = TreeBatch::chain(0);
        chain.to_batch(&mut tb).unwrap();
        assert!(tb.is_chain() && tb.len() == 3);
    }
}
