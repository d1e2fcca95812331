//! Scoring and the top-k cut of one search (`recall/query/rank.py`).
//!
//! The plain path is the definition and the oracle: for the same postings,
//! filters and ranks this returns a set of candidates that holds the plain
//! path's top `limit`, with bit-identical scores, and the same `matched`
//! and `any_exact`. Python then orders those few exactly as the plain path
//! does (their ids compared as strings), so which path ranked never shows.
//!
//! One pass walks the query terms' postings from the newest record down,
//! merged by record number: a record's sum adds its terms' weights in query
//! order (duplicates kept), the same additions in the same order as the
//! reference, and is divided by the number of query terms. Newest first
//! because the order prefers later event times and records mostly arrive in
//! time order: the best `limit` are found early, and the rest fail a single
//! comparison with the heap's weakest.
//!
//! Records tied with the k-th best on every numeric key (exact, score,
//! event time) are ordered by id. Ranks of ids (`idorder`) compare records
//! only within one block, so of the tied records the best `need` of every
//! block by rank are kept: a set that holds the best `need` of all.

mod top;

use std::sync::atomic::{AtomicU8, Ordering};

use top::{Key, Top};

/// A request's cancellation, as the caller's thread flags it while a
/// search runs here without the GIL: one byte, set nonzero once and never
/// cleared. A search with terms repeated many times costs minutes (each
/// query position adds its term's weights to every record holding it), so
/// it looks at the flag between windows and between query positions, and
/// gives up (`None`) as soon as it is set.
#[derive(Clone, Copy, Default)]
pub struct Stop<'a>(pub Option<&'a AtomicU8>);

impl Stop<'_> {
    fn asked(&self) -> bool {
        self.0.is_some_and(|flag| flag.load(Ordering::Relaxed) != 0)
    }
}

/// One segment's postings of a term: record numbers ascending, and `meta`
/// (`count << 2 | weight code`) beside them.
#[derive(Clone, Copy)]
pub struct List<'a> {
    pub recs: &'a [u32],
    pub meta: &'a [u8],
}

/// A term's postings across segments (or one number variant's): the lists
/// in segment order, so their records ascend along the chain.
pub type Chain<'a> = Vec<List<'a>>;

/// A query term that has postings: its own chain at `scale` 1, or its
/// variants' chains at the variant weight (a record's weight is the best
/// of them).
pub struct Term<'a> {
    pub chains: Vec<Chain<'a>>,
    pub scale: f64,
}

/// The per-record columns the filters and the order read, as the index's
/// structured rows: `stride` bytes a record, fields at these offsets.
pub struct Columns<'a> {
    pub bytes: &'a [u8],
    pub stride: usize,
    pub sec: usize,
    pub nsec: usize,
    pub kind: usize,
    pub times: TimeBlocks<'a>,
}

/// `maxima[b]` is at least the event second of every record `r < covered`
/// in block `b` of `1 << shift` records.
pub struct TimeBlocks<'a> {
    pub maxima: &'a [i64],
    pub covered: u32,
    pub shift: u32,
}

impl TimeBlocks<'_> {
    /// Whether every record of `rec`'s block is known to be older than `sec`.
    fn older(&self, rec: u32, sec: i64) -> bool {
        rec < self.covered && self.maxima[(rec >> self.shift) as usize] < sec
    }
}

impl Columns<'_> {
    fn i64_at(&self, rec: u32, field: usize) -> i64 {
        let at = rec as usize * self.stride + field;
        i64::from_le_bytes(self.bytes[at..at + 8].try_into().unwrap())
    }

    fn i32_at(&self, rec: u32, field: usize) -> i32 {
        let at = rec as usize * self.stride + field;
        i32::from_le_bytes(self.bytes[at..at + 4].try_into().unwrap())
    }

    fn time(&self, rec: u32) -> (i64, i32) {
        (self.i64_at(rec, self.sec), self.i32_at(rec, self.nsec))
    }
}

/// The time and type window and the records a source has taken back.
#[derive(Default)]
pub struct Window<'a> {
    /// Event time at most this `(sec, nsec)` (the lesser of as_of and until).
    pub upper: Option<(i64, i32)>,
    /// Event time at least this.
    pub lower: Option<(i64, i32)>,
    /// Allowed kind codes, when the query names record types.
    pub kinds: Option<Vec<bool>>,
    /// Removed records, nonzero by record number; records past its end stay.
    pub removed: Option<&'a [u8]>,
}

