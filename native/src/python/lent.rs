//! `SealedArray`: one array of a sealed segment, lent to Python as it lies.
//!
//! A segment's arrays used to be copied into new `bytes` objects (tens of
//! MB a segment: fresh pages, zeroed by the kernel, then written), only to
//! be viewed by numpy, written to the segment file and dropped. Lent
//! through the buffer protocol (read-only bytes), numpy views the vector
//! the seal made; the object keeps it alive as long as any view does.

use std::ffi::{c_int, c_void};

use pyo3::exceptions::PyBufferError;
use pyo3::ffi;
use pyo3::prelude::*;

/// A sealed array's elements, as the seal made them.
enum Elements {
    Bytes(Vec<u8>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
}

/// Read-only little-endian bytes of one array (`bytes(a)`,
/// `numpy.frombuffer(a, dtype)`), on a little-endian machine without a copy.
#[pyclass(module = "streamd._native", frozen)]
pub struct SealedArray {
    elements: Elements,
}

/// The bytes of `v`'s elements as they lie in memory.
fn raw<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: the elements are plain integers (no padding, any bit pattern
    // is a valid u8); the slice covers exactly their memory.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

impl SealedArray {
    /// The little-endian bytes (what the plain Segment's dtypes read).
    fn bytes(&self) -> &[u8] {
        match &self.elements {
            Elements::Bytes(v) => v,
            Elements::U32(v) => raw(v),
            Elements::I32(v) => raw(v),
            Elements::U64(v) => raw(v),
            Elements::I64(v) => raw(v),
        }
    }
}

macro_rules! lend {
    ($name:ident, $t:ty, $variant:ident) => {
        pub fn $name(v: Vec<$t>) -> SealedArray {
            // A big-endian machine gets the little-endian bytes, copied once.
            let elements = if cfg!(target_endian = "little") {
                Elements::$variant(v)
            } else {
                Elements::Bytes(v.iter().flat_map(|x| x.to_le_bytes()).collect())
            };
            SealedArray { elements }
        }
    };
}

impl SealedArray {
    pub fn of_bytes(v: Vec<u8>) -> SealedArray {
        SealedArray { elements: Elements::Bytes(v) }
    }
    lend!(of_u32, u32, U32);
    lend!(of_i32, i32, I32);
    lend!(of_u64, u64, U64);
    lend!(of_i64, i64, I64);
}

#[pymethods]
impl SealedArray {
    fn __len__(&self) -> usize {
        self.bytes().len()
    }

    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int)
                            -> PyResult<()> {
        if flags & ffi::PyBUF_WRITABLE == ffi::PyBUF_WRITABLE {
            return Err(PyBufferError::new_err("a sealed array is read-only"));
        }
        let bytes = slf.get().bytes();
        let len = isize::try_from(bytes.len()).map_err(|_| PyBufferError::new_err("too long"))?;
        // SAFETY: `view` is the interpreter's; the bytes never change and
        // live as long as `slf`, which the view holds a reference to.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(view, slf.as_ptr(), bytes.as_ptr() as *mut c_void, len, 1, flags)
        };
        if rc == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        // Nothing was allocated for the view.
    }
}
