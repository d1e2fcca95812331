//! Records -> the arrays of one index segment, exactly as the plain
//! `SegmentBuilder` (`recall/index/segment.py`) lays them out, so a segment
//! built here is byte-for-byte the one the plain path builds:
//!
//! * terms get local ids in order of first appearance (a record's text,
//!   then kind, system, actor and ref, then title); `term_hash` is their
//!   64-bit BLAKE2b hashes sorted, `term_local` the local id at each place;
//! * postings are CSR by local id (`starts`), records ascending within a
//!   term; `meta` is `min(count, 63) << 2 | weight code` (1 text, 2 the
//!   short fields, 3 title: the strongest field the term appears in), with
//!   the exact count of every posting that reaches 63 in `big_pos` /
//!   `big_count`;
//! * `ident_hash` / `ident_rec`: the hashes of each record's folded id, ref
//!   and correlation (each distinct non-empty one once), sorted;
//! * one 52-byte `COLUMNS` row per record, and the ids as a JSON array
//!   written the way msgspec writes it.
//!
//! Kind codes here are local to the builder (its `kinds`, in order of first
//! appearance); the index maps them onto its own table when it takes the
//! segment.

use ahash::AHashMap;

use std::borrow::Cow;

use crate::events::{self, Described, Row};
use crate::hashes::{ident_hash, IdentBatch};
use crate::gotime::{self, Instant};
use crate::json::{parse_record, Record};
use crate::lines::{next_line, trim_space, HOLD_LIMIT, MAX_LINE_BYTES};
use crate::tokenize::{fold, Tokenizer};

mod parts;
mod terms;
mod vocab;

pub use parts::{feed_rows, RowsFed};
use terms::Terms;

pub const COUNT_CAP: u32 = 63;
const TEXT: u8 = 1;
const FIELDS: u8 = 2;
const TITLE: u8 = 3;
/// Bytes per `COLUMNS` row (packed little-endian, in the dtype's order).
pub const ROW_BYTES: usize = 52;
/// Where a row's kind code lies (after two times and the schema).
const KIND_AT: usize = 28;

pub use crate::hashes::term_hash;

/// Where a fed buffer comes from.
#[derive(Clone, Copy, Debug)]
pub struct Origin {
    /// The file offset of the buffer's first byte.
    pub base_offset: u64,
    pub file_no: i32,
    /// The build time, for records without observed_at.
    pub built_at: Instant,
}

/// What one `feed` did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fed {
    /// Where in the buffer the next unconsumed line starts.
    pub pos: usize,
    /// Lines consumed: records, failed and blank ones.
    pub lines: u64,
    pub records: u64,
    pub failed: u64,
    pub latest: Option<Instant>,
}

/// The arrays of a sealed segment (see the module docs).
pub struct Sealed {
    pub count: u32,
    pub term_hash: Vec<u64>,
    pub term_local: Vec<i32>,
    pub starts: Vec<i64>,
    pub recs: Vec<u32>,
    pub meta: Vec<u8>,
    pub big_pos: Vec<i64>,
    pub big_count: Vec<i64>,
    pub ident_hash: Vec<u64>,
    pub ident_rec: Vec<i64>,
    pub columns: Vec<u8>,
    pub ids: Vec<u8>,
    pub kinds: Vec<String>,
}

/// Accumulates the records of one segment, numbered from `base`. A segment
/// may span files (each feed says which file its lines come from).
pub struct Builder {
    base: u64,
    count: u32,
    terms: Terms,
    tokenizer: Tokenizer,
    // Postings in record order: the term, and its occurrences << 2 | its
    // field code (a record's line is at most 1 MiB, so far fewer than 2^30
    // occurrences); record r's are `rec_starts[r]..rec_starts[r + 1]`.
    p_term: Vec<u32>,
    p_meta: Vec<u32>,
    rec_starts: Vec<usize>,
    // Whether the arrays were given room for the rest of the segment.
    reserved: bool,
    // (hash, record); a hash `ident_batch` still computes is 0 until its flush.
    idents: Vec<(u64, i64)>,
    ident_batch: IdentBatch,
    // Identifiers came from more than a record's own fields, so a pair can
    // repeat (an app equal to a session, say): kept once at seal.
    shared_idents: bool,
    columns: Vec<u8>,
    ids: Vec<u8>,
    kinds: Vec<String>,
    kind_codes: AHashMap<String, i32>,
    // Scratch of `add`: the record's text tokens on the fast path, as
    // (where the run stopped, its place among the queued tokens).
    text_runs: Vec<(usize, usize)>,
}

