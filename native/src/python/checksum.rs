//! `crc32` and `file_crc32`: segment files' checksums (`crate::checksum`),
//! computed with the GIL released, for `recall/index/checksum.py`.

use std::fs::File;
use std::mem::ManuallyDrop;
use std::os::fd::FromRawFd;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::guarded;
use crate::checksum;

/// CRC-32 of a contiguous buffer of bytes (format `B`), continuing from
/// `value`. The caller does not write to the buffer meanwhile (a segment's
/// arrays are never written once sealed); the buffer is held until the
/// call returns.
#[pyfunction]
#[pyo3(signature = (data, value = 0))]
pub fn crc32(py: Python<'_>, data: PyBuffer<u8>, value: u32) -> PyResult<u32> {
    if !data.is_c_contiguous() {
        return Err(PyValueError::new_err("crc32: the buffer must be contiguous"));
    }
    // SAFETY: the buffer is contiguous and held (`data`) until we return;
    // its exporter keeps the memory alive and unmoved while it is exported.
    let bytes = unsafe { std::slice::from_raw_parts(data.buf_ptr() as *const u8, data.item_count()) };
    py.allow_threads(|| guarded("crc32", || checksum::crc32(value, bytes)))
}

/// CRC-32 of each `(offset, length)` span of the open file `fd`, read with
/// `pread` in bounded chunks (never mapped). The descriptor stays the
/// caller's: it is borrowed, not closed, and the caller keeps it open
/// until the call returns. A span past the end of the file is an OSError.
#[pyfunction]
pub fn file_crc32(py: Python<'_>, fd: i32, spans: Vec<(u64, u64)>) -> PyResult<Vec<u32>> {
    if fd < 0 {
        return Err(PyValueError::new_err("file_crc32: not an open file"));
    }
    // SAFETY: the caller owns `fd` and keeps it open for the call;
    // ManuallyDrop keeps this borrowed File from closing it.
    let file = ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
    let result = py.allow_threads(|| {
        guarded("file_crc32", || {
            let mut scratch = Scratch::new(checksum::scratch_len(&spans))?;
            checksum::spans_crc32(&file, &spans, scratch.bytes())
        })
    })?;
    Ok(result?)
}

/// A buffer in an anonymous mapping of its own, unmapped when dropped. The
/// daemon's allocator serves it from the calling thread's heap (`heap.py`
/// maps only blocks of 32 MiB apart), where what the checks freed stayed
/// resident: 5 MB more after a 1M-record restart (`segment.check` says what
/// else that took).
struct Scratch {
    ptr: *mut u8,
    len: usize,
}

impl Scratch {
    fn new(len: usize) -> std::io::Result<Scratch> {
        if len == 0 {
            return Ok(Scratch { ptr: std::ptr::NonNull::dangling().as_ptr(), len });
        }
        // SAFETY: a fresh private anonymous mapping, owned by this Scratch alone.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Scratch { ptr: at.cast(), len })
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes mapped readable and writable (or none, at a
        // dangling but aligned pointer), borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: the mapping `new` made, unmapped once.
            unsafe { libc::munmap(self.ptr.cast(), self.len) };
        }
    }
}
