//! The rules of the HTTP front door (docs/limits.md "Per-client limits"): who a client is, and what
//! one client may hold of the server's connections and of a subscription's body slots, so that one
//! address can never take what every other sender needs (the fairness of nginx `limit_conn` and of
//! Envoy's per-downstream limits).
//!
//! - A client is its address, counted under [`client_key`]: an IPv4 address as itself, an IPv6
//!   address by its /64 (one host usually holds a whole /64).
//! - Behind a trusted proxy the client is the address the proxy saw, read from the one header the
//!   operator names ([`ForwardedHeader`], [`client_of`]); from any other peer, the TCP peer.
//! - One client holds at most its share of the open connections and of each target's body slots
//!   ([`client_admits`], the defaults [`default_connections_per_client`] and
//!   [`default_bodies_per_client`]).
//! - `/health` and `/ready` are answered even when every connection slot is taken
//!   ([`is_probe`], [`request_line`]); near the cap, connections without a request are cut after
//!   [`PRESSURE_HEADER_TIMEOUT_MS`] ([`near_cap`]).
//!
//! Pure functions only; the accept loop (`trigger-bridge serve`) and the ingest body gate
//! (`tb_api::body`) apply them.

use std::net::{IpAddr, Ipv6Addr};

/// Most connections one client holds at once by default (`[server].max_connections_per_client`),
/// when a quarter of `max_connections` is not smaller ([`default_connections_per_client`]).
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 64;

/// ms a connection that has not sent a whole request head may stay open while the server is near its
/// connection cap ([`near_cap`]); the configured `[server].header_timeout_ms` when that is shorter.
/// A real client sends its head in its first packets; only a client holding a slot idle waits longer.
pub const PRESSURE_HEADER_TIMEOUT_MS: u64 = 1_000;

/// The key one client is counted under: an IPv4 address (or an IPv4-mapped IPv6 address) as the IPv4
/// address, an IPv6 address as the network address of its /64.
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
    }
}

/// Whether a client holding `held` of something (connections, one target's body slots) may take one
/// more under its `share`.
pub fn client_admits(held: usize, share: usize) -> bool {
    held < share
}

/// Default of `[server].max_connections_per_client`: [`DEFAULT_MAX_CONNECTIONS_PER_CLIENT`], or a
/// quarter of `max_connections` when that is smaller, at least 1 (with the default 512 connections:
/// 64, an eighth of the slots, so it takes eight clients at their share to fill them all and four
/// leave half of them free).
pub fn default_connections_per_client(max_connections: usize) -> usize {
    DEFAULT_MAX_CONNECTIONS_PER_CLIENT
        .min(max_connections / 4)
        .max(1)
}

/// Default of `[server].max_inflight_bodies_per_client`: a quarter of one target's body slots
/// (`max_inflight_bodies_per_target`), at least 1 (with the defaults: 4 of 16). A provider's body
/// arrives in its first packets, so a sender seldom has more than one being read at once.
pub fn default_bodies_per_client(per_target: usize) -> usize {
    (per_target / 4).max(1)
}

/// Whether `open` connections are near the cap of `max_connections`: at least three quarters of it.
/// Then connections without a request are cut after [`PRESSURE_HEADER_TIMEOUT_MS`].
pub fn near_cap(open: usize, max_connections: usize) -> bool {
    open.saturating_mul(4) >= max_connections.saturating_mul(3)
}

/// The header timeout near the cap, in ms: [`PRESSURE_HEADER_TIMEOUT_MS`], or `header_timeout_ms` when
/// that is shorter.
pub fn pressure_header_timeout_ms(header_timeout_ms: u64) -> u64 {
    header_timeout_ms.min(PRESSURE_HEADER_TIMEOUT_MS)
}

/// Whether a request is a probe the server answers even when its connection slots are all taken:
/// `GET` or `HEAD` of `/health` or `/ready` (a query string allowed).
pub fn is_probe(method: &str, target: &str) -> bool {
    let path = target.split_once('?').map_or(target, |(p, _)| p);
    matches!(method, "GET" | "HEAD") && matches!(path, "/health" | "/ready")
}

/// The method and request target of an HTTP/1.x request head read so far (`GET /health HTTP/1.1`),
/// once its first line is complete; `None` before that or when the line is not
/// `METHOD SP TARGET SP HTTP/1.x`.
pub fn request_line(head: &[u8]) -> Option<(&str, &str)> {
    let end = head.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&head[..end]).ok()?;
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !version.starts_with("HTTP/1.") || method.is_empty() {
        return None;
    }
    Some((method, target))
}