impl Window<'_> {
    fn admits(&self, cols: &Columns<'_>, rec: u32) -> bool {
        if self.upper.is_some() || self.lower.is_some() {
            let t = cols.time(rec);
            if self.upper.is_some_and(|u| t > u) || self.lower.is_some_and(|l| t < l) {
                return false;
            }
        }
        if let Some(kinds) = &self.kinds {
            let code = cols.i32_at(rec, cols.kind);
            if !usize::try_from(code).is_ok_and(|c| kinds.get(c).copied().unwrap_or(false)) {
                return false;
            }
        }
        self.removed.is_none_or(|r| r.get(rec as usize).is_none_or(|&g| g == 0))
    }
}

/// What to rank.
pub struct Query<'a> {
    /// Records `< n` are visible.
    pub n: u32,
    pub terms: Vec<Term<'a>>,
    /// The query's terms in order, duplicates kept, as indexes into `terms`;
    /// terms without postings are left out (they add nothing).
    pub order: Vec<usize>,
    /// How many terms the query has, those without postings included: the
    /// divisor of a record's sum.
    pub positions: usize,
    /// Records matched as exact identifiers, ascending.
    pub exact: &'a [i64],
    /// No terms: every visible record is a candidate, scored 0.
    pub browse: bool,
    /// Weight by weight code.
    pub weights: [f64; 4],
}

/// The ranks of ids: `ranks[b][r - b * block]` orders record `r` within
/// block `b` by (id, record number).
pub struct IdRanks<'a> {
    pub ranks: Vec<&'a [i32]>,
    pub block: usize,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hit {
    pub rec: u32,
    pub score: f64,
    pub exact: bool,
}

pub struct Ranked {
    /// Holds the best `limit` (and may hold more); unordered.
    pub hits: Vec<Hit>,
    pub matched: u64,
    pub any_exact: bool,
}

/// A chain walked backwards from its last posting below `n`.
struct Cursor<'a> {
    lists: &'a [List<'a>],
    list: usize,
    // Position of the next posting plus one within `lists[list]` (0: used up).
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(lists: &'a [List<'a>], n: u32) -> Self {
        let mut c = Cursor { lists, list: lists.len(), pos: 0 };
        while c.list > 0 {
            c.list -= 1;
            let recs = lists[c.list].recs;
            c.pos = recs.partition_point(|&r| r < n);
            if c.pos > 0 {
                break;
            }
        }
        c
    }

    fn head(&self) -> Option<u32> {
        (self.pos > 0).then(|| self.lists[self.list].recs[self.pos - 1])
    }

    /// Hand `f` every posting `>= lo` still ahead, newest first, with its
    /// weight code, and move past them.
    fn take_from(&mut self, lo: u32, mut f: impl FnMut(u32, usize)) {
        while self.pos > 0 {
            let List { recs, meta } = self.lists[self.list];
            let mut p = self.pos;
            while p > 0 && recs[p - 1] >= lo {
                f(recs[p - 1], (meta[p - 1] & 3) as usize);
                p -= 1;
            }
            self.pos = p;
            if p > 0 {
                return;
            }
            self.advance_list();
        }
    }

    /// The current list is used up: on to the previous one with postings.
    fn advance_list(&mut self) {
        while self.pos == 0 && self.list > 0 {
            self.list -= 1;
            self.pos = self.lists[self.list].recs.len();
        }
    }
}

