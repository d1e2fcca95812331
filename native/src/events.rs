//! One event of the log as a record, the way `recall/eventlog/project.py`
//! projects it: kind, title and text from the content's shape, the record
//! line's size, and the exact identifiers the line format has no field for.
//!
//! The plain path is the oracle and stays the definition. A row whose
//! projection depends on something only Python defines (`str()` of a
//! non-string tool name or role, a float re-encoded by msgspec, content
//! that is not JSON) is *declined*: [`describe`] answers `None` and the
//! caller projects that row in Python. Declines are rare by construction
//! (streamd writes the content itself, and ADK's names and roles are
//! strings), and they keep every answer identical to the plain path's.

use std::borrow::Cow;

use crate::gotime::{self, Instant};
use crate::postings::json_string;
use crate::unicode;

mod content;

use content::{Map, Value};

/// A title is cut here, the text there (`project.TITLE_BYTES`, `TEXT_BYTES`).
pub const TITLE_BYTES: usize = 120;
pub const TEXT_BYTES: usize = 64 << 10;
const ARGS_BYTES: usize = 240;
const RESPONSE_BYTES: usize = 480;

/// One row of `LogRequests.event_rows`, borrowed.
pub struct Row<'a> {
    pub seq: i64,
    pub app: &'a str,
    pub user: &'a str,
    pub session: &'a str,
    pub id: &'a str,
    pub invocation: &'a str,
    pub author: &'a str,
    pub branch: &'a str,
    pub at_us: i64,
    pub content: &'a str,
    pub delta: Option<&'a str>,
}

/// What an event says: its record kind, title and text (slices of the
/// stored content where they are that, copies only where they are made).
#[derive(Debug, PartialEq, Eq)]
pub struct Described<'a> {
    pub kind: &'static str,
    pub title: Cow<'a, str>,
    pub text: Cow<'a, str>,
}

/// Kind, title and text of stored content, or `None` for a row the plain
/// path must project (see the module docs).
pub fn describe<'a>(content: &'a str, author: &str, delta: Option<&str>) -> Option<Described<'a>> {
    let value = content::parse(content)?;
    let (mut kind, mut title, mut text) = match parts_of(&value)? {
        Some((parts, role)) => adk(parts, role, author)?,
        None => match &value {
            Value::String(s) => ("message", Cow::Borrowed(""), lend(s)),
            Value::Object(m) if matches!(m.get("text"), Some(Value::String(_))) => {
                let Some(Value::String(s)) = m.get("text") else { unreachable!() };
                ("message", Cow::Borrowed(""), lend(s))
            }
            other => {
                let mut out = Vec::new();
                strings(other, &mut out);
                ("event", Cow::Borrowed(""), joined(out))
            }
        },
    };
    if let Some(delta) = delta {
        if py_strip(&text).is_empty() {
            kind = "state_change";
            let keys = state_keys(delta);
            title = Cow::Owned(format!("state: {keys}"));
            text = Cow::Owned(keys);
        }
    }
    let text = clipped(text, TEXT_BYTES);
    if title.is_empty() {
        title = match &text {
            Cow::Borrowed(t) => Cow::Borrowed(first_line(t)),
            Cow::Owned(t) => Cow::Owned(first_line(t).to_owned()),
        };
    }
    Some(Described { kind, title: clipped(title, TITLE_BYTES), text })
}

/// The first line of the text stripped as Python strips.
fn first_line(text: &str) -> &str {
    py_strip(text).split('\n').next().unwrap_or("")
}

/// A string of the decoded content, for as long as the content lives: a
/// slice of it when the parser lent one, else a copy.
fn lend<'a>(s: &Cow<'a, str>) -> Cow<'a, str> {
    match s {
        Cow::Borrowed(b) => Cow::Borrowed(b),
        Cow::Owned(o) => Cow::Owned(o.clone()),
    }
}

