//! The stable 64-bit hash of terms and exact identifiers, and what spares
//! recomputing it: a BLAKE2b costs about 100 ns even for a short string,
//! and a record needs several.

use std::cell::RefCell;


/// The stable 64-bit term hash: BLAKE2b with an 8-byte digest, little-endian.
pub fn term_hash(term: &str) -> u64 {
    let digest = term_params().hash(term.as_bytes());
    u64::from_le_bytes(digest.as_bytes().try_into().expect("an 8-byte digest"))
}

thread_local! {
    static TERM_MEMO: RefCell<Vec<MemoSlot>> = const { RefCell::new(Vec::new()) };
    static IDENT_CACHE: RefCell<IdentCache> = RefCell::new(IdentCache::new());
}

/// A term whose hash a segment needs (see [`term_hashes`]).
#[derive(Clone, Copy)]
pub struct Wanted {
    /// Where its hash goes.
    pub id: u32,
    /// Bits of a fast hash of the term, which pick its memo slot.
    pub spot: u32,
    /// The term's bytes as the memo holds them, when it may: 1 to 23
    /// bytes as three little-endian words, zero-padded, the length in the
    /// last byte (so that every such term has its own key, and no key is
    /// all zeros, an empty slot's).
    pub memo_key: Option<[u64; 3]>,
}

/// Terms recur from segment to segment (Zipf), and a small catch-up meets
/// thousands of them at once: their hashes are remembered per thread, in a
/// direct-mapped memo of 2^17 slots (4 MiB), where a term displaces
/// whatever shared its slot, so the terms that keep coming back stay.
const MEMO_SLOTS: usize = 1 << 17;

#[derive(Clone, Copy, Default)]
#[repr(C, align(32))]
struct MemoSlot {
    key: [u64; 3],
    hash: u64,
}

/// The hash of each wanted term (whose bytes `term` gives), into `out` by
/// id: from the memo where it holds the term, the rest computed four at a
/// time (BLAKE2b over several short inputs at once costs about 60 % of one
/// at a time).
pub fn term_hashes<'t>(wanted: impl Iterator<Item = Wanted>, term: impl Fn(u32) -> &'t [u8],
                       out: &mut [u64]) {
    const BATCH: usize = 64;
    let params = term_params();
    TERM_MEMO.with(|memo| {
        let mut memo = memo.borrow_mut();
        if memo.is_empty() {
            memo.resize(MEMO_SLOTS, MemoSlot::default());
        }
        let mut batch: Vec<Wanted> = Vec::with_capacity(BATCH);
        let flush = |batch: &mut Vec<Wanted>, memo: &mut [MemoSlot], out: &mut [u64]| {
            let mut jobs: Vec<blake2b_simd::many::HashManyJob<'_>> =
                batch.iter().map(|w| blake2b_simd::many::HashManyJob::new(&params, term(w.id))).collect();
            blake2b_simd::many::hash_many(jobs.iter_mut());
            for (w, job) in batch.iter().zip(&jobs) {
                let hash = u64::from_le_bytes(job.to_hash().as_bytes().try_into().expect("an 8-byte digest"));
                out[w.id as usize] = hash;
                if let Some(key) = w.memo_key {
                    memo[w.spot as usize % MEMO_SLOTS] = MemoSlot { key, hash };
                }
            }
            batch.clear();
        };
        for w in wanted {
            if let Some(key) = w.memo_key {
                let slot = &memo[w.spot as usize % MEMO_SLOTS];
                if slot.key[0] == key[0] && slot.key[1] == key[1] && slot.key[2] == key[2] {
                    out[w.id as usize] = slot.hash;
                    continue;
                }
            }
            batch.push(w);
            if batch.len() == BATCH {
                flush(&mut batch, &mut memo, out);
            }
        }
        flush(&mut batch, &mut memo, out);
    });
}

fn term_params() -> blake2b_simd::Params {
    let mut params = blake2b_simd::Params::new();
    params.hash_length(8);
    params
}

/// The hash of an exact identifier that is likely to come again soon: an
/// event's session, app, user and invocation, a record's correlation. Such
/// identifiers repeat from record to record (a session's events come
/// together, an app and a handful of users recur throughout), so the last
/// few hundred are remembered per thread; an id that is new every record
/// is hashed with [`term_hash`] instead, and never displaces them.
pub fn ident_hash(key: &str) -> u64 {
    if key.len() > IDENT_BYTES {
        return term_hash(key);
    }
    IDENT_CACHE.with(|cache| cache.borrow_mut().hash(key))
}

/// Identifiers longer than this are hashed every time (ids and sessions
/// are mostly far shorter).
const IDENT_BYTES: usize = 40;
const IDENT_SLOTS: usize = 1 << 10;

