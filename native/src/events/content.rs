//! Event content decoded as JSON, its strings borrowed from the stored text.
//!
//! `serde_json::Value` owns every key and string, so decoding one event's
//! content cost a dozen allocations and a copy of its text, and the text was
//! copied again on its way into the record. This value is decoded by the
//! same parser (serde_json: the same syntax, nesting limit and numbers) and
//! means the same thing as `serde_json::Value` with `preserve_order`, down
//! to a repeated key, which keeps its first place and takes its last value
//! (as `IndexMap::insert` and a Python dict do); a string without escapes
//! is a slice of the content instead of a copy.

use std::borrow::Cow;
use std::fmt;

use ahash::AHashMap;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Number;

#[derive(Debug, PartialEq)]
pub enum Value<'a> {
    Null,
    Bool(bool),
    Number(Number),
    String(Cow<'a, str>),
    Array(Vec<Value<'a>>),
    Object(Map<'a>),
}

impl Value<'_> {
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }
}

/// An object's members in stored order, each key once.
#[derive(Debug, PartialEq, Default)]
pub struct Map<'a> {
    entries: Vec<(Cow<'a, str>, Value<'a>)>,
}

impl<'a> Map<'a> {
    pub fn get(&self, key: &str) -> Option<&Value<'a>> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value<'a>)> {
        self.entries.iter().map(|(k, v)| (&**k, v))
    }

    pub fn values(&self) -> impl Iterator<Item = &Value<'a>> {
        self.entries.iter().map(|(_, v)| v)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Members as decoded, a repeated key folded into its first place.
    fn from_members(members: Vec<(Cow<'a, str>, Value<'a>)>) -> Map<'a> {
        let n = members.len();
        // Where each member's key first appears (a map only past a few
        // members, so that a huge object cannot make this quadratic).
        let first: Vec<usize> = if n <= 8 {
            (0..n).map(|i| (0..=i).find(|&j| members[j].0 == members[i].0).unwrap_or(i)).collect()
        } else {
            let mut seen: AHashMap<&str, usize> = AHashMap::with_capacity(n);
            (0..n).map(|i| *seen.entry(&members[i].0).or_insert(i)).collect()
        };
        if first.iter().enumerate().all(|(i, &f)| f == i) {
            return Map { entries: members };
        }
        let mut entries: Vec<(Cow<'a, str>, Value<'a>)> = Vec::with_capacity(n);
        let mut place = vec![0usize; n];
        for (i, (key, value)) in members.into_iter().enumerate() {
            if first[i] == i {
                place[i] = entries.len();
                entries.push((key, value));
            } else {
                entries[place[first[i]]].1 = value;
            }
        }
        Map { entries }
    }
}

/// `content` decoded, or `None` where serde_json would refuse it.
pub fn parse(content: &str) -> Option<Value<'_>> {
    serde_json::from_str(content).ok()
}

impl<'de> Deserialize<'de> for Value<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ValueVisitor)
    }
}

/// A key or string: borrowed when the parser can lend it.
struct Text<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Text<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(TextVisitor)
    }
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = Text<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Text(Cow::Borrowed(s)))
    }

    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Text(Cow::Owned(s.to_owned())))
    }

    fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
        Ok(Text(Cow::Owned(s)))
    }
}

/// serde_json's own `Value` visitor, visit for visit, with borrowed strings.
struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Self::Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Self::Value, E> {
        Ok(Value::Number(n.into()))
    }

    fn visit_i128<E: de::Error>(self, n: i128) -> Result<Self::Value, E> {
        Number::deserialize(de::value::I128Deserializer::new(n)).map(Value::Number)
    }

    fn visit_u64<E>(self, n: u64) -> Result<Self::Value, E> {
        Ok(Value::Number(n.into()))
    }

    fn visit_u128<E: de::Error>(self, n: u128) -> Result<Self::Value, E> {
        Number::deserialize(de::value::U128Deserializer::new(n)).map(Value::Number)
    }

    fn visit_f64<E>(self, f: f64) -> Result<Self::Value, E> {
        Ok(Number::from_f64(f).map_or(Value::Null, Value::Number))
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Value::String(Cow::Borrowed(s)))
    }

    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Value::String(Cow::Owned(s.to_owned())))
    }

    fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
        Ok(Value::String(Cow::Owned(s)))
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        Deserialize::deserialize(d)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = Vec::new();
        while let Some(Text(key)) = map.next_key()? {
            members.push((key, map.next_value()?));
        }
        Ok(Value::Object(Map::from_members(members)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same walk over serde_json's own value, for comparison.
    fn same(ours: &Value<'_>, theirs: &serde_json::Value) -> bool {
        match (ours, theirs) {
            (Value::Null, serde_json::Value::Null) => true,
            (Value::Bool(a), serde_json::Value::Bool(b)) => a == b,
            (Value::Number(a), serde_json::Value::Number(b)) => a == b,
            (Value::String(a), serde_json::Value::String(b)) => a == b,
            (Value::Array(a), serde_json::Value::Array(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
            }
            (Value::Object(a), serde_json::Value::Object(b)) => {
                a.entries.len() == b.len()
                    && a.iter().zip(b).all(|((ka, va), (kb, vb))| ka == kb && same(va, vb))
            }
            _ => false,
        }
    }

    #[test]
    fn it_reads_what_serde_json_reads_repeated_keys_included() {
        let many: String = {
            let members: Vec<String> = (0..40).map(|i| format!("\"k{}\":{i}", i % 13)).collect();
            format!("{{{}}}", members.join(","))
        };
        let docs = [
            r#"{"a":1,"b":[true,null,"x\"y"],"a":{"c":2.5,"c":-3},"d":"é"}"#,
            r#"[1e400, -0, 18446744073709551616, 1.0, "\ud83d\ude00"]"#,
            r#""plain""#,
            "  {}  ",
            &many,
        ];
        for doc in docs {
            let theirs: Result<serde_json::Value, _> = serde_json::from_str(doc);
            match (parse(doc), theirs) {
                (Some(ours), Ok(theirs)) => assert!(same(&ours, &theirs), "{doc}"),
                (None, Err(_)) => {}
                (ours, theirs) => panic!("{doc}: {ours:?} against {theirs:?}"),
            }
        }
        for bad in ["{\"a\":1,}", "[1] x", "\"\\ud800\"", "nul"] {
            assert_eq!(parse(bad).is_some(), serde_json::from_str::<serde_json::Value>(bad).is_ok());
        }
    }

    #[test]
    fn strings_without_escapes_are_borrowed() {
        let Some(Value::Object(m)) = parse(r#"{"text":"hello","esc":"a\nb"}"#) else { panic!() };
        assert!(matches!(m.get("text"), Some(Value::String(Cow::Borrowed("hello")))));
        assert!(matches!(m.get("esc"), Some(Value::String(Cow::Owned(_)))));
    }
}