/// Python's `"\n".join(parts)`, without a copy for a single part.
fn joined(mut parts: Vec<Cow<'_, str>>) -> Cow<'_, str> {
    match parts.len() {
        0 => Cow::Borrowed(""),
        1 => parts.pop().unwrap_or_default(),
        _ => Cow::Owned(parts.join("\n")),
    }
}

/// The parts and role of ADK-shaped content (`parts` at the top, or under
/// `content`); `Some(None)` for other content, `None` to decline.
#[allow(clippy::type_complexity)]
fn parts_of<'v, 'a>(value: &'v Value<'a>) -> Option<Option<(&'v Vec<Value<'a>>, Cow<'a, str>)>> {
    let Value::Object(m) = value else { return Some(None) };
    if let Some(Value::Array(parts)) = m.get("parts") {
        return Some(Some((parts, py_str_or_empty(m.get("role"))?)));
    }
    if let Some(Value::Object(inner)) = m.get("content") {
        if let Some(Value::Array(parts)) = inner.get("parts") {
            return Some(Some((parts, py_str_or_empty(inner.get("role"))?)));
        }
    }
    Some(None)
}

#[allow(clippy::type_complexity)]
fn adk<'a>(parts: &[Value<'a>], role: Cow<'a, str>, author: &str)
           -> Option<(&'static str, Cow<'a, str>, Cow<'a, str>)> {
    let mut texts: Vec<Cow<'a, str>> = Vec::new();
    let mut kind = "";
    let mut title = String::new();
    for part in parts {
        let Value::Object(part) = part else { continue };
        if let Some(Value::String(t)) = part.get("text") {
            texts.push(lend(t));
        }
        // The first tool part of either kind names the event's kind and title.
        let mut tool = |found: &'static str, named: String, text: String| {
            texts.push(Cow::Owned(text));
            if kind.is_empty() {
                kind = found;
            }
            if title.is_empty() {
                title = named;
            }
        };
        if let Some(Value::Object(call)) = either(part, "function_call", "functionCall") {
            let name = py_str_or_empty(call.get("name"))?;
            let args = short(call.get("args"), ARGS_BYTES)?;
            tool("tool_call", format!("call {name}"), format!("{name}({args})"));
        }
        if let Some(Value::Object(resp)) = either(part, "function_response", "functionResponse") {
            let name = py_str_or_empty(resp.get("name"))?;
            let shown = short(resp.get("response"), RESPONSE_BYTES)?;
            tool("tool_result", format!("result of {name}"), format!("{name} -> {shown}"));
        }
    }
    if kind.is_empty() {
        let who = if role.is_empty() { author } else { &role };
        kind = if who == "user" { "user_message" } else { "model_message" };
    }
    Some((kind, Cow::Owned(title), joined(texts)))
}

/// Python's `part.get(a, part.get(b))`: `a` when present, even as null.
fn either<'v, 'a>(m: &'v Map<'a>, a: &str, b: &str) -> Option<&'v Value<'a>> {
    m.get(a).or_else(|| m.get(b))
}

/// Python's `str(v or "")` where it is ours to compute: a string, or
/// anything falsy; `None` (decline) for another truthy value.
fn py_str_or_empty<'a>(v: Option<&Value<'a>>) -> Option<Cow<'a, str>> {
    let empty = Some(Cow::Borrowed(""));
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => empty,
        Some(Value::String(s)) => Some(lend(s)),
        Some(Value::Array(a)) if a.is_empty() => empty,
        Some(Value::Object(o)) if o.is_empty() => empty,
        Some(Value::Number(n)) if n.as_i64() == Some(0) || n.as_u64() == Some(0) => empty,
        _ => None,
    }
}

/// A tool call's arguments or result as msgspec writes them, cut short;
/// `None` (decline) if it holds a float, whose text only msgspec defines.
fn short(v: Option<&Value>, limit: usize) -> Option<String> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Some(String::new()) };
    let mut out = Vec::new();
    encode(v, &mut out)?;
    let s = String::from_utf8(out).ok()?;
    Some(clipped(Cow::Owned(s), limit).into_owned())
}

fn encode(v: &Value, out: &mut Vec<u8>) -> Option<()> {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.extend_from_slice(i.to_string().as_bytes());
            } else if let Some(u) = n.as_u64() {
                out.extend_from_slice(u.to_string().as_bytes());
            } else {
                return None;
            }
        }
        Value::String(s) => json_string(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                encode(item, out)?;
            }
            out.push(b']');
        }
        Value::Object(m) => {
            out.push(b'{');
            for (i, (k, item)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                json_string(out, k);
                out.push(b':');
                encode(item, out)?;
            }
            out.push(b'}');
        }
    }
    Some(())
}

/// Every string value, depth first, in stored order.
fn strings<'a>(v: &Value<'a>, out: &mut Vec<Cow<'a, str>>) {
    match v {
        Value::String(s) => out.push(lend(s)),
        Value::Array(items) => items.iter().for_each(|i| strings(i, out)),
        Value::Object(m) => m.values().for_each(|i| strings(i, out)),
        _ => {}
    }
}

fn state_keys(delta: &str) -> String {
    let mut keys: Vec<String> = Vec::new();
    if let Some(Value::Object(scopes)) = content::parse(delta) {
        for scope in ["app", "user", "session"] {
            if let Some(Value::Object(values)) = scopes.get(scope) {
                for (k, _) in values.iter() {
                    keys.push(if scope == "session" { k.to_owned() } else { format!("{scope}:{k}") });
                }
            }
        }
    }
    // Python's `", ".join(keys) or "state"`: one empty key also says "state".
    let joined = keys.join(", ");
    if joined.is_empty() { "state".to_owned() } else { joined }
}

