//! SSRF guard for outbound calls (DESIGN §10; OpenWOP webhooks §security, RFC 0093): https only, no
//! loopback, private (RFC 1918, CGNAT), link-local (incl. cloud metadata 169.254.169.254), ULA,
//! unspecified, multicast or broadcast address, no `localhost` / `metadata` host names. Every resolved
//! address is checked, and the caller connects to the checked address (pinned), so a DNS answer cannot
//! change between check and connect. `allow_private` (local testing only) lifts the address and scheme
//! rules.
//!
//! The http executor goes through the same address rule by its client's resolver
//! ([`GuardedResolver`]) and [`forbidden_literal`]; a workflow opts in to a private worker with
//! `allow_private = true` (its URL is the operator's, never a payload's) and then uses a client without
//! the guard. Neither client uses a proxy from the environment (`HTTP_PROXY` would connect to the
//! proxy's address, not the checked one).

use std::net::{IpAddr, SocketAddr};

/// Why a URL is refused (stable code `webhook_url_rejected`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected(pub &'static str);

/// True for addresses an outbound call must never reach. IPv6 forms that carry an IPv4 address
/// (IPv4-mapped `::ffff:a.b.c.d`, IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::/96` and the local-use
/// `64:ff9b:1::/48`, 6to4 `2002::/16`) are judged by the address they carry; Teredo (`2001::/32`, whose
/// client address is obscured) is refused whole.
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
                // CGNAT 100.64/10
                || (o[0] == 100 && (64..128).contains(&o[1]))
                // IETF protocol assignments 192.0.0/24 (DS-Lite, NAT64 discovery ...)
                || (o[0] == 192 && o[1] == 0 && o[2] == 0)
                // benchmarking 198.18/15
                || (o[0] == 198 && (o[1] & 0xfe) == 18)
                // reserved 240/4
                || o[0] >= 240
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_v4(v6) {
                return forbidden_ip(IpAddr::V4(v4));
            }
            let s = v6.segments();
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                // ULA fc00::/7 (AWS's metadata fd00:ec2::254 is one)
                || (s[0] & 0xfe00) == 0xfc00
                // link-local fe80::/10 and the deprecated site-local fec0::/10
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] & 0xffc0) == 0xfec0
                // Teredo 2001::/32
                || (s[0] == 0x2001 && s[1] == 0)
                // discard-only 100::/64
                || (s[0] == 0x100 && s[1] == 0 && s[2] == 0 && s[3] == 0)
                // documentation 2001:db8::/32
                || (s[0] == 0x2001 && s[1] == 0xdb8)
        }
    }
}

/// The IPv4 address an IPv6 address carries, if it is one of the forms that carry one.
fn embedded_v4(v6: std::net::Ipv6Addr) -> Option<std::net::Ipv4Addr> {
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = v6.segments();
    let o = v6.octets();
    let tail = std::net::Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    // IPv4-compatible ::a.b.c.d (not :: and ::1, which are judged as IPv6)
    if s[..6].iter().all(|x| *x == 0) && (s[6] != 0 || s[7] > 1) {
        return Some(tail);
    }
    // NAT64: 64:ff9b::/96 and 64:ff9b:1::/48 (RFC 6052, RFC 8215)
    if s[0] == 0x64 && s[1] == 0xff9b && (s[2..6].iter().all(|x| *x == 0) || s[2] == 1) {
        return Some(tail);
    }
    // 6to4: 2002:a.b.c.d::/48
    if s[0] == 0x2002 {
        return Some(std::net::Ipv4Addr::new(o[2], o[3], o[4], o[5]));
    }
    None
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

/// An outbound call refused because its host resolves to (or is) an address [`forbidden_ip`] names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForbiddenAddress {
    /// The host as written in the URL.
    pub host: String,
    /// The first forbidden address it resolved to.
    pub ip: IpAddr,
}

impl std::fmt::Display for ForbiddenAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} resolves to {}, a private, loopback, link-local or metadata address",
            self.host, self.ip
        )
    }
}

impl std::error::Error for ForbiddenAddress {}

