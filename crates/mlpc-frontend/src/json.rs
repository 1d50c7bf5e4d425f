//! JSON helpers for the model reader: strict parsing (a key given twice in one object is an error,
//! not "last one wins"), locations inside the document (`nodes[3].inputs[1]`) and their line and
//! column in the source text, and short descriptions of values for error messages.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::fmt;

/// Parses `src` as JSON, refusing duplicate keys. The error carries serde_json's line and column.
pub(crate) fn parse_strict(src: &str) -> Result<Value, serde_json::Error> {
    serde_json::from_str::<Strict>(src).map(|s| s.0)
}

struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // JSON text cannot spell NaN or infinity, so this only guards against the impossible.
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut v = Vec::new();
        while let Some(Strict(e)) = seq.next_element()? {
            v.push(e);
        }
        Ok(Value::Array(v))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut m = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if m.contains_key(&k) {
                return Err(de::Error::custom(format!(
                    "duplicate key `{k}` (each key may appear once per object)"
                )));
            }
            let Strict(v) = map.next_value()?;
            m.insert(k, v);
        }
        Ok(Value::Object(m))
    }
}

/// serde_json's message without its trailing " at line L column C".
pub(crate) fn syntax_message(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.rfind(" at line ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// One step of a [`Loc`].
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seg {
    Key(String),
    Index(usize),
}

/// A location in a JSON document, such as `nodes[3].inputs[1]` or `sparsity["*.weight"].block`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Loc(Vec<Seg>);

impl Loc {
    pub(crate) fn root() -> Loc {
        Loc::default()
    }

    pub(crate) fn key(&self, k: &str) -> Loc {
        let mut l = self.clone();
        l.0.push(Seg::Key(k.to_string()));
        l
    }

    pub(crate) fn index(&self, i: usize) -> Loc {
        let mut l = self.clone();
        l.0.push(Seg::Index(i));
        l
    }

    pub(crate) fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The 1-based line and column where the value at this location starts in `src`, if `src` is
    /// valid JSON holding such a value.
    pub(crate) fn line_col(&self, src: &str) -> Option<(usize, usize)> {
        let before = src.get(..self.start(src)?)?;
        let line = before.matches('\n').count() + 1;
        let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        Some((line, col))
    }

    /// The text of the value at this location in `src` (a number as written, e.g. `1e-400`,
    /// where the parsed value is 0), if `src` is valid JSON holding such a value.
    pub(crate) fn text<'s>(&self, src: &'s str) -> Option<&'s str> {
        let start = self.start(src)?;
        let mut sc = Scan {
            b: src.as_bytes(),
            i: start,
        };
        sc.skip_value()?;
        src.get(start..sc.i)
    }

    /// The byte offset where the value at this location starts in `src`.
    fn start(&self, src: &str) -> Option<usize> {
        let mut sc = Scan {
            b: src.as_bytes(),
            i: 0,
        };
        for seg in &self.0 {
            sc.ws();
            match seg {
                Seg::Key(want) => {
                    sc.eat(b'{')?;
                    loop {
                        sc.ws();
                        let k = sc.string()?;
                        sc.ws();
                        sc.eat(b':')?;
                        sc.ws();
                        if &k == want {
                            break;
                        }
                        sc.skip_value()?;
                        sc.ws();
                        sc.eat(b',')?;
                    }
                }
                Seg::Index(n) => {
                    sc.eat(b'[')?;
                    for _ in 0..*n {
                        sc.ws();
                        sc.skip_value()?;
                        sc.ws();
                        sc.eat(b',')?;
                    }
                }
            }
        }
        sc.ws();
        Some(sc.i)
    }
}

fn is_plain_key(k: &str) -> bool {
    !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            match s {
                Seg::Key(k) if is_plain_key(k) => {
                    if i > 0 {
                        f.write_str(".")?;
                    }
                    f.write_str(k)?;
                }
                Seg::Key(k) => write!(f, "[{}]", Value::String(k.clone()))?,
                Seg::Index(n) => write!(f, "[{n}]")?,
            }
        }
        Ok(())
    }
}

/// A cursor over JSON text already known to be valid; every step returns `None` on surprise.
struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl Scan<'_> {
    fn ws(&mut self) {
        while self.b.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.b.get(self.i) == Some(&c)).then(|| self.i += 1)
    }

    /// Reads a string literal and decodes its escapes.
    fn string(&mut self) -> Option<String> {
        let start = self.i;
        self.eat(b'"')?;
        loop {
            match *self.b.get(self.i)? {
                b'\\' => self.i += 2,
                b'"' => {
                    self.i += 1;
                    break;
                }
                _ => self.i += 1,
            }
        }
        let lit = std::str::from_utf8(self.b.get(start..self.i)?).ok()?;
        serde_json::from_str(lit).ok()
    }

    fn skip_value(&mut self) -> Option<()> {
        match *self.b.get(self.i)? {
            b'"' => self.string().map(|_| ()),
            open @ (b'{' | b'[') => {
                let close = if open == b'{' { b'}' } else { b']' };
                self.i += 1;
                self.ws();
                if self.eat(close).is_some() {
                    return Some(());
                }
                loop {
                    self.ws();
                    if open == b'{' {
                        self.string()?;
                        self.ws();
                        self.eat(b':')?;
                        self.ws();
                    }
                    self.skip_value()?;
                    self.ws();
                    if self.eat(close).is_some() {
                        return Some(());
                    }
                    self.eat(b',')?;
                }
            }
            _ => {
                while self
                    .b
                    .get(self.i)
                    .is_some_and(|c| !matches!(c, b',' | b']' | b'}') && !c.is_ascii_whitespace())
                {
                    self.i += 1;
                }
                Some(())
            }
        }
    }
}

/// A short description of a value for "expected X, found Y" messages.
pub(crate) fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => {
            let short: String = s.chars().take(40).collect();
            if short.len() < s.len() {
                format!("the string {:?}...", short)
            } else {
                format!("the string {s:?}")
            }
        }
        Value::Array(a) => format!("an array of {} element(s)", a.len()),
        Value::Object(_) => "an object".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_are_refused_with_a_position() {
        let e = parse_strict("{\n  \"a\": 1,\n  \"a\": 2\n}").unwrap_err();
        assert_eq!(e.line(), 3);
        assert!(syntax_message(&e).contains("duplicate key `a`"), "{e}");
        assert!(parse_strict("{\"a\": {\"b\": 1}, \"b\": 2}").is_ok());
    }

    #[test]
    fn locations_print_and_resolve() {
        let src = "{\n \"nodes\": [\n  {\"name\": \"a\"},\n  {\"name\": \"b\", \"inputs\": [\"x\", \"y\"]}\n ],\n \"sparsity\": {\"*.w\": {\"block\": [1]}}\n}";
        let l = Loc::root().key("nodes").index(1).key("inputs").index(1);
        assert_eq!(l.to_string(), "nodes[1].inputs[1]");
        assert_eq!(l.line_col(src), Some((4, 33)));
        let s = Loc::root().key("sparsity").key("*.w").key("block");
        assert_eq!(s.to_string(), "sparsity[\"*.w\"].block");
        assert_eq!(s.line_col(src), Some((6, 32)));
        assert_eq!(Loc::root().key("missing").line_col(src), None);
    }
}