/// Python's `str.isspace` per character: Go's space set and the four
/// information separators U+001C..U+001F.
fn py_space(c: char) -> bool {
    unicode::is_space(c) || ('\u{1c}'..='\u{1f}').contains(&c)
}

fn py_strip(s: &str) -> &str {
    s.trim_matches(py_space)
}

/// [`clip`], keeping a string that fits as it is.
fn clipped(s: Cow<'_, str>, limit: usize) -> Cow<'_, str> {
    if s.len() <= limit { s } else { Cow::Owned(clip(&s, limit)) }
}

/// `render.clip`: within `limit` UTF-8 bytes, else cut at a character
/// boundary, trimmed of Go spaces and marked with an ellipsis.
pub fn clip(s: &str, limit: usize) -> String {
    if s.len() <= limit {
        return s.to_owned();
    }
    let mut end = limit;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = s[..end].trim_matches(unicode::is_space).to_owned();
    out.push('…');
    out
}

/// The record line `project.line` writes for `row` with `d` (msgspec's
/// encoding of `_Line`, newline included), appended to `out`.
pub fn write_line(out: &mut Vec<u8>, row: &Row<'_>, d: &Described, when: &str) {
    out.extend_from_slice(b"{\"schema\":2,\"id\":");
    json_string(out, row.id);
    out.extend_from_slice(b",\"kind\":");
    json_string(out, d.kind);
    out.extend_from_slice(b",\"event_time\":");
    json_string(out, when);
    out.extend_from_slice(b",\"observed_at\":");
    json_string(out, when);
    out.extend_from_slice(b",\"correlation\":");
    json_string(out, row.session);
    out.extend_from_slice(b",\"system\":");
    json_string(out, row.app);
    for (name, value) in [("actor", row.author), ("title", &*d.title), ("text", &*d.text)] {
        if !value.is_empty() {
            out.extend_from_slice(b",\"");
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\":");
            json_string(out, value);
        }
    }
    out.extend_from_slice(b"}\n");
}

/// The length of the line [`write_line`] writes, without writing it (the
/// size column is all the index keeps of the line).
pub fn line_len(row: &Row<'_>, d: &Described, when: Instant) -> usize {
    let mut n = r#"{"schema":2,"id":,"kind":,"event_time":,"observed_at":,"correlation":,"system":}"#
        .len() + 1;
    n += json_len(row.id) + json_len(d.kind) + json_len(row.session) + json_len(row.app);
    n += 2 * (2 + nano_len(when));
    for (name, value) in [("actor", row.author), ("title", &*d.title), ("text", &*d.text)] {
        if !value.is_empty() {
            n += name.len() + 4 + json_len(value);
        }
    }
    n
}

/// The length of `json_string`'s output for `s`.
fn json_len(s: &str) -> usize {
    let mut n = s.len() + 2;
    if !needs_escape(s.as_bytes()) {
        return n;
    }
    for &c in s.as_bytes() {
        if c < 0x20 {
            n += if matches!(c, 0x08 | 0x0c | b'\n' | b'\r' | b'\t') { 1 } else { 5 };
        } else if c == b'"' || c == b'\\' {
            n += 1;
        }
    }
    n
}

/// Whether `b` holds a byte JSON escapes. Most strings hold none: this
/// says so 32 bytes at a time (a chunk without an early exit is compiled to
/// vector compares), where the count above goes byte by byte.
fn needs_escape(b: &[u8]) -> bool {
    let hit = |c: u8| (c < 0x20) | (c == b'"') | (c == b'\\');
    let mut chunks = b.chunks_exact(32);
    for chunk in &mut chunks {
        if chunk.iter().fold(false, |any, &c| any | hit(c)) {
            return true;
        }
    }
    chunks.remainder().iter().any(|&c| hit(c))
}

/// The length of [`format_nano`]'s text for a printable instant.
fn nano_len(t: Instant) -> usize {
    if t.nsec == 0 {
        20
    } else {
        21 + 9 - t.nsec.trailing_zeros_decimal()
    }
}

trait DecimalZeros {
    fn trailing_zeros_decimal(self) -> usize;
}

impl DecimalZeros for u32 {
    fn trailing_zeros_decimal(mut self) -> usize {
        let mut n = 0;
        while self % 10 == 0 {
            self /= 10;
            n += 1;
        }
        n
    }
}

