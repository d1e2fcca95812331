//! One trimmed JSONL line -> one record, decoded the way Go's encoding/json
//! decodes it into the reference's record struct.
//!
//! The rules (RECALL-ADAPTER-NOTES, "Edge behaviour"; `recall/records.py`
//! is the oracle the property tests hold this to):
//!
//! * The whole line must be one valid JSON value (Go checks the syntax of
//!   everything before it assigns anything), nesting at most 10,000 arrays
//!   and objects deep (Go's scanner limit). Raw control characters inside a
//!   string are a syntax error; invalid UTF-8 inside a string is not: it
//!   decodes to one U+FFFD per invalid byte, as does a lone surrogate escape.
//! * A top-level `null` is an empty record; any other non-object fails.
//! * Keys match the known fields exactly or under simple case folding
//!   (`ID`, `Event_Time`, `ſchema`); members are applied in order, so the
//!   last of duplicate keys wins; other keys are skipped.
//! * `null` leaves a field as it was, except `observed_at` (a pointer in Go),
//!   which it clears. A value of the wrong JSON type fails the line, even
//!   when a later duplicate would be fine: `schema` must be an integer
//!   literal within int64 (`1.0`, `1e0`, `"1"` fail), every other field a
//!   string.
//! * Times are parsed from the raw bytes between the quotes, unescaped
//!   (Go's `time.Time.UnmarshalJSON`): an escape in a time fails it.
//!
//! Nothing here recurses: nested values are only validated and skipped,
//! with an explicit stack, so a hostile line cannot exhaust the stack.

use std::borrow::Cow;

use crate::gotime::{self, Instant};
use crate::tokenize::fold;

mod scanner;

use scanner::{Parser, Str, Value};

/// Go's `maxNestingDepth`.
pub const MAX_DEPTH: usize = 10_000;

/// Why a line is not a record. Only the kind is kept: a failed line is
/// counted, never reported one by one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineError {
    Syntax,
    TooDeep,
    NotAnObject,
    WrongType(Field),
    BadTime(Field),
    UnsupportedSchema,
    NoIdOrEventTime,
    Unprintable(Field),
}

/// The record fields the reference knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Schema,
    Id,
    Kind,
    EventTime,
    ObservedAt,
    System,
    Ref,
    Correlation,
    Title,
    Body,
    Text,
    Actor,
    Revision,
}

const FIELDS: [(&str, Field); 13] = [
    ("schema", Field::Schema),
    ("id", Field::Id),
    ("kind", Field::Kind),
    ("event_time", Field::EventTime),
    ("observed_at", Field::ObservedAt),
    ("system", Field::System),
    ("ref", Field::Ref),
    ("correlation", Field::Correlation),
    ("title", Field::Title),
    ("body", Field::Body),
    ("text", Field::Text),
    ("actor", Field::Actor),
    ("revision", Field::Revision),
];

/// A decoded record; strings borrow from the line when nothing needed decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub schema: i64,
    pub id: Cow<'a, str>,
    pub kind: Cow<'a, str>,
    pub event_time: Instant,
    pub observed_at: Option<Instant>,
    pub system: Cow<'a, str>,
    pub reference: Cow<'a, str>,
    pub correlation: Cow<'a, str>,
    pub title: Cow<'a, str>,
    pub text: Cow<'a, str>,
    pub actor: Cow<'a, str>,
    pub revision: Cow<'a, str>,
}

/// The fields as assigned so far (Go's struct during Unmarshal).
#[derive(Default)]
struct Fields<'a> {
    schema: i64,
    id: Cow<'a, str>,
    kind: Cow<'a, str>,
    event_time: Option<Instant>,
    observed_at: Option<Instant>,
    system: Cow<'a, str>,
    reference: Cow<'a, str>,
    correlation: Cow<'a, str>,
    title: Cow<'a, str>,
    body: Cow<'a, str>,
    text: Cow<'a, str>,
    actor: Cow<'a, str>,
    revision: Cow<'a, str>,
}

type Result<T> = std::result::Result<T, LineError>;

/// The known field a key spells exactly.
fn exact_field(raw: &[u8]) -> Option<Field> {
    Some(match raw {
        b"schema" => Field::Schema,
        b"id" => Field::Id,
        b"kind" => Field::Kind,
        b"event_time" => Field::EventTime,
        b"observed_at" => Field::ObservedAt,
        b"system" => Field::System,
        b"ref" => Field::Ref,
        b"correlation" => Field::Correlation,
        b"title" => Field::Title,
        b"body" => Field::Body,
        b"text" => Field::Text,
        b"actor" => Field::Actor,
        b"revision" => Field::Revision,
        _ => return None,
    })
}

