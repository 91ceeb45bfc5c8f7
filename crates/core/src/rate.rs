//! Request rate limits: the rules (signals-and-connectors §0.3 "limits on endpoint, source, binding and
//! global request rates"; §0.5 "Reference quotas (persisted fixed-minute UTC buckets)" and `429` with
//! `Retry-After`).
//!
//! Every level counts the requests it admitted in one fixed UTC minute (`at_ms / 60 000`); a request is
//! refused when any level checked with it has already admitted its limit in that minute, and is then
//! counted by none of them. The global and source levels are checked before the body is read, so a
//! request they admit keeps its place whatever a later check says.
//! `Retry-After` is the whole seconds left in the minute. The engine keeps the counts and shares them
//! between replicas through the store (`ingress_counts`); nothing here does I/O.

use std::net::IpAddr;

use crate::{ErrorCode, TbError};

/// One minute in ms: the width of a bucket.
pub const MINUTE_MS: i64 = 60_000;

/// Refused requests kept as individual content-free records (a `rate_limited` receipt, a
/// `verification_failed` dead letter) per subscription, minute and replica; past this they are only
/// counted (`ingress_counts`), so a flood of refusals is a bounded number of writes.
pub const RECORDS_PER_MINUTE: u64 = 10;

/// A level a limit applies at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Every webhook request the process is asked to take (key `""`).
    Global,
    /// One client address ([`source_key`]), before the body is read.
    Source,
    /// One subscription's authenticated requests (its ingest URL: the endpoint).
    Subscription,
    /// One binding's matched deliveries.
    Binding,
    /// One capability endpoint's authenticated requests (signals-and-connectors §4.2 step 6).
    Endpoint,
}

impl Scope {
    /// Every scope, in the order requests are checked.
    pub const ALL: [Scope; 5] = [
        Scope::Global,
        Scope::Source,
        Scope::Subscription,
        Scope::Binding,
        Scope::Endpoint,
    ];

    /// The stored and displayed name: `global`, `source`, `subscription`, `binding`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Global => "global",
            Scope::Source => "source",
            Scope::Subscription => "subscription",
            Scope::Binding => "binding",
            Scope::Endpoint => "endpoint",
        }
    }

    /// The inverse of [`Scope::as_str`].
    pub fn parse(s: &str) -> Option<Scope> {
        Scope::ALL.into_iter().find(|x| x.as_str() == s)
    }

    /// The configuration key that sets this level's limit, for error messages.
    pub fn config_key(self) -> &'static str {
        match self {
            Scope::Global => "[rate_limits].global_per_min",
            Scope::Source => "[rate_limits].source_per_min",
            Scope::Subscription => "[[subscriptions]].rate_limit_per_min",
            Scope::Binding => "[[bindings]].rate_limit_per_min",
            Scope::Endpoint => "fixed for capability endpoints",
        }
    }
}

/// The UTC minute `at_ms` falls in, counted from the Unix epoch (floor, also before 1970).
pub fn minute_of(at_ms: i64) -> i64 {
    at_ms.div_euclid(MINUTE_MS)
}

/// Whole seconds from `at_ms` to the start of the next minute, at least 1 (the `Retry-After` value).
pub fn retry_after_s(at_ms: i64) -> u64 {
    let rest = MINUTE_MS - at_ms.rem_euclid(MINUTE_MS);
    (rest.div_euclid(1000) + i64::from(rest % 1000 != 0)).max(1) as u64
}

/// Whether a level that has admitted `seen` requests this minute admits one more under `limit`
/// (0 = unlimited).
pub fn admits(seen: u64, limit: u32) -> bool {
    limit == 0 || seen < u64::from(limit)
}

/// Whether the `nth` refusal (from 0) of a subscription in a minute is kept as its own record
/// ([`RECORDS_PER_MINUTE`]).
pub fn keep_record(nth: u64) -> bool {
    nth < RECORDS_PER_MINUTE
}

/// The key a client address is counted under: an IPv4 address as itself (an IPv4-mapped IPv6 address
/// as its IPv4 form), an IPv6 address by its /64 prefix, as `2001:db8:1:2::/64` (one host usually holds
/// a whole /64, so counting single IPv6 addresses would let one host spread a flood over 2^64 buckets).
pub fn source_key(ip: IpAddr) -> String {
    // One rule for what a client is: `front_door::client_key`; this is its text form.
    match crate::front_door::client_key(ip) {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(prefix) => format!("{prefix}/64"),
    }
}

/// The client address of a request that reached us from `peer` carrying `X-Forwarded-For` values
/// `forwarded` (every header, in order): `peer` itself unless it is one of `trusted` proxies; else the
/// rightmost forwarded address that is not a trusted proxy (the one the nearest trusted proxy saw). A
/// hop may carry a port; IPv4-mapped IPv6 addresses are judged as IPv4. A hop that is not an address
/// stops the walk: `peer` is kept rather than anything a client could have written.
pub fn client_addr(peer: IpAddr, forwarded: &[&str], trusted: &[ipnet::IpNet]) -> IpAddr {
    // A dual-stack listener sees IPv4 peers as `::ffff:a.b.c.d`: judged as the IPv4 address.
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|n| n.contains(&ip.to_canonical()));
    let peer = peer.to_canonical();
    if !is_trusted(&peer) {
        return peer;
    }
    let mut client = peer;
    for hop in forwarded.iter().rev().flat_map(|h| h.rsplit(',')) {
        match hop_addr(hop.trim()) {
            Some(ip) => {
                client = ip;
                if !is_trusted(&ip) {
                    break;
                }
            }
            None => return peer,
        }
    }
    client
}

