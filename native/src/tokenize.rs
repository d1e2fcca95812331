//! The reference tokenizer: identifier runs, lowercased per character.
//!
//! A token is a maximal run of letters, decimal digits and `- _ . / :`
//! (Go's `unicode.IsLetter` / `unicode.IsDigit`, Unicode 17), lowercased
//! with Go's per-rune `unicode.ToLower`, with the five joiners trimmed from
//! both ends; an empty result is no token. The plain path
//! (`recall/tokenize.py`) is the oracle for every rule here.

use crate::unicode;

/// 0: separates tokens; 1: builds tokens as it is; 2: an ASCII capital.
const ASCII_CLASS: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut c = 0;
    while c < 128 {
        let b = c as u8;
        t[c] = if b.is_ascii_lowercase() || b.is_ascii_digit() {
            1
        } else if b.is_ascii_uppercase() {
            2
        } else {
            match b {
                b'-' | b'_' | b'.' | b'/' | b':' => 1,
                _ => 0,
            }
        };
        c += 1;
    }
    t
};

#[inline]
fn is_joiner(b: u8) -> bool {
    matches!(b, b'-' | b'_' | b'.' | b'/' | b':')
}

/// Reused between calls so a token costs no allocation.
#[derive(Default)]
pub struct Tokenizer {
    buf: String,
}

impl Tokenizer {
    /// Call `emit` with each token of `s`, in order.
    pub fn tokens(&mut self, s: &str, mut emit: impl FnMut(&str)) {
        self.tokens_ended(s, |t, _| emit(t));
    }

    /// [`Tokenizer::tokens`], with where each token's run stopped: for a
    /// token of the ASCII text on the fast path, the index of the separator
    /// that ended it (`s.len()` at the end of `s`); for any other token,
    /// `usize::MAX`. A token whose separator lies at `i` is a token of
    /// every string that shares `s[..=i]`.
    pub fn tokens_ended(&mut self, s: &str, mut emit: impl FnMut(&str, usize)) {
        if s.is_ascii() {
            self.ascii(s, &mut emit);
            return;
        }
        // No token spans a separator, so the ASCII text up to the last
        // separator before the first other character takes the fast path
        // and only the rest goes character by character (a title cut short
        // ends in '…', which used to send all of it the slow way).
        let b = s.as_bytes();
        let first = b.iter().position(|&c| c >= 0x80).unwrap_or(b.len());
        let split = b[..first].iter().rposition(|&c| ASCII_CLASS[c as usize] == 0).map_or(0, |p| p + 1);
        self.ascii(&s[..split], &mut emit);
        self.unicode(&s[split..], &mut |t: &str| emit(t, usize::MAX));
    }

    fn ascii(&mut self, s: &str, emit: &mut impl FnMut(&str, usize)) {
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if ASCII_CLASS[b[i] as usize] == 0 {
                i += 1;
                continue;
            }
            let mut end = i;
            let mut capital = false;
            while end < b.len() {
                match ASCII_CLASS[b[end] as usize] {
                    0 => break,
                    2 => capital = true,
                    _ => {}
                }
                end += 1;
            }
            let (mut lo, mut hi) = (i, end);
            while lo < hi && is_joiner(b[lo]) {
                lo += 1;
            }
            while hi > lo && is_joiner(b[hi - 1]) {
                hi -= 1;
            }
            // Every byte of ASCII text is a character boundary.
            if let Some(run) = s.get(lo..hi).filter(|r| !r.is_empty()) {
                if capital {
                    self.buf.clear();
                    self.buf.push_str(run);
                    self.buf.make_ascii_lowercase();
                    emit(&self.buf, end);
                } else {
                    emit(run, end);
                }
            }
            i = end;
        }
    }

    fn unicode(&mut self, s: &str, emit: &mut impl FnMut(&str)) {
        self.buf.clear();
        for c in s.chars() {
            match unicode::token_char(c) {
                Some(low) => self.buf.push(low),
                None => self.flush(emit),
            }
        }
        self.flush(emit);
    }

    fn flush(&mut self, emit: &mut impl FnMut(&str)) {
        if !self.buf.is_empty() {
            let token = self.buf.trim_matches(unicode::JOINERS);
            if !token.is_empty() {
                emit(token);
            }
            self.buf.clear();
        }
    }
}

/// Every token of `s` (for tests and the Python-facing `tokenize`).
pub fn tokenize(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    Tokenizer::default().tokens(s, |t| out.push(t.to_owned()));
    out
}

/// Simple case folding of a whole string (see [`unicode::fold`]).
pub fn fold(s: &str) -> std::borrow::Cow<'_, str> {
    if s.bytes().all(|b| !b.is_ascii_uppercase() && b < 0x80) {
        return std::borrow::Cow::Borrowed(s);
    }
    std::borrow::Cow::Owned(s.chars().map(unicode::fold).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifier_runs_survive_whole() {
        assert_eq!(tokenize("td-f62256 C0RECALL/1746177600.000200"),
                   ["td-f62256", "c0recall/1746177600.000200"]);
        assert_eq!(tokenize("--a--b-- ...:: /x/"), ["a--b", "x"]);
        assert_eq!(tokenize("x² ½"), ["x"]);
        assert_eq!(tokenize(""), Vec::<String>::new());
    }

    #[test]
    fn lowercasing_is_per_character() {
        assert_eq!(tokenize("İSTANBUL ΟΔΟΣ"), ["istanbul", "οδοσ"]);
        assert_eq!(tokenize("Straße-1"), ["straße-1"]);
        assert_eq!(tokenize("a\u{1e900}b😀c"), ["a\u{1e922}b", "c"]);
    }

    #[test]
    fn text_with_some_non_ascii_tokenizes_as_if_all_of_it_went_character_by_character() {
        let texts = ["w0001 W0002 abc…", "abc…", "…abc", "x-y/Z:é.b", "a b-é c", "AB CD ÉF gh",
                     "one two\tthree\nfour…five", "--x-- ½ y", "tail-_", "é"];
        for text in texts {
            let mut whole = Vec::new();
            Tokenizer::default().unicode(text, &mut |t: &str| whole.push(t.to_owned()));
            let mut ended = Vec::new();
            Tokenizer::default().tokens_ended(text, |t, _| ended.push(t.to_owned()));
            assert_eq!(ended, whole, "{text}");
            assert_eq!(tokenize(text), whole, "{text}");
        }
    }

    #[test]
    fn fold_is_simple_case_folding() {
        assert_eq!(fold("STRASSE-1"), "strasse-1");
        assert_eq!(fold("ſchema"), "schema");
        assert_ne!(fold("straße-1"), fold("strasse-1"));
    }
}
