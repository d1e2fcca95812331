//! The per-line rules of a build, before any JSON: where lines end, which
//! are too long, and Go's `bytes.TrimSpace`.
//!
//! A line ends just after its `\n`; bytes after the last `\n` are a write in
//! progress and are left for the next pass. A line longer than
//! [`HOLD_LIMIT`] (newline included) is failed without a look at its
//! content, as the plain reader consumes it without holding it; a line
//! that is blank after trimming is skipped; one longer than
//! [`MAX_LINE_BYTES`] after trimming fails.

/// Records are capped at 1 MiB after trimming.
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// Lines longer than this (newline included) are failed unread.
pub const HOLD_LIMIT: usize = 2 << 20;

/// One complete line of a chunk: where it starts in the chunk and its
/// length, newline included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Line {
    pub start: usize,
    pub size: usize,
}

/// The complete line starting at `pos`, if one is there.
#[inline]
pub fn next_line(buf: &[u8], pos: usize) -> Option<Line> {
    let nl = memchr::memchr(b'\n', buf.get(pos..)?)?;
    Some(Line { start: pos, size: nl + 1 })
}

const ASCII_SPACE: [bool; 128] = {
    let mut t = [false; 128];
    t[b'\t' as usize] = true;
    t[b'\n' as usize] = true;
    t[0x0b] = true;
    t[0x0c] = true;
    t[b'\r' as usize] = true;
    t[b' ' as usize] = true;
    t
};

/// The rune that starts `s`, if `s` starts with a valid UTF-8 sequence.
fn first_rune(s: &[u8]) -> Option<(char, usize)> {
    let head = &s[..s.len().min(4)];
    let valid = match std::str::from_utf8(head) {
        Ok(v) => v,
        // The prefix before the first invalid byte is valid by construction.
        Err(e) => std::str::from_utf8(&head[..e.valid_up_to()]).ok()?,
    };
    valid.chars().next().map(|c| (c, c.len_utf8()))
}

/// The rune that ends `s`, the way Go's `utf8.DecodeLastRune` finds it: from
/// the nearest start byte among the last four, valid only if it reaches the end.
fn last_rune(s: &[u8]) -> Option<(char, usize)> {
    let end = s.len();
    let lim = end.saturating_sub(4);
    let mut start = end.checked_sub(1)?;
    while start > lim && (s[start] & 0xC0) == 0x80 {
        start -= 1;
    }
    let tail = std::str::from_utf8(&s[start..]).ok()?;
    let mut chars = tail.chars();
    let c = chars.next()?;
    chars.next().is_none().then_some((c, end - start))
}

/// Go's `bytes.TrimSpace`: white space by `unicode.IsSpace`, at both ends.
pub fn trim_space(mut s: &[u8]) -> &[u8] {
    loop {
        match s.first() {
            Some(&b) if b < 0x80 => {
                if !ASCII_SPACE[b as usize] {
                    break;
                }
                s = &s[1..];
            }
            Some(_) => match first_rune(s) {
                Some((c, n)) if crate::unicode::is_space(c) => s = &s[n..],
                _ => break,
            },
            None => return s,
        }
    }
    loop {
        match s.last() {
            Some(&b) if b < 0x80 => {
                if !ASCII_SPACE[b as usize] {
                    break;
                }
                s = &s[..s.len() - 1];
            }
            Some(_) => match last_rune(s) {
                Some((c, n)) if crate::unicode::is_space(c) => s = &s[..s.len() - n],
                _ => break,
            },
            None => return s,
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_end_after_their_newline_and_a_tail_waits() {
        let buf = b"a\n\nbc\npartial";
        assert_eq!(next_line(buf, 0), Some(Line { start: 0, size: 2 }));
        assert_eq!(next_line(buf, 2), Some(Line { start: 2, size: 1 }));
        assert_eq!(next_line(buf, 3), Some(Line { start: 3, size: 3 }));
        assert_eq!(next_line(buf, 6), None);
        assert_eq!(next_line(buf, 99), None);
    }

    #[test]
    fn trims_unicode_space_at_both_ends_only() {
        assert_eq!(trim_space(b" \t{}\r\n"), b"{}");
        assert_eq!(trim_space("\u{a0}\u{3000}{ }\u{85}\u{2028}".as_bytes()), b"{ }");
        assert_eq!(trim_space(" x\u{2029}y ".as_bytes()), "x\u{2029}y".as_bytes());
        assert_eq!(trim_space("\u{feff}{}".as_bytes()), "\u{feff}{}".as_bytes());
        assert_eq!(trim_space(b"\x1c{}"), b"\x1c{}");
        assert_eq!(trim_space(b" \xff "), b"\xff");
        assert_eq!(trim_space(b"\xe2\xc2\x85"), b"\xe2");
        assert_eq!(trim_space(b" \n "), b"");
    }
}
