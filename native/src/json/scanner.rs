//! The scanner under `parse_record`: JSON tokens of one line, validated as
//! Go's scanner validates them, and strings decoded as Go's decoder does.

use std::borrow::Cow;

use super::{LineError, Result, MAX_DEPTH};

/// A string token: the bytes between its quotes, and what decoding it needs.
#[derive(Clone, Copy)]
pub(super) struct Str {
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) escaped: bool,
    pub(super) non_ascii: bool,
}

/// A member's value, as far as assigning it needs to know.
pub(super) enum Value {
    Null,
    Str(Str),
    Number(usize, usize),
    Other, // true, false, an array or an object
}

pub(super) struct Parser<'a> {
    pub(super) s: &'a [u8],
    /// The line as text when it is valid UTF-8 (nearly always): unescaped
    /// strings are then slices of it, with no check of their own.
    pub(super) text: Option<&'a str>,
    pub(super) i: usize,
}


impl<'a> Parser<'a> {
    #[inline]
    pub(super) fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.s.get(self.i) {
            self.i += 1;
        }
    }

    #[inline]
    pub(super) fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    pub(super) fn expect(&mut self, b: u8) -> Result<()> {
        if self.peek() == Some(b) {
            self.i += 1;
            Ok(())
        } else {
            Err(LineError::Syntax)
        }
    }

    pub(super) fn literal(&mut self, word: &[u8]) -> Result<()> {
        if self.s[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(LineError::Syntax)
        }
    }

    /// A string token, the opening quote at `self.i`.
    pub(super) fn string(&mut self) -> Result<Str> {
        self.i += 1;
        let start = self.i;
        let (mut escaped, mut non_ascii) = (false, false);
        loop {
            // Only a quote or a backslash ends a plain run; inside one, a
            // control character is a syntax error and a byte >= 0x80 means
            // the token needs UTF-8 checking. Both tests run over the whole
            // run at once (vectorized), not byte by byte.
            let rest = &self.s[self.i..];
            let stop = memchr::memchr2(b'"', b'\\', rest).ok_or(LineError::Syntax)?;
            let run = &rest[..stop];
            let (control, high) = run
                .iter()
                .fold((false, false), |(c, h), &b| (c | (b < 0x20), h | (b >= 0x80)));
            if control {
                return Err(LineError::Syntax);
            }
            non_ascii |= high;
            self.i += stop;
            if self.s[self.i] == b'"' {
                let end = self.i;
                self.i += 1;
                return Ok(Str { start, end, escaped, non_ascii });
            }
            escaped = true;
            match self.s.get(self.i + 1) {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.i += 2,
                Some(b'u') => {
                    let hex = self.s.get(self.i + 2..self.i + 6).ok_or(LineError::Syntax)?;
                    if !hex.iter().all(u8::is_ascii_hexdigit) {
                        return Err(LineError::Syntax);
                    }
                    self.i += 6;
                }
                _ => return Err(LineError::Syntax),
            }
        }
    }

    /// A number token; returns its span.
    pub(super) fn number(&mut self) -> Result<(usize, usize)> {
        let start = self.i;
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => {
                while self.peek().is_some_and(|b| b.is_ascii_digit()) {
                    self.i += 1;
                }
            }
            _ => return Err(LineError::Syntax),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            self.digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            self.digits()?;
        }
        Ok((start, self.i))
    }

    pub(super) fn digits(&mut self) -> Result<()> {
        let from = self.i;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.i += 1;
        }
        if self.i == from {
            Err(LineError::Syntax)
        } else {
            Ok(())
        }
    }

    /// Validate and skip one array or object, its opening byte at `self.i`,
    /// found at nesting `depth` (the top-level object is depth 1).
    pub(super) fn skip_nested(&mut self, depth: usize) -> Result<()> {
        // What each open container expects next; true for an object.
        let mut stack: Vec<bool> = Vec::new();
        let open = |stack: &mut Vec<bool>, object: bool| {
            stack.push(object);
            if depth + stack.len() - 1 > MAX_DEPTH {
                Err(LineError::TooDeep)
            } else {
                Ok(())
            }
        };
        let first = self.s[self.i];
        self.i += 1;
        open(&mut stack, first == b'{')?;
        // At the start of a container: it may close at once.
        let mut fresh = true;
        loop {
            self.ws();
            let object = *stack.last().expect("a container is open");
            if fresh {
                fresh = false;
                if self.peek() == Some(if object { b'}' } else { b']' }) {
                    self.i += 1;
                    stack.pop();
                    if !self.after_value(&mut stack)? {
                        return Ok(());
                    }
                    continue;
                }
            }
            if object {
                if self.peek() != Some(b'"') {
                    return Err(LineError::Syntax);
                }
                self.string()?;
                self.ws();
                self.expect(b':')?;
                self.ws();
            }
            match self.peek() {
                Some(b @ (b'{' | b'[')) => {
                    self.i += 1;
                    open(&mut stack, b == b'{')?;
                    fresh = true;
                    continue;
                }
                Some(_) => self.scalar()?,
                None => return Err(LineError::Syntax),
            }
            if !self.after_value(&mut stack)? {
                return Ok(());
            }
        }
    }

    /// After a value inside a container: a comma (more to come, true), or
    /// closing brackets, popped until one is followed by a comma. False once
    /// the outermost container has closed.
    pub(super) fn after_value(&mut self, stack: &mut Vec<bool>) -> Result<bool> {
        loop {
            let Some(&object) = stack.last() else { return Ok(false) };
            self.ws();
            match self.peek() {
                Some(b',') => {
                    self.i += 1;
                    return Ok(true);
                }
                Some(b'}') if object => {}
                Some(b']') if !object => {}
                _ => return Err(LineError::Syntax),
            }
            self.i += 1;
            stack.pop();
        }
    }

    /// A string, number or literal.
    pub(super) fn scalar(&mut self) -> Result<()> {
        match self.peek() {
            Some(b'"') => self.string().map(drop),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(b'-' | b'0'..=b'9') => self.number().map(drop),
            _ => Err(LineError::Syntax),
        }
    }

    /// A member's value at nesting depth 2.
    pub(super) fn value(&mut self) -> Result<Value> {
        match self.peek() {
            Some(b'"') => Ok(Value::Str(self.string()?)),
            Some(b'n') => self.literal(b"null").map(|_| Value::Null),
            Some(b't') => self.literal(b"true").map(|_| Value::Other),
            Some(b'f') => self.literal(b"false").map(|_| Value::Other),
            Some(b'-' | b'0'..=b'9') => {
                let (a, b) = self.number()?;
                Ok(Value::Number(a, b))
            }
            Some(b'{' | b'[') => self.skip_nested(2).map(|_| Value::Other),
            _ => Err(LineError::Syntax),
        }
    }

    pub(super) fn decoded(&self, t: Str) -> Cow<'a, str> {
        if !t.escaped {
            // Quotes are ASCII, so the token's ends are character boundaries.
            if let Some(s) = self.text.and_then(|text| text.get(t.start..t.end)) {
                return Cow::Borrowed(s);
            }
        }
        let raw = &self.s[t.start..t.end];
        if !t.escaped {
            if let Ok(s) = std::str::from_utf8(raw) {
                return Cow::Borrowed(s);
            }
        }
        Cow::Owned(unquote(raw))
    }
}

