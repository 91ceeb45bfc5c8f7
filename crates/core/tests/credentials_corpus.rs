//! The credential list (`tb_core::credentials::PATTERNS`) against the corpus in
//! `tests/fixtures/credentials/` (PROVENANCE.md there): every example is found by the pattern it names,
//! whole, wherever it stands in a text, and masked away; every pattern has an example; nothing is found
//! in the ordinary text.

use std::collections::BTreeSet;

use trigger_bridge_core::credentials::{contains, corpus, find, mask, PATTERNS};

fn read(name: &str) -> Vec<(String, String)> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/credentials")
        .join(name);
    corpus(&std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

/// A PEM block cut before its END line is hidden to the end of the text.
fn runs_to_the_end(example: &str) -> bool {
    example.contains("-----BEGIN") && !example.contains("-----END")
}

#[test]
fn every_example_is_found_whole_by_its_pattern_and_masked_away() {
    let positives = read("positives.txt");
    assert!(positives.len() >= 30, "{}", positives.len());
    for (name, example) in &positives {
        assert!(
            PATTERNS.iter().any(|p| p.name == name),
            "{name}: no such pattern"
        );
        for (before, after) in [
            ("", ""),
            ("HTTP 401: {\"error\":\"", "\",\"retry\":false}"),
            ("config: ", " (rotated)\nnext line"),
            ("'", "'"),
        ] {
            let text = format!("{before}{example}{after}");
            let found = find(&text);
            let whole = before.len()..before.len() + example.len();
            assert!(
                found.iter().any(|f| f.name == name
                    && f.range.start <= whole.start
                    && f.range.end >= whole.end
                    || f.name == name && runs_to_the_end(example) && f.range.start == whole.start),
                "{name}: {example:?} in {text:?} not found whole: {found:?}"
            );
            let masked = mask(&text, "[x]");
            let expected = if runs_to_the_end(example) {
                format!("{before}[x]")
            } else {
                format!("{before}[x]{after}")
            };
            assert_eq!(masked, expected, "{name}: {example:?}");
            assert!(contains(&text));
        }
    }
    let named: BTreeSet<&str> = positives.iter().map(|(n, _)| n.as_str()).collect();
    for p in PATTERNS {
        assert!(
            named.contains(p.name),
            "pattern {} has no example in positives.txt",
            p.name
        );
    }
}

#[test]
fn ordinary_text_passes_untouched() {
    let negatives = read("negatives.txt");
    assert!(negatives.len() >= 25, "{}", negatives.len());
    for (_, text) in &negatives {
        assert_eq!(find(text), vec![], "{text:?}");
        assert_eq!(mask(text, "[x]"), text.as_str());
    }
    // All of them in one text, too.
    let all: Vec<&str> = negatives.iter().map(|(_, t)| t.as_str()).collect();
    assert!(!contains(&all.join(" ")));
}

/// The list is scanned once per text with a set, then once per matching pattern: a 1 MiB body of
/// ordinary text is scanned in well under a second even in a debug build.
#[test]
fn a_large_text_is_scanned_in_bounded_time() {
    let line = "pull_request.opened on Codertocat/Hello-World#2 by octocat: Bearer authentication required; ";
    let mut text = line.repeat((1 << 20) / line.len());
    text.push_str("ghp_FAKE0example0token0value0abcdefgh1");
    let t0 = std::time::Instant::now();
    let found = find(&text);
    assert_eq!(found.len(), 1, "{:?}", found.first());
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        t0.elapsed()
    );
}