/// The known field a key names, matched exactly or under simple case folding.
fn field_of(p: &Parser<'_>, key: Str) -> Option<Field> {
    let raw = &p.s[key.start..key.end];
    if !key.escaped && !key.non_ascii {
        if let Some(f) = exact_field(raw) {
            return Some(f);
        }
        if raw.len() > 11 {
            return None; // longer than any known name
        }
        return FIELDS.iter().find(|(n, _)| n.as_bytes().eq_ignore_ascii_case(raw)).map(|&(_, f)| f);
    }
    let decoded = p.decoded(key);
    let folded = fold(&decoded);
    FIELDS.iter().find(|(n, _)| *n == folded).map(|&(_, f)| f)
}

/// Go's `strconv.ParseInt(token, 10, 64)` of a number token.
fn parse_int(token: &[u8]) -> Option<i64> {
    let (neg, digits) = match token.split_first() {
        Some((b'-', d)) => (true, d),
        _ => (false, token),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None; // a fraction or an exponent
    }
    let mut v: i128 = 0;
    for &d in digits {
        v = v * 10 + (d - b'0') as i128;
        if v > i64::MAX as i128 + 1 {
            return None;
        }
    }
    let v = if neg { -v } else { v };
    i64::try_from(v).ok()
}

fn assign<'a>(p: &Parser<'a>, f: &mut Fields<'a>, field: Field, value: Value) -> Result<()> {
    match (field, value) {
        (Field::ObservedAt, Value::Null) => f.observed_at = None,
        (_, Value::Null) => {}
        (Field::Schema, Value::Number(a, b)) => {
            f.schema = parse_int(&p.s[a..b]).ok_or(LineError::WrongType(field))?;
        }
        (Field::EventTime | Field::ObservedAt, Value::Str(t)) => {
            // The raw bytes, unescaped: an escape can never be a time.
            let t = (!t.escaped).then(|| gotime::parse(&p.s[t.start..t.end])).flatten();
            let t = t.ok_or(LineError::BadTime(field))?;
            if field == Field::EventTime {
                f.event_time = Some(t);
            } else {
                f.observed_at = Some(t);
            }
        }
        (Field::Schema | Field::EventTime | Field::ObservedAt, _) => {
            return Err(LineError::WrongType(field))
        }
        (_, Value::Str(t)) => {
            let s = p.decoded(t);
            let slot = match field {
                Field::Id => &mut f.id,
                Field::Kind => &mut f.kind,
                Field::System => &mut f.system,
                Field::Ref => &mut f.reference,
                Field::Correlation => &mut f.correlation,
                Field::Title => &mut f.title,
                Field::Body => &mut f.body,
                Field::Text => &mut f.text,
                Field::Actor => &mut f.actor,
                Field::Revision => &mut f.revision,
                Field::Schema | Field::EventTime | Field::ObservedAt => unreachable!(),
            };
            *slot = s;
        }
        (_, _) => return Err(LineError::WrongType(field)),
    }
    Ok(())
}

/// The members of the top-level object, applied in order.
fn gather(line: &[u8]) -> Result<Fields<'_>> {
    let mut p = Parser { s: line, text: std::str::from_utf8(line).ok(), i: 0 };
    let mut f = Fields::default();
    p.ws();
    match p.peek() {
        Some(b'{') => p.i += 1,
        Some(b'n') => {
            // Unmarshalling null into a struct leaves it as it was.
            p.literal(b"null")?;
            p.ws();
            return if p.i == line.len() { Ok(f) } else { Err(LineError::Syntax) };
        }
        Some(b'[') => {
            p.skip_nested(1)?;
            return Err(LineError::NotAnObject);
        }
        _ => {
            p.scalar()?;
            return Err(LineError::NotAnObject);
        }
    }
    p.ws();
    if p.peek() == Some(b'}') {
        p.i += 1;
    } else {
        // A type error fails the line; so does a syntax error anywhere, so
        // stopping at the first of either decides the same.
        loop {
            p.ws();
            if p.peek() != Some(b'"') {
                return Err(LineError::Syntax);
            }
            let key = p.string()?;
            p.ws();
            p.expect(b':')?;
            p.ws();
            let value = p.value()?;
            if let Some(field) = field_of(&p, key) {
                assign(&p, &mut f, field, value)?;
            }
            p.ws();
            match p.peek() {
                Some(b',') => p.i += 1,
                Some(b'}') => {
                    p.i += 1;
                    break;
                }
                _ => return Err(LineError::Syntax),
            }
        }
    }
    p.ws();
    if p.i != line.len() {
        return Err(LineError::Syntax);
    }
    Ok(f)
}

