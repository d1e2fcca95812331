//! Event-log rows read straight from the host's SQLite connection.
//!
//! Reading a page of rows through APSW made eleven Python objects a row
//! (a tuple, eight strings decoded from UTF-8, two ints) that the builder
//! then took apart again: about 1.1 us an event of CPython, under the GIL,
//! plus the cyclic collector's passes over the tuples. Here the rows go
//! from SQLite's cursor into one buffer, with the GIL released.
//!
//! A second SQLite library in the process is not an option: two libraries
//! on one file do not see each other's POSIX locks, and closing a
//! descriptor in one drops the other's locks. So this module calls APSW's
//! own SQLite, which exports no symbols: this library is also a SQLite
//! *loadable extension*. Loading it into any connection of the process
//! (`Connection.load_extension`) runs [`sqlite3_streamd_init`], which
//! keeps the host library's table of entry points (`sqlite3_api_routines`,
//! the struct every extension is handed); the reader then prepares, steps
//! and reads columns on the connection it is given
//! (`Connection.sqlite3_pointer()`) through that table. The caller runs it
//! where the connection may be used: on the connection's own thread, as
//! every other read of the store.
//!
//! A page that is anything but what a plain read would turn into ordinary
//! rows (a column of another type, text that is not UTF-8, an error from
//! SQLite) is not read here at all: the caller reads it through APSW, which
//! gives the same rows, or raises the same error, as it always did.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use crate::events::Row;

const SQLITE_OK: c_int = 0;
const SQLITE_ROW: c_int = 100;
const SQLITE_DONE: c_int = 101;
const SQLITE_INTEGER: c_int = 1;
const SQLITE_TEXT: c_int = 3;
const SQLITE_NULL: c_int = 5;

/// Slots of `sqlite3_api_routines` (`sqlite3ext.h`): the struct only ever
/// grows at its end, so these places hold in every SQLite since 3.7.
mod slot {
    pub const BIND_INT64: usize = 5;
    pub const COLUMN_BYTES: usize = 20;
    pub const COLUMN_COUNT: usize = 22;
    pub const COLUMN_INT64: usize = 29;
    pub const COLUMN_TEXT: usize = 36;
    pub const COLUMN_TYPE: usize = 38;
    pub const FINALIZE: usize = 57;
    pub const MUTEX_ENTER: usize = 131;
    pub const MUTEX_LEAVE: usize = 133;
    pub const DB_MUTEX: usize = 164;
    pub const STEP: usize = 94;
    pub const PREPARE_V2: usize = 116;
    /// One past the last slot used, for a table too short to hold them.
    pub const USED: usize = 165;
}

/// The host library's entry points, kept by the first load.
static API: AtomicPtr<*const c_void> = AtomicPtr::new(std::ptr::null_mut());

/// The extension's entry point, run by SQLite when a connection loads this
/// library (`load_extension(path, "sqlite3_streamd_init")`). It registers
/// nothing on the connection; it keeps the table of entry points.
///
/// # Safety
/// Called by SQLite only, with its own `sqlite3_api_routines` table.
#[no_mangle]
pub unsafe extern "C" fn sqlite3_streamd_init(_db: *mut c_void, _err: *mut *mut c_char,
                                              api: *const *const c_void) -> c_int {
    // The first table is kept: only APSW's connections load this library,
    // and a table must never change under a reader that holds it.
    if !api.is_null() {
        let _ = API.compare_exchange(std::ptr::null_mut(), api.cast_mut(), Ordering::AcqRel,
                                     Ordering::Acquire);
    }
    SQLITE_OK
}

/// Whether a connection of this process has loaded the extension.
pub fn loaded() -> bool {
    !API.load(Ordering::Acquire).is_null()
}

/// The table, typed: each call casts one slot to its C signature.
struct Api(*const *const c_void);

type Stmt = *mut c_void;

impl Api {
    fn get() -> Option<Api> {
        let p = API.load(Ordering::Acquire);
        (!p.is_null()).then_some(Api(p))
    }

    /// # Safety
    /// `F` must be the C signature of slot `i`.
    unsafe fn slot<F: Copy>(&self, i: usize) -> F {
        debug_assert!(i < slot::USED);
        let f = *self.0.add(i);
        assert!(!f.is_null(), "SQLite's table of entry points has no slot {i}");
        std::mem::transmute_copy::<*const c_void, F>(&f)
    }
}

