//! `streamd._native`: the Python face of the compiled core.
//!
//! Every entry point that does real work runs it with the GIL released
//! (`py.allow_threads`), so several builds can run in threads of one
//! process, and inside `catch_unwind`, so that a bug here surfaces as a
//! `streamd._native.NativeError` (a RuntimeError) rather than unwinding
//! into the interpreter. A builder whose work panicked is spent: it could
//! be half-way through a record, so every later call on it raises too.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::pybacked::PyBackedStr;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};

use crate::events::{self, Row};
use crate::gotime::Instant;
use crate::postings::{Builder, Origin, Sealed};
use crate::{json, lines, postings, tokenize, unicode};

mod checksum;
mod entry;
mod inode;
mod lent;
mod page;
mod rebuild;
mod search;
mod sqlite;

use lent::SealedArray;
use page::EventPage;

create_exception!(_native, NativeError, PyRuntimeError, "The compiled indexing core failed (a bug: please report it).");

fn guarded<T>(what: &str, work: impl FnOnce() -> T) -> PyResult<T> {
    catch_unwind(AssertUnwindSafe(work)).map_err(|panic| {
        let detail = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no detail".to_owned());
        NativeError::new_err(format!("{what}: internal error: {detail}"))
    })
}

/// Records of one segment in the making: `feed` it chunks of lines, then `seal`.
#[pyclass(module = "streamd._native")]
struct ChunkBuilder {
    inner: Option<Builder>,
}

impl ChunkBuilder {
    /// A builder whose work panicked could be half-way through a record:
    /// it is spent.
    fn spent_on_error<T>(&mut self, result: PyResult<T>) -> PyResult<T> {
        if result.is_err() {
            self.inner = None;
        }
        result
    }

    fn builder(&mut self) -> PyResult<&mut Builder> {
        self.inner
            .as_mut()
            .ok_or_else(|| PyValueError::new_err("this ChunkBuilder was sealed or has failed"))
    }
}

#[pymethods]
impl ChunkBuilder {
    /// A builder whose records are numbered from `base`.
    #[new]
    fn new(base: u64) -> Self {
        ChunkBuilder { inner: Some(Builder::new(base)) }
    }

    /// Records added so far.
    #[getter]
    fn count(&self) -> u32 {
        self.inner.as_ref().map_or(0, Builder::count)
    }

    /// Consume the complete lines of `data[start:]` (`data[0]` lies at
    /// `offset` of file number `file_no`), adding at most `max_records`
    /// records and consuming at most `max_lines` lines; a record without
    /// observed_at gets `built_at` (ns). Returns `(next_start, lines,
    /// records, failed, latest_event_time_ns_or_None)`; the lines before
    /// `next_start` are consumed, a tail without a newline is not.
    #[allow(clippy::too_many_arguments)]
    fn feed(
        &mut self,
        py: Python<'_>,
        data: &Bound<'_, PyBytes>,
        start: usize,
        offset: u64,
        max_records: u64,
        max_lines: u64,
        file_no: i32,
        built_at: i128,
    ) -> PyResult<(usize, u64, u64, u64, Option<i128>)> {
        let buf = data.as_bytes();
        if start > buf.len() {
            return Err(PyValueError::new_err("start lies past the end of data"));
        }
        let at = Origin { base_offset: offset, file_no, built_at: Instant::from_nanos(built_at) };
        let builder = self.builder()?;
        let result = py.allow_threads(|| guarded("feed", || builder.feed(buf, start, at, max_records, max_lines)));
        let fed = self.spent_on_error(result)?;
        Ok((fed.pos, fed.lines, fed.records, fed.failed, fed.latest.map(Instant::nanos)))
    }

    /// Add the records of event-log rows `rows[start:]` (a list of tuples
    /// shaped as `LogRequests.event_rows` gives them, or an `EventPage`;
    /// all admitted), at most `max_records` of them. Returns `(next, records, failed,
    /// latest_event_time_ns_or_None, declined)`: rows before `next` are
    /// consumed; when `declined`, `rows[next]` is one only the plain path
    /// projects (the caller does, then calls again from `next + 1`).
    fn feed_events(
        &mut self,
        py: Python<'_>,
        rows: &Bound<'_, PyAny>,
        start: usize,
        max_records: u64,
        built_at: i128,
    ) -> PyResult<(usize, u64, u64, Option<i128>, bool)> {
        let at = Origin { base_offset: 0, file_no: 0, built_at: Instant::from_nanos(built_at) };
        if let Ok(page) = rows.downcast::<EventPage>() {
            // Its rows are read in place, without the GIL.
            let page = page.get();
            let end = page.len().min(start.saturating_add(max_records as usize)).max(start);
            let builder = self.builder()?;
            let result = py.allow_threads(|| {
                guarded("feed_events", || {
                    builder.reserve_records(max_records);
                    let rows: Vec<Row<'_>> = (start..end).map(|i| page.row(i)).collect();
                    postings::feed_rows(builder, &rows, at)
                })
            });
            let (done, records, failed, latest, refused) = self.spent_on_error(result)?;
            return Ok((start + done, records, failed, latest.map(Instant::nanos), refused));
        }
        let rows = rows.downcast::<PyList>()?;
        let end = rows.len().min(start.saturating_add(max_records as usize));
        // Held under the GIL, so the work below can run without it.
        let mut owned: Vec<HeldRow> = Vec::with_capacity(end.saturating_sub(start));
        let mut declined = false;
        for i in start..end {
            match HeldRow::extract(&rows.get_item(i)?)? {
                Some(row) => owned.push(row),
                None => {
                    declined = true;
                    break;
                }
            }
        }
        let builder = self.builder()?;
        let result = py.allow_threads(|| {
            guarded("feed_events", || {
                builder.reserve_records(max_records);
                let rows: Vec<Row<'_>> = owned.iter().map(HeldRow::row).collect();
                postings::feed_rows(builder, &rows, at)
            })
        });
        let (done, records, failed, latest, refused) = self.spent_on_error(result)?;
        Ok((start + done, records, failed, latest.map(Instant::nanos), declined || refused))
    }