/// The resolver of the http executor's guarded client (`reqwest::ClientBuilder::dns_resolver`): every
/// name the client connects to is resolved here and refused when any address it resolves to is
/// forbidden. The client connects only to the addresses returned, so the checked address is the one
/// used (pinned): a DNS answer cannot pass the check and then change. IP-literal URLs never reach a
/// resolver: check them with [`forbidden_literal`]. Workflows with `allow_private = true` use a
/// client without it.
#[derive(Debug, Default, Clone, Copy)]
pub struct GuardedResolver;

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_ascii_lowercase();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if let Some(bad) = addrs.iter().find(|a| forbidden_ip(a.ip())) {
                return Err(Box::new(ForbiddenAddress { host, ip: bad.ip() })
                    as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Whether `url`'s host is a name no outbound call may use without `allow_private`: `localhost`,
/// `*.localhost`, `metadata*` (as [`check`] refuses them), for `check-config` to say so before any
/// attempt fails.
pub fn forbidden_name(url: &str) -> bool {
    let Ok(u) = reqwest::Url::parse(url) else {
        return false;
    };
    let host = u.host_str().unwrap_or_default().to_ascii_lowercase();
    host == "localhost" || host.ends_with(".localhost") || host.starts_with("metadata")
}

/// The forbidden address `url` names literally (`http://10.0.0.5/`, `http://[::1]/`), unless
/// `allow_private`; `None` for a host name (checked by [`GuardedResolver`]) or an allowed address.
pub fn forbidden_literal(url: &str, allow_private: bool) -> Option<ForbiddenAddress> {
    if allow_private {
        return None;
    }
    let u = reqwest::Url::parse(url).ok()?;
    let host = u.host_str()?;
    let ip: IpAddr = host.trim_matches(['[', ']']).parse().ok()?;
    forbidden_ip(ip).then(|| ForbiddenAddress {
        host: host.to_string(),
        ip,
    })
}

/// The [`ForbiddenAddress`] somewhere in `e`'s chain of sources, if a refusal of the resolver is why
/// the call failed.
pub fn forbidden_in<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a ForbiddenAddress> {
    let mut cur: Option<&'a (dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(f) = err.downcast_ref::<ForbiddenAddress>() {
            return Some(f);
        }
        cur = err.source();
    }
    None
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
            // IPv6 forms carrying a forbidden IPv4 address
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "::10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::7f00:1",
            "64:ff9b:1::c0a8:101",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
            // Teredo, site-local, ULA metadata, reserved and special IPv4 ranges
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "fec0::1",
            "fd00:ec2::254",
            "2001:db8::1",
            "100::1",
            "192.0.0.170",
            "198.18.0.1",
            "240.0.0.1",
            "255.255.255.255",
        ] {
            assert!(forbidden_ip(ip.parse().unwrap()), "{ip}");
        }
        // The same forms carrying a public address are allowed.
        for ip in [
            "93.184.216.34",
            "2606:4700::1111",
            "8.8.8.8",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
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
    #[test]
    fn literal_addresses_in_urls_are_judged_by_the_address() {
        for url in [
            "http://127.0.0.1:9/run",
            "http://10.0.0.5/run",
            "http://169.254.169.254/latest/meta-data",
            "http://[::1]:8080/",
            "http://[::ffff:10.0.0.1]/",
            "http://[64:ff9b::a9fe:a9fe]/",
        ] {
            let f = forbidden_literal(url, false).unwrap_or_else(|| panic!("{url} passed"));
            assert!(forbidden_ip(f.ip), "{url}");
            assert_eq!(forbidden_literal(url, true), None, "allowed: {url}");
        }
        for url in [
            "https://8.8.8.8/run",
            "https://worker.example/run",
            "not a url",
        ] {
            assert_eq!(forbidden_literal(url, false), None, "{url}");
        }
    }

    #[tokio::test]
    async fn a_name_that_resolves_to_loopback_is_refused_unless_allowed() {
        use reqwest::dns::Resolve;
        use std::str::FromStr;
        let name = || reqwest::dns::Name::from_str("localhost").unwrap();
        let err = match GuardedResolver.resolve(name()).await {
            Ok(_) => panic!("localhost resolved through the guard"),
            Err(e) => e,
        };
        let f = forbidden_in(err.as_ref()).expect("a ForbiddenAddress");
        assert_eq!(f.host, "localhost");
        assert!(f.ip.is_loopback(), "{f}");
        assert!(forbidden_name("http://LocalHost:9/run"));
        assert!(forbidden_name("http://metadata.google.internal/"));
        assert!(!forbidden_name("https://worker.example/run"));
    }
}