impl Builder {
    pub fn new(base: u64) -> Builder {
        Builder {
            base,
            count: 0,
            terms: Terms::default(),
            tokenizer: Tokenizer::default(),
            p_term: Vec::new(),
            p_meta: Vec::new(),
            rec_starts: vec![0],
            reserved: false,
            idents: Vec::new(),
            ident_batch: IdentBatch::default(),
            shared_idents: false,
            columns: Vec::new(),
            ids: vec![b'['],
            kinds: Vec::new(),
            kind_codes: AHashMap::new(),
            text_runs: Vec::new(),
        }
    }

    pub fn count(&self) -> u32 {
        self.count
    }

    /// Give the arrays room for `more` records like the ones added so far,
    /// once enough of them say what that is: the arrays of a segment then
    /// grow once, instead of doubling their way up and copying all they
    /// hold each time. Room the records never use is never touched, so it
    /// costs address space, not memory.
    pub fn reserve_records(&mut self, more: u64) {
        const SAMPLE: u32 = 1024;
        if self.reserved || self.count < SAMPLE {
            return;
        }
        self.reserved = true;
        // A segment is 65,536 records; a caller may not say how many are to come.
        let more = more.min(1 << 17) as usize;
        let n = self.count as usize;
        let ahead = |len: usize| len * more / n * 5 / 4 + 64;
        self.p_term.reserve_exact(ahead(self.p_term.len()));
        self.p_meta.reserve_exact(ahead(self.p_meta.len()));
        self.rec_starts.reserve_exact(more);
        self.idents.reserve_exact(ahead(self.idents.len()));
        self.columns.reserve_exact(more * ROW_BYTES);
        self.ids.reserve_exact(ahead(self.ids.len()));
    }

    /// Consume the complete lines of `buf` from `start` on (the byte at
    /// `buf[0]` is at `at.base_offset` of file number `at.file_no`), adding
    /// at most `max_records` records and consuming at most `max_lines` lines;
    /// a tail without a newline is left for the caller. A record without
    /// observed_at gets `at.built_at`.
    pub fn feed(&mut self, buf: &[u8], start: usize, at: Origin, max_records: u64,
                max_lines: u64) -> Fed {
        let mut fed = Fed { pos: start, ..Fed::default() };
        self.reserve_records(max_records);
        while fed.records < max_records && fed.lines < max_lines {
            let Some(line) = next_line(buf, fed.pos) else { break };
            fed.pos += line.size;
            fed.lines += 1;
            if line.size > HOLD_LIMIT {
                fed.failed += 1;
                continue;
            }
            let trimmed = trim_space(&buf[line.start..line.start + line.size]);
            if trimmed.is_empty() {
                continue;
            }
            if trimmed.len() > MAX_LINE_BYTES {
                fed.failed += 1;
                continue;
            }
            match parse_record(trimmed) {
                Ok(rec) => {
                    fed.latest = Some(fed.latest.map_or(rec.event_time, |l| l.max(rec.event_time)));
                    let offset = at.base_offset + line.start as u64;
                    self.add(&rec, at, offset, line.size as u32);
                    fed.records += 1;
                }
                Err(_) => fed.failed += 1,
            }
        }
        fed
    }

    fn kind_code(&mut self, kind: &str) -> i32 {
        if let Some(&c) = self.kind_codes.get(kind) {
            return c;
        }
        let c = self.kinds.len() as i32;
        self.kinds.push(kind.to_owned());
        self.kind_codes.insert(kind.to_owned(), c);
        c
    }