/// Parse one trimmed, non-empty line.
pub fn parse_record(line: &[u8]) -> Result<Record<'_>> {
    let f = gather(line)?;
    if !(1..=2).contains(&f.schema) {
        return Err(LineError::UnsupportedSchema);
    }
    let event_time = f.event_time.unwrap_or(gotime::ZERO_TIME);
    if f.id.is_empty() || event_time == gotime::ZERO_TIME {
        return Err(LineError::NoIdOrEventTime);
    }
    if !gotime::printable(event_time) {
        // Deliberate difference: the reference indexes it and then fails
        // every search that would return it.
        return Err(LineError::Unprintable(Field::EventTime));
    }
    if f.observed_at.is_some_and(|t| !gotime::printable(t)) {
        return Err(LineError::Unprintable(Field::ObservedAt));
    }
    let v2 = f.schema == 2;
    Ok(Record {
        schema: f.schema,
        id: f.id,
        kind: if f.kind.is_empty() { Cow::Borrowed("event") } else { f.kind },
        event_time,
        // Go's zero time is no time: the build's is stamped, as for none.
        observed_at: f.observed_at.filter(|&t| t != gotime::ZERO_TIME),
        system: f.system,
        reference: f.reference,
        correlation: f.correlation,
        title: f.title,
        text: if v2 { f.text } else { f.body },
        actor: if v2 { f.actor } else { Cow::Borrowed("") },
        revision: f.revision,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(line: &str) -> Record<'static> {
        // Leaked so a test can keep the record of a line it formatted.
        let line: &'static str = Box::leak(line.to_owned().into_boxed_str());
        parse_record(line.as_bytes()).unwrap_or_else(|e| panic!("{line}: {e:?}"))
    }

    fn fails(line: &[u8]) {
        assert!(parse_record(line).is_err(), "{}", String::from_utf8_lossy(line));
    }

    const T: &str = r#""event_time":"2026-05-02T10:00:00Z""#;

    #[test]
    fn a_plain_record() {
        let r = ok(&format!(r#"{{"schema":2,"id":"a",{T},"text":"hi","actor":"me"}}"#));
        assert_eq!((r.schema, &*r.id, &*r.kind, &*r.text, &*r.actor), (2, "a", "event", "hi", "me"));
        let r = ok(&format!(r#"{{"schema":1,"id":"a",{T},"body":"b","text":"t","actor":"x"}}"#));
        assert_eq!((&*r.text, &*r.actor), ("b", ""));
    }

    #[test]
    fn keys_fold_and_the_last_duplicate_wins() {
        let r = ok(&format!(r#"{{"SCHEMA":1,"ID":"a","Id":"b",{T},"ſystem":"s","\u004bind":"k"}}"#));
        assert_eq!((&*r.id, &*r.system, &*r.kind), ("b", "s", "k"));
    }

    #[test]
    fn gos_zero_time_as_observed_at_is_none() {
        for zero in ["0001-01-01T00:00:00Z", "0001-01-01T01:00:00+01:00"] {
            let line = format!(r#"{{"schema":1,"id":"a",{T},"observed_at":"{zero}"}}"#);
            assert_eq!(parse_record(line.as_bytes()).unwrap().observed_at, None);
        }
        let line = format!(r#"{{"schema":1,"id":"a",{T},"observed_at":"0001-01-01T00:00:01Z"}}"#);
        assert!(parse_record(line.as_bytes()).unwrap().observed_at.is_some());
    }

    #[test]
    fn null_keeps_a_field_but_clears_observed_at() {
        let r = ok(&format!(r#"{{"schema":1,"id":"a","id":null,{T},"event_time":null}}"#));
        assert_eq!(&*r.id, "a");
        let r = ok(&format!(
            r#"{{"schema":1,"id":"a",{T},"observed_at":"2026-05-02T10:00:00Z","observed_at":null}}"#
        ));
        assert_eq!(r.observed_at, None);
    }

    #[test]
    fn wrong_types_fail_the_line_even_before_a_good_duplicate() {
        for bad in [r#""schema":1.0"#, r#""schema":1e0"#, r#""schema":"1""#, r#""revision":7"#,
                    r#""schema":true"#, r#""id":["a"]"#, r#""schema":9223372036854775808"#] {
            fails(format!(r#"{{"schema":1,"id":"a",{T},{bad}}}"#).as_bytes());
        }
        fails(format!(r#"{{"schema":1.0,"schema":1,"id":"a",{T}}}"#).as_bytes());
        assert_eq!(ok(&format!(r#"{{"schema":1,"schema":-0,"schema":2,"id":"a",{T}}}"#)).schema, 2);
    }

    #[test]
    fn invalid_utf8_is_replaced_per_byte_and_kept() {
        let line = [&b"{\"schema\":1,\"id\":\"a\xe2\x80\","[..], T.as_bytes(), b"}"].concat();
        let r = parse_record(&line).unwrap();
        assert_eq!(r.id, "a\u{fffd}\u{fffd}");
        fails(b"{\"schema\":1,\xff\"id\":\"a\"}");
        // Invalid bytes elsewhere in the line leave the other strings whole.
        let line = [&b"{\"schema\":1,\"x\":\"\xff\",\"id\":\"\xc3\xa9t\xc3\xa9\","[..], T.as_bytes(), b"}"]
            .concat();
        assert_eq!(parse_record(&line).unwrap().id, "\u{e9}t\u{e9}");
    }

    #[test]
    fn every_known_name_is_matched_exactly() {
        for (name, field) in FIELDS {
            assert_eq!(exact_field(name.as_bytes()), Some(field));
        }
        assert_eq!(exact_field(b"ID"), None);
    }

    #[test]
    fn surrogate_escapes() {
        let r = ok(&format!(r#"{{"schema":1,"id":"\ud83d\ude00\ud800\u0041\udc00",{T}}}"#));
        assert_eq!(r.id, "😀\u{fffd}A\u{fffd}");
    }

    #[test]
    fn syntax_and_control_characters() {
        fails(b"{\"schema\":1,\"id\":\"a\tb\"}");
        fails(format!(r#"{{"schema":1,"id":"a",{T},}}"#).as_bytes());
        fails(format!(r#"{{"schema":1,"id":"a",{T}}} x"#).as_bytes());
        fails(format!(r#"{{"schema":01,"id":"a",{T}}}"#).as_bytes());
        fails(format!(r#"{{"schema":1,"id":"a",{T},"x":NaN}}"#).as_bytes());
        fails(format!(r#"{{"schema":1,"id":"a",{T},"x":[1,]}}"#).as_bytes());
        fails(b"null");
        fails(b"[]");
        fails(b"\"x\"");
        ok(&format!("{{\"schema\":1,\"id\":\"a\u{2028}\",{T}}}"));
    }

    #[test]
    fn an_escaped_time_is_not_a_time() {
        fails(br#"{"schema":1,"id":"a","event_time":"2026-05-02T10:00:00\u005a"}"#);
        ok(r#"{"schema":1,"id":"a","event\u005ftime":"2026-05-02T10:00:00Z"}"#);
    }

    #[test]
    fn nesting_is_bounded_as_in_go() {
        let deep = |d: usize| format!(r#"{{"schema":1,"id":"a",{T},"x":{}{}}}"#, "[".repeat(d), "]".repeat(d));
        ok(&deep(MAX_DEPTH - 1)); // with the record itself, MAX_DEPTH levels
        fails(deep(MAX_DEPTH).as_bytes());
        let objects = format!(r#"{{"schema":1,"id":"a",{T},"x":{}1{}}}"#, r#"{"a":"#.repeat(50), "}".repeat(50));
        ok(&objects);
        fails(format!(r#"{{"schema":1,"id":"a",{T},"x":[{{"a":1}},{{}}]]}}"#).as_bytes());
        ok(&format!(r#"{{"schema":1,"id":"a",{T},"x":[{{"a":[]}},{{}},[[],{{}}]]}}"#));
    }

    #[test]
    fn records_need_an_id_an_event_time_and_a_printable_year() {
        fails(br#"{"schema":1,"id":"a"}"#);
        fails(br#"{"schema":1,"id":"","event_time":"2026-05-02T10:00:00Z"}"#);
        fails(br#"{"schema":3,"id":"a","event_time":"2026-05-02T10:00:00Z"}"#);
        fails(br#"{"schema":1,"id":"a","event_time":"0001-01-01T00:00:00Z"}"#);
        fails(br#"{"schema":1,"id":"a","event_time":"0000-01-01T00:00:00+00:01"}"#);
        ok(r#"{"schema":1,"id":"a","event_time":"0000-01-01T00:00:00Z"}"#);
    }
}
