//! PostgreSQL connection URLs in the CLI: which store a URL selects, its pool size bounds, and the
//! redacted form that is the only one ever printed (logs, banner, errors).

/// Default of `[server].database_pool_size`: connections (one thread each) of the PostgreSQL pool.
pub const DEFAULT_POOL_SIZE: usize = tb_store::postgres::pool::DEFAULT_CONNECTIONS;

/// Largest accepted `[server].database_pool_size` (a PostgreSQL server allows 100 connections by
/// default, shared by every replica).
pub const MAX_POOL_SIZE: usize = 256;

/// What replaces a password in [`redact`].
pub const MASK: &str = "***";

/// `url` with its password replaced by [`MASK`], in every form libpq accepts: the userinfo of
/// `postgres://user:PASSWORD@host/db`, a `password=` query parameter
/// (`postgres://host/db?password=PASSWORD`), and a `password=` pair of the key/value form
/// (`host=h password=PASSWORD`). Anything else is returned unchanged. Never fails.
pub fn redact(url: &str) -> String {
    if let Some((scheme, rest)) = url.split_once("://") {
        let (authority_end, _) = rest
            .char_indices()
            .find(|&(_, c)| c == '/' || c == '?')
            .unwrap_or((rest.len(), ' '));
        let (authority, tail) = rest.split_at(authority_end);
        let authority = match authority.rsplit_once('@') {
            Some((userinfo, host)) => match userinfo.split_once(':') {
                Some((user, _password)) => format!("{user}:{MASK}@{host}"),
                None => authority.to_string(),
            },
            None => authority.to_string(),
        };
        let tail = match tail.split_once('?') {
            Some((path, query)) => {
                let query: Vec<String> = query
                    .split('&')
                    .map(|kv| match kv.split_once('=') {
                        Some((k, _)) if k.eq_ignore_ascii_case("password") => {
                            format!("{k}={MASK}")
                        }
                        _ => kv.to_string(),
                    })
                    .collect();
                format!("{path}?{}", query.join("&"))
            }
            None => tail.to_string(),
        };
        return format!("{scheme}://{authority}{tail}");
    }
    redact_text(url)
}

/// `text` (an error message, a key/value connection string) with every URL in it passed through
/// [`redact`] and every `password=` word masked. Words are split at spaces.
pub fn redact_text(text: &str) -> String {
    text.split(' ')
        .map(|w| {
            if w.contains("://") {
                redact(w)
            } else {
                match w.split_once('=') {
                    Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}={MASK}"),
                    _ => w.to_string(),
                }
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether `url` names a PostgreSQL server (`postgres://` or `postgresql://`).
pub fn is_postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// The problems of a configured `database_url` and `database_pool_size`, each naming its key and what
/// to set; the URL appears only redacted.
pub fn problems(url: Option<&str>, pool_size: Option<usize>) -> Vec<String> {
    let mut errs = Vec::new();
    if let Some(url) = url {
        if !is_postgres(url) {
            errs.push(format!(
                "[server].database_url {} must start with postgres:// (postgres://user@host:5432/db); leave it out for the SQLite store in data_dir",
                redact(url)
            ));
        } else if let Err(e) = tb_store::postgres::parse_url(url) {
            errs.push(format!(
                "[server].database_url {}: {}",
                redact(url),
                redact_text(&e.to_string())
            ));
        }
    }
    if let Some(n) = pool_size {
        if n == 0 || n > MAX_POOL_SIZE {
            errs.push(format!(
                "[server].database_pool_size {n} is out of range; use 1 to {MAX_POOL_SIZE} connections (default {DEFAULT_POOL_SIZE})"
            ));
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_is_masked_in_every_form() {
        assert_eq!(
            redact("postgres://tb:s3cr%40t@db.internal:5432/tb?sslmode=disable"),
            "postgres://tb:***@db.internal:5432/tb?sslmode=disable"
        );
        assert_eq!(
            redact("postgresql://u:p@h/db?application_name=x&password=s3cret"),
            "postgresql://u:***@h/db?application_name=x&password=***"
        );
        assert_eq!(
            redact("host=h user=u password=s3cret dbname=d"),
            "host=h user=u password=*** dbname=d"
        );
        assert_eq!(
            redact_text("cannot reach postgres://u:pw@h/d with password=pw"),
            "cannot reach postgres://u:***@h/d with password=***"
        );
        // A password holding '@' ends at the last '@' before the host.
        assert_eq!(redact("postgres://u:a@b@h:1/d"), "postgres://u:***@h:1/d");
    }

    #[test]
    fn a_url_without_a_password_is_unchanged() {
        for u in [
            "postgres://postgres@127.0.0.1:5432/test",
            "postgres://127.0.0.1/test?options=-c%20search_path%3Dtb_x",
            "host=h user=u",
        ] {
            assert_eq!(redact(u), u);
        }
    }

    #[test]
    fn pool_size_and_scheme_problems_name_the_key() {
        assert!(problems(Some("postgres://u@h/d"), Some(8)).is_empty());
        let e = problems(Some("mysql://u:pw@h/d"), Some(0));
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(
            e[0].contains("[server].database_url mysql://u:***@h/d"),
            "{e:?}"
        );
        assert!(!e[0].contains("pw"), "{e:?}");
        assert!(
            e[1].contains("database_pool_size 0 is out of range; use 1 to 256"),
            "{e:?}"
        );
        assert_eq!(problems(None, Some(257)).len(), 1);
    }
}
