//! The compiled indexing core of streamd.
//!
//! One call turns the bytes of a chunk of stream lines into what an index
//! segment is made of, doing per record what the plain Python path does
//! (`recall/records.py`, `recall/tokenize.py`, `recall/index/segment.py`)
//! with the same results, byte for byte:
//!
//! * [`lines`]: where lines end, which are too long, Go's `bytes.TrimSpace`;
//! * [`json`]: a line decoded as Go's encoding/json decodes a record;
//! * [`gotime`]: Go's RFC 3339 parser;
//! * [`unicode`]: the pinned Unicode tables (generated from `gounicode.py`);
//! * [`tokenize`]: identifier-run tokens, Go lowercasing and folding;
//! * [`postings`]: the segment arrays;
//! * [`events`]: an event-log row as a record (`recall/eventlog/project.py`);
//! * [`rank`]: a search's scores and its top-k cut (`recall/query/rank.py`);
//! * [`checksum`]: the CRC-32 of a segment file's arrays, read without a mapping
//!   (`recall/index/checksum.py`).
//!
//! The Python module (`streamd._native`, feature `python`) is a thin layer
//! in [`python`]: it releases the GIL for the work and turns a panic into a
//! Python exception instead of letting it cross the FFI boundary.

pub mod checksum;
pub mod events;
pub mod gotime;
pub mod hashes;
pub mod json;
pub mod lines;
pub mod postings;
pub mod rank;
pub mod tokenize;
pub mod unicode;

#[cfg(feature = "python")]
mod python;
