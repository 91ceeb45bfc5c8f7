//! The one list of credential shapes this product hides wherever outside text is shown to an agent or
//! an operator: MCP tool results (withheld whole), the redacted body view of a receipt (API and
//! console) and the message of a failed attempt before it is stored (masked). Each [`Pattern`] names
//! the public source of its format; the corpus in `tests/fixtures/credentials/` holds one made-up
//! example per pattern and ordinary text that must pass (docs/limits.md, "Credentials in shown text").
//!
//! A pattern matches a credential by its published shape (a vendor prefix and length, a JWT's two
//! `eyJ` segments, a PEM block, an `Authorization` scheme and its value). A prefix that only one
//! vendor uses (`ghp_`, `glpat-`, `whsec_`, `tbk_`, ...) matches from 8 characters on, so a token cut
//! by a length limit (an attempt message keeps 256 bytes of a body) is hidden too. A secret without a
//! shape (a password, an AWS secret access key) is not found here: the callers also hide the values of
//! credential-named keys.

use std::borrow::Cow;
use std::ops::Range;
use std::sync::LazyLock;

use regex::{Regex, RegexSet};

/// What a masked credential reads as, in a stored attempt message and the redacted body view.
pub const MASK: &str = "[redacted]";

/// An extra test a pattern's match must pass, for shapes whose text alone would also match prose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// The match is a credential as it stands.
    None,
    /// The scheme's value holds a character other than a letter (a digit, `.`, `_`, `-`, `~`, `+`,
    /// `/`): `Bearer authentication` is prose, `Bearer abc123...` a token.
    NotOnlyLetters,
    /// The scheme's value is standard base64 of text holding `:` (`user:password`, RFC 7617 §2):
    /// `Basic example` is prose.
    Base64UserPass,
}

/// One credential shape.
#[derive(Debug, Clone, Copy)]
pub struct Pattern {
    /// Stable name, e.g. `github-pat` (the corpus names its examples by it).
    pub name: &'static str,
    /// Where the format is published.
    pub source: &'static str,
    /// The shape, in the syntax of the `regex` crate (leftmost match, no look-around; `(?-u:\b)` is
    /// an ASCII word boundary, so the scan stays on the fast automaton whatever the text).
    pub regex: &'static str,
    /// An extra test of a match.
    pub check: Check,
}

