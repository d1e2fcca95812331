//! Go's Unicode tables, as far as the reference adapter's text rules use them:
//! which runes build tokens (`unicode.IsLetter || unicode.IsDigit`), how a
//! rune lowercases (`unicode.ToLower`), how it folds (`strings.EqualFold`),
//! and what `bytes.TrimSpace` trims.
//!
//! The tables are generated at build time from `golang/gounicode.py`, the
//! file the plain Python path reads, so both paths use one edition
//! ([`UNICODE_VERSION`], pinned to the Go that builds the reference).
//! Lookups for the Basic Multilingual Plane go through one table built on
//! first use; runes beyond it (rare in practice) are binary-searched.

use std::sync::OnceLock;

mod tables {
    include!(concat!(env!("OUT_DIR"), "/unicode_tables.rs"));
}

pub use tables::UNICODE_VERSION;

/// Characters that join letters and digits inside a token.
pub const JOINERS: &[char] = &['-', '_', '.', '/', ':'];

const BMP_END: u32 = 0x10000;
/// In [`bmp`]: the rune separates tokens.
const SEPARATOR: u32 = u32::MAX;

fn in_ranges(r: u32) -> bool {
    let ranges = &tables::LETTER_OR_DIGIT;
    // The last range starting at or before r is the only one that can hold it.
    let i = ranges.partition_point(|&(lo, _)| lo <= r);
    i > 0 && r <= ranges[i - 1].1
}

/// Apply a table of (lo, hi, stride, delta) groups: r + delta if a group holds r.
fn mapped(groups: &[(u32, u32, u32, i32)], r: u32) -> u32 {
    let i = groups.partition_point(|&(lo, _, _, _)| lo <= r);
    if i == 0 {
        return r;
    }
    let (lo, hi, stride, delta) = groups[i - 1];
    if r <= hi && (r - lo) % stride == 0 {
        r.wrapping_add_signed(delta)
    } else {
        r
    }
}

/// Go's `unicode.ToLower` for one rune.
pub fn to_lower(c: char) -> char {
    if c.is_ascii() {
        return c.to_ascii_lowercase();
    }
    char::from_u32(mapped(&tables::TO_LOWER, c as u32)).unwrap_or(c)
}

/// The member of `c`'s simple case folding orbit that stands for the orbit:
/// `fold(a) == fold(b)` exactly when Go's `strings.EqualFold` equates them.
/// Orbits holding an ASCII letter stand as that letter in lowercase.
pub fn fold(c: char) -> char {
    if c.is_ascii() {
        return c.to_ascii_lowercase();
    }
    char::from_u32(mapped(&tables::FOLD, c as u32)).unwrap_or(c)
}

/// Whether `unicode.IsSpace` holds.
pub fn is_space(c: char) -> bool {
    tables::SPACE.contains(&(c as u32))
}

/// Index = a BMP rune: its lowercase if it builds tokens, else SEPARATOR.
fn bmp() -> &'static [u32] {
    static TABLE: OnceLock<Vec<u32>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = vec![SEPARATOR; BMP_END as usize];
        for &(lo, hi) in tables::LETTER_OR_DIGIT.iter() {
            for r in lo..=hi.min(BMP_END - 1) {
                t[r as usize] = r;
            }
        }
        for &j in JOINERS {
            t[j as usize] = j as u32;
        }
        for (r, slot) in t.iter_mut().enumerate() {
            if *slot != SEPARATOR {
                if let Some(c) = char::from_u32(r as u32) {
                    *slot = to_lower(c) as u32;
                }
            }
        }
        t
    })
}

/// A token character (letter, digit or joiner) lowercased, or None for a
/// character that separates tokens.
#[inline]
pub fn token_char(c: char) -> Option<char> {
    let r = c as u32;
    if r < BMP_END {
        let v = bmp()[r as usize];
        if v == SEPARATOR {
            None
        } else {
            char::from_u32(v)
        }
    } else if in_ranges(r) {
        Some(to_lower(c))
    } else {
        None
    }
}

/// Force the lookup table to be built (so a timed build does not pay for it).
pub fn warm() {
    let _ = bmp();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_edition_is_the_pinned_one() {
        assert_eq!(UNICODE_VERSION, "17.0.0");
    }

    #[test]
    fn letters_digits_and_joiners_build_tokens() {
        assert_eq!(token_char('A'), Some('a'));
        assert_eq!(token_char('7'), Some('7'));
        assert_eq!(token_char('-'), Some('-'));
        assert_eq!(token_char(' '), None);
        assert_eq!(token_char('²'), None); // a number, not a decimal digit
        assert_eq!(token_char('½'), None);
        assert_eq!(token_char('İ'), Some('i'));
        assert_eq!(token_char('Σ'), Some('σ'));
        assert_eq!(token_char('\u{1e900}'), Some('\u{1e922}')); // Adlam, beyond the BMP
        assert_eq!(token_char('\u{1f600}'), None); // an emoji
    }

    #[test]
    fn folding_equates_what_equalfold_does() {
        assert_eq!(fold('ſ'), 's');
        assert_eq!(fold('\u{212a}'), 'k'); // Kelvin sign
        assert_eq!(fold('ß'), 'ß');
        assert_eq!(fold('µ'), fold('μ'));
    }

    #[test]
    fn go_white_space() {
        for c in ['\t', '\n', '\u{b}', '\u{c}', '\r', ' ', '\u{85}', '\u{a0}', '\u{3000}'] {
            assert!(is_space(c), "{c:?}");
        }
        assert!(!is_space('\u{1c}'));
        assert!(!is_space('\u{feff}'));
    }
}
