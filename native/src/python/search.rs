//! `streamd._native.rank`: a search scored and cut in the compiled core.
//!
//! Every array is borrowed from the caller's numpy buffers, never copied:
//! the index's arrays are immutable once a generation is published (the
//! rules of `recall/index/index.py`), and the buffers stay held here until
//! the work, done without the GIL, is over.

use std::sync::atomic::AtomicU8;

use pyo3::buffer::{Element, PyBuffer};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::guarded;
use crate::rank::{self, Columns, IdRanks, List, Query, Stop, Term, TimeBlocks, Window};

/// A buffer's items as a slice. Safety: the slice lives as long as the
/// borrow of `buf`, which keeps the exporter's memory alive and unmoved; the
/// caller promises nobody writes to it meanwhile (see the module's rules).
fn items<T: Element>(buf: &PyBuffer<T>) -> PyResult<&[T]> {
    if !buf.is_c_contiguous() {
        return Err(PyValueError::new_err("rank: every array must be contiguous"));
    }
    Ok(unsafe { std::slice::from_raw_parts(buf.buf_ptr() as *const T, buf.item_count()) })
}

fn buffers<T: Element>(objs: &[Bound<'_, PyAny>]) -> PyResult<Vec<PyBuffer<T>>> {
    objs.iter().map(PyBuffer::get).collect()
}

/// One query term as Python lists it: `(scale, [chain, ...])`, each chain a
/// list of `(recs: uint32, meta: uint8)` arrays in segment order.
type PyTerm<'py> = (f64, Vec<Vec<(Bound<'py, PyAny>, Bound<'py, PyAny>)>>);

/// `(recs, scores, exact, matched, any_exact)`: the hits hold the plain
/// path's best `limit`, unordered (see `native/src/rank.rs`).
type Answer = (Vec<u32>, Vec<f64>, Vec<bool>, u64, bool);

/// Rank the records `< n`. `columns` is the index's structured rows as
/// bytes, `layout` `(stride, sec, nsec, kind)` their byte offsets; `upper`
/// and `lower` bound the event time as `(sec, nsec)`; `kinds` says by kind
/// code which are wanted; `removed` marks taken-back records (uint8); `ranks`
/// are the id ranks of each `block` records; `sec_max[b]` bounds the event
/// seconds of the records `< covered` of each `time_block` records;
/// `stop` is a one-byte array the caller sets nonzero (from another thread)
/// to have the search give up, which then returns None.
#[pyfunction]
#[pyo3(signature = (n, terms, order, positions, exact, browse, weights, columns, layout,
                    upper, lower, kinds, removed, ranks, block, sec_max, covered,
                    time_block, limit, stop))]