/// The credential shapes, one line each. Add a shape here and an example of it to
/// `tests/fixtures/credentials/positives.txt`; the corpus test fails for a shape without an example.
pub const PATTERNS: &[Pattern] = &[
    Pattern {
        name: "trigger-bridge-api-key",
        source: "this product: docs/mcp.md (`tbk_` + `openssl rand -hex 24`)",
        regex: r"(?-u:\b)tbk_[A-Za-z0-9_-]{8,}",
        check: Check::None,
    },
    Pattern {
        name: "trigger-bridge-capability-token",
        source: "this product: crates/engine/src/capability.rs (`tbcap_` + 43 base64url)",
        regex: r"(?-u:\b)tbcap_[A-Za-z0-9_-]{8,}",
        check: Check::None,
    },
    Pattern {
        name: "trigger-bridge-result-token",
        source: "this product: the http executor's `resultToken` (docs/configuration.md, `tbres_` + 64 hex)",
        regex: r"(?-u:\b)tbres_[A-Za-z0-9]{8,}",
        check: Check::None,
    },
    Pattern {
        name: "standard-webhooks-secret",
        source: "Standard Webhooks specification, \"Signature scheme\" (`whsec_` + base64 key)",
        regex: r"(?-u:\b)whsec_[A-Za-z0-9+/]{8,}={0,2}",
        check: Check::None,
    },
    Pattern {
        name: "github-token",
        source: "GitHub Docs, \"About authentication to GitHub\" token prefixes (`ghp_` `gho_` `ghu_` `ghs_` `ghr_` + 36 base62); gitleaks rules github-pat, github-oauth, github-app-token, github-refresh-token",
        regex: r"(?-u:\b)gh[pousr]_[A-Za-z0-9]{8,}",
        check: Check::None,
    },
    Pattern {
        name: "github-fine-grained-pat",
        source: "GitHub Docs, fine-grained personal access tokens (`github_pat_` + 82); gitleaks rule github-fine-grained-pat",
        regex: r"(?-u:\b)github_pat_[A-Za-z0-9_]{8,}",
        check: Check::None,
    },
    Pattern {
        name: "gitlab-token",
        source: "GitLab Docs, \"Token overview\", token prefixes (`glpat-`, `glptt-`, `gldt-`, `glrt-`); gitleaks rule gitlab-pat",
        regex: r"(?-u:\b)gl(?:pat|ptt|dt|rt)-[A-Za-z0-9_.-]{8,}",
        check: Check::None,
    },
    Pattern {
        name: "aws-access-key-id",
        source: "AWS IAM User Guide, \"Understanding unique ID prefixes\" (`AKIA` long-term, `ASIA` temporary, + 16); gitleaks rule aws-access-token",
        regex: r"(?-u:\b)(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16}(?-u:\b)",
        check: Check::None,
    },
    Pattern {
        name: "openai-api-key",
        source: "OpenAI API reference, \"Authentication\" (`sk-`, project keys `sk-proj-`); gitleaks rule openai-api-key (also Anthropic's `sk-ant-`)",
        regex: r"(?-u:\b)sk-[A-Za-z0-9][A-Za-z0-9_-]{30,}",
        check: Check::None,
    },
    Pattern {
        name: "stripe-secret-key",
        source: "Stripe Docs, \"API keys\" (secret `sk_live_`/`sk_test_`, restricted `rk_live_`/`rk_test_`); gitleaks rule stripe-access-token",
        regex: r"(?-u:\b)[rs]k_(?:live|test)_[A-Za-z0-9]{8,}",
        check: Check::None,
    },
    Pattern {
        name: "slack-token",
        source: "Slack API docs, \"Token types\" (`xoxb-` bot, `xoxp-` user, `xoxa-`/`xoxr-`/`xoxe-`/`xoxs-`/`xoxo-`, app-level `xapp-`; a digit follows the dash); gitleaks rules slack-bot-token, slack-user-token, slack-app-token",
        regex: r"(?-u:\b)(?:xox[abeoprs]|xapp)-[0-9][A-Za-z0-9-]{7,}",
        check: Check::None,
    },
    Pattern {
        name: "google-api-key",
        source: "Google Cloud Docs, \"API keys\" (`AIza` + 35); gitleaks rule gcp-api-key",
        regex: r"(?-u:\b)AIza[A-Za-z0-9_-]{35}",
        check: Check::None,
    },
    Pattern {
        name: "npm-token",
        source: "npm Docs, \"About access tokens\" (`npm_` + 36); gitleaks rule npm-access-token",
        regex: r"(?-u:\b)npm_[A-Za-z0-9]{36}",
        check: Check::None,
    },
    Pattern {
        name: "jwt",
        source: "RFC 7519 (JWT) in the JWS compact serialization of RFC 7515 §7.1: base64url(`{\"...`) = `eyJ`, three dot-separated parts; gitleaks rule jwt",
        regex: r"(?-u:\b)eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*",
        check: Check::None,
    },
    Pattern {
        name: "private-key-pem",
        source: "RFC 7468 (PEM textual encoding: `-----BEGIN ... PRIVATE KEY-----`), RFC 4880 armor for PGP; gitleaks rule private-key. A block cut before its END line is hidden to the end of the text",
        regex: r"-----BEGIN[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----(?s:.*?)(?:-----END[ A-Z0-9]*PRIVATE KEY(?: BLOCK)?-----|\z)",
        check: Check::None,
    },
    Pattern {
        name: "bearer-credential",
        source: "RFC 6750 §2.1 (`Authorization: Bearer <b64token>`)",
        regex: r"(?-u:\b)(?:Bearer|bearer|BEARER)[ \t]+[A-Za-z0-9._~+/-]{8,}=*",
        check: Check::NotOnlyLetters,
    },
    Pattern {
        name: "basic-credential",
        source: "RFC 7617 §2 (`Authorization: Basic base64(user:password)`)",
        regex: r"(?-u:\b)(?:Basic|basic|BASIC)[ \t]+[A-Za-z0-9+/]{4,}={0,2}",
        check: Check::Base64UserPass,
    },
    Pattern {
        name: "oauth-token-in-query",
        source: "RFC 6750 §2.3 (`access_token` URI query parameter), RFC 6749 §4 (`refresh_token`, `client_secret`), OpenID Connect Core §3.2.2.5 (`id_token`)",
        regex: r"(?-u:\b)(?:access_token|refresh_token|id_token|client_secret)=[^&\s#\x22'\[]{4,}",
        check: Check::None,
    },
];

