//! Go `encoding/json`-compatible bytes (wire spec §5), as a `serde_json` formatter, so a Rust value
//! encodes to the bytes a Go peer writes and hashes.
//!
//! What differs from plain `serde_json`, each rule in one place:
//! * floats follow Go's "ES6" rule ([`go_float`]): `2.0` is `2`, `1e21` is `1e+21`, `1e-7` stays
//!   exponent form, `-0.0` is `-0`;
//! * U+2028 and U+2029 are always escaped (`\u2028`, `\u2029`), even with HTML escaping off;
//! * with HTML escaping on (Go's `json.Marshal` default) `<`, `>`, `&` are `\u003c`, `\u003e`,
//!   `\u0026`; off for the manifest hash (`Encoder.SetEscapeHTML(false)`);
//! * raw values ([`Raw`], Go `json.RawMessage`) are compacted, their numbers and escapes kept verbatim
//!   (plus the HTML / line-separator escapes in HTML mode);
//! * [`go_any`] re-reads JSON as Go's `map[string]any` would: keys sorted byte-wise at every depth,
//!   every number a float64 (`1.0` -> `1`, `1e2` -> `100`, integers above 2^53 rounded).
//!
//! Control characters, `\b\f\n\r\t`, lowercase hex escapes, unescaped `/` and DEL, and non-ASCII
//! written as UTF-8 are already Go's (>= 1.22) in `serde_json`.

use std::io;

use serde::Serialize;
use serde_json::ser::{CharEscape, Formatter};
use serde_json::value::RawValue;
use serde_json::Value;

/// Go's float64 text: exponent form (shortest round-trip digits, explicit exponent sign) when
/// `x != 0` and `|x| < 1e-6` or `|x| >= 1e21`, else shortest round-trip fixed notation without a
/// trailing `.0`. NaN and infinities have no JSON form: Go refuses them; here they encode as `null`.
pub fn go_float(x: f64) -> String {
    go_text(
        x.is_finite(),
        x != 0.0 && !(1e-6..1e21).contains(&x.abs()),
        || (format!("{x}"), format!("{x:e}")),
    )
}

/// Go's float32 text: the same rule over 32-bit shortest digits (`float32(0.1)` is `0.1`).
pub fn go_float32(x: f32) -> String {
    go_text(
        x.is_finite(),
        x != 0.0 && !(1e-6..1e21).contains(&x.abs()),
        || (format!("{x}"), format!("{x:e}")),
    )
}

/// The rule shared by both widths: `texts` gives (fixed, Rust exponent) forms; the exponent form
/// gets Go's explicit `+` sign.
fn go_text(finite: bool, exponent: bool, texts: impl FnOnce() -> (String, String)) -> String {
    if !finite {
        return "null".into();
    }
    let (fixed, exp) = texts();
    if !exponent {
        return fixed;
    }
    match exp.split_once('e') {
        Some((m, e)) if !e.starts_with('-') => format!("{m}e+{e}"),
        _ => exp,
    }
}

/// The `serde_json` formatter that writes Go's bytes. `html`: Go's `json.Marshal` default (escape
/// `<>&`); false: `Encoder.SetEscapeHTML(false)`, the manifest hash's setting.
#[derive(Debug, Clone, Copy)]
pub struct GoFormatter {
    pub html: bool,
}

impl GoFormatter {
    fn escape(&self, c: char) -> Option<&'static [u8]> {
        match c {
            '\u{2028}' => Some(b"\\u2028"),
            '\u{2029}' => Some(b"\\u2029"),
            '<' if self.html => Some(b"\\u003c"),
            '>' if self.html => Some(b"\\u003e"),
            '&' if self.html => Some(b"\\u0026"),
            _ => None,
        }
    }

    /// Writes `s` (already valid JSON string content) with this formatter's extra escapes.
    fn write_escaped<W: ?Sized + io::Write>(&self, w: &mut W, s: &str) -> io::Result<()> {
        let mut start = 0;
        for (i, c) in s.char_indices() {
            if let Some(esc) = self.escape(c) {
                w.write_all(&s.as_bytes()[start..i])?;
                w.write_all(esc)?;
                start = i + c.len_utf8();
            }
        }
        w.write_all(&s.as_bytes()[start..])
    }
}