    /// The segment's arrays as bytes (little-endian, the plain Segment's
    /// dtypes), its local kind table and record count. The builder is spent.
    fn seal<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let builder = self.inner.take().ok_or_else(|| {
            PyValueError::new_err("this ChunkBuilder was sealed or has failed")
        })?;
        let sealed = py.allow_threads(|| guarded("seal", || builder.seal()))?;
        sealed_dict(py, sealed)
    }
}

/// A row's fields, held: its strings are the Python objects' own UTF-8,
/// which a Python str never changes and the list keeps alive for the call,
/// so the work can read them without the GIL and without a copy.
struct HeldRow {
    seq: i64,
    text: [PyBackedStr; 8],
    at_us: i64,
    delta: Option<PyBackedStr>,
}

impl HeldRow {
    /// None for a row whose strings are not valid UTF-8 (lone surrogates):
    /// the plain path decides what becomes of it.
    fn extract(item: &Bound<'_, PyAny>) -> PyResult<Option<HeldRow>> {
        let t = item.downcast::<PyTuple>()?;
        if t.len() != 11 {
            return Err(PyValueError::new_err("an event row has 11 fields"));
        }
        let text_at = |i: usize| -> PyResult<Option<PyBackedStr>> {
            Ok(t.get_item(i)?.extract::<PyBackedStr>().ok())
        };
        let mut text: [Option<PyBackedStr>; 8] = Default::default();
        for (slot, i) in [1, 2, 3, 4, 5, 6, 7, 9].into_iter().enumerate() {
            let Some(s) = text_at(i)? else { return Ok(None) };
            text[slot] = Some(s);
        }
        let delta_item = t.get_item(10)?;
        let delta = if delta_item.is_none() {
            None
        } else {
            let Some(s) = text_at(10)? else { return Ok(None) };
            Some(s)
        };
        let seq = t.get_item(0)?.extract()?;
        let at_us = t.get_item(8)?.extract()?;
        // Every slot was filled above.
        let text = text.map(|s| s.expect("a held string"));
        Ok(Some(HeldRow { seq, text, at_us, delta }))
    }

    fn row(&self) -> Row<'_> {
        let [app, user, session, id, invocation, author, branch, content] = &self.text;
        Row {
            seq: self.seq,
            app,
            user,
            session,
            id,
            invocation,
            author,
            branch,
            at_us: self.at_us,
            content,
            delta: self.delta.as_deref(),
        }
    }
}

/// `(kind, title, text, line)`.
type Projection<'py> = (String, String, String, Bound<'py, PyBytes>);

/// An event-log row's projection, `(kind, title, text, line)`, or None
/// where the plain path must project it. For tests against `project.py`.
#[pyfunction]
#[pyo3(name = "project_event")]
fn py_project_event<'py>(py: Python<'py>, row: &Bound<'py, PyAny>)
                         -> PyResult<Option<Projection<'py>>> {
    let Some(owned) = HeldRow::extract(row)? else { return Ok(None) };
    let row = owned.row();
    let Some(d) = events::describe(row.content, row.author, row.delta) else { return Ok(None) };
    let when = events::instant_of(row.at_us);
    let mut line = Vec::new();
    events::write_line(&mut line, &row, &d, &events::format_nano(when));
    Ok(Some((d.kind.to_owned(), d.title.into_owned(), d.text.into_owned(), PyBytes::new(py, &line))))
}

/// The sealed segment's arrays, each lent as it lies (`SealedArray`).
fn sealed_dict(py: Python<'_>, s: Sealed) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    let put = |name: &str, a: SealedArray| d.set_item(name, Py::new(py, a)?);
    d.set_item("count", s.count)?;
    put("term_hash", SealedArray::of_u64(s.term_hash))?;
    put("term_local", SealedArray::of_i32(s.term_local))?;
    put("starts", SealedArray::of_i64(s.starts))?;
    put("recs", SealedArray::of_u32(s.recs))?;
    put("meta", SealedArray::of_bytes(s.meta))?;
    put("big_pos", SealedArray::of_i64(s.big_pos))?;
    put("big_count", SealedArray::of_i64(s.big_count))?;
    put("ident_hash", SealedArray::of_u64(s.ident_hash))?;
    put("ident_rec", SealedArray::of_i64(s.ident_rec))?;
    put("columns", SealedArray::of_bytes(s.columns))?;
    put("ids", SealedArray::of_bytes(s.ids))?;
    d.set_item("kinds", s.kinds)?;
    Ok(d)
}