/// Go's RFC3339Nano in UTC (`gotime.format_nano`), for a printable instant.
pub fn format_nano(t: Instant) -> String {
    let days = t.sec.div_euclid(86_400);
    let rem = t.sec.rem_euclid(86_400);
    let (year, month, day) = gotime::civil_from_days(days);
    let mut s = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    );
    if t.nsec != 0 {
        let frac = format!("{:09}", t.nsec);
        s.push('.');
        s.push_str(frac.trim_end_matches('0'));
    }
    s.push('Z');
    s
}

/// The instant of a row's timestamp (microseconds since the epoch).
pub fn instant_of(at_us: i64) -> Instant {
    Instant::from_nanos(at_us as i128 * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(content: &str) -> Option<Described<'_>> {
        describe(content, "model", None)
    }

    #[test]
    fn adk_text_parts_are_the_text_and_the_role_decides_the_kind() {
        let got = d(r#"{"role":"user","parts":[{"text":"hello"},{"text":" there "}]}"#).unwrap();
        assert_eq!((got.kind, &*got.title, &*got.text), ("user_message", "hello", "hello\n there "));
        let got = describe(r#"{"content":{"parts":[{"text":"x"}]}}"#, "user", None).unwrap();
        assert_eq!(got.kind, "user_message");
        assert_eq!(d(r#"{"parts":[{"text":"x"}]}"#).unwrap().kind, "model_message");
    }

    #[test]
    fn a_tool_call_is_its_name_and_short_arguments() {
        let got = d(r#"{"parts":[{"function_call":{"name":"run","args":{"q":"a\"b","n":3}}}]}"#)
            .unwrap();
        assert_eq!((got.kind, &*got.title, &*got.text), ("tool_call", "call run", r#"run({"q":"a\"b","n":3})"#));
        let got = d(r#"{"parts":[{"functionResponse":{"name":"run","response":[true,null]}}]}"#)
            .unwrap();
        assert_eq!((got.kind, &*got.text), ("tool_result", "run -> [true,null]"));
    }

    #[test]
    fn what_only_python_defines_is_declined() {
        assert_eq!(d(r#"{"parts":[{"function_call":{"name":7}}]}"#), None);
        assert_eq!(d(r#"{"parts":[{"function_call":{"name":"f","args":{"x":1.5}}}]}"#), None);
        assert_eq!(d(r#"{"role":["user"],"parts":[]}"#), None);
        assert_eq!(d("not json"), None);
        // A float nobody re-encodes is fine.
        assert_eq!(d(r#"{"score":1.5,"note":"n"}"#).unwrap().text, "n");
    }

    #[test]
    fn other_json_is_its_strings_in_order_and_state_names_its_keys() {
        assert_eq!(d(r#"{"b":["x",{"c":"y"}],"a":"z","n":1}"#).unwrap().text, "x\ny\nz");
        let got = describe(r#"{}"#, "a", Some(r#"{"user":{"k":1},"session":{"s":2}}"#)).unwrap();
        assert_eq!((got.kind, &*got.title, &*got.text), ("state_change", "state: user:k, s", "user:k, s"));
    }

    #[test]
    fn clip_cuts_at_a_character_and_trims_go_spaces() {
        assert_eq!(clip("ab", 2), "ab");
        assert_eq!(clip("a é", 3), "a…");
        // U+001C is space to Python, not to Go: clip keeps it.
        assert_eq!(clip("\u{1c}ab", 2), "\u{1c}a…");
    }

    #[test]
    fn the_line_length_is_the_written_lines() {
        let contents = [r#"{"parts":[{"text":"a\"b\u0001\n"}]}"#, r#""plain""#, r#"{}"#];
        for (i, content) in contents.into_iter().enumerate() {
            for at_us in [0, 1, 1_500_000, 1_234_567_891] {
                let row = Row { seq: 1, app: "a\\pp", user: "u", session: "s\t", id: "e",
                                invocation: "", author: if i == 1 { "" } else { "me" }, branch: "",
                                at_us, content, delta: Some("{}") };
                let d = describe(content, row.author, row.delta).unwrap();
                let when = instant_of(at_us);
                let mut out = Vec::new();
                write_line(&mut out, &row, &d, &format_nano(when));
                assert_eq!(line_len(&row, &d, when), out.len(), "{}", String::from_utf8_lossy(&out));
            }
        }
    }

    #[test]
    fn times_print_as_go_does() {
        assert_eq!(format_nano(instant_of(0)), "1970-01-01T00:00:00Z");
        assert_eq!(format_nano(instant_of(1_500_000)), "1970-01-01T00:00:01.5Z");
    }
}
