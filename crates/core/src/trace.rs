//! W3C Trace Context (`traceparent`, <https://www.w3.org/TR/trace-context/> §3.2): the one parser
//! and formatter of the header the bridge reads from inbound requests, stores with a receipt's
//! deliveries, and sends to `http` and `nats` executors.
//!
//! Rules (from the recommendation): `version "-" trace-id "-" parent-id "-" trace-flags`, each field
//! lowercase hex of 2, 32, 16 and 2 digits. Version `ff` is invalid; an all-zero trace id or parent id
//! is invalid; a version other than `00` is parsed by its first four fields, and for `00` nothing may
//! follow them. A header that breaks a rule is ignored (the request starts a new trace), never refused:
//! tracing must not decide whether work is accepted.

/// Longest `traceparent` value read, in bytes; a longer one is ignored. Version `00` is exactly 55
/// bytes; a later version may append fields, and 512 bytes is far above any header we answer to.
pub const MAX_TRACEPARENT_BYTES: usize = 512;

/// A parsed `traceparent`: which trace, which span in it, and the sampled flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceContext {
    /// 16 bytes, never all zero.
    pub trace_id: [u8; 16],
    /// The parent (span) id, 8 bytes, never all zero.
    pub span_id: [u8; 8],
    /// The trace flags byte; bit 0 is `sampled`.
    pub flags: u8,
}

impl TraceContext {
    /// Parses a `traceparent` value (surrounding spaces and tabs are allowed, as in any header).
    /// `None` for anything the rules above refuse.
    pub fn parse(value: &str) -> Option<TraceContext> {
        let v = value.trim_matches([' ', '\t']);
        if v.len() > MAX_TRACEPARENT_BYTES || v.len() < 55 {
            return None;
        }
        let b = v.as_bytes();
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let version = hex_byte(&b[0..2])?;
        if version == 0xff {
            return None;
        }
        // Version 00 is exactly 55 bytes; a later version may go on, but only after a '-'.
        if (version == 0 && b.len() != 55) || (b.len() > 55 && b[55] != b'-') {
            return None;
        }
        let mut trace_id = [0u8; 16];
        for (i, out) in trace_id.iter_mut().enumerate() {
            *out = hex_byte(&b[3 + 2 * i..5 + 2 * i])?;
        }
        let mut span_id = [0u8; 8];
        for (i, out) in span_id.iter_mut().enumerate() {
            *out = hex_byte(&b[36 + 2 * i..38 + 2 * i])?;
        }
        let flags = hex_byte(&b[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceContext {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The version `00` header value: `00-<32 hex>-<16 hex>-<2 hex>`, 55 bytes.
    pub fn to_traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex::encode(self.trace_id),
            hex::encode(self.span_id),
            self.flags
        )
    }

    /// The trace id as 32 lowercase hex digits (the wire's `X-Triggers-Trace-Id`).
    pub fn trace_id_hex(&self) -> String {
        hex::encode(self.trace_id)
    }

    /// The span id as 16 lowercase hex digits (the wire's `X-Triggers-Span-Id`).
    pub fn span_id_hex(&self) -> String {
        hex::encode(self.span_id)
    }

    /// Whether the caller sampled this trace (flag bit 0).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The same trace with another span as the parent (flags kept); `None` for an all-zero span id.
    pub fn with_span(&self, span_id: [u8; 8]) -> Option<TraceContext> {
        (span_id != [0; 8]).then_some(TraceContext { span_id, ..*self })
    }
}

/// Two lowercase hex digits (the recommendation refuses upper case).
fn hex_byte(two: &[u8]) -> Option<u8> {
    let d = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    Some(d(two[0])? << 4 | d(two[1])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_recommendations_example_round_trips() {
        let t = TraceContext::parse(EXAMPLE).unwrap();
        assert_eq!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.span_id_hex(), "00f067aa0ba902b7");
        assert_eq!(t.flags, 1);
        assert!(t.sampled());
        assert_eq!(t.to_traceparent(), EXAMPLE);
        assert_eq!(TraceContext::parse(&format!(" \t{EXAMPLE} ")), Some(t));
    }

    #[test]
    fn values_the_rules_refuse_are_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0é",
        ] {
            assert_eq!(TraceContext::parse(bad), None, "{bad:?}");
        }
        let long = format!("01-{}-{}", &EXAMPLE[3..], "x".repeat(MAX_TRACEPARENT_BYTES));
        assert_eq!(TraceContext::parse(&long), None);
    }

    #[test]
    fn a_later_version_is_read_by_its_first_four_fields() {
        let t = TraceContext::parse(&format!("cc{}-what-comes-next", &EXAMPLE[2..])).unwrap();
        assert_eq!(t.to_traceparent(), EXAMPLE);
    }

    #[test]
    fn with_span_keeps_the_trace_and_flags() {
        let t = TraceContext::parse(EXAMPLE).unwrap();
        let c = t.with_span([1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        assert_eq!(
            c.to_traceparent(),
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0102030405060708-01"
        );
        assert_eq!(t.with_span([0; 8]), None);
    }
}