/// The best `limit` candidates of `q` under the plain path's order (and
/// records tied with the last of them; see the module's rules), or None
/// when `stop` was asked before the end.
pub fn rank(q: &Query<'_>, cols: &Columns<'_>, window: &Window<'_>, ids: &IdRanks<'_>,
            limit: usize, stop: Stop<'_>) -> Option<Ranked> {
    // No more than every record can be kept: a limit of a billion must not
    // reserve a heap for a billion.
    let mut top = Top::new(limit.min(q.n as usize));
    let (mut matched, mut any_exact) = (0u64, false);
    let mut offer = |rec: u32, score: f64, exact: bool| {
        if !window.admits(cols, rec) {
            return;
        }
        matched += 1;
        any_exact |= exact;
        // The event time is read only for a record that can still enter:
        // the columns are the largest memory a search would otherwise touch.
        if top.beaten(exact, score, |sec| cols.times.older(rec, sec)) {
            return;
        }
        let (sec, nsec) = cols.time(rec);
        top.offer(Key { exact, score, sec, nsec }, Hit { rec, score, exact });
    };
    if q.browse {
        // Every record is a candidate; a block whose greatest second lies
        // before the window's start holds none that passes, unread.
        let times = &cols.times;
        let mut rec = q.n;
        while rec > 0 {
            rec -= 1;
            if rec % WINDOW == 0 && stop.asked() {
                return None;
            }
            if let Some((sec, _)) = window.lower {
                if times.older(rec, sec) {
                    rec &= !((1u32 << times.shift) - 1);
                    continue;
                }
            }
            offer(rec, 0.0, false);
        }
    } else if !merge(q, &mut offer, stop) {
        return None;
    }
    Some(Ranked { hits: top.finish(ids), matched, any_exact })
}

/// Records per window of the merge: its sums and flags fit in the L1 and
/// L2 caches, and a window no posting falls in is never visited.
const WINDOW: u32 = 4096;

/// Every candidate of `q` with its score and exactness, newest record first;
/// false if `stop` cut it short.
///
/// The postings are merged a window of records at a time: each query
/// position adds its term's weights to the window's sums in query order
/// (the plain path's dense additions, in its order), then the window's
/// candidates are offered from the newest down.
fn merge(q: &Query<'_>, offer: &mut impl FnMut(u32, f64, bool), stop: Stop<'_>) -> bool {
    let mut cursors: Vec<Vec<Cursor<'_>>> = q
        .terms
        .iter()
        .map(|t| t.chains.iter().map(|c| Cursor::new(c, q.n)).collect())
        .collect();
    let mut exact_end = q.exact.partition_point(|&r| r < i64::from(q.n));
    let mut quotients = Quotients::new(q.positions as f64);
    let win = WINDOW as usize;
    let mut sums = vec![0.0f64; win];
    let mut seen = vec![false; win];
    let mut exact = vec![false; win];
    let mut best = vec![-1.0f64; win];
    let mut touched: Vec<u32> = Vec::with_capacity(win);
    let mut term_hits: Vec<Vec<(u32, f64)>> = vec![Vec::new(); q.terms.len()];
    loop {
        if stop.asked() {
            return false;
        }
        // The newest record anything still holds ends the next window.
        let mut top: Option<u32> = exact_end.checked_sub(1).map(|i| q.exact[i] as u32);
        for c in cursors.iter().flatten() {
            if let Some(h) = c.head() {
                top = Some(top.map_or(h, |m| m.max(h)));
            }
        }
        let Some(top) = top else { return true };
        let lo = (top + 1).saturating_sub(WINDOW);
        for (t, chains) in cursors.iter_mut().enumerate() {
            let hits = &mut term_hits[t];
            hits.clear();
            let scale = q.terms[t].scale;
            if let [only] = chains.as_mut_slice() {
                // Scaled only for variants: the plain path never multiplies
                // a term's own weights (w * 1.0 is w, but say it plainly).
                if scale == 1.0 {
                    only.take_from(lo, |rec, code| hits.push((rec - lo, q.weights[code])));
                } else {
                    only.take_from(lo, |rec, code| hits.push((rec - lo, q.weights[code] * scale)));
                }
                continue;
            }
            // Several variants: a record's weight is the best of theirs.
            for c in chains.iter_mut() {
                c.take_from(lo, |rec, code| {
                    let i = (rec - lo) as usize;
                    if best[i] < 0.0 {
                        hits.push((rec - lo, 0.0));
                    }
                    best[i] = best[i].max(q.weights[code] * scale);
                });
            }
            for h in hits.iter_mut() {
                h.1 = best[h.0 as usize];
                best[h.0 as usize] = -1.0;
            }
        }
        let exact_here = exact_end > 0 && q.exact[exact_end - 1] >= i64::from(lo);
        if let ([t], [_], false) = (q.order.as_slice(), q.terms.first().map_or(&[][..], |t| &t.chains[..]), exact_here) {
            // One term, its own postings (or one variant's), no identifier:
            // its hits are the candidates, already newest first, and a sum
            // of one weight is that weight.
            for &(i, w) in &term_hits[*t] {
                offer(lo + i, quotients.of(w), false);
            }
            continue;
        }
        let span = (top + 1 - lo) as usize;
        // Dense where at least one record in eight is a candidate: then the
        // window is scanned, else only what was touched is sorted.
        let held: usize = term_hits.iter().map(Vec::len).sum();
        let dense = held * 8 >= span;
        for &t in &q.order {
            if stop.asked() {
                return false;
            }
            for &(i, w) in &term_hits[t] {
                let i = i as usize;
                sums[i] += w;
                if !dense && !seen[i] {
                    touched.push(i as u32);
                }
                seen[i] = true;
            }
        }
        while exact_end > 0 && q.exact[exact_end - 1] >= i64::from(lo) {
            exact_end -= 1;
            let i = (q.exact[exact_end] as u32 - lo) as usize;
            exact[i] = true;
            if !dense && !seen[i] {
                touched.push(i as u32);
            }
            seen[i] = true;
        }
        // Newest first.
        let mut emit = |i: usize, sum: f64, is_exact: bool| {
            offer(lo + i as u32, quotients.of(sum), is_exact);
        };
        if dense {
            for i in (0..span).rev() {
                if seen[i] {
                    emit(i, sums[i], exact[i]);
                    (sums[i], seen[i], exact[i]) = (0.0, false, false);
                }
            }
        } else {
            touched.sort_unstable_by(|a, b| b.cmp(a));
            for &i in &touched {
                let i = i as usize;
                emit(i, sums[i], exact[i]);
                (sums[i], seen[i], exact[i]) = (0.0, false, false);
            }
        }
        touched.clear();
    }
}

