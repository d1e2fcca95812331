//! A page of event-log rows indexed on two threads.
//!
//! Projecting an event and counting its terms is most of what a record
//! costs, and it needs nothing from the records before it. So a long run
//! of rows is cut in two: the builder takes the first half on the calling
//! thread while a *part* (a builder of its own, numbering from 0) takes the
//! second half on another; then the builder absorbs the part. Absorbing is
//! cheap: each of the part's terms is looked up once (not once a token),
//! its postings are renumbered in one pass.
//!
//! The segment comes out byte for byte as if every row had been added in
//! order on one thread: the part's terms, in their order of first
//! appearance within the part, are exactly the segment's new terms in
//! theirs (the part's records all come after the builder's); the same goes
//! for kinds; record numbers and identifiers move by the records before.

use std::sync::OnceLock;
use std::thread;

use super::{Builder, Origin, KIND_AT, ROW_BYTES};
use crate::events::{self, Row};
use crate::gotime::{self, Instant};

/// What feeding a run of rows did: (rows consumed, records, failed, the
/// latest event time, whether it stopped at a row only the plain path
/// projects; that row is then the one after those consumed).
pub type RowsFed = (usize, u64, u64, Option<Instant>, bool);

/// Fewer rows than this are not worth a second thread (a page is 10,000).
const SPLIT_ROWS: usize = 2_048;

fn two_cores() -> bool {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| thread::available_parallelism().map_or(1, |n| n.get())) >= 2
}