    /// Add one parsed record whose line starts at `offset` and is `size` bytes long.
    pub fn add(&mut self, rec: &Record<'_>, at: Origin, offset: u64, size: u32) {
        let local = self.count;
        let number = self.base + local as u64;
        // The text's tokens, and where each one's run stopped (see below).
        let (terms, runs) = (&mut self.terms, &mut self.text_runs);
        terms.begin();
        runs.clear();
        self.tokenizer.tokens_ended(&rec.text, |t, end| {
            if end != usize::MAX {
                runs.push((end, terms.queued()));
            }
            terms.queue(t, TEXT);
        });
        let fields: [(&str, u8); 4] =
            [(&rec.kind, FIELDS), (&rec.system, FIELDS), (&rec.actor, FIELDS), (&rec.reference, FIELDS)];
        for (text, code) in fields {
            self.tokenizer.tokens(text, |t| terms.queue(t, code));
        }
        // A title is mostly the text's beginning, cut short: a token of the
        // text whose separator lies within the prefix the two share is a
        // token of the title, in the same order, and its term is known. The
        // title is tokenized from the last such separator on (no token
        // spans a separator). A fifth of a record's lookups saved.
        let (title, text) = (rec.title.as_bytes(), rec.text.as_bytes());
        let prefix = title.iter().zip(text).take_while(|(a, b)| a == b).count();
        let shared = runs.iter().take_while(|&&(end, _)| end < prefix).count();
        let from = if shared > 0 { runs[shared - 1].0 } else { 0 };
        let title_at = terms.queued();
        self.tokenizer.tokens(&rec.title[from..], |t| terms.queue(t, TITLE));
        terms.resolve();
        terms.count(local, title_at, &runs[..shared]);
        let length = (terms.queued() + shared) as u32;
        for &(tid, n, code) in &self.terms.current {
            self.p_term.push(tid);
            self.p_meta.push(n << 2 | u32::from(code));
        }
        self.rec_starts.push(self.p_term.len());

        let keys = [fold(&rec.id), fold(&rec.reference), fold(&rec.correlation)];
        for (i, key) in keys.iter().enumerate() {
            if !key.is_empty() && !keys[..i].contains(key) {
                // An id is new with every record; a ref or a correlation recurs.
                let hash = self.ident_batch.hash_or_wait(key, self.idents.len(), i > 0);
                self.idents.push((hash.unwrap_or(0), number as i64));
            }
        }
        if self.ident_batch.is_full() {
            self.hash_idents();
        }

        let kind = self.kind_code(&rec.kind);
        let observed = rec.observed_at.unwrap_or(at.built_at);
        let row = &mut self.columns;
        row.extend_from_slice(&rec.event_time.sec.to_le_bytes());
        row.extend_from_slice(&(rec.event_time.nsec as i32).to_le_bytes());
        row.extend_from_slice(&observed.sec.to_le_bytes());
        row.extend_from_slice(&(observed.nsec as i32).to_le_bytes());
        row.extend_from_slice(&(rec.schema as i32).to_le_bytes());
        row.extend_from_slice(&kind.to_le_bytes());
        row.extend_from_slice(&at.file_no.to_le_bytes());
        row.extend_from_slice(&(offset as i64).to_le_bytes());
        row.extend_from_slice(&(size as i32).to_le_bytes());
        row.extend_from_slice(&(length as i32).to_le_bytes());

        if local > 0 {
            self.ids.push(b',');
        }
        json_string(&mut self.ids, &rec.id);
        self.count += 1;
    }

    /// Add the record of one event-log row (see [`crate::events`]): its line
    /// is `size` bytes long (the size column), its offset the row's seq, and `more` are
    /// exact identifiers beyond the record's own. Returns whether a record
    /// was added; a row the line format refuses counts as failed.
    pub fn add_event(&mut self, row: &Row<'_>, d: &Described, size: usize, at: Origin,
                     more: [&str; 4]) -> Option<Instant> {
        let when = events::instant_of(row.at_us);
        if row.id.is_empty() || when == gotime::ZERO_TIME || !gotime::printable(when)
            || size > HOLD_LIMIT || size - 1 > MAX_LINE_BYTES {
            return None;
        }
        let rec = Record {
            schema: 2,
            id: Cow::Borrowed(row.id),
            kind: Cow::Borrowed(d.kind),
            event_time: when,
            observed_at: Some(when),
            system: Cow::Borrowed(row.app),
            reference: Cow::Borrowed(""),
            correlation: Cow::Borrowed(row.session),
            title: Cow::Borrowed(&d.title),
            text: Cow::Borrowed(&d.text),
            actor: Cow::Borrowed(row.author),
            revision: Cow::Borrowed(""),
        };
        let number = self.base + self.count as u64;
        self.add(&rec, at, row.seq as u64, size as u32);
        for key in more {
            let key = fold(key);
            if !key.is_empty() {
                self.idents.push((ident_hash(&key), number as i64));
                self.shared_idents = true;
            }
        }
        Some(when)
    }

    /// Fill in the identifier hashes still waiting in `ident_batch`.
    fn hash_idents(&mut self) {
        let idents = &mut self.idents;
        self.ident_batch.flush(|at, hash| idents[at].0 = hash);
    }

