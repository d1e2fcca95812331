//! A segment's vocabulary: each term's local id, in order of first appearance.
//!
//! The lookup is most of what a token costs, and it is bound by memory, not
//! by arithmetic: a segment holds some 80,000 terms, and each rare one costs
//! cache misses (a general hash table's control bytes, then its entry, then
//! the term's bytes to compare). So the table is our own, built for the two
//! things that remove them:
//!
//! * a slot holds the term itself when it is at most 24 bytes long (most
//!   terms), beside its id, its length and 24 bits of its hash: a lookup reads one slot
//!   line, and reaches the arena only for a longer term;
//! * the caller computes a token's [`Key`] first and [`Vocab::prefetch`]es
//!   its slot, so a record's lookups wait for memory together instead of
//!   one after another (`Builder::add` keys a whole record before it looks
//!   any of its tokens up).

use std::sync::OnceLock;

use crate::hashes::{term_hashes, Wanted};

/// Bytes of a term held in its slot; a longer term is compared in the arena too.
const INLINE: usize = 24;
/// A slot's id when it holds no term.
const EMPTY: u32 = u32::MAX;
/// The table doubles before more than 7 in 10 slots are taken.
const LOAD_TENTHS: usize = 7;
const FIRST_SLOTS: usize = 1 << 10;

/// A token ready for lookup: its tag (24 bits of its hash, which place its
/// slot and filter before the bytes, and its length up to 255) and its
/// first 24 bytes as three words, zero-padded, which is exactly how a slot
/// holds a term.
#[derive(Clone, Copy)]
pub(super) struct Key {
    tag: u32,
    packed: [u64; 3],
}

#[derive(Clone, Copy)]
#[repr(C, align(32))]
struct Slot {
    tag: u32,
    id: u32,
    packed: [u64; 3],
}

const VACANT: Slot = Slot { tag: 0, id: EMPTY, packed: [0; 3] };

/// A segment's terms by local id, in one arena, and the table that finds them.
pub(super) struct Vocab {
    /// Open addressing with linear probing; a power of two long, or empty.
    slots: Vec<Slot>,
    hasher: ahash::RandomState,
    /// Term t is `bytes[starts[t]..starts[t + 1]]`.
    starts: Vec<usize>,
    bytes: Vec<u8>,
}

impl Default for Vocab {
    fn default() -> Vocab {
        // One set of keys for every vocabulary in the process (random, so
        // that no input can be made to collide): a term's tag is the same in
        // every segment, and so is its place in the hashes' memo.
        static HASHER: OnceLock<ahash::RandomState> = OnceLock::new();
        let hasher = HASHER.get_or_init(ahash::RandomState::new).clone();
        Vocab { slots: Vec::new(), hasher, starts: vec![0], bytes: Vec::new() }
    }
}

impl Vocab {
    /// How many terms it holds.
    pub(super) fn len(&self) -> usize {
        self.starts.len() - 1
    }

    /// Term `t`'s bytes.
    pub(super) fn term(&self, t: u32) -> &[u8] {
        &self.bytes[self.starts[t as usize]..self.starts[t as usize + 1]]
    }

    /// Every term's term hash (BLAKE2b, see `hashes`), by id.
    pub(super) fn term_hashes(&self) -> Vec<u64> {
        let mut out = vec![0; self.len()];
        // In slot order, which walks the memo in order too.
        let wanted = self.slots.iter().filter(|s| s.id != EMPTY).map(|s| {
            let len = (s.tag & 0xff) as usize;
            let memo_key =
                (1..INLINE).contains(&len).then(|| [s.packed[0], s.packed[1], s.packed[2] | (len as u64) << 56]);
            Wanted { id: s.id, spot: home(s.tag) as u32, memo_key }
        });
        term_hashes(wanted, |t| self.term(t), &mut out);
        out
    }

