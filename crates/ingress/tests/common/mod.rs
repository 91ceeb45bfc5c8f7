//! Shared test helpers: the fixtures folder (which must exist) and header maps.
#![allow(dead_code)]

use std::path::PathBuf;

use http::{HeaderMap, HeaderName, HeaderValue};

/// The repo's `tests/fixtures` (see its `PROVENANCE.md`), located relative to this crate; panics if it
/// is missing so no test passes vacuously.
pub fn fixtures() -> PathBuf {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures"));
    assert!(
        dir.is_dir(),
        "fixtures directory {} is missing; these tests need the repo's tests/fixtures",
        dir.display()
    );
    dir
}

/// Reads a fixture JSON file.
pub fn json(rel: &str) -> serde_json::Value {
    let bytes = std::fs::read(fixtures().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"));
    serde_json::from_slice(&bytes).unwrap()
}

/// A header map from `(name, value)` pairs (appended, so repeats are kept).
pub fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    map
}