    /// The segment's arrays. The builder is spent afterwards.
    pub fn seal(mut self) -> Sealed {
        self.hash_idents();
        let n_terms = self.terms.vocab.len();
        // The vocabulary and the record scratch go before the postings'
        // arrays come: a sealing builder's peak is its postings twice over.
        let hashes = self.terms.vocab.term_hashes();
        drop(std::mem::take(&mut self.terms));
        let mut starts = vec![0i64; n_terms + 1];
        for &t in &self.p_term {
            starts[t as usize + 1] += 1;
        }
        for t in 0..n_terms {
            starts[t + 1] += starts[t];
        }
        let total = self.p_term.len();
        let mut next: Vec<i64> = starts[..n_terms].to_vec();
        let mut recs = vec![0u32; total];
        let mut meta = vec![0u8; total];
        // Saturated counts are rare: gather them, then put them in position order.
        let mut big: Vec<(i64, i64)> = Vec::new();
        // Records were added in order, so each term's postings come out ascending.
        for (local, span) in self.rec_starts.windows(2).enumerate() {
            // Record numbers are stored as uint32, as the plain path's astype does.
            let rec = (self.base + local as u64) as u32;
            for k in span[0]..span[1] {
                let t = self.p_term[k] as usize;
                let at = next[t] as usize;
                next[t] += 1;
                recs[at] = rec;
                let (count, code) = (self.p_meta[k] >> 2, (self.p_meta[k] & 3) as u8);
                meta[at] = ((count.min(COUNT_CAP) << 2) as u8) | code;
                if count >= COUNT_CAP {
                    big.push((at as i64, count as i64));
                }
            }
        }
        drop((self.p_term, self.p_meta, self.rec_starts));
        big.sort_unstable();
        let (big_pos, big_count) = big.into_iter().unzip();
        let mut order: Vec<u32> = (0..n_terms as u32).collect();
        order.sort_unstable_by_key(|&t| hashes[t as usize]);
        self.idents.sort_unstable();
        if self.shared_idents {
            self.idents.dedup();
        }
        self.ids.push(b']');
        Sealed {
            count: self.count,
            term_hash: order.iter().map(|&t| hashes[t as usize]).collect(),
            term_local: order.iter().map(|&t| t as i32).collect(),
            starts,
            recs,
            meta,
            big_pos,
            big_count,
            ident_hash: self.idents.iter().map(|p| p.0).collect(),
            ident_rec: self.idents.iter().map(|p| p.1).collect(),
            columns: self.columns,
            ids: self.ids,
            kinds: self.kinds,
        }
    }
}