/// A direct-mapped cache: each identifier has one slot, chosen by a fast
/// hash of its bytes, holding the last identifier that landed there. Keys
/// live inline, so a miss allocates nothing; 1,024 slots of 56 bytes stay
/// in the core's cache.
struct IdentCache {
    slots: Vec<IdentSlot>,
    pick: ahash::RandomState,
}

#[derive(Clone, Copy)]
struct IdentSlot {
    len: u8,
    key: [u8; IDENT_BYTES],
    hash: u64,
}

impl IdentCache {
    fn new() -> IdentCache {
        // len 0 never matches: an empty key is never an identifier.
        let empty = IdentSlot { len: 0, key: [0; IDENT_BYTES], hash: 0 };
        IdentCache { slots: vec![empty; IDENT_SLOTS], pick: ahash::RandomState::new() }
    }

    fn hash(&mut self, key: &str) -> u64 {
        if let Some(hash) = self.get(key.as_bytes()) {
            return hash;
        }
        let hash = term_hash(key);
        self.put(key.as_bytes(), hash);
        hash
    }

    fn spot(&self, key: &[u8]) -> usize {
        self.pick.hash_one(key) as usize & (IDENT_SLOTS - 1)
    }

    /// The remembered hash of `key` (at most `IDENT_BYTES` long).
    fn get(&self, key: &[u8]) -> Option<u64> {
        let slot = &self.slots[self.spot(key)];
        let held = !key.is_empty() && usize::from(slot.len) == key.len() && &slot.key[..key.len()] == key;
        held.then_some(slot.hash)
    }

    fn put(&mut self, key: &[u8], hash: u64) {
        let at = self.spot(key);
        let slot = &mut self.slots[at];
        slot.len = key.len() as u8;
        slot.key[..key.len()].copy_from_slice(key);
        slot.hash = hash;
    }
}

/// Identifier hashes a builder needs, computed many at a time. Most of a
/// record's identifiers are new (its id always, a ref often): each cost a
/// BLAKE2b of its own, 7 % of a stream build's CPU. Hashed four at a time
/// (as `term_hashes` does) they cost about 60 % of that. A recurring
/// identifier that the per-thread cache holds is answered at once; the
/// rest wait in a batch until the caller `flush`es it, and the recurring
/// ones among them are remembered then.
#[derive(Default)]
pub struct IdentBatch {
    /// The waiting keys' bytes, one after another.
    keys: Vec<u8>,
    /// Per waiting key: the caller's place for its hash, where its bytes
    /// end in `keys`, and whether the cache should remember it.
    waiting: Vec<(usize, usize, bool)>,
}

impl IdentBatch {
    /// Keys past which a batch is worth hashing (four lanes, sixteen times).
    pub const FULL: usize = 64;

    /// The hash of `key` now, when it `recurs` and the cache holds it; else
    /// `None`, and the hash is handed to `flush`'s caller for place `at`.
    pub fn hash_or_wait(&mut self, key: &str, at: usize, recurs: bool) -> Option<u64> {
        let remember = recurs && key.len() <= IDENT_BYTES;
        if remember {
            if let Some(hash) = IDENT_CACHE.with(|cache| cache.borrow().get(key.as_bytes())) {
                return Some(hash);
            }
        }
        self.keys.extend_from_slice(key.as_bytes());
        self.waiting.push((at, self.keys.len(), remember));
        None
    }

    pub fn is_full(&self) -> bool {
        self.waiting.len() >= Self::FULL
    }