/// The start of a credential: a listed shape's prefix and one character of its value, for text that
/// is withheld whole rather than masked (MCP tool results, docs/mcp.md), where hiding a harmless
/// string costs little and a short or cut token (`Bearer abc123`, `ghp_abc12`, `tbk_x1`) must not
/// pass. Each entry is named after the [`PATTERNS`] entry it starts (same source). Only prefixes that
/// ordinary words do not start with are here: not AWS `AKIA`/`ASIA` (`ASIAN`), bare `sk-` (`sk-learn`),
/// `npm_` (`npm_package_version`), Slack's `xoxo-` without its digit (`xoxo-hugs`), `eyJ`.
/// [`contains_start`] applies them.
pub const STARTS: &[Pattern] = &[
    start(
        "trigger-bridge-api-key",
        r"(?-u:\b)tbk_[A-Za-z0-9_-]",
        Check::None,
    ),
    start(
        "trigger-bridge-capability-token",
        r"(?-u:\b)tbcap_[A-Za-z0-9_-]",
        Check::None,
    ),
    start(
        "trigger-bridge-result-token",
        r"(?-u:\b)tbres_[A-Za-z0-9]",
        Check::None,
    ),
    start(
        "standard-webhooks-secret",
        r"(?-u:\b)whsec_[A-Za-z0-9+/]",
        Check::None,
    ),
    start(
        "github-token",
        r"(?-u:\b)gh[pousr]_[A-Za-z0-9]",
        Check::None,
    ),
    start(
        "github-fine-grained-pat",
        r"(?-u:\b)github_pat_[A-Za-z0-9_]",
        Check::None,
    ),
    start(
        "gitlab-token",
        r"(?-u:\b)gl(?:pat|ptt|dt|rt)-[A-Za-z0-9_.-]",
        Check::None,
    ),
    start(
        "openai-api-key",
        r"(?-u:\b)sk-(?:proj|ant|svcacct|admin)-[A-Za-z0-9_-]",
        Check::None,
    ),
    start(
        "stripe-secret-key",
        r"(?-u:\b)[rs]k_(?:live|test)_[A-Za-z0-9]",
        Check::None,
    ),
    start(
        "slack-token",
        r"(?-u:\b)(?:xox[bp]-[A-Za-z0-9]|(?:xox[aeors]|xapp)-[0-9])",
        Check::None,
    ),
    start(
        "bearer-credential",
        r"(?-u:\b)(?:Bearer|bearer|BEARER)[ \t]+[A-Za-z0-9._~+/-]+=*",
        Check::NotOnlyLetters,
    ),
    start(
        "oauth-token-in-query",
        r"(?-u:\b)(?:access_token|refresh_token|id_token|client_secret)=[^&\s#\x22'\[]",
        Check::None,
    ),
];

const fn start(name: &'static str, regex: &'static str, check: Check) -> Pattern {
    Pattern {
        name,
        source: "the PATTERNS entry of the same name",
        regex,
        check,
    }
}

struct Compiled {
    set: RegexSet,
    each: Vec<Regex>,
}

