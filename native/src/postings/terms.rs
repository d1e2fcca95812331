//! A segment's terms as a builder counts them: the vocabulary, and one
//! record's tokens looked up together and counted (see `Builder::add`).

use super::vocab::{self, Key, Vocab};
use super::TITLE;

/// The vocabulary of one segment and the scratch that counts one record's terms.
#[derive(Default)]
pub(super) struct Terms {
    pub(super) vocab: Vocab,
    /// Per term: 1 + the local number of the last record that used it, and
    /// where the term sits in `current` while that says so.
    marks: Vec<(u32, u32)>,
    /// The record being added: (term, occurrences, strongest field code).
    pub(super) current: Vec<(u32, u32, u8)>,
    /// The record's tokens, in order, keyed (their slots asked for) before
    /// any is looked up (see `vocab`): each one's key, field code and where
    /// its bytes end in `spelled`, where they lie one after another; then
    /// their terms, in `ids`.
    queued: Vec<(Key, u8, u32)>,
    spelled: Vec<u8>,
    ids: Vec<u32>,
}

impl Terms {
    /// Start a record.
    pub(super) fn begin(&mut self) {
        self.current.clear();
        self.queued.clear();
        self.spelled.clear();
    }

    /// Queue `token`, of the record's field `code`.
    #[inline]
    pub(super) fn queue(&mut self, token: &str, code: u8) {
        let key = self.vocab.key(token.as_bytes());
        self.vocab.prefetch(&key);
        self.spelled.extend_from_slice(token.as_bytes());
        let end = u32::try_from(self.spelled.len()).expect("a line shorter than 4 GiB");
        self.queued.push((key, code, end));
    }

    pub(super) fn queued(&self) -> usize {
        self.queued.len()
    }

    /// The terms of the queued tokens, in their order, into `ids`.
    pub(super) fn resolve(&mut self) {
        let Terms { vocab, queued, spelled, ids, .. } = self;
        ids.clear();
        let mut start = 0;
        for &(key, _, end) in queued.iter() {
            let token = &spelled[start..end as usize];
            start = end as usize;
            let (t, new) = vocab.intern_key(&key, token);
            if new {
                self.marks.push((0, 0));
            } else {
                // Its mark is read when the record is counted, after the lookups.
                vocab::prefetch_line(&self.marks[t as usize]);
            }
            ids.push(t);
        }
    }

    /// The id of `term` (from another builder's vocabulary).
    pub(super) fn intern(&mut self, term: &[u8]) -> u32 {
        let (t, new) = self.vocab.intern_bytes(term);
        if new {
            self.marks.push((0, 0));
        }
        t
    }

    /// Count the resolved tokens in `record`, in the order a record's
    /// tokens come: the text and the short fields (the first `title_at`
    /// queued), then the title: its run shared with the text (the queued
    /// text tokens at `shared`), then its tokens after that run.
    pub(super) fn count(&mut self, record: u32, title_at: usize, shared: &[(usize, usize)]) {
        for k in 0..title_at {
            self.touch_term(self.ids[k], record, self.queued[k].1);
        }
        for &(_, k) in shared {
            self.touch_term(self.ids[k], record, TITLE);
        }
        for k in title_at..self.ids.len() {
            self.touch_term(self.ids[k], record, TITLE);
        }
    }

    /// Count term `t` (already in the vocabulary) in `record`'s field `code`.
    #[inline]
    fn touch_term(&mut self, t: u32, record: u32, code: u8) {
        let mark = &mut self.marks[t as usize];
        if mark.0 == record + 1 {
            let c = &mut self.current[mark.1 as usize];
            c.1 += 1;
            c.2 = c.2.max(code);
        } else {
            *mark = (record + 1, self.current.len() as u32);
            self.current.push((t, 1, code));
        }
    }
}
