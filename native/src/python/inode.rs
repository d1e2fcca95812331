//! Device and inode numbers of paths, asked of the kernel without their times.
//!
//! The Python twin is `streamd/eventlog/sqlite/inode.py`, which says why the
//! times must not be asked for (multigrain timestamps: a file whose change
//! time was read gets a fine-grained one at its next write, and the WAL's
//! every `fdatasync` then writes its inode too). The database guard looks up
//! three paths after every store call; through ctypes each lookup cost about
//! 1.9 us of interpreted glue around a syscall of a few hundred nanoseconds.

use std::ffi::CString;

use pyo3::prelude::*;
use pyo3::pybacked::PyBackedBytes;
use pyo3::types::PyTuple;

/// What one lookup found: `(dev, ino)`, nothing at the path (`ENOENT`), or
/// another error number for the caller to raise (or, for `ENOSYS`/`EPERM`,
/// to fall back on `os.stat`).
enum Found {
    Id(u64, u64),
    Missing,
    Errno(i32),
}

fn lookup(path: &[u8]) -> Found {
    // The caller refuses paths holding NUL (as os.stat does) before asking.
    let Ok(c_path) = CString::new(path) else {
        return Found::Errno(libc::EINVAL);
    };
    // SAFETY: `buf` is a zeroed statx the kernel fills; `c_path` is a valid
    // NUL-terminated string that outlives the call.
    let mut buf: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statx(libc::AT_FDCWD, c_path.as_ptr(), 0, libc::STATX_INO, &mut buf) };
    if rc == 0 {
        // The device is filled whatever the mask asks for.
        let dev = libc::makedev(buf.stx_dev_major, buf.stx_dev_minor);
        return Found::Id(dev as u64, buf.stx_ino);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ENOENT) => Found::Missing,
        Some(code) => Found::Errno(code),
        None => Found::Errno(libc::EIO),
    }
}

/// For each path: a `(dev, ino)` tuple, None when nothing is there, or the
/// error number (an int) of a lookup that failed otherwise. The lookups run
/// with the GIL released, as ctypes' calls do: on a network or FUSE file
/// system one can block, and must not stop the process's other threads.
#[pyfunction]
pub fn devices_and_inodes<'py>(py: Python<'py>, paths: Vec<PyBackedBytes>) -> PyResult<Vec<PyObject>> {
    let found: Vec<Found> = py.allow_threads(|| paths.iter().map(|p| lookup(p)).collect());
    found
        .into_iter()
        .map(|found| {
            Ok(match found {
                Found::Id(dev, ino) => PyTuple::new(py, [dev, ino])?.into_any().unbind(),
                Found::Missing => py.None(),
                Found::Errno(code) => code.into_pyobject(py)?.into_any().unbind(),
            })
        })
        .collect()
}