/// Add the records of `rows` (see [`RowsFed`]), on two threads when there
/// are enough rows and cores.
pub fn feed_rows(builder: &mut Builder, rows: &[Row<'_>], at: Origin) -> RowsFed {
    if rows.len() < SPLIT_ROWS || !two_cores() {
        return add_rows(builder, rows, at);
    }
    let (first, second) = rows.split_at(rows.len() / 2);
    let (a, (part, b)) = thread::scope(|scope| {
        let helper = scope.spawn(|| {
            let mut part = Builder::new(0);
            let fed = add_rows(&mut part, second, at);
            (part, fed)
        });
        let a = add_rows(builder, first, at);
        // A panic on the helper is raised here, where the caller catches it.
        (a, helper.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
    });
    if a.4 {
        // The plain path projects a row of the first half before anything
        // after it is added: the second half's records are dropped, to be
        // added again when the caller continues.
        return a;
    }
    builder.absorb(part);
    let latest = match (a.3, b.3) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    };
    (first.len() + b.0, a.1 + b.1, a.2 + b.2, latest, b.4)
}

/// Add the records of `rows` in order on this thread.
fn add_rows(builder: &mut Builder, rows: &[Row<'_>], at: Origin) -> RowsFed {
    let (mut records, mut failed, mut latest) = (0u64, 0u64, None::<Instant>);
    for (done, row) in rows.iter().enumerate() {
        let Some(d) = events::describe(row.content, row.author, row.delta) else {
            return (done, records, failed, latest, true);
        };
        let when = events::instant_of(row.at_us);
        // An unprintable time fails the row whatever the line's length.
        let size = if gotime::printable(when) { events::line_len(row, &d, when) } else { 0 };
        match builder.add_event(row, &d, size, at, [row.app, row.user, row.branch, row.invocation]) {
            Some(t) => {
                records += 1;
                latest = Some(latest.map_or(t, |l| l.max(t)));
            }
            None => failed += 1,
        }
    }
    (rows.len(), records, failed, latest, false)
}

impl Builder {
    /// Append the records of `part` after this builder's own.
    fn absorb(&mut self, mut part: Builder) {
        part.hash_idents();
        let first_posting = self.p_term.len();
        let vocab = &part.terms.vocab;
        let n_terms = vocab.len();
        let mut ours = Vec::with_capacity(n_terms);
        for t in 0..n_terms as u32 {
            let term = vocab.term(t);
            ours.push(self.terms.intern(term));
        }
        self.p_term.extend(part.p_term.iter().map(|&t| ours[t as usize]));
        self.p_meta.extend_from_slice(&part.p_meta);
        self.rec_starts.extend(part.rec_starts[1..].iter().map(|&p| p + first_posting));

        let shift = (self.base + u64::from(self.count)) as i64;
        self.idents.extend(part.idents.iter().map(|&(hash, rec)| (hash, rec + shift)));
        self.shared_idents |= part.shared_idents;

        let codes: Vec<i32> = part.kinds.iter().map(|k| self.kind_code(k)).collect();
        let from = self.columns.len();
        self.columns.extend_from_slice(&part.columns);
        for row in self.columns[from..].chunks_exact_mut(ROW_BYTES) {
            let field = &mut row[KIND_AT..KIND_AT + 4];
            let local = i32::from_le_bytes(field.try_into().expect("four bytes"));
            field.copy_from_slice(&codes[local as usize].to_le_bytes());
        }

        if part.count > 0 {
            if self.count > 0 {
                self.ids.push(b',');
            }
            // The part's ids, without its opening bracket.
            self.ids.extend_from_slice(&part.ids[1..]);
        }
        self.count += part.count;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::postings::Sealed;

    const T0: Instant = Instant { sec: 1_700_000_000, nsec: 0 };

    struct Owned {
        seq: i64,
        session: String,
        id: String,
        invocation: String,
        content: String,
        at_us: i64,
    }

    fn rows(n: i64) -> Vec<Owned> {
        let contents = [
            r#"{"role":"model","parts":[{"text":"words about the drill"}]}"#.to_owned(),
            r#"{"role":"user","parts":[{"text":"quoted \"drill\"\nsecond Line"}]}"#.to_owned(),
            r#"{"parts":[{"function_call":{"name":"search","args":{"q":"x"}}}]}"#.to_owned(),
            r#""just text""#.to_owned(),
        ];
        (1..=n)
            .map(|i| Owned {
                seq: i,
                session: format!("s{}", i * 7 % 300),
                id: if i % 97 == 0 { String::new() } else { format!("ev-{i}") },
                invocation: format!("inv-{}", i / 4),
                // New terms and a new kind appear only late, in a part.
                content: if i > n * 3 / 4 && i % 5 == 0 {
                    format!(r#"{{"parts":[{{"function_response":{{"name":"late","response":"t{i}"}}}}]}}"#)
                } else if i % 1_300 == 0 {
                    r#"{"parts":[{"function_call":{"name":7}}]}"#.to_owned() // declined
                } else {
                    contents[i as usize % contents.len()].clone()
                },
                at_us: 1_777_680_000_000_000 + i,
            })
            .collect()
    }

    fn row(o: &Owned) -> Row<'_> {
        Row { seq: o.seq, app: "app", user: "U1", session: &o.session, id: &o.id,
              invocation: &o.invocation, author: "model", branch: "", at_us: o.at_us,
              content: &o.content, delta: None }
    }

    /// Every row fed, declined ones skipped as the caller would (after the
    /// plain path projects them), by `feed` in runs of `run` rows.
    fn build(rows: &[Row<'_>], run: usize,
             feed: fn(&mut Builder, &[Row<'_>], Origin) -> RowsFed) -> (Sealed, u64, u64) {
        let at = Origin { base_offset: 0, file_no: 0, built_at: T0 };
        let mut b = Builder::new(5);
        let (mut records, mut failed, mut i) = (0, 0, 0);
        while i < rows.len() {
            let end = rows.len().min(i + run);
            let fed = feed(&mut b, &rows[i..end], at);
            records += fed.1;
            failed += fed.2;
            i += fed.0 + usize::from(fed.4);
        }
        (b.seal(), records, failed)
    }

    #[test]
    fn rows_fed_on_two_threads_seal_as_rows_fed_on_one() {
        let owned = rows(9_000);
        let rows: Vec<Row<'_>> = owned.iter().map(row).collect();
        let (one, r1, f1) = build(&rows, 3_000, add_rows);
        let (two, r2, f2) = build(&rows, 3_000, feed_rows);
        assert_eq!((r1, f1), (r2, f2));
        assert!(f1 > 0 && one.kinds.len() == 5);
        assert_eq!((one.count, &one.kinds), (two.count, &two.kinds));
        assert_eq!((&one.term_hash, &one.term_local, &one.starts), (&two.term_hash, &two.term_local, &two.starts));
        assert_eq!((&one.recs, &one.meta), (&two.recs, &two.meta));
        assert_eq!((&one.big_pos, &one.big_count), (&two.big_pos, &two.big_count));
        assert_eq!((&one.ident_hash, &one.ident_rec), (&two.ident_hash, &two.ident_rec));
        assert_eq!((&one.columns, &one.ids), (&two.columns, &two.ids));
    }
}
