//! `EventPage`: a page of event-log rows read by the compiled core
//! (`sqlite.rs`), which a builder takes as it takes a list of row tuples.

use pyo3::exceptions::PyIndexError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::sqlite::{self, Page};
use crate::events::Row;

/// Rows of the event log, in seq order, held in one buffer. `page[i]` is
/// row `i` as the tuple a plain read gives (`EventRow`).
#[pyclass(module = "streamd._native", frozen, sequence)]
pub struct EventPage {
    page: Page,
}

impl EventPage {
    pub fn len(&self) -> usize {
        self.page.len()
    }

    pub fn row(&self, i: usize) -> Row<'_> {
        self.page.row(i)
    }
}

#[pymethods]
impl EventPage {
    fn __len__(&self) -> usize {
        self.page.len()
    }

    fn __getitem__<'py>(&self, py: Python<'py>, i: isize) -> PyResult<Bound<'py, PyTuple>> {
        let n = self.page.len() as isize;
        let at = if i < 0 { i + n } else { i };
        if !(0..n).contains(&at) {
            return Err(PyIndexError::new_err("event page index out of range"));
        }
        let r = self.page.row(at as usize);
        (r.seq, r.app, r.user, r.session, r.id, r.invocation, r.author, r.branch, r.at_us,
         r.content, r.delta)
            .into_pyobject(py)
    }
}

/// Whether a connection of this process has loaded the compiled core as a
/// SQLite extension (entry point `sqlite3_streamd_init`).
#[pyfunction]
pub fn sqlite_extension_loaded() -> bool {
    sqlite::loaded()
}

/// The page of `sql` (the event-row columns, parameters `from_seq` and
/// `limit`) read on the connection at address `db` (APSW's
/// `Connection.sqlite3_pointer()`), or None where the caller must read it
/// through APSW (not loaded, an error, a row of unusual types or text).
/// The caller must be the one user of that connection for the call: the
/// address is trusted as it is.
#[pyfunction]
pub fn read_event_page(py: Python<'_>, db: usize, sql: &str, from_seq: i64, limit: i64)
                       -> PyResult<Option<EventPage>> {
    if db == 0 {
        return Ok(None);
    }
    let read = py.allow_threads(|| {
        super::guarded("read_event_page", || {
            // SAFETY: the caller gives an open connection of the library
            // that loaded the extension, used by no other thread meanwhile.
            unsafe { sqlite::read_page(db as *mut std::ffi::c_void, sql, from_seq, limit) }
        })
    })?;
    // Whatever the reason it was not read here, APSW reads it (and raises
    // what it raises).
    Ok(read.ok().map(|page| EventPage { page }))
}
