//! Listen addresses: a socket address (`127.0.0.1:8080`, `[::1]:8080`) or a host
//! name with a port (`localhost:8093`), resolved at start.

use std::net::SocketAddr;

/// Checks the shape of a listen address without resolving it: `ip:port`, `[ipv6]:port` or
/// `name:port` (name of letters, digits, `-`, `.`; port 0..=65535). Errors: what is wrong and an example.
pub fn check(s: &str) -> Result<(), String> {
    if s.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    let bad =
        || format!("{s:?} is not host:port; use e.g. \"127.0.0.1:8080\" or \"localhost:8080\"");
    let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
    if port.parse::<u16>().is_err() {
        return Err(bad());
    }
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !name_ok {
        return Err(bad());
    }
    Ok(())
}

/// Resolves a listen address to the first socket address it names. Errors: a bad shape (see [`check`])
/// or a name that does not resolve.
pub async fn resolve(s: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    check(s).map_err(|e| anyhow::anyhow!("listen address {e}"))?;
    let mut addrs = tokio::net::lookup_host(s)
        .await
        .map_err(|e| anyhow::anyhow!("listen address {s:?} does not resolve: {e}"))?;
    addrs
        .next()
        .ok_or_else(|| anyhow::anyhow!("listen address {s:?} resolves to no address"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_addresses_with_a_port_are_accepted() {
        assert!(check("127.0.0.1:8080").is_ok());
        assert!(check("[::1]:8080").is_ok());
        assert!(check("localhost:8093").is_ok());
        assert!(check("bridge.internal:80").is_ok());
    }

    #[test]
    fn shapes_without_a_port_or_with_junk_are_refused() {
        assert!(check("localhost").is_err());
        assert!(check("localhost:http").is_err());
        assert!(check(":8080").is_err());
        assert!(check("local host:80").is_err());
        assert!(check("localhost:99999").is_err());
    }

    #[tokio::test]
    async fn localhost_resolves_to_loopback() {
        let a = resolve("localhost:8093").await.unwrap();
        assert!(a.ip().is_loopback());
        assert_eq!(a.port(), 8093);
    }
}