#[allow(clippy::too_many_arguments)]
pub fn rank_search(
    py: Python<'_>,
    n: u32,
    terms: Vec<PyTerm<'_>>,
    order: Vec<usize>,
    positions: usize,
    exact: &Bound<'_, PyAny>,
    browse: bool,
    weights: [f64; 4],
    columns: &Bound<'_, PyAny>,
    layout: (usize, usize, usize, usize),
    upper: Option<(i64, i32)>,
    lower: Option<(i64, i32)>,
    kinds: Option<Vec<bool>>,
    removed: Option<Bound<'_, PyAny>>,
    ranks: Vec<Bound<'_, PyAny>>,
    block: usize,
    sec_max: &Bound<'_, PyAny>,
    covered: u32,
    time_block: usize,
    limit: usize,
    stop: Option<Bound<'_, PyAny>>,
) -> PyResult<Option<Answer>> {
    if order.iter().any(|&t| t >= terms.len()) {
        return Err(PyValueError::new_err("rank: order names a term that is not given"));
    }
    if block == 0 || !time_block.is_power_of_two() {
        return Err(PyValueError::new_err("rank: blocks must hold records (time blocks a power of two)"));
    }
    let (stride, sec, nsec, kind) = layout;
    if sec + 8 > stride || nsec + 4 > stride || kind + 4 > stride {
        return Err(PyValueError::new_err("rank: a column lies outside the row"));
    }
    // Held for the whole call: the slices below borrow from them.
    let mut rec_bufs: Vec<Vec<Vec<PyBuffer<u32>>>> = Vec::with_capacity(terms.len());
    let mut meta_bufs: Vec<Vec<Vec<PyBuffer<u8>>>> = Vec::with_capacity(terms.len());
    for (_, chains) in &terms {
        let mut rc = Vec::with_capacity(chains.len());
        let mut mc = Vec::with_capacity(chains.len());
        for chain in chains {
            let (r, m): (Vec<_>, Vec<_>) = chain.iter().cloned().unzip();
            rc.push(buffers::<u32>(&r)?);
            mc.push(buffers::<u8>(&m)?);
        }
        rec_bufs.push(rc);
        meta_bufs.push(mc);
    }
    let exact_buf = PyBuffer::<i64>::get(exact)?;
    let col_buf = PyBuffer::<u8>::get(columns)?;
    let removed_buf = removed.as_ref().map(PyBuffer::<u8>::get).transpose()?;
    let rank_bufs = buffers::<i32>(&ranks)?;
    let max_buf = PyBuffer::<i64>::get(sec_max)?;

    let mut q_terms = Vec::with_capacity(terms.len());
    for (t, (scale, _)) in terms.iter().enumerate() {
        let mut chains = Vec::with_capacity(rec_bufs[t].len());
        for (rc, mc) in rec_bufs[t].iter().zip(&meta_bufs[t]) {
            let mut lists = Vec::with_capacity(rc.len());
            for (r, m) in rc.iter().zip(mc) {
                let (recs, meta) = (items(r)?, items(m)?);
                if recs.len() != meta.len() {
                    return Err(PyValueError::new_err("rank: recs and meta differ in length"));
                }
                lists.push(List { recs, meta });
            }
            chains.push(lists);
        }
        q_terms.push(Term { chains, scale: *scale });
    }
    let maxima = items(&max_buf)?;
    if maxima.len() < (covered as usize).div_ceil(time_block) {
        return Err(PyValueError::new_err("rank: the time maxima cover fewer records than said"));
    }
    let times = TimeBlocks { maxima, covered, shift: time_block.trailing_zeros() };
    let cols = Columns { bytes: items(&col_buf)?, stride, sec, nsec, kind, times };
    if cols.bytes.len() < n as usize * stride {
        return Err(PyValueError::new_err("rank: fewer rows than records"));
    }
    let ids = IdRanks { ranks: rank_bufs.iter().map(items).collect::<PyResult<_>>()?, block };
    if ids.ranks.iter().map(|r| r.len()).sum::<usize>() < n as usize {
        return Err(PyValueError::new_err("rank: some records have no id rank"));
    }
    let window = Window {
        upper,
        lower,
        kinds,
        removed: removed_buf.as_ref().map(items).transpose()?,
    };
    let q = Query { n, terms: q_terms, order, positions, exact: items(&exact_buf)?, browse, weights };
    let stop_buf = stop.as_ref().map(PyBuffer::<u8>::get).transpose()?;
    if stop_buf.as_ref().is_some_and(|b| b.item_count() < 1 || b.readonly()) {
        return Err(PyValueError::new_err("rank: stop must be a writable array of one byte"));
    }
    // Safety: the byte lives as long as `stop_buf`'s borrow, past the call.
    // Unlike every other array here it is written while the search reads
    // it, so it is read atomically (an AtomicU8 has a u8's layout).
    let flag = stop_buf.as_ref().map(|b| unsafe { &*(b.buf_ptr() as *const AtomicU8) });
    let stop = Stop(flag);
    let r = py.allow_threads(|| {
        guarded("rank", || rank::rank(&q, &cols, &window, &ids, limit, stop))
    })?;
    let Some(r) = r else { return Ok(None) };
    let recs = r.hits.iter().map(|h| h.rec).collect();
    let scores = r.hits.iter().map(|h| h.score).collect();
    let exact = r.hits.iter().map(|h| h.exact).collect();
    Ok(Some((recs, scores, exact, r.matched, r.any_exact)))
}