impl Formatter for GoFormatter {
    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        w.write_all(go_float(value).as_bytes())
    }

    fn write_f32<W: ?Sized + io::Write>(&mut self, w: &mut W, value: f32) -> io::Result<()> {
        w.write_all(go_float32(value).as_bytes())
    }

    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        self.write_escaped(w, fragment)
    }

    fn write_char_escape<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        escape: CharEscape,
    ) -> io::Result<()> {
        // serde_json's own escapes already match Go >= 1.22; keep them.
        serde_json::ser::CompactFormatter.write_char_escape(w, escape)
    }

    fn write_raw_fragment<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let compact = compact(fragment);
        if self.html {
            self.write_escaped(w, &compact)
        } else {
            w.write_all(compact.as_bytes())
        }
    }
}

/// `value` as Go's bytes: `html` selects `json.Marshal` (true) or an `Encoder` with
/// `SetEscapeHTML(false)` and the trailing newline stripped (false). Errors: `serde_json`'s (a map
/// with non-string keys).
pub fn to_vec<T: Serialize + ?Sized>(value: &T, html: bool) -> serde_json::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(256);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, GoFormatter { html });
    value.serialize(&mut ser)?;
    Ok(out)
}

/// [`to_vec`] as a `String` (the bytes are UTF-8).
pub fn to_string<T: Serialize + ?Sized>(value: &T, html: bool) -> serde_json::Result<String> {
    to_vec(value, html).map(|v| String::from_utf8(v).expect("JSON is UTF-8"))
}

/// Removes insignificant whitespace from JSON text, leaving strings (and their escapes) and numbers
/// exactly as written (Go's `json.Compact`, applied to every `json.RawMessage` on output). The input
/// is trusted to be valid JSON (a [`RawValue`] is).
pub fn compact(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let (mut in_str, mut esc) = (false, false);
    for c in json.chars() {
        if in_str {
            out.push(c);
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == '"' {
                in_str = false;
            }
        } else if c == '"' {
            in_str = true;
            out.push(c);
        } else if !c.is_ascii_whitespace() {
            out.push(c);
        }
    }
    out
}

/// A JSON value carried verbatim (Go `json.RawMessage`): `None` encodes as `null`.
#[derive(Debug, Clone, Default)]
pub struct Raw(pub Option<Box<RawValue>>);

impl Raw {
    /// Parses `text` as one JSON value. Errors: not JSON.
    pub fn parse(text: &str) -> serde_json::Result<Raw> {
        RawValue::from_string(text.to_string()).map(|r| Raw(Some(r)))
    }

    /// The bytes received as a JSON value when they are one, else as a JSON string of their
    /// (lossy UTF-8) text (wire spec §6.4: a DLQ entry's body that is not JSON).
    pub fn from_payload(bytes: &[u8]) -> Raw {
        match std::str::from_utf8(bytes)
            .ok()
            .and_then(|t| Raw::parse(t).ok())
        {
            Some(r) => r,
            None => {
                let text = serde_json::to_string(&String::from_utf8_lossy(bytes))
                    .expect("a string encodes");
                Raw::parse(&text).expect("an encoded string parses")
            }
        }
    }

    /// The raw text (`null` when absent).
    pub fn get(&self) -> &str {
        self.0.as_ref().map_or("null", |r| r.get())
    }
}

impl PartialEq for Raw {
    fn eq(&self, other: &Raw) -> bool {
        compact(self.get()) == compact(other.get())
    }
}

impl Serialize for Raw {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Some(r) => r.serialize(s),
            None => s.serialize_unit(),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Raw {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Raw, D::Error> {
        let r = Box::<RawValue>::deserialize(d)?;
        Ok(if r.get() == "null" {
            Raw(None)
        } else {
            Raw(Some(r))
        })
    }
}

/// `v` re-read as Go's `map[string]any` would hold it: objects keep sorted keys (serde_json's
/// default map is sorted byte-wise, like Go's), every number becomes a float64.
pub fn go_any(v: &Value) -> Value {
    match v {
        Value::Number(n) => n
            .as_f64()
            .and_then(serde_json::Number::from_f64)
            .map(Value::Number)
            .unwrap_or(Value::Null),
        Value::Array(a) => Value::Array(a.iter().map(go_any).collect()),
        Value::Object(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), go_any(v))).collect()),
        other => other.clone(),
    }
}
