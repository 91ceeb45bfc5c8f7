//! The replica id of a `serve` process: the `replica` field of the span every log line of the process
//! is in, and the lease owner the delivery worker writes on the deliveries it holds.

/// Target of the [`span`]; `init_tracing` enables it at every level so the span exists whatever
/// `RUST_LOG` says (an `info` span under `RUST_LOG=warn` would be filtered out, and its field with it).
pub const SPAN_TARGET: &str = "trigger_bridge::replica";

/// The span `replica{replica=<id>}` every log line of a `serve` process is in.
pub fn span(id: &str) -> tracing::Span {
    tracing::error_span!(target: "trigger_bridge::replica", "replica", replica = %id)
}

/// Longest replica id, in bytes.
pub const MAX_LEN: usize = 64;

/// Longest host name part of the default id, in bytes.
const HOST_LEN: usize = 24;

/// The default id, `<short host name>-<pid>` (e.g. `web-3-41822`): the host name up to its first `.`,
/// cut to 24 bytes, with characters outside `[A-Za-z0-9_-]` replaced by `-`; `host` when the name
/// cannot be read. Unique among the processes of one host; across hosts as unique as their names.
pub fn default_id() -> String {
    let host = hostname()
        .map(|h| {
            h.split('.')
                .next()
                .unwrap_or_default()
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                        c
                    } else {
                        '-'
                    }
                })
                .take(HOST_LEN)
                .collect::<String>()
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into());
    format!("{host}-{}", std::process::id())
}

/// Checks an id given with `--replica-id` / `TRIGGER_BRIDGE_REPLICA_ID`: 1 to [`MAX_LEN`] bytes of
/// `[A-Za-z0-9._-]`. Errors: what is wrong, quoting the id.
pub fn check(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > MAX_LEN {
        return Err(format!(
            "--replica-id {id:?} must be 1 to {MAX_LEN} characters"
        ));
    }
    if let Some(c) = id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "--replica-id {id:?} has {c:?}; use letters, digits, '.', '_' and '-'"
        ));
    }
    Ok(())
}

#[cfg(unix)]
fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into a buffer this function owns.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8(buf[..end].to_vec()).ok()
}

#[cfg(not(unix))]
fn hostname() -> Option<String> {
    std::env::var("COMPUTERNAME").ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_id_is_short_valid_and_ends_with_the_pid() {
        let id = default_id();
        assert!(id.ends_with(&format!("-{}", std::process::id())), "{id}");
        assert!(id.len() <= HOST_LEN + 1 + 10, "{id}");
        check(&id).unwrap();
    }

    #[test]
    fn ids_with_spaces_or_too_long_are_refused() {
        check("api-1").unwrap();
        check("eu.worker_2").unwrap();
        assert!(check("").is_err());
        assert!(check("a b").unwrap_err().contains("' '"));
        assert!(check(&"x".repeat(65)).is_err());
    }
}
