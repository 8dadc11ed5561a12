//! Substitution memory of the suffix drafter: the edits the target makes to text it copies.
//!
//! A rename, a changed keyword, a reformatted line ending: where the target rewrites the text
//! it copies, it tends to make the same replacement again (`config` → `settings` at every use).
//! A plain suffix drafter pays for every one of them three times: the draft that still says
//! `config` is rejected, then the context ends in `settings`, which the source never had, so
//! nothing matches for a pass or two, then the match is short and drafts are few.
//!
//! The memory keeps, per source token X, one rule X → Y learned where the target wrote Y at a
//! rejected draft X, with its hits (the target wrote Y where the source had X) and misses (it
//! kept X, or wrote something else). A rule is **active** from its second hit while its
//! estimate p = hits / (hits + misses + 1) is at least ½ (one edit is as often a one-off as
//! the first of a series: activating rules on their first hit made the drafter slower on
//! recorded generations without renames, in `examples/replay.rs`). An active rule is used both
//! ways:
//! - **drafting**: a draft token X becomes Y, with its acceptance probability (and its
//!   subtree's) scaled by p;
//! - **matching**: the context's Ys are read as Xs, so the text after `settings` finds the
//!   source after `config` again and the copy goes on at full length.

use std::collections::HashMap;

/// Rules kept at most; the least useful one makes room for a new one.
const MAX_RULES: usize = 64;

#[derive(Clone, Copy, Debug)]
struct Rule {
    to: u32,
    hits: f32,
    misses: f32,
}

impl Rule {
    fn p(&self) -> f32 {
        self.hits / (self.hits + self.misses + 1.0)
    }

    fn active(&self) -> bool {
        self.hits >= MIN_HITS && self.p() >= 0.5
    }
}

/// Hits before a rule is used (see the module notes).
const MIN_HITS: f32 = 2.0;

/// See the module notes.
#[derive(Clone, Debug, Default)]
pub struct Substitutions {
    rules: HashMap<u32, Rule>,
    /// Target token → source token of the active rules (rebuilt when a rule changes state).
    back: HashMap<u32, u32>,
}

impl Substitutions {
    /// Forgets every rule.
    pub fn clear(&mut self) {
        self.rules.clear();
        self.back.clear();
    }

    /// Whether any rule is active.
    pub fn any_active(&self) -> bool {
        !self.back.is_empty()
    }

    /// The active rule's replacement of source token `from` and its probability.
    pub fn active(&self, from: u32) -> Option<(u32, f32)> {
        let r = self.rules.get(&from)?;
        r.active().then_some((r.to, r.p()))
    }

    /// The source token that an active rule replaces by `tok`, else `tok`.
    pub fn source_of(&self, tok: u32) -> u32 {
        self.back.get(&tok).copied().unwrap_or(tok)
    }

    /// The target wrote `target` where the source had `from` (a rejected draft `from`, or an
    /// accepted substituted draft): a hit for a rule `from → target`; otherwise a miss for the
    /// rule of `from`, which `from → target` replaces once it is no longer active. Writing
    /// `from` itself is a plain miss.
    pub fn observe(&mut self, from: u32, target: u32) {
        match self.rules.get_mut(&from) {
            Some(r) if r.to == target => r.hits += 1.0,
            Some(r) => {
                r.misses += 1.0;
                if r.p() < 0.5 && target != from {
                    *r = Rule {
                        to: target,
                        hits: 1.0,
                        misses: 0.0,
                    };
                }
            }
            None if target != from => {
                if self.rules.len() >= MAX_RULES {
                    self.evict();
                }
                self.rules.insert(
                    from,
                    Rule {
                        to: target,
                        hits: 1.0,
                        misses: 0.0,
                    },
                );
            }
            None => {}
        }
        self.rebuild_back();
    }

    /// The lowest-p rule (ties: the smallest source token, for determinism).
    fn evict(&mut self) {
        let worst = self
            .rules
            .iter()
            .min_by(|a, b| a.1.p().total_cmp(&b.1.p()).then(a.0.cmp(b.0)))
            .map(|(&k, _)| k);
        if let Some(k) = worst {
            self.rules.remove(&k);
        }
    }

    fn rebuild_back(&mut self) {
        self.back.clear();
        for (&from, r) in &self.rules {
            if r.active() {
                // Two rules with one target: the smaller source token, for determinism.
                let e = self.back.entry(r.to).or_insert(from);
                *e = (*e).min(from);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hit_activates_a_miss_retires() {
        let mut s = Substitutions::default();
        assert!(!s.any_active());
        s.observe(7, 9);
        assert_eq!(s.active(7), None, "one edit is not yet a rule");
        assert_eq!(s.source_of(9), 9);
        s.observe(7, 9);
        assert_eq!(s.active(7), Some((9, 2.0 / 3.0)));
        assert_eq!(s.source_of(9), 7);
        assert_eq!(s.source_of(8), 8);
        // Two misses (the target kept 7): p = 2 / 5, inactive, and 9 reads as 9 again.
        s.observe(7, 7);
        s.observe(7, 7);
        assert_eq!(s.active(7), None);
        assert_eq!(s.source_of(9), 9);
        // A different replacement takes over an inactive rule.
        s.observe(7, 11);
        s.observe(7, 11);
        assert_eq!(s.active(7), Some((11, 2.0 / 3.0)));
        assert_eq!(s.source_of(11), 7);
        // Keeping the token where no rule exists teaches nothing.
        s.observe(3, 3);
        assert_eq!(s.active(3), None);
    }

    #[test]
    fn the_memory_is_bounded() {
        let mut s = Substitutions::default();
        for i in 0..200 {
            s.observe(i, i + 1000);
        }
        assert!(s.rules.len() <= MAX_RULES);
        s.observe(199, 1199);
        assert!(s.active(199).is_some(), "the newest rule is kept");
    }
}