    /// `token` made ready for [`Vocab::intern_key`].
    #[inline]
    pub(super) fn key(&self, token: &[u8]) -> Key {
        let hash = (self.hasher.hash_one(token) >> 32) as u32;
        let tag = hash & !0xff | token.len().min(255) as u32;
        Key { tag, packed: [word(token, 0), word(token, 8), word(token, 16)] }
    }

    /// Ask for the line of `key`'s first slot, so that a lookup shortly
    /// after finds it in the cache. Only a hint: a lookup is right without it.
    #[inline]
    pub(super) fn prefetch(&self, key: &Key) {
        if let Some(slot) = self.slots.get(home(key.tag) & self.slots.len().wrapping_sub(1)) {
            prefetch_line(slot);
        }
    }

    /// The id of `token`, and whether it is new. Ids count up from 0.
    #[inline]
    pub(super) fn intern_bytes(&mut self, token: &[u8]) -> (u32, bool) {
        let key = self.key(token);
        self.intern_key(&key, token)
    }

    /// [`Vocab::intern_bytes`] of `token`, whose key is `key`.
    #[inline]
    pub(super) fn intern_key(&mut self, key: &Key, token: &[u8]) -> (u32, bool) {
        if (self.len() + 1) * 10 > self.slots.len() * LOAD_TENTHS {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut i = home(key.tag) & mask;
        loop {
            // Compared in place, word by word: a copy of the slot (or an
            // array comparison) goes through the stack, and reading it back
            // in other widths than it was written stalls every lookup.
            let slot = &self.slots[i];
            if slot.id == EMPTY {
                break;
            }
            if slot.tag == key.tag
                && slot.packed[0] == key.packed[0]
                && slot.packed[1] == key.packed[1]
                && slot.packed[2] == key.packed[2]
                && (token.len() <= INLINE || self.term(slot.id) == token)
            {
                return (slot.id, false);
            }
            i = (i + 1) & mask;
        }
        let id = u32::try_from(self.len()).expect("fewer than 2^32 terms in a segment");
        self.slots[i] = Slot { tag: key.tag, id, packed: key.packed };
        self.bytes.extend_from_slice(token);
        self.starts.push(self.bytes.len());
        (id, true)
    }

    /// Twice the slots, each term placed again by its tag (its hash is
    /// not needed again).
    fn grow(&mut self) {
        let size = (self.slots.len() * 2).max(FIRST_SLOTS);
        let old = std::mem::replace(&mut self.slots, vec![VACANT; size]);
        let mask = size - 1;
        for slot in old.into_iter().filter(|s| s.id != EMPTY) {
            let mut i = home(slot.tag) & mask;
            while self.slots[i].id != EMPTY {
                i = (i + 1) & mask;
            }
            self.slots[i] = slot;
        }
    }
}

/// Where the probe for a tag starts: its hash bits (the length byte last,
/// for tables of more than 2^24 slots).
#[inline]
fn home(tag: u32) -> usize {
    tag.rotate_right(8) as usize
}

/// Bytes `lo..lo + 8` of `token` as a little-endian word, zero past its
/// end. Read as whole words, never byte by byte into a buffer: a word read
/// back from narrower stores waits for them (a store-forwarding stall that
/// cost more than the rest of the key).
#[inline]
fn word(token: &[u8], lo: usize) -> u64 {
    let len = token.len();
    let at = |i: usize| u64::from_le_bytes(token[i..i + 8].try_into().expect("8 bytes"));
    if len >= lo + 8 {
        at(lo)
    } else if len <= lo {
        0
    } else if len >= 8 {
        // The last 8 bytes, shifted so that byte `lo` comes first.
        at(len - 8) >> (8 * (lo + 8 - len))
    } else {
        // Shorter than a word: two overlapping halves, or three bytes.
        let half = |i: usize| u64::from(u32::from_le_bytes(token[i..i + 4].try_into().expect("4 bytes")));
        if len >= 4 {
            half(0) | half(len - 4) << (8 * (len - 4))
        } else {
            let b = |i: usize| u64::from(token[i]) << (8 * i);
            b(0) | b(len / 2) | b(len - 1)
        }
    }
}

#[inline]
pub(super) fn prefetch_line<T>(at: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint that never faults, and `at` is a valid reference.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>((at as *const T).cast::<i8>());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vocabulary_gives_each_term_one_id_however_it_grows() {
        let mut v = Vocab::default();
        let terms: Vec<String> = (0..50_000).map(|i| format!("t{i}")).collect();
        for (i, t) in terms.iter().enumerate() {
            assert_eq!(v.intern_bytes(t.as_bytes()), (i as u32, true));
        }
        for (i, t) in terms.iter().enumerate().rev() {
            assert_eq!(v.intern_bytes(t.as_bytes()), (i as u32, false));
            assert_eq!(v.term(i as u32), t.as_bytes());
        }
    }

    #[test]
    fn a_word_is_the_bytes_at_its_place_zero_padded() {
        let token: Vec<u8> = (1..=40).collect();
        for len in 0..=token.len() {
            let t = &token[..len];
            for lo in [0, 8, 16] {
                let mut want = [0u8; 8];
                for (i, w) in want.iter_mut().enumerate() {
                    *w = t.get(lo + i).copied().unwrap_or(0);
                }
                assert_eq!(word(t, lo), u64::from_le_bytes(want), "len {len} lo {lo}");
            }
        }
    }

    #[test]
    fn each_terms_hash_is_its_blake2b_in_every_vocabulary_of_the_thread() {
        // The second and third vocabularies meet the first's terms again
        // (their hashes come from the memo) among terms of their own.
        for round in 0..3 {
            let mut v = Vocab::default();
            let mut terms: Vec<String> = (0..3_000).map(|i| format!("w{}", i * (round + 1))).collect();
            terms.extend((20..27).map(|n| "z".repeat(n)));
            terms.push(format!("{round}\0"));
            for t in &terms {
                v.intern_bytes(t.as_bytes());
            }
            let hashes = v.term_hashes();
            assert_eq!(hashes.len(), v.len());
            for (t, h) in hashes.iter().enumerate() {
                let term = std::str::from_utf8(v.term(t as u32)).unwrap();
                assert_eq!(*h, crate::hashes::term_hash(term), "{term:?}");
            }
        }
    }

    #[test]
    fn terms_alike_in_their_first_bytes_or_their_tags_stay_apart() {
        let mut v = Vocab::default();
        // Long terms that share their inline 24 bytes, a term and its
        // prefix, lengths on either side of the inline limit and past 255
        // (where the tag's length saturates), the empty term.
        let base = "x".repeat(24);
        let mut terms: Vec<String> =
            vec![String::new(), "a".into(), "a\0".into(), "\0a".into(), base[1..].into(), base.clone()];
        terms.extend((0..300).map(|i| format!("{base}{i}")));
        terms.extend([300, 301, 600].map(|n| "y".repeat(n)));
        terms.push(format!("{}z", "y".repeat(299)));
        for (i, t) in terms.iter().enumerate() {
            assert_eq!(v.intern_bytes(t.as_bytes()), (i as u32, true), "{t:?}");
        }
        for (i, t) in terms.iter().enumerate() {
            assert_eq!(v.intern_bytes(t.as_bytes()), (i as u32, false), "{t:?}");
        }
        // Every term given the same hash bits: its length and bytes alone
        // tell it apart.
        let same = |key: Key| Key { tag: 7 << 8 | key.tag & 0xff, ..key };
        let mut v = Vocab::default();
        for (i, t) in terms.iter().enumerate() {
            let key = same(v.key(t.as_bytes()));
            assert_eq!(v.intern_key(&key, t.as_bytes()), (i as u32, true), "{t:?}");
        }
        for (i, t) in terms.iter().enumerate() {
            let key = same(v.key(t.as_bytes()));
            v.prefetch(&key);
            assert_eq!(v.intern_key(&key, t.as_bytes()), (i as u32, false), "{t:?}");
        }
    }
}