    /// Hash every waiting key, giving each hash to `put` with its place.
    pub fn flush(&mut self, mut put: impl FnMut(usize, u64)) {
        if self.waiting.is_empty() {
            return;
        }
        let params = term_params();
        let mut start = 0;
        let mut jobs = Vec::with_capacity(self.waiting.len());
        for &(_, end, _) in &self.waiting {
            jobs.push(blake2b_simd::many::HashManyJob::new(&params, &self.keys[start..end]));
            start = end;
        }
        blake2b_simd::many::hash_many(jobs.iter_mut());
        IDENT_CACHE.with(|cache| {
            let mut cache = cache.borrow_mut();
            let mut start = 0;
            for (&(at, end, remember), job) in self.waiting.iter().zip(&jobs) {
                let hash = u64::from_le_bytes(job.to_hash().as_bytes().try_into().expect("an 8-byte digest"));
                put(at, hash);
                if remember {
                    cache.put(&self.keys[start..end], hash);
                }
                start = end;
            }
        });
        self.keys.clear();
        self.waiting.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_term_hash_is_blake2b_64() {
        // hashlib.blake2b(b"hello", digest_size=8).digest() read little-endian.
        assert_eq!(term_hash("hello"), u64::from_le_bytes([167, 182, 237, 168, 1, 229, 52, 125]));
    }

    /// The memo's key of a term of at most 23 bytes (see `Wanted`).
    fn memo_key(term: &str) -> Option<[u64; 3]> {
        let b = term.as_bytes();
        (1..24).contains(&b.len()).then(|| {
            let mut buf = [0u8; 24];
            buf[..b.len()].copy_from_slice(b);
            buf[23] = b.len() as u8;
            [0, 8, 16].map(|i| u64::from_le_bytes(buf[i..i + 8].try_into().unwrap()))
        })
    }

    #[test]
    fn remembered_term_hashes_are_the_hashes_however_terms_share_slots() {
        // Short and long terms, NULs, and the 23/24-byte edge; asked for in
        // three rounds, each term at three spots (its own, one all share,
        // and one a neighbour's), more terms than a batch.
        let mut terms: Vec<String> = (0..500).map(|i| format!("term{i}")).collect();
        terms.extend(["a", "a\0", "\0a", "", &"x".repeat(23), &"x".repeat(24), &"y".repeat(300)].map(String::from));
        for round in 0..3u32 {
            for spot_of in [|i: u32| i * 7919, |_: u32| 3, |i: u32| i / 2] {
                let wanted = terms.iter().enumerate().map(|(i, t)| Wanted {
                    id: i as u32,
                    spot: spot_of(i as u32).wrapping_add(round),
                    memo_key: memo_key(t),
                });
                let mut out = vec![0; terms.len()];
                term_hashes(wanted, |id| terms[id as usize].as_bytes(), &mut out);
                for (t, h) in terms.iter().zip(&out) {
                    assert_eq!(*h, term_hash(t), "{t:?} round {round}");
                }
            }
        }
    }

    #[test]
    fn batched_identifier_hashes_are_the_hashes_cached_or_not() {
        // Ids never seen, recurring keys met again before and after their
        // batch is hashed, keys past the cache's length, the empty key, and
        // more keys than a batch; every place gets its key's true hash.
        let mut keys: Vec<(String, bool)> = Vec::new();
        for i in 0..300 {
            keys.push((format!("evt-{i:07}"), false));
            keys.push((format!("corr-{}", i / 7), true));
            if i % 50 == 0 {
                keys.push(("z".repeat(IDENT_BYTES + 1 + i % 3), true));
                keys.push((String::new(), i % 100 == 0));
            }
        }
        let mut batch = IdentBatch::default();
        let mut out = vec![None; keys.len()];
        for (at, (key, recurs)) in keys.iter().enumerate() {
            if let Some(hash) = batch.hash_or_wait(key, at, *recurs) {
                out[at] = Some(hash);
            }
            if batch.is_full() || at % 97 == 0 {
                batch.flush(|at, hash| out[at] = Some(hash));
            }
        }
        batch.flush(|at, hash| out[at] = Some(hash));
        for ((key, _), hash) in keys.iter().zip(&out) {
            assert_eq!(*hash, Some(term_hash(key)), "{key:?}");
        }
        // The recurring keys were remembered: asked again, the last one is
        // answered at once. (Only the last is sure to be held: the cache's
        // slots are picked by a randomly keyed hash, so an earlier key may
        // have been displaced by a later one.)
        assert_eq!(keys.last().map(|k| k.0.as_str()), Some("corr-42"));
        assert_eq!(batch.hash_or_wait("corr-42", 0, true), Some(term_hash("corr-42")));
        assert_eq!(batch.hash_or_wait("evt-0000003", 0, false), None);
    }

    #[test]
    fn a_cached_identifier_hash_is_the_hash_however_slots_are_shared() {
        // Far more keys than slots, each asked for twice in a row and again
        // after thousands of others: every answer is the true hash.
        let keys: Vec<String> = (0..5_000).map(|i| format!("session-{i}")).collect();
        for round in 0..2 {
            for k in &keys {
                assert_eq!(ident_hash(k), term_hash(k), "round {round}");
                assert_eq!(ident_hash(k), term_hash(k));
            }
        }
        let long = "x".repeat(IDENT_BYTES + 1);
        assert_eq!(ident_hash(&long), term_hash(&long));
        let at_bound = "y".repeat(IDENT_BYTES);
        assert_eq!(ident_hash(&at_bound), term_hash(&at_bound));
        assert_eq!(ident_hash(&at_bound), term_hash(&at_bound));
        assert_eq!(ident_hash(""), term_hash(""));
    }
}