/// A record's score: its sum divided by the query's number of terms. Sums
/// take few distinct values (sums of a few weights), and a division per
/// record was a third of a common term's time, so quotients are kept by a
/// hash of the sum's bits.
struct Quotients {
    divisor: f64,
    slots: [(u64, f64); 16],
}

impl Quotients {
    fn new(divisor: f64) -> Self {
        // 0.0 has bits 0: the empty slots already hold its quotient.
        Quotients { divisor, slots: [(0, 0.0 / divisor); 16] }
    }

    fn of(&mut self, sum: f64) -> f64 {
        let bits = sum.to_bits();
        let slot = &mut self.slots[(bits.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 60) as usize];
        if slot.0 != bits {
            *slot = (bits, sum / self.divisor);
        }
        slot.1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: [f64; 4] = [0.0, 0.4, 0.5, 1.0];

    fn cols(times: &[(i64, i32)]) -> Vec<u8> {
        let mut out = Vec::new();
        for &(s, ns) in times {
            out.extend_from_slice(&s.to_le_bytes());
            out.extend_from_slice(&ns.to_le_bytes());
            out.extend_from_slice(&0i32.to_le_bytes()); // kind
        }
        out
    }

    fn columns(bytes: &[u8]) -> Columns<'_> {
        Columns { bytes, stride: 16, sec: 0, nsec: 8, kind: 12, times: NO_TIMES }
    }

    const NO_TIMES: TimeBlocks<'static> = TimeBlocks { maxima: &[], covered: 0, shift: 0 };