impl Compiled {
    fn of(list: &[Pattern]) -> Compiled {
        Compiled {
            set: RegexSet::new(list.iter().map(|p| p.regex)).expect("credential shapes compile"),
            each: list
                .iter()
                .map(|p| Regex::new(p.regex).expect("credential shapes compile"))
                .collect(),
        }
    }
}

static COMPILED: LazyLock<Compiled> = LazyLock::new(|| Compiled::of(PATTERNS));
static STARTS_COMPILED: LazyLock<Compiled> = LazyLock::new(|| Compiled::of(STARTS));

/// Whether `s` holds a credential of a listed shape ([`contains`]) or the start of one
/// ([`STARTS`]: a listed prefix and one character of its value, `Bearer` with a value that is not
/// only letters): for text withheld whole (docs/mcp.md). Linear in `s`.
pub fn contains_start(s: &str) -> bool {
    if contains(s) {
        return true;
    }
    let c = &*STARTS_COMPILED;
    c.set.matches(s).iter().any(|i| {
        c.each[i]
            .find_iter(s)
            .any(|m| passes(STARTS[i].check, m.as_str()))
    })
}

/// One credential found in a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The [`Pattern::name`].
    pub name: &'static str,
    /// Byte range in the text.
    pub range: Range<usize>,
}

/// Every credential in `s`, by start (a span two patterns both cover is reported by each). Cost: one
/// pass of a [`RegexSet`] over `s`, then one pass per pattern that matched; linear in `s`.
pub fn find(s: &str) -> Vec<Found> {
    let c = &*COMPILED;
    let mut out = Vec::new();
    for i in c.set.matches(s).iter() {
        let p = &PATTERNS[i];
        for m in c.each[i].find_iter(s) {
            if passes(p.check, m.as_str()) {
                out.push(Found {
                    name: p.name,
                    range: m.range(),
                });
            }
        }
    }
    out.sort_by_key(|f| (f.range.start, std::cmp::Reverse(f.range.end)));
    out
}

/// Whether `s` holds a credential of a listed shape.
pub fn contains(s: &str) -> bool {
    COMPILED.set.is_match(s) && !find(s).is_empty()
}

/// `s` with every credential of a listed shape replaced by `with` (overlapping matches become one
/// replacement); borrowed when there is none.
pub fn mask<'a>(s: &'a str, with: &str) -> Cow<'a, str> {
    if !COMPILED.set.is_match(s) {
        return Cow::Borrowed(s);
    }
    let found = find(s);
    if found.is_empty() {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len());
    let mut at = 0;
    for f in found {
        if f.range.end <= at {
            continue;
        }
        if f.range.start >= at {
            out.push_str(&s[at..f.range.start]);
            out.push_str(with);
        }
        at = f.range.end;
    }
    out.push_str(&s[at..]);
    Cow::Owned(out)
}

/// Reads the corpus format of `tests/fixtures/credentials/` (`PROVENANCE.md` there): one entry a
/// line, `#` lines and blank lines skipped; `<pattern name><TAB><text>` gives `(name, text)`, a line
/// without a tab `("", text)`; every `·` (U+00B7) is deleted and `\n` becomes a line break.
pub fn corpus(file: &str) -> Vec<(String, String)> {
    file.lines()
        .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, text) = l.split_once('\t').unwrap_or(("", l));
            (
                name.to_string(),
                text.replace('\u{b7}', "").replace("\\n", "\n"),
            )
        })
        .collect()
}

/// The value of an `Authorization`-scheme match (what follows the scheme and its blanks).
fn scheme_value(m: &str) -> &str {
    m.split_once([' ', '\t'])
        .map(|(_, v)| v.trim_start())
        .unwrap_or("")
}

fn passes(check: Check, m: &str) -> bool {
    match check {
        Check::None => true,
        Check::NotOnlyLetters => scheme_value(m).bytes().any(|b| !b.is_ascii_alphabetic()),
        Check::Base64UserPass => base64_decode(scheme_value(m))
            .and_then(|d| String::from_utf8(d).ok())
            .is_some_and(|t| t.contains(':') && !t.chars().any(char::is_control)),
    }
}