/// One page of event rows: every string in one buffer.
pub struct Page {
    bytes: Vec<u8>,
    rows: Vec<Spans>,
}

/// Where a row's fields lie in [`Page::bytes`]: app, user, session, id,
/// invocation, author, branch, content, then the delta (absent when NULL).
struct Spans {
    seq: i64,
    at_us: i64,
    text: [(usize, usize); 8],
    delta: Option<(usize, usize)>,
}

/// Columns of a row, in `EVENT_ROW_COLUMNS`' order (`eventlog/store/reads.py`).
const COLUMNS: c_int = 11;
const TEXT_COLUMNS: [c_int; 8] = [1, 2, 3, 4, 5, 6, 7, 9];
const SEQ: c_int = 0;
const AT_US: c_int = 8;
const DELTA: c_int = 10;

impl Page {
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn row(&self, i: usize) -> Row<'_> {
        let r = &self.rows[i];
        let s = |(from, len): (usize, usize)| {
            // SAFETY: `read_rows` checked the buffer as UTF-8 and every
            // field's ends as character boundaries; the buffer never changes.
            unsafe { std::str::from_utf8_unchecked(&self.bytes[from..from + len]) }
        };
        let [app, user, session, id, invocation, author, branch, content] = r.text.map(s);
        Row { seq: r.seq, app, user, session, id, invocation, author, branch, at_us: r.at_us,
              content, delta: r.delta.map(s) }
    }
}

/// Why a page was not read here (the caller reads it through APSW).
#[derive(Debug, PartialEq, Eq)]
pub enum NotRead {
    /// No connection has loaded the extension.
    NotLoaded,
    /// SQLite refused the statement or failed a step (the code).
    Sqlite(c_int),
    /// A row the plain read would give otherwise (a type, not UTF-8).
    Unusual,
}

/// A page of `sql` (a `SELECT` of the event-row columns with two
/// parameters, `from_seq` and `limit`) read on connection `db`.
///
/// # Safety
/// `db` must be an open connection of the library that loaded the
/// extension, not used by any other thread for the length of the call.
pub unsafe fn read_page(db: *mut c_void, sql: &str, from_seq: i64, limit: i64)
                        -> Result<Page, NotRead> {
    let api = Api::get().ok_or(NotRead::NotLoaded)?;
    // Every call below would take and release the connection's (recursive)
    // mutex: taken once for the page, the calls inside are cheap re-entries
    // (they were a tenth of the read).
    let _held = Held::enter(&api, db);
    type Prepare = unsafe extern "C" fn(*mut c_void, *const c_char, c_int, *mut Stmt,
                                        *mut *const c_char) -> c_int;
    let prepare: Prepare = api.slot(slot::PREPARE_V2);
    let finalize: unsafe extern "C" fn(Stmt) -> c_int = api.slot(slot::FINALIZE);
    let Ok(sql_len) = c_int::try_from(sql.len()) else { return Err(NotRead::Unusual) };
    let mut stmt: Stmt = std::ptr::null_mut();
    let rc = prepare(db, sql.as_ptr().cast(), sql_len, &mut stmt, std::ptr::null_mut());
    if rc != SQLITE_OK || stmt.is_null() {
        if !stmt.is_null() {
            finalize(stmt);
        }
        return Err(NotRead::Sqlite(rc));
    }
    let read = read_rows(&api, stmt, from_seq, limit);
    // Its result is the last step's, which `read_rows` has seen already.
    finalize(stmt);
    read
}

/// The connection's mutex, held until dropped (a panic included).
struct Held {
    mutex: *mut c_void,
    leave: unsafe extern "C" fn(*mut c_void),
}

impl Held {
    unsafe fn enter(api: &Api, db: *mut c_void) -> Held {
        let of: unsafe extern "C" fn(*mut c_void) -> *mut c_void = api.slot(slot::DB_MUTEX);
        let enter: unsafe extern "C" fn(*mut c_void) = api.slot(slot::MUTEX_ENTER);
        // Null where the library was built without mutexes: then a no-op.
        let mutex = of(db);
        enter(mutex);
        Held { mutex, leave: api.slot(slot::MUTEX_LEAVE) }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // SAFETY: entered by `Held::enter` on this thread.
        unsafe { (self.leave)(self.mutex) }
    }
}