/// Append `raw` (no escapes) with one U+FFFD per byte that does not start a
/// valid UTF-8 sequence, as Go's decoder does.
fn push_lossy(out: &mut String, mut raw: &[u8]) {
    loop {
        match std::str::from_utf8(raw) {
            Ok(s) => {
                out.push_str(s);
                return;
            }
            Err(e) => {
                let (ok, bad) = raw.split_at(e.valid_up_to());
                out.push_str(std::str::from_utf8(ok).expect("valid prefix"));
                // The invalid sequence (or, at the end, the incomplete one):
                // every byte of it is one replacement.
                let n = e.error_len().unwrap_or(bad.len());
                out.extend(std::iter::repeat_n('\u{fffd}', n));
                raw = &bad[n..];
            }
        }
    }
}

fn hex4(h: &[u8]) -> u32 {
    h.iter().fold(0, |v, &b| v * 16 + (b as char).to_digit(16).expect("checked hex") )
}

/// Go's `unquote` of a validated string token's contents.
fn unquote(raw: &[u8]) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let next = raw[i..].iter().position(|&b| b == b'\\').map_or(raw.len(), |p| i + p);
        push_lossy(&mut out, &raw[i..next]);
        i = next;
        if i >= raw.len() {
            break;
        }
        // The token was validated: an escape is complete.
        let c = raw[i + 1];
        i += 2;
        let ch = match c {
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let r = hex4(&raw[i..i + 4]);
                i += 4;
                if (0xD800..0xDC00).contains(&r) {
                    // A high surrogate pairs only with an escaped low one.
                    let low = (raw.get(i..i + 2) == Some(b"\\u"))
                        .then(|| raw.get(i + 2..i + 6))
                        .flatten()
                        .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                        .map(hex4)
                        .filter(|lo| (0xDC00..0xE000).contains(lo));
                    match low {
                        Some(lo) => {
                            i += 6;
                            char::from_u32(0x10000 + ((r - 0xD800) << 10) + (lo - 0xDC00))
                                .unwrap_or('\u{fffd}')
                        }
                        None => '\u{fffd}',
                    }
                } else {
                    char::from_u32(r).unwrap_or('\u{fffd}')
                }
            }
            other => other as char, // " \ /
        };
        out.push(ch);
    }
    out
}
