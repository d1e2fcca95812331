//! A segment's vocabulary: each term's local id, in order of first appearance.

/// A segment's terms by local id, in one arena; the table holds where
/// each term lies in the arena (and its id), so a lookup touches the table
/// and one slice of the arena, not a heap object per term (the lookup is
/// most of a record's cost, and memory-bound).
#[derive(Default)]
pub(super) struct Vocab {
    table: hashbrown::HashTable<Entry>,
    hasher: ahash::RandomState,
    /// Term t is `bytes[starts[t]..starts[t + 1]]`.
    starts: Vec<usize>,
    bytes: Vec<u8>,
}

/// A term in the table: its place in the arena beside its id, so that a
/// probe compares lengths without a load, and bytes after one (through
/// `starts` it was a load more, a cache miss for a rare term).
#[derive(Clone, Copy)]
struct Entry {
    start: usize,
    len: u32,
    id: u32,
}

impl Entry {
    #[inline]
    fn term<'v>(&self, bytes: &'v [u8]) -> &'v [u8] {
        &bytes[self.start..self.start + self.len as usize]
    }
}

fn term_of<'v>(bytes: &'v [u8], starts: &[usize], t: u32) -> &'v [u8] {
    &bytes[starts[t as usize]..starts[t as usize + 1]]
}

/// Slice equality without a call to memcmp, which costs more than the
/// comparison itself for terms a few bytes long (most of them).
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        if x != y {
            return false;
        }
    }
    ca.remainder().iter().zip(cb.remainder()).all(|(x, y)| x == y)
}

impl Vocab {
    /// How many terms it holds.
    pub(super) fn len(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    /// Term `t`'s bytes.
    pub(super) fn term(&self, t: u32) -> &[u8] {
        term_of(&self.bytes, &self.starts, t)
    }

    /// The id of `token`, and whether it is new. Ids count up from 0.
    #[inline]
    pub(super) fn intern(&mut self, token: &str) -> (u32, bool) {
        self.intern_bytes(token.as_bytes())
    }

    #[inline]
    pub(super) fn intern_bytes(&mut self, token: &[u8]) -> (u32, bool) {
        if self.starts.is_empty() {
            self.starts.push(0);
        }
        // Hashed as bytes, the same way the table rehashes what it holds.
        let h = self.hasher.hash_one(token);
        let bytes = &self.bytes;
        let len = token.len();
        if let Some(e) = self.table.find(h, |e| e.len as usize == len && same_bytes(e.term(bytes), token)) {
            return (e.id, false);
        }
        // A term lies within one record's line (at most 1 MiB).
        let entry = Entry {
            start: self.bytes.len(),
            len: u32::try_from(len).expect("a term shorter than 4 GiB"),
            id: (self.starts.len() - 1) as u32,
        };
        self.bytes.extend_from_slice(token);
        self.starts.push(self.bytes.len());
        let (hasher, bytes) = (&self.hasher, &self.bytes);
        self.table.insert_unique(h, entry, |e| hasher.hash_one(e.term(bytes)));
        (entry.id, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vocabulary_gives_each_term_one_id_however_it_grows() {
        let mut v = Vocab::default();
        let terms: Vec<String> = (0..50_000).map(|i| format!("t{i}")).collect();
        for (i, t) in terms.iter().enumerate() {
            assert_eq!(v.intern(t), (i as u32, true));
        }
        for (i, t) in terms.iter().enumerate().rev() {
            assert_eq!(v.intern(t), (i as u32, false));
        }
    }
}
