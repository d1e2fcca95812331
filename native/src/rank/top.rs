//! The heap of a search's best `k` (`Top`), and the numeric part of the
//! order it keeps them by (`Key`); see `rank.rs` for the rules of the cut.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use super::{Hit, IdRanks};

/// The numeric part of the order, larger is better.
#[derive(Clone, Copy)]
pub(super) struct Key {
    pub(super) exact: bool,
    pub(super) score: f64,
    pub(super) sec: i64,
    pub(super) nsec: i32,
}

impl Key {
    fn cmp(&self, other: &Key) -> Ordering {
        self.exact
            .cmp(&other.exact)
            .then(self.score.total_cmp(&other.score))
            .then(self.sec.cmp(&other.sec))
            .then(self.nsec.cmp(&other.nsec))
    }
}

struct Entry {
    key: Key,
    hit: Hit,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.key.cmp(&other.key) == Ordering::Equal
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Entry {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key.cmp(&other.key)
    }
}

/// The best `k` entries seen, and every entry tied with the weakest of them.
pub(super) struct Top {
    k: usize,
    heap: BinaryHeap<Reverse<Entry>>,
    // Entries equal on every key to the heap's weakest, turned away or
    // pushed out while it was.
    ties: Vec<Hit>,
}

impl Top {
    pub(super) fn new(k: usize) -> Self {
        Top { k, heap: BinaryHeap::with_capacity(k + 1), ties: Vec::new() }
    }

    /// Whether an entry with this exactness and score is worse than the
    /// weakest of a full heap: whatever its time, or because `older` says
    /// its time lies before the weakest's second.
    pub(super) fn beaten(&self, exact: bool, score: f64, older: impl Fn(i64) -> bool) -> bool {
        if self.k == 0 {
            return true;
        }
        if self.heap.len() < self.k {
            return false;
        }
        let w = self.heap.peek().expect("the heap is full").0.key;
        match exact.cmp(&w.exact).then(score.total_cmp(&w.score)) {
            Ordering::Less => true,
            Ordering::Equal => older(w.sec),
            Ordering::Greater => false,
        }
    }

    pub(super) fn offer(&mut self, key: Key, hit: Hit) {
        if self.k == 0 {
            return;
        }
        if self.heap.len() < self.k {
            self.heap.push(Reverse(Entry { key, hit }));
            return;
        }
        let weakest = self.heap.peek().expect("the heap is full").0.key;
        match key.cmp(&weakest) {
            Ordering::Less => {}
            Ordering::Equal => self.ties.push(hit),
            Ordering::Greater => {
                let out = self.heap.pop().expect("the heap is full").0;
                self.heap.push(Reverse(Entry { key, hit }));
                let now = self.heap.peek().expect("the heap is full").0.key;
                if now.cmp(&out.key) == Ordering::Equal {
                    self.ties.push(out.hit);
                } else {
                    self.ties.clear();
                }
            }
        }
    }

    pub(super) fn finish(self, ids: &IdRanks<'_>) -> Vec<Hit> {
        let Some(weakest) = self.heap.peek().map(|e| e.0.key) else { return Vec::new() };
        let mut out = Vec::with_capacity(self.k);
        let mut tied = self.ties;
        for Reverse(e) in self.heap.into_vec() {
            if e.key.cmp(&weakest) == Ordering::Equal {
                tied.push(e.hit);
            } else {
                out.push(e.hit);
            }
        }
        let need = self.k - out.len();
        if tied.len() <= need {
            out.extend(tied);
            return out;
        }
        tied.sort_unstable_by_key(|h| h.rec);
        let mut rest = tied.as_mut_slice();
        while let Some(first) = rest.first() {
            let block = first.rec as usize / ids.block;
            let len = rest.partition_point(|h| h.rec as usize / ids.block == block);
            let (group, tail) = rest.split_at_mut(len);
            if group.len() > need {
                let ranks = ids.ranks[block];
                let rank = |h: &Hit| ranks[h.rec as usize - block * ids.block];
                group.select_nth_unstable_by_key(need - 1, rank);
                out.extend_from_slice(&group[..need]);
            } else {
                out.extend_from_slice(group);
            }
            rest = tail;
        }
        out
    }
}