    /// A query of one term whose postings are one list.
    fn one_term<'a>(n: u32, recs: &'a [u32], meta: &'a [u8], exact: &'a [i64]) -> Query<'a> {
        Query {
            n,
            terms: vec![Term { chains: vec![vec![List { recs, meta }]], scale: 1.0 }],
            order: vec![0],
            positions: 1,
            exact,
            browse: false,
            weights: W,
        }
    }

    #[test]
    fn sums_in_query_order_and_keeps_the_newest_of_equals() {
        // Two segments of one term, records 0..4; a second term on 1 and 3.
        let a0 = [0u32, 1];
        let m0 = [1u8, 3];
        let a1 = [2u32, 3];
        let m1 = [1u8, 1];
        let b = [1u32, 3];
        let mb = [2u8, 2];
        let bytes = cols(&[(10, 0), (10, 0), (11, 0), (9, 5)]);
        let c = columns(&bytes);
        let q = Query {
            n: 4,
            terms: vec![
                Term { chains: vec![vec![List { recs: &a0, meta: &m0 }, List { recs: &a1, meta: &m1 }]], scale: 1.0 },
                Term { chains: vec![vec![List { recs: &b, meta: &mb }]], scale: 1.0 },
            ],
            order: vec![0, 1, 0],
            positions: 3,
            exact: &[],
            browse: false,
            weights: W,
        };
        let ids = IdRanks { ranks: vec![&[0, 1, 2, 3]], block: 4 };
        let r = rank(&q, &c, &Window::default(), &ids, 10, Stop::default()).unwrap();
        assert_eq!(r.matched, 4);
        let mut hits = r.hits;
        hits.sort_by_key(|h| h.rec);
        let want = [(0.4 + 0.4) / 3.0, (1.0 + 0.5 + 1.0) / 3.0,
                    (0.4 + 0.4) / 3.0, (0.4 + 0.5 + 0.4) / 3.0];
        let got: Vec<f64> = hits.iter().map(|h| h.score).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn ties_beyond_the_limit_are_cut_by_rank_within_each_block() {
        let recs: Vec<u32> = (0..8).collect();
        let meta = [1u8; 8];
        let bytes = cols(&[(5, 0); 8]);
        let c = columns(&bytes);
        let q = one_term(8, &recs, &meta, &[3]);
        // Blocks of 4: ranks put record 2 first in block 0, record 7 in block 1.
        let ids = IdRanks { ranks: vec![&[3, 1, 0, 2], &[3, 2, 1, 0]], block: 4 };
        let r = rank(&q, &c, &Window::default(), &ids, 2, Stop::default()).unwrap();
        let mut got: Vec<u32> = r.hits.iter().map(|h| h.rec).collect();
        got.sort_unstable();
        // Record 3 is exact (better); of the 7 tied, the best one per block.
        assert_eq!(got, vec![2, 3, 7]);
        assert!(r.any_exact);
        assert_eq!(r.matched, 8);
    }

    #[test]
    fn a_stop_asked_gives_up_on_terms_and_on_a_browse_alike() {
        let recs: Vec<u32> = (0..4).collect();
        let meta = [1u8; 4];
        let bytes = cols(&[(1, 0); 4]);
        let c = columns(&bytes);
        let ids = IdRanks { ranks: vec![&[0, 1, 2, 3]], block: 4 };
        let flag = AtomicU8::new(1);
        let mut q = one_term(4, &recs, &meta, &[]);
        assert!(rank(&q, &c, &Window::default(), &ids, 2, Stop(Some(&flag))).is_none());
        q.browse = true;
        assert!(rank(&q, &c, &Window::default(), &ids, 2, Stop(Some(&flag))).is_none());
        flag.store(0, Ordering::Relaxed);
        assert_eq!(rank(&q, &c, &Window::default(), &ids, 2, Stop(Some(&flag))).unwrap().matched, 4);
    }

    #[test]
    fn a_limit_past_every_record_reserves_no_more_than_the_records() {
        let recs: Vec<u32> = (0..4).collect();
        let meta = [1u8; 4];
        let bytes = cols(&[(1, 0); 4]);
        let c = columns(&bytes);
        let ids = IdRanks { ranks: vec![&[0, 1, 2, 3]], block: 4 };
        let q = one_term(4, &recs, &meta, &[]);
        // usize::MAX + 1 would overflow the heap's capacity, a billion exhaust memory.
        for limit in [usize::MAX, 1_000_000_000] {
            let r = rank(&q, &c, &Window::default(), &ids, limit, Stop::default()).unwrap();
            assert_eq!(r.hits.len(), 4);
        }
    }

    #[test]
    fn the_window_filters_before_counting() {
        let recs: Vec<u32> = (0..4).collect();
        let meta = [1u8; 4];
        let bytes = cols(&[(1, 0), (2, 0), (2, 7), (3, 0)]);
        let c = columns(&bytes);
        let q = one_term(4, &recs, &meta, &[]);
        let removed = [0u8, 0, 1];
        let w = Window { upper: Some((2, 7)), lower: Some((2, 0)), kinds: None, removed: Some(&removed) };
        let ids = IdRanks { ranks: vec![&[0, 1, 2, 3]], block: 4 };
        let r = rank(&q, &c, &w, &ids, 10, Stop::default()).unwrap();
        let got: Vec<u32> = r.hits.iter().map(|h| h.rec).collect();
        assert_eq!((got, r.matched), (vec![1], 1));
    }
}
