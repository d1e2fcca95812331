//! The checksums of a segment file's arrays: CRC-32 as zlib computes it.
//!
//! The plain path (`recall/index/checksum.py`) computes the same values with
//! Python's `zlib.crc32`, so a file either path wrote checks on either path
//! (CRC-32C or xxh3 would have needed a package beside the standard library
//! there). `crc32fast` folds with carry-less multiplication where the CPU has
//! it, several times zlib's speed: what a restart pays to check a workdir.
//!
//! A file's arrays are checked by reading them (`pread`) in chunks of at most
//! [`CHUNK`] bytes into one buffer, never through a mapping: pages read that
//! way stay in the page cache and are never counted in this process's
//! resident set, which a restart works to keep low (`recall/index/segfile.py`).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// The most a check reads at once: each chunk is summed while it is still in
/// the CPU's cache (a 1M index checked in 44 ms of CPU, against 52 in 1 MiB
/// chunks); the plain path's `CHUNK` is the same.
pub const CHUNK: usize = 1 << 18;

/// CRC-32 of `data`, continuing from `value` (0 to begin).
pub fn crc32(value: u32, data: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new_with_initial(value);
    hasher.update(data);
    hasher.finalize()
}

/// The buffer [`spans_crc32`] needs for `spans`: the longest, up to [`CHUNK`].
pub fn scratch_len(spans: &[(u64, u64)]) -> usize {
    spans.iter().map(|&(_, len)| len).max().unwrap_or(0).min(CHUNK as u64) as usize
}

/// CRC-32 of each `(offset, length)` span of `file`, read in chunks into
/// `buf` ([`scratch_len`] bytes or more). A span that runs past the end of
/// the file is an `UnexpectedEof` error.
pub fn spans_crc32(file: &File, spans: &[(u64, u64)], buf: &mut [u8]) -> io::Result<Vec<u32>> {
    assert!(buf.len() >= scratch_len(spans), "a scratch buffer too small for the spans");
    spans
        .iter()
        .map(|&(offset, len)| {
            let mut hasher = crc32fast::Hasher::new();
            let mut done = 0u64;
            while done < len {
                let want = (len - done).min(buf.len() as u64) as usize;
                let got = file.read_at(&mut buf[..want], offset + done)?;
                if got == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the file is shorter than its header says",
                    ));
                }
                hasher.update(&buf[..got]);
                done += got as u64;
            }
            Ok(hasher.finalize())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn the_checksum_is_zlibs_crc32() {
        // zlib.crc32(b"123456789") == 0xCBF43926, the CRC-32 check value.
        assert_eq!(crc32(0, b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(crc32(0, b"1234"), b"56789"), 0xCBF4_3926);
        assert_eq!(crc32(0, b""), 0);
    }

    #[test]
    fn spans_are_read_in_chunks_and_checked_whole() {
        let data: Vec<u8> = (0..(3 * CHUNK + 17)).map(|i| (i * 7 + i / 251) as u8).collect();
        let path = std::env::temp_dir().join(format!("streamd-crc-{}", std::process::id()));
        File::create(&path).unwrap().write_all(&data).unwrap();
        let file = File::open(&path).unwrap();
        let spans = [(0, data.len() as u64), (5, 0), (CHUNK as u64 - 3, CHUNK as u64 + 9)];
        let mut buf = vec![0u8; scratch_len(&spans)];
        let sums = spans_crc32(&file, &spans, &mut buf).unwrap();
        let expected: Vec<u32> = spans
            .iter()
            .map(|&(at, len)| crc32(0, &data[at as usize..(at + len) as usize]))
            .collect();
        assert_eq!(sums, expected);
        let past = spans_crc32(&file, &[(data.len() as u64 - 4, 8)], &mut buf).unwrap_err();
        assert_eq!(past.kind(), io::ErrorKind::UnexpectedEof);
        std::fs::remove_file(&path).unwrap();
    }
}
