//! SSRF guard for outbound calls (DESIGN §10; OpenWOP webhooks §security, RFC 0093): https only, no
//! loopback, private (RFC 1918, CGNAT), link-local (incl. cloud metadata 169.254.169.254), ULA,
//! unspecified, multicast or broadcast address, no `localhost` / `metadata` host names. Every resolved
//! address is checked, and the caller connects to the checked address (pinned), so a DNS answer cannot
//! change between check and connect. `allow_private` (local testing only) lifts the address and scheme
//! rules.

use std::net::{IpAddr, SocketAddr};

/// Why a URL is refused (stable code `webhook_url_rejected`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected(pub &'static str);

/// True for addresses an outbound call must never reach.
pub fn forbidden_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || o[0] == 0
                || (o[0] == 100 && (64..128).contains(&o[1]))
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return forbidden_ip(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
        }
    }
}

/// Checks `url` and resolves it. Returns the host and the addresses to connect to.
pub async fn check(url: &str, allow_private: bool) -> Result<(String, Vec<SocketAddr>), Rejected> {
    let u = reqwest::Url::parse(url).map_err(|_| Rejected("url is not a valid absolute URL"))?;
    match u.scheme() {
        "https" => {}
        "http" if allow_private => {}
        _ => return Err(Rejected("url must be https")),
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(Rejected("url must not carry credentials"));
    }
    let host = u
        .host_str()
        .ok_or(Rejected("url has no host"))?
        .trim_matches(['[', ']'])
        .to_ascii_lowercase();
    if !allow_private
        && (host == "localhost" || host.ends_with(".localhost") || host.starts_with("metadata"))
    {
        return Err(Rejected("url names a local or metadata host"));
    }
    let port = u
        .port_or_known_default()
        .ok_or(Rejected("url has no port"))?;
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|_| Rejected("url host does not resolve"))?
        .collect();
    if addrs.is_empty() {
        return Err(Rejected("url host does not resolve"));
    }
    if !allow_private && addrs.iter().any(|a| forbidden_ip(a.ip())) {
        return Err(Rejected(
            "url resolves to a private, loopback, link-local or metadata address",
        ));
    }
    Ok((host, addrs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forbidden_ranges() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fc00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "224.0.0.1",
        ] {
            assert!(forbidden_ip(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["93.184.216.34", "2606:4700::1111", "8.8.8.8"] {
            assert!(!forbidden_ip(ip.parse().unwrap()), "{ip}");
        }
    }

    #[tokio::test]
    async fn urls() {
        assert_eq!(
            check("http://example.com/x", false).await,
            Err(Rejected("url must be https"))
        );
        assert_eq!(
            check("https://127.0.0.1/x", false).await.unwrap_err().0,
            "url resolves to a private, loopback, link-local or metadata address"
        );
        assert_eq!(
            check("https://localhost/x", false).await.unwrap_err().0,
            "url names a local or metadata host"
        );
        assert_eq!(
            check("https://u:p@93.184.216.34/x", false)
                .await
                .unwrap_err()
                .0,
            "url must not carry credentials"
        );
        assert!(
            check("https://93.184.216.34/x", false).await.is_ok(),
            "a public literal address needs no DNS"
        );
        assert!(
            check("http://127.0.0.1:9/x", true).await.is_ok(),
            "the local-testing switch"
        );
    }
}
