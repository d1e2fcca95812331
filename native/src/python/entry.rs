//! `encode_entry`: an event-log row's entry as the JSON the log answers with,
//! the bytes the Python path (`eventlog/store/rows.py`: `to_entry` with raw
//! content, then msgspec) writes for the same row.
//!
//! Only the common row: every text column a `str`, the seq and the event
//! time an `int` (the time within years 0001-9999), no metadata and no state
//! delta. Any other row (metadata or a delta to decode and write again, a
//! value the Python path renders as damaged, a type SQLite should not have
//! given) is declined, and the Python path encodes it.

use std::io::Write;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyInt, PyString, PyTuple};

use crate::gotime::Utc;
use crate::postings::json_string;

/// Columns of a row, in `ENTRY_COLUMNS`' order.
const COLUMNS: usize = 12;

/// The entry of `row` as JSON bytes, or None where the Python path must
/// encode it (see the module's text).
#[pyfunction]
pub fn encode_entry<'py>(py: Python<'py>, row: &Bound<'py, PyTuple>) -> PyResult<Option<Bound<'py, PyBytes>>> {
    if row.len() != COLUMNS {
        return Ok(None);
    }
    let item = |i: usize| row.get_item(i);
    let (Some(seq), Some(at_us)) = (int(&item(0)?), int(&item(8)?)) else { return Ok(None) };
    if !item(10)?.is_none() || !item(11)?.is_none() {
        return Ok(None); // metadata or a state delta: decoded and written again in Python
    }
    let mut text: [&str; 8] = [""; 8];
    let held: Vec<Bound<'py, PyAny>> = [1, 2, 3, 4, 5, 6, 7, 9].iter().map(|&i| item(i)).collect::<PyResult<_>>()?;
    for (slot, value) in text.iter_mut().zip(&held) {
        match str_of(value) {
            Some(s) => *slot = s,
            None => return Ok(None),
        }
    }
    let [app, user, session, id, invocation, author, branch, content] = text;
    let Some(time) = Utc::of(at_us) else { return Ok(None) };
    let mut out = Vec::with_capacity(160 + content.len() + app.len() + user.len() + session.len() + id.len());
    out.extend_from_slice(b"{\"seq\":");
    write!(out, "{seq}").expect("writing to a Vec cannot fail");
    for (key, value) in [(&b",\"app\":"[..], app), (b",\"user\":", user), (b",\"session\":", session),
                         (b",\"event\":{\"id\":", id), (b",\"author\":", author)] {
        out.extend_from_slice(key);
        json_string(&mut out, value);
    }
    out.extend_from_slice(b",\"content\":");
    out.extend_from_slice(content.as_bytes()); // stored JSON, written as it is (msgspec.Raw)
    for (key, value) in [(&b",\"branch\":"[..], branch), (b",\"invocation_id\":", invocation)] {
        out.extend_from_slice(key);
        json_string(&mut out, value);
    }
    out.extend_from_slice(b",\"timestamp\":\"");
    time.write(&mut out);
    out.extend_from_slice(b"\"},\"metadata\":null}");
    Ok(Some(PyBytes::new(py, &out)))
}

/// An `int` (exactly: a subclass could encode otherwise) that fits in 64 bits.
fn int(value: &Bound<'_, PyAny>) -> Option<i64> {
    if value.is_exact_instance_of::<PyInt>() {
        value.extract::<i64>().ok()
    } else {
        None
    }
}

/// A `str` (exactly) as UTF-8; None for one holding a lone surrogate, which
/// no UTF-8 can say.
fn str_of<'a>(value: &'a Bound<'_, PyAny>) -> Option<&'a str> {
    if !value.is_exact_instance_of::<PyString>() {
        return None;
    }
    value.downcast::<PyString>().ok()?.to_str().ok()
}