/// A JSON string as msgspec writes one: `"` and `\` escaped, the control
/// characters with a short escape where JSON has one, else `\u00xx`;
/// everything else (DEL and non-ASCII included) as it is.
pub fn json_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let b = s.as_bytes();
    let mut from = 0;
    for (i, &c) in b.iter().enumerate() {
        let short = match c {
            b'"' => b'"',
            b'\\' => b'\\',
            0x08 => b'b',
            0x0c => b'f',
            b'\n' => b'n',
            b'\r' => b'r',
            b'\t' => b't',
            0x00..=0x1f => 0,
            _ => continue,
        };
        out.extend_from_slice(&b[from..i]);
        out.push(b'\\');
        if short != 0 {
            out.push(short);
        } else {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"u00");
            out.push(HEX[(c >> 4) as usize]);
            out.push(HEX[(c & 15) as usize]);
        }
        from = i + 1;
    }
    out.extend_from_slice(&b[from..]);
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: Instant = Instant { sec: 1_700_000_000, nsec: 0 };

    fn at(base_offset: u64) -> Origin {
        Origin { base_offset, file_no: 3, built_at: T0 }
    }

    fn build(lines: &str) -> (Fed, Sealed) {
        let mut b = Builder::new(0);
        let fed = b.feed(lines.as_bytes(), 0, at(0), u64::MAX, u64::MAX);
        (fed, b.seal())
    }

    #[test]
    fn lines_blank_failed_and_a_partial_tail() {
        let tail = r#"{"schema":2,"id":"c""#;
        let buf = [
            r#"{"schema":1,"id":"a","event_time":"2026-05-02T10:00:00Z","body":"x y x"}"#, "\n",
            "   \n",
            "not json\n",
            r#"{"schema":2,"id":"b","event_time":"2026-05-02T11:00:00Z","title":"X"}"#, "\n",
            tail,
        ]
        .concat();
        let (fed, s) = build(&buf);
        assert_eq!((fed.records, fed.failed), (2, 1));
        assert_eq!(fed.pos, buf.len() - tail.len());
        assert_eq!(s.count, 2);
        assert_eq!(s.ids, br#"["a","b"]"#);
        assert_eq!(s.kinds, ["event"]);
        assert_eq!(s.columns.len(), 2 * ROW_BYTES);
        // Terms: x (rec 0 twice as text, rec 1 as title), y, event.
        assert_eq!(s.starts, [0, 2, 3, 5]);
        let x = s.term_local.iter().position(|&t| t == 0).unwrap();
        assert_eq!(s.term_hash[x], term_hash("x"));
        assert_eq!(&s.recs[0..2], &[0, 1]);
        assert_eq!(&s.meta[0..2], &[2 << 2 | 1, 1 << 2 | 3]);
    }

    #[test]
    fn a_limit_stops_after_that_many_records() {
        let line = r#"{"schema":1,"id":"a","event_time":"2026-05-02T10:00:00Z"}"#;
        let buf = format!("{line}\n{line}\n{line}\n");
        let mut b = Builder::new(10);
        let fed = b.feed(buf.as_bytes(), 0, at(100), 2, 10);
        assert_eq!((fed.records, fed.lines, fed.pos), (2, 2, 2 * (line.len() + 1)));
        let fed = b.feed(buf.as_bytes(), fed.pos, at(100), 5, 10);
        assert_eq!((fed.records, fed.pos), (1, buf.len()));
        let fed = b.feed(buf.as_bytes(), 0, at(100), 5, 1);
        assert_eq!((fed.records, fed.lines, fed.pos), (1, 1, line.len() + 1));
        let s = b.seal();
        assert_eq!(s.ident_rec, [10, 11, 12, 13]);
    }

    #[test]
    fn a_title_sharing_the_texts_beginning_counts_as_one_tokenized_alone() {
        // A tab ahead of the title shares nothing with the text and adds no
        // token: the title is then tokenized whole, the reference.
        let cases = [
            ("w1 w2 w3 w4", "w1 w2…"),
            ("w1 w2 w3", "w1 w2 w3"),
            ("abc def", "abc de…"),
            ("Alpha Beta-gamma delta", "Alpha Beta-g…"),
            ("a-b- c--d x", "a-b- c--…"),
            ("x.y z", "x.y"),
            ("ab cd", "ab cdx"),
            ("w1 w2 w3", "w1 w2x…"),
            ("one two", "one two three"),
            ("é w1 w2", "é w1…"),
            ("w1 w2 é w3", "w1 w2 é…"),
            ("w1, w2", "w1,"),
            ("w1 w2", "tool: call"),
            ("", "w1"),
            ("w1 w2", ""),
        ];
        for (text, title) in cases {
            let sealed = |title: &str| {
                let mut b = Builder::new(0);
                let rec = Record {
                    schema: 2,
                    id: Cow::Borrowed("a"),
                    kind: Cow::Borrowed("event"),
                    event_time: T0,
                    observed_at: None,
                    system: Cow::Borrowed("s"),
                    reference: Cow::Borrowed(""),
                    correlation: Cow::Borrowed(""),
                    title: Cow::Owned(title.to_owned()),
                    text: Cow::Borrowed(text),
                    actor: Cow::Borrowed("w1"),
                    revision: Cow::Borrowed(""),
                };
                b.add(&rec, at(0), 0, 10);
                b.seal()
            };
            let (shared, alone) = (sealed(title), sealed(&format!("\t{title}")));
            assert_eq!((&shared.term_hash, &shared.term_local, &shared.starts),
                       (&alone.term_hash, &alone.term_local, &alone.starts), "{text:?} / {title:?}");
            assert_eq!((&shared.recs, &shared.meta, &shared.columns), (&alone.recs, &alone.meta, &alone.columns),
                       "{text:?} / {title:?}");
        }
    }

    #[test]
    fn saturated_counts_are_kept_exactly() {
        let words = "w ".repeat(70);
        let (_, s) = build(&format!(
            "{{\"schema\":1,\"id\":\"a\",\"event_time\":\"2026-05-02T10:00:00Z\",\"body\":\"{words}\"}}\n"
        ));
        assert_eq!(s.big_pos, [0]);
        assert_eq!(s.big_count, [70]);
        assert_eq!(s.meta[0], (63 << 2 | 1) as u8);
    }

    #[test]
    fn ids_are_written_as_msgspec_writes_them() {
        let mut out = Vec::new();
        json_string(&mut out, "a\"b\\c\u{0}\u{1f}\u{7f}\u{8}\t\n\u{c}\r\u{b}é\u{2028}");
        assert_eq!(out, "\"a\\\"b\\\\c\\u0000\\u001f\u{7f}\\b\\t\\n\\f\\r\\u000bé\u{2028}\"".as_bytes());
    }
}