/// The header a trusted proxy names the client in (`[server].client_address_header`). Only the one
/// the proxy writes may be read: a header the proxy passes through unchanged is whatever the client
/// wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2` (the default; nginx, HAProxy, AWS ALB, Envoy).
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client;proto=https, for="[2001:db8::1]:4711"`.
    Forwarded,
}

impl ForwardedHeader {
    /// The configuration value and header name: `x-forwarded-for` or `forwarded`.
    pub fn name(self) -> &'static str {
        match self {
            ForwardedHeader::XForwardedFor => "x-forwarded-for",
            ForwardedHeader::Forwarded => "forwarded",
        }
    }

    /// The inverse of [`ForwardedHeader::name`], ignoring ASCII case.
    pub fn parse(s: &str) -> Option<ForwardedHeader> {
        [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded]
            .into_iter()
            .find(|h| h.name().eq_ignore_ascii_case(s))
    }
}

/// The client address of a request that reached us from `peer` with `values` of `header` (every
/// occurrence, in order): `peer` unless it is within one of the `trusted` proxies; else the rightmost
/// forwarded address that is not a trusted proxy ([`crate::rate::client_addr`]). A forwarded element
/// that is not an address (`for=unknown`, an obfuscated `for=_hidden`, junk) stops the walk and the
/// peer is kept.
pub fn client_of(
    peer: IpAddr,
    header: ForwardedHeader,
    values: &[&str],
    trusted: &[ipnet::IpNet],
) -> IpAddr {
    match header {
        ForwardedHeader::XForwardedFor => crate::rate::client_addr(peer, values, trusted),
        ForwardedHeader::Forwarded => {
            let hops = forwarded_for_hops(values);
            let hops: Vec<&str> = hops.iter().map(String::as_str).collect();
            crate::rate::client_addr(peer, &hops, trusted)
        }
    }
}

/// The `for=` value of every element of RFC 7239 `Forwarded` header `values`, in order, unquoted and
/// without the brackets of an IPv6 address (`[2001:db8::1]:4711` stays with its port, which
/// [`crate::rate::client_addr`] drops). An element without `for=` gives `""`, which is not an address.
/// Commas and semicolons inside a quoted string do not split.
pub fn forwarded_for_hops(values: &[&str]) -> Vec<String> {
    let mut hops = Vec::new();
    for v in values {
        for element in split_unquoted(v, ',') {
            let mut found = String::new();
            for pair in split_unquoted(element, ';') {
                let Some((k, val)) = pair.split_once('=') else {
                    continue;
                };
                if k.trim().eq_ignore_ascii_case("for") {
                    found = unquote(val.trim());
                    break;
                }
            }
            if let Some(inner) = found.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
                found = inner.to_string();
            }
            if found.contains(',') {
                // Not an address; kept whole it would be split into hops by the walk.
                found.clear();
            }
            hops.push(found);
        }
    }
    hops
}

/// `s` split at every `sep` outside a quoted string.
fn split_unquoted(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut start, mut quoted, mut escaped) = (0, false, false);
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if quoted && c == '\\' {
            escaped = true;
        } else if c == '"' {
            quoted = !quoted;
        } else if c == sep && !quoted {
            parts.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    parts.push(&s[start..]);
    parts
}

/// A token or an RFC 7230 quoted string, unquoted.
fn unquote(v: &str) -> String {
    match v.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        Some(inner) => {
            let mut out = String::with_capacity(inner.len());
            let mut escaped = false;
            for c in inner.chars() {
                if !escaped && c == '\\' {
                    escaped = true;
                    continue;
                }
                escaped = false;
                out.push(c);
            }
            out
        }
        None => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_client_is_an_ipv4_address_or_an_ipv6_slash_64() {
        assert_eq!(client_key(ip("203.0.113.9")), ip("203.0.113.9"));
        assert_eq!(client_key(ip("::ffff:203.0.113.9")), ip("203.0.113.9"));
        assert_eq!(client_key(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(
            client_key(ip("2001:db8:1:2:ffff::9")),
            client_key(ip("2001:db8:1:2::1")),
            "one /64, one client"
        );
        assert_ne!(
            client_key(ip("2001:db8:1:3::1")),
            client_key(ip("2001:db8:1:2::1"))
        );
    }

    #[test]
    fn shares_and_their_defaults() {
        assert!(client_admits(63, 64));
        assert!(!client_admits(64, 64));
        assert_eq!(default_connections_per_client(512), 64);
        assert_eq!(default_connections_per_client(48), 12);
        assert_eq!(default_connections_per_client(10_000), 64);
        assert_eq!(default_connections_per_client(2), 1, "at least one");
        assert_eq!(default_bodies_per_client(16), 4);
        assert_eq!(default_bodies_per_client(8), 2);
        assert_eq!(default_bodies_per_client(1), 1);
    }

    #[test]
    fn near_the_cap_is_three_quarters_of_it() {
        assert!(!near_cap(383, 512));
        assert!(near_cap(384, 512));
        assert!(near_cap(600, 512));
        assert!(near_cap(1, 1));
        assert!(!near_cap(0, 2));
        assert_eq!(pressure_header_timeout_ms(10_000), 1_000);
        assert_eq!(pressure_header_timeout_ms(600), 600);
    }

    #[test]
    fn probes_are_get_or_head_of_health_and_ready() {
        assert!(is_probe("GET", "/health"));
        assert!(is_probe("HEAD", "/ready"));
        assert!(is_probe("GET", "/ready?verbose=1"));
        assert!(!is_probe("POST", "/health"));
        assert!(!is_probe("GET", "/healthz"));
        assert!(!is_probe("GET", "/metrics"));
        assert!(!is_probe("GET", "/v1/trigger-subscriptions/sw/ingest"));
        assert!(!is_probe("GET", "/health/../v1/runs"));
    }

    #[test]
    fn the_request_line_is_read_once_complete() {
        assert_eq!(
            request_line(b"GET /health HTTP/1.1\r\nHost: x\r\n"),
            Some(("GET", "/health"))
        );
        assert_eq!(request_line(b"GET /health HTTP/1.1"), None, "not complete");
        assert_eq!(request_line(b"GET /health\r\n"), None, "no version");
        assert_eq!(request_line(b"GET  /health HTTP/1.1\r\n"), None);
        assert_eq!(request_line(b"\xff /health HTTP/1.1\r\n"), None);
        assert_eq!(request_line(b"GET /health HTTP/2.0\r\n"), None);
    }

    #[test]
    fn the_forwarded_header_is_read_only_behind_a_trusted_proxy() {
        let trusted: Vec<ipnet::IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let lb = ip("10.1.2.3");
        let outside = ip("198.51.100.7");
        let fwd = ForwardedHeader::Forwarded;
        assert_eq!(
            client_of(outside, fwd, &["for=192.0.2.1"], &trusted),
            outside,
            "an untrusted peer's header is ignored"
        );
        assert_eq!(
            client_of(
                lb,
                fwd,
                &["for=192.0.2.1;proto=http, for=198.51.100.7;by=10.1.2.3"],
                &trusted
            ),
            outside,
            "the rightmost untrusted hop"
        );
        assert_eq!(
            client_of(
                lb,
                fwd,
                &["For=\"[2001:db8:cafe::17]:4711\"", "for=10.9.9.9"],
                &trusted
            ),
            ip("2001:db8:cafe::17"),
            "quoted IPv6 with a port, over a second trusted hop"
        );
        assert_eq!(
            client_of(lb, fwd, &["for=\"[2001:db8::1]\""], &trusted),
            ip("2001:db8::1")
        );
        assert_eq!(
            client_of(lb, fwd, &["for=unknown"], &trusted),
            lb,
            "not an address: the proxy is kept"
        );
        assert_eq!(client_of(lb, fwd, &["proto=https"], &trusted), lb);
        assert_eq!(
            client_of(lb, fwd, &["for=\"198.51.100.7, 192.0.2.1\""], &trusted),
            lb,
            "a comma inside quotes does not split"
        );
        // The header that is not configured is ignored entirely.
        assert_eq!(
            client_of(
                lb,
                ForwardedHeader::XForwardedFor,
                &["198.51.100.7"],
                &trusted
            ),
            outside
        );
        assert_eq!(
            ForwardedHeader::parse("X-Forwarded-For"),
            Some(ForwardedHeader::XForwardedFor)
        );
        assert_eq!(
            ForwardedHeader::parse("forwarded"),
            Some(ForwardedHeader::Forwarded)
        );
        assert_eq!(ForwardedHeader::parse("x-real-ip"), None);
    }
}