/// One `X-Forwarded-For` hop: an address, or an address with a port (`198.51.100.7:4711`,
/// `[2001:db8::1]:4711`, as some load balancers write it), canonical.
fn hop_addr(hop: &str) -> Option<IpAddr> {
    hop.parse::<IpAddr>()
        .or_else(|_| hop.parse::<std::net::SocketAddr>().map(|s| s.ip()))
        .ok()
        .map(|ip| ip.to_canonical())
}

/// A request refused at one level.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The level that was full.
    pub scope: Scope,
    /// What it counts (a subscription or binding id, a source key; `""` for global).
    pub key: String,
    /// Its limit in requests a minute.
    pub limit: u32,
    /// Whole seconds until the next minute, when it admits again.
    pub retry_after_s: u64,
}

impl Refusal {
    /// The answer: 429 `rate_limited` with `Retry-After`, naming the level and the key that sets it.
    pub fn error(&self) -> TbError {
        let what = match self.scope {
            Scope::Global => "this server".to_string(),
            Scope::Source => format!("source {}", self.key),
            Scope::Subscription => format!("subscription {:?}", self.key),
            Scope::Binding => format!("binding {:?}", self.key),
            Scope::Endpoint => "this endpoint".to_string(),
        };
        TbError::new(
            ErrorCode::RateLimited,
            format!(
                "{what} accepts {} request{} a minute ({}); retry after {} s",
                self.limit,
                if self.limit == 1 { "" } else { "s" },
                self.scope.config_key(),
                self.retry_after_s
            ),
        )
        .retry_after(self.retry_after_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_are_fixed_utc_buckets() {
        assert_eq!(minute_of(0), 0);
        assert_eq!(minute_of(59_999), 0);
        assert_eq!(minute_of(60_000), 1);
        assert_eq!(minute_of(-1), -1);
        assert_eq!(retry_after_s(0), 60);
        assert_eq!(retry_after_s(59_000), 1);
        assert_eq!(retry_after_s(59_999), 1);
        assert_eq!(retry_after_s(58_500), 2, "a part second rounds up");
        assert_eq!(retry_after_s(61_000), 59);
    }

    #[test]
    fn a_level_admits_up_to_its_limit() {
        assert!(admits(0, 1));
        assert!(!admits(1, 1));
        assert!(admits(119, 120));
        assert!(!admits(120, 120));
        assert!(admits(u64::MAX, 0), "0 = unlimited");
        assert!(keep_record(0) && keep_record(9) && !keep_record(10));
    }

    #[test]
    fn sources_are_addresses_and_ipv6_slash_64s() {
        assert_eq!(source_key("203.0.113.9".parse().unwrap()), "203.0.113.9");
        assert_eq!(
            source_key("::ffff:203.0.113.9".parse().unwrap()),
            "203.0.113.9"
        );
        assert_eq!(
            source_key("2001:db8:1:2:aaaa::1".parse().unwrap()),
            "2001:db8:1:2::/64"
        );
        assert_eq!(
            source_key("2001:db8:1:2:ffff::9".parse().unwrap()),
            "2001:db8:1:2::/64",
            "one /64, one bucket"
        );
    }

    #[test]
    fn forwarded_for_is_read_only_behind_a_trusted_proxy() {
        let trusted: Vec<ipnet::IpNet> = vec!["10.0.0.0/8".parse().unwrap()];
        let lb: IpAddr = "10.1.2.3".parse().unwrap();
        let outside: IpAddr = "198.51.100.7".parse().unwrap();
        // Not behind a trusted proxy: whatever the client wrote is ignored.
        assert_eq!(client_addr(outside, &["192.0.2.1"], &trusted), outside);
        // Behind one: the rightmost untrusted hop, not the leftmost (which the client can forge).
        assert_eq!(
            client_addr(lb, &["192.0.2.1, 198.51.100.7"], &trusted),
            outside
        );
        assert_eq!(
            client_addr(lb, &["192.0.2.1", "198.51.100.7, 10.9.9.9"], &trusted),
            outside,
            "several headers, and a second trusted hop"
        );
        assert_eq!(client_addr(lb, &[], &trusted), lb, "no header: the proxy");
        assert_eq!(
            client_addr(lb, &["198.51.100.7, garbage"], &trusted),
            lb,
            "a hop that is not an address stops the walk"
        );
        // A dual-stack listener's peer, and hops with ports.
        let mapped: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
        assert_eq!(client_addr(mapped, &["198.51.100.7"], &trusted), outside);
        assert_eq!(client_addr(lb, &["198.51.100.7:4711"], &trusted), outside);
        assert_eq!(
            client_addr(lb, &["[2001:db8::1]:4711"], &trusted),
            "2001:db8::1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn a_refusal_names_its_level_and_key() {
        let e = Refusal {
            scope: Scope::Source,
            key: "198.51.100.7".into(),
            limit: 120,
            retry_after_s: 17,
        }
        .error();
        assert_eq!(e.code, ErrorCode::RateLimited);
        assert_eq!(e.retry_after_s, Some(17));
        assert!(e.message.contains("source 198.51.100.7 accepts 120 requests a minute ([rate_limits].source_per_min); retry after 17 s"), "{}", e.message);
        for s in Scope::ALL {
            assert_eq!(Scope::parse(s.as_str()), Some(s));
        }
    }
}