/// Standard base64 (RFC 4648 §4, padding required when the length is not a multiple of 4 is not
/// enforced: `=` may be left out). `None` when a character is outside the alphabet or the length
/// cannot be one of base64.
fn base64_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim_end_matches('=');
    if s.len() % 4 == 1 {
        return None;
    }
    let val = |b: u8| -> Option<u32> {
        Some(match b {
            b'A'..=b'Z' => b - b'A',
            b'a'..=b'z' => b - b'a' + 26,
            b'0'..=b'9' => b - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    for chunk in s.as_bytes().chunks(4) {
        let mut n = 0u32;
        for (i, &b) in chunk.iter().enumerate() {
            n |= val(b)? << (18 - 6 * i);
        }
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..chunk.len() - 1]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pattern_compiles_and_names_a_source() {
        assert_eq!(COMPILED.each.len(), PATTERNS.len());
        let mut names: Vec<&str> = PATTERNS.iter().map(|p| p.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), PATTERNS.len(), "names are unique");
        assert!(PATTERNS.iter().all(|p| !p.source.is_empty()));
    }

    #[test]
    fn masks_in_place_and_keeps_the_rest() {
        let s = "HTTP 401: token ghp_0123456789abcdefghijABCDEFGHIJ012345 expired; retry";
        assert_eq!(
            mask(s, "[redacted]"),
            "HTTP 401: token [redacted] expired; retry"
        );
        assert!(matches!(mask("nothing here", "x"), Cow::Borrowed(_)));
        // A JWT behind `Bearer`: both match; one replacement.
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk";
        assert_eq!(mask(&format!("a Bearer {jwt} b"), "#"), "a # b");
    }

    #[test]
    fn the_start_of_a_credential_is_found_for_text_withheld_whole() {
        for s in [
            "Bearer abc123",
            "500: {\"auth\":\"Bearer abc123\"}",
            "ghp_abc12",
            "tbk_x1",
            "tbres_0",
            "whsec_a",
            "glpat-x",
            "sk_live_1",
            "sk-proj-a",
            "xoxb-a",
            "xoxe-1",
            "access_token=a",
        ] {
            assert!(!contains(s), "{s}: too short for the full shapes");
            assert!(contains_start(s), "{s}");
        }
        for s in [
            "Bearer authentication required",
            "the bearer token is missing or expired",
            "tokens start with ghp_ or github_pat_ and keys with tbk_...",
            "use sk-learn or sk_live_ keys from the dashboard",
            "xoxo-hugs-and-kisses-from-the-team",
            "ASIAN-PACIFIC region, AKIA prefix",
            "npm_package_version=1.2.3",
            "access_token=[redacted]&page=2",
        ] {
            assert!(!contains_start(s), "{s}");
        }
        let names: Vec<&str> = PATTERNS.iter().map(|p| p.name).collect();
        for p in STARTS {
            assert!(names.contains(&p.name), "{} starts no pattern", p.name);
        }
        assert_eq!(STARTS_COMPILED.each.len(), STARTS.len());
    }

    #[test]
    fn scheme_words_in_prose_are_not_credentials() {
        for s in [
            "Bearer authentication required",
            "basic functionality works",
            "a basic example",
            "Basic authentication failed",
        ] {
            assert!(!contains(s), "{s}");
        }
        // base64("aladdin:opensesame"), RFC 7617 §2's example.
        assert!(contains("Authorization: Basic YWxhZGRpbjpvcGVuc2VzYW1l"));
        assert_eq!(
            base64_decode("YWxhZGRpbjpvcGVuc2VzYW1l").unwrap(),
            b"aladdin:opensesame"
        );
        assert_eq!(base64_decode("YQ").unwrap(), b"a");
        assert_eq!(base64_decode("Y"), None);
    }
}