/// One trimmed line decoded as a record (a dict of its fields, times in ns),
/// or None where the line counts as failed. For tests against the plain path.
#[pyfunction]
#[pyo3(name = "parse_record")]
fn py_parse_record<'py>(py: Python<'py>, line: &[u8]) -> PyResult<Option<Bound<'py, PyDict>>> {
    let Ok(r) = json::parse_record(line) else { return Ok(None) };
    let d = PyDict::new(py);
    d.set_item("schema", r.schema)?;
    d.set_item("id", &*r.id)?;
    d.set_item("kind", &*r.kind)?;
    d.set_item("event_time", r.event_time.nanos())?;
    d.set_item("observed_at", r.observed_at.map(Instant::nanos))?;
    d.set_item("system", &*r.system)?;
    d.set_item("ref", &*r.reference)?;
    d.set_item("correlation", &*r.correlation)?;
    d.set_item("title", &*r.title)?;
    d.set_item("text", &*r.text)?;
    d.set_item("actor", &*r.actor)?;
    d.set_item("revision", &*r.revision)?;
    Ok(Some(d))
}

/// Go's bytes.TrimSpace.
#[pyfunction]
#[pyo3(name = "trim_space")]
fn py_trim_space<'py>(py: Python<'py>, line: &[u8]) -> Bound<'py, PyBytes> {
    PyBytes::new(py, lines::trim_space(line))
}

/// The tokens of `s`, as the index and the query see them.
#[pyfunction]
#[pyo3(name = "tokenize")]
fn py_tokenize(s: &str) -> Vec<String> {
    tokenize::tokenize(s)
}

/// Simple case folding of `s`.
#[pyfunction]
#[pyo3(name = "fold")]
fn py_fold(s: &str) -> String {
    tokenize::fold(s).into_owned()
}

/// The 64-bit term hash.
#[pyfunction]
#[pyo3(name = "term_hash")]
fn py_term_hash(term: &str) -> u64 {
    postings::term_hash(term)
}

/// Panic inside the guard, to show that a panic comes out as NativeError.
#[pyfunction]
fn _panic_for_tests() -> PyResult<()> {
    guarded("_panic_for_tests", || panic!("as asked"))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    unicode::warm();
    // Bumped whenever a call's arguments or results change: `index/native.py`
    // refuses a module built from older sources (an editable install whose
    // extension was not rebuilt) instead of failing mid-build.
    m.add("INTERFACE", 6)?;
    m.add("UNICODE_VERSION", unicode::UNICODE_VERSION)?;
    m.add("MAX_LINE_BYTES", lines::MAX_LINE_BYTES)?;
    m.add("HOLD_LIMIT", lines::HOLD_LIMIT)?;
    m.add("MAX_DEPTH", json::MAX_DEPTH)?;
    m.add_function(wrap_pyfunction!(_panic_for_tests, m)?)?;
    m.add("NativeError", m.py().get_type::<NativeError>())?;
    m.add_class::<ChunkBuilder>()?;
    m.add_class::<EventPage>()?;
    m.add_class::<SealedArray>()?;
    // Bumped whenever `encode_entry`'s call or output changes (`eventlog/store/rows.py`).
    m.add("ENTRY_INTERFACE", 1)?;
    m.add_function(wrap_pyfunction!(entry::encode_entry, m)?)?;
    m.add_function(wrap_pyfunction!(page::read_event_page, m)?)?;
    m.add_function(wrap_pyfunction!(page::sqlite_extension_loaded, m)?)?;
    m.add_function(wrap_pyfunction!(py_parse_record, m)?)?;
    m.add_function(wrap_pyfunction!(py_project_event, m)?)?;
    m.add_function(wrap_pyfunction!(py_trim_space, m)?)?;
    m.add_function(wrap_pyfunction!(py_tokenize, m)?)?;
    m.add_function(wrap_pyfunction!(py_fold, m)?)?;
    m.add_function(wrap_pyfunction!(py_term_hash, m)?)?;
    m.add_function(wrap_pyfunction!(search::rank_search, m)?)?;
    // Bumped whenever `devices_and_inodes`'s call or results change
    // (`eventlog/sqlite/inode.py`).
    m.add("INODE_INTERFACE", 1)?;
    m.add_function(wrap_pyfunction!(inode::devices_and_inodes, m)?)?;
    // Bumped whenever `crc32` or `file_crc32` change their call or values
    // (`recall/index/checksum.py`).
    m.add("CHECKSUM_INTERFACE", 1)?;
    m.add_function(wrap_pyfunction!(checksum::crc32, m)?)?;
    m.add_function(wrap_pyfunction!(checksum::file_crc32, m)?)?;
    rebuild::register(m)?;
    Ok(())
}
