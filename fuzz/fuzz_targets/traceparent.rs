//! The W3C `traceparent` parser (issue #14; read from every inbound request, before any key is
//! checked): whatever it accepts formats back to a canonical version-00 value that parses to the same
//! context, and a version-00 value it accepts is exactly that canonical form.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tb_core::trace::TraceContext;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let Some(t) = TraceContext::parse(s) else {
        return;
    };
    let out = t.to_traceparent();
    assert_eq!(out.len(), 55);
    assert_eq!(TraceContext::parse(&out), Some(t));
    assert_ne!(t.trace_id, [0; 16]);
    assert_ne!(t.span_id, [0; 8]);
    let v = s.trim_matches([' ', '\t']);
    if v.starts_with("00-") {
        assert_eq!(out, v);
    }
});