unsafe fn read_rows(api: &Api, stmt: Stmt, from_seq: i64, limit: i64) -> Result<Page, NotRead> {
    let bind: unsafe extern "C" fn(Stmt, c_int, i64) -> c_int = api.slot(slot::BIND_INT64);
    let step: unsafe extern "C" fn(Stmt) -> c_int = api.slot(slot::STEP);
    let count: unsafe extern "C" fn(Stmt) -> c_int = api.slot(slot::COLUMN_COUNT);
    let kind: unsafe extern "C" fn(Stmt, c_int) -> c_int = api.slot(slot::COLUMN_TYPE);
    let int64: unsafe extern "C" fn(Stmt, c_int) -> i64 = api.slot(slot::COLUMN_INT64);
    let text: unsafe extern "C" fn(Stmt, c_int) -> *const u8 = api.slot(slot::COLUMN_TEXT);
    let bytes: unsafe extern "C" fn(Stmt, c_int) -> c_int = api.slot(slot::COLUMN_BYTES);

    for (i, v) in [(1, from_seq), (2, limit)] {
        let rc = bind(stmt, i, v);
        if rc != SQLITE_OK {
            return Err(NotRead::Sqlite(rc));
        }
    }
    if count(stmt) != COLUMNS {
        return Err(NotRead::Unusual);
    }
    let expected = usize::try_from(limit).unwrap_or(0).min(1 << 16);
    let mut page = Page { bytes: Vec::with_capacity(expected * 640), rows: Vec::with_capacity(expected) };
    // The text of column `c` of the current row, appended to the buffer.
    let mut take = |c: c_int| -> Result<(usize, usize), NotRead> {
        // column_text before column_bytes: the length is then the UTF-8 one.
        let p = text(stmt, c);
        let n = usize::try_from(bytes(stmt, c)).map_err(|_| NotRead::Unusual)?;
        let from = page.bytes.len();
        if n > 0 {
            if p.is_null() {
                return Err(NotRead::Unusual); // out of memory in SQLite
            }
            page.bytes.extend_from_slice(std::slice::from_raw_parts(p, n));
        }
        Ok((from, n))
    };
    let mut rows = Vec::with_capacity(expected);
    loop {
        match step(stmt) {
            SQLITE_ROW => {}
            SQLITE_DONE => break,
            rc => return Err(NotRead::Sqlite(rc)),
        }
        if kind(stmt, SEQ) != SQLITE_INTEGER || kind(stmt, AT_US) != SQLITE_INTEGER {
            return Err(NotRead::Unusual);
        }
        let mut spans = [(0, 0); 8];
        for (slot, c) in TEXT_COLUMNS.into_iter().enumerate() {
            if kind(stmt, c) != SQLITE_TEXT {
                return Err(NotRead::Unusual);
            }
            spans[slot] = take(c)?;
        }
        let delta = match kind(stmt, DELTA) {
            SQLITE_NULL => None,
            SQLITE_TEXT => Some(take(DELTA)?),
            _ => return Err(NotRead::Unusual),
        };
        rows.push(Spans { seq: int64(stmt, SEQ), at_us: int64(stmt, AT_US), text: spans, delta });
    }
    page.rows = rows;
    // One check of the whole buffer is cheaper than one a field; where it
    // fails, the fields are not split up to find which one it was.
    // ASCII (most pages) is UTF-8 cut anywhere.
    if !page.bytes.is_ascii()
        && (std::str::from_utf8(&page.bytes).is_err() || !page.rows.iter().all(|r| page.spans_utf8(r))) {
        return Err(NotRead::Unusual);
    }
    Ok(page)
}

impl Page {
    /// Whether every field of `r` starts and ends on a character boundary
    /// (the buffer as a whole being UTF-8, each field then is).
    fn spans_utf8(&self, r: &Spans) -> bool {
        // SAFETY: the caller checked the buffer as UTF-8.
        let text = unsafe { std::str::from_utf8_unchecked(&self.bytes) };
        r.text.iter().chain(r.delta.iter()).all(|&(from, n)| {
            text.is_char_boundary(from) && text.is_char_boundary(from + n)
        })
    }
}
