//! The stable 64-bit hash of terms and exact identifiers, and what spares
//! recomputing it: a BLAKE2b costs about 100 ns even for a short string,
//! and a record needs several.

use std::cell::RefCell;

use ahash::AHashMap;

/// The stable 64-bit term hash: BLAKE2b with an 8-byte digest, little-endian.
pub fn term_hash(term: &str) -> u64 {
    let digest = blake2b_simd::Params::new().hash_length(8).hash(term.as_bytes());
    u64::from_le_bytes(digest.as_bytes().try_into().expect("an 8-byte digest"))
}

/// Terms recur from segment to segment (Zipf), and a small catch-up meets
/// thousands of them at once: their hashes are remembered per thread. The
/// cache is dropped whole when it reaches its bound: 64k terms, about 4 MB
/// a thread (a full build, which meets millions, gains little from more).
const HASH_CACHE_MAX: usize = 1 << 16;

thread_local! {
    static HASH_CACHE: RefCell<AHashMap<Box<str>, u64>> = RefCell::new(AHashMap::new());
    static IDENT_CACHE: RefCell<IdentCache> = RefCell::new(IdentCache::new());
}

pub fn cached_term_hash(term: &str) -> u64 {
    HASH_CACHE.with(|cache| {
        let mut cache = cache.borrow_mut();
        if let Some(&h) = cache.get(term) {
            return h;
        }
        if cache.len() >= HASH_CACHE_MAX {
            cache.clear();
        }
        let h = term_hash(term);
        cache.insert(term.into(), h);
        h
    })
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
        let bytes = key.as_bytes();
        let at = self.pick.hash_one(bytes) as usize & (IDENT_SLOTS - 1);
        let slot = &mut self.slots[at];
        if !bytes.is_empty() && usize::from(slot.len) == bytes.len() && &slot.key[..bytes.len()] == bytes {
            return slot.hash;
        }
        let hash = term_hash(key);
        slot.len = bytes.len() as u8;
        slot.key[..bytes.len()].copy_from_slice(bytes);
        slot.hash = hash;
        hash
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
